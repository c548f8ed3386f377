"""Policy vs backend: for each config of a space, whether its backend can honour a network
spec, and the warnings the policy form shows on save (which configs cannot, and how their
sessions will behave)."""

from __future__ import annotations

from collections.abc import Sequence

from console.models import Space
from netpolicy import AddressClass

from ..backends.base import NetworkSpec, RemoteError
from ..catalog.bridge import get_backend
from ..catalog.network import unsupported_policy_switches
from ..models import SandboxConfig
from .explain import BackendView


def backend_views(space: Space, spec: NetworkSpec) -> list[BackendView]:
    views = []
    for config in SandboxConfig.objects.filter(space=space).select_related("backend").order_by("name"):
        try:
            backend = get_backend(config)
            caps = backend.network_capabilities()
            egress = backend.egress()
            reserved = egress.reserved() if egress is not None else ()
        except RemoteError:
            views.append(BackendView(config.name, config.backend.name, None))
            continue
        problems = tuple(unsupported_policy_switches(spec, caps))
        views.append(BackendView(config.name, backend.label, caps, problems, tuple(reserved)))
    return views


def policy_backend_warnings(space: Space, spec: NetworkSpec, *, live_sessions: dict[str, int]) -> list[str]:
    """`live_sessions`: config name -> sessions with a bound sandbox."""
    warnings = []
    for view in backend_views(space, spec):
        if view.capabilities is None:
            warnings.append(
                f"Config {view.config}: its backend did not answer, so whether it honours this policy is unknown."
            )
        elif view.problems:
            warnings.append(
                f"Config {view.config} ({view.label}) cannot enforce {'; '.join(view.problems)}: new sessions on it are"
                " refused (HTTP 409) until the policy or the config changes; running ones keep their old rules."
            )
        elif unreachable := unreachable_entries(spec, view.reserved):
            warnings.append(f"Config {view.config} ({view.label}): {'; '.join(unreachable)}.")
        elif not view.capabilities.live_update and live_sessions.get(view.config):
            warnings.append(
                f"Config {view.config} ({view.label}) fixes the network at create: its"
                f" {live_sessions[view.config]} running session(s) keep the old rules until rebuilt."
            )
    return warnings


def unreachable_entries(spec: NetworkSpec, reserved: Sequence[AddressClass]) -> list[str]:
    """The allow entries and private exceptions holding addresses the backend never lets a
    sandbox reach (its host, other sandboxes), in words: saving them opens nothing there."""
    found = []
    for entry in (*spec.cidrs("allow_out"), *spec.allow_private):
        held = [c for c in reserved if c.network.version == entry.version and c.network.overlaps(entry.network)]
        if held:
            reasons = ", ".join(dict.fromkeys(c.reason for c in held))
            found.append(f"{entry} holds addresses that are never reachable ({reasons}); for those it changes nothing")
    return found
