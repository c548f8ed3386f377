"""What the space's network policy becomes for one backend: the `NetworkSpec` sent (space
policy plus a session's grants), its fingerprint (which policy version a sandbox runs with),
and the parts a backend's capabilities cannot honour, in words (docs/network.md).

Imports the models and the backends' contract only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

from console.models import NetworkPolicy, Space
from console.network import Destination, overlaps, parse_destination, private_range_of

from ..backends.base import Backend, ErrorKind, L7Rule, NetworkCapabilities, NetworkSpec, RemoteError
from ..models import Session, SessionGrant


def policy_spec(policy: NetworkPolicy) -> NetworkSpec:
    return NetworkSpec(
        allow_internet_access=policy.allow_internet_access,
        allow_public_traffic=policy.allow_public_traffic,
        allow_out=tuple(policy.allow_out),
        deny_out=tuple(policy.deny_out),
        allow_private=tuple(policy.allow_private),
        l7_rules=tuple(
            L7Rule(
                domain=rule["domain"],
                methods=tuple(rule.get("methods") or ()),
                path_prefix=rule.get("path_prefix") or "/",
                action=rule["action"],
            )
            for rule in policy.l7_rules
        ),
    )


def merge_grants(spec: NetworkSpec, grants: list[SessionGrant]) -> NetworkSpec:
    """A session's grants on top of its space's spec. A grant has the shape of an approval
    for this one session: an `allow` entry joins the allow list only where the space already
    allows only listed destinations (else it would cut everything else off), a `private`
    entry joins the private exceptions. Deny entries still win. Outbound off stays off."""
    if not spec.allow_internet_access or not grants:
        return spec
    allow = list(spec.allow_out)
    private = list(spec.allow_private)
    for grant in grants:
        if grant.kind == SessionGrant.Kind.ALLOW and spec.allow_out:
            target = allow
        elif grant.kind == SessionGrant.Kind.PRIVATE or _is_private_cidr(grant.entry):
            target = private
        else:
            continue  # the space allows every destination now: nothing to add
        if grant.entry not in target:
            target.append(grant.entry)
    return NetworkSpec(
        allow_internet_access=spec.allow_internet_access,
        allow_public_traffic=spec.allow_public_traffic,
        allow_out=tuple(allow),
        deny_out=spec.deny_out,
        allow_private=tuple(private),
        l7_rules=spec.l7_rules,
    )


def _is_private_cidr(entry: str) -> bool:
    try:
        destination = parse_destination(entry)
    except ValueError:
        return False
    return destination.network is not None and private_range_of(destination.network) is not None


def network_spec_for(space: Space, session: Session | None = None) -> NetworkSpec:
    """The space's policy as sent to a backend (every switch explicit), with the session's grants."""
    spec = policy_spec(NetworkPolicy.objects.get_or_create(space=space)[0])
    if session is None:
        return spec
    return merge_grants(spec, list(SessionGrant.objects.filter(session=session).order_by("created")))


def spec_fingerprint(spec: NetworkSpec) -> str:
    """A short, stable name for a NetworkSpec: equal specs, equal fingerprints."""
    material = json.dumps(asdict(spec), sort_keys=True, default=list)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def _names(destinations: list[Destination]) -> tuple[list[str], list[str]]:
    return [d.text for d in destinations if d.network is not None], [d.text for d in destinations if d.network is None]


def _inside(deny: Destination, allow: Destination) -> bool:
    if deny.network is not None and allow.network is not None:
        return overlaps(deny.network, allow.network)
    return allow.covers(deny)


def unsupported_policy_switches(network: NetworkSpec | NetworkPolicy, caps: NetworkCapabilities) -> list[str]:
    """The parts of a network spec (or a space's policy) this backend cannot honour, in words."""
    spec = policy_spec(network) if isinstance(network, NetworkPolicy) else network
    problems = []
    if spec.allow_internet_access:
        # Stored entries were validated on save; parse_destination tells networks from names.
        allowed = [parse_destination(entry) for entry in spec.allow_out]
        denied = [parse_destination(entry) for entry in spec.deny_out]
        private = [parse_destination(entry) for entry in spec.allow_private]
        for verb, entries, cidr_ok, domain_ok in (
            ("deny", denied, caps.deny_out_cidr, caps.deny_out_domain),
            ("allow", allowed, caps.allow_out_cidr, caps.allow_out_domain),
        ):
            cidrs, domains = _names(entries)
            if cidrs and not cidr_ok:
                problems.append(f"CIDR {verb} entries ({', '.join(cidrs)})")
            if domains and not domain_ok:
                problems.append(f"domain {verb} entries ({', '.join(domains)})")
        if private and not caps.allow_private:
            problems.append(f"private addresses also allowed ({', '.join(d.text for d in private)})")
        if not caps.deny_wins:
            # Where an allow entry beats a deny entry, a deny entry inside an allowed range is lost.
            for deny in denied:
                holder = next((a for a in allowed + private if _inside(deny, a)), None)
                if holder is not None:
                    problems.append(
                        f"deny entry {deny.text} inside allow entry {holder.text} (on this backend allow entries win)"
                    )
        if spec.l7_rules and not caps.l7_rules:
            problems.append(f"{len(spec.l7_rules)} HTTP (L7) rule(s)")
    if spec.allow_public_traffic and not caps.inbound_toggle:
        problems.append("public inbound traffic")
    return problems


class PolicyConflict(RemoteError):
    """A session refused because its config's backend cannot enforce the space's policy: a
    settings conflict (409, `policy_conflict`), never a backend failure."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.CONFLICT, message, retryable=False)


def policy_refusal(config_name: str, backend_label: str, problems: list[str]) -> str:
    """The one sentence a session refused for the policy answers (409), the form and tests show."""
    return (
        f"The space's network policy cannot be honoured by config {config_name} ({backend_label}): it cannot"
        f" enforce {'; '.join(problems)}. Sessions on this config are refused until the policy or the config"
        " changes."
    )


def refuse_unless_honoured(network: NetworkSpec, backend: Backend, config_name: str) -> None:
    """Raise PolicyConflict when `backend` cannot enforce `network` (before anything is created)."""
    problems = unsupported_policy_switches(network, backend.network_capabilities())
    if problems:
        raise PolicyConflict(policy_refusal(config_name, backend.label, problems))
