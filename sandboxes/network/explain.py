"""Would a destination be allowed, and by which rule? The answer of `netpolicy.decide` (the
policy's one meaning, the one every enforcing layer follows) over a space's spec, a
session's grants and the backends' own never-reachable ranges (`EgressCapability.reserved`),
with what each config's backend can honour. Names are matched as names, never resolved: the
address checks (deny CIDRs, the always-denied classes) apply to what a name resolves to,
which is said.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from netpolicy import AddressClass, Advice, Decision, Destination, decide, http_decision, parse_destination

from ..backends.base import NetworkCapabilities, NetworkSpec


def parse_target(text: str) -> Destination:
    """`host`, `host:port`, `[v6]:port`, an address or an http(s) URL; ValueError (a
    `netpolicy.PolicyError`) with the reason otherwise."""
    return parse_destination(text)


@dataclass(frozen=True)
class BackendView:
    """One config of the space as the explain answer shows it."""

    config: str
    label: str
    capabilities: NetworkCapabilities | None  # None: the backend did not answer
    problems: tuple[str, ...] = ()
    reserved: tuple[AddressClass, ...] = ()  # its never-reachable ranges (the host, other sandboxes)


def reserved_of(backends: Sequence[BackendView]) -> tuple[AddressClass, ...]:
    """Every backend's never-reachable ranges, once each."""
    return tuple(dict.fromkeys(found for view in backends for found in view.reserved))


def _http_line(spec: NetworkSpec, target: Destination) -> Decision | None:
    """For a name asked without a port or scheme: what the HTTP rules would say of plain
    HTTP to it (`decide` applies them itself when the port or the URL says HTTP or TLS)."""
    if not spec.l7_rules or target.name is None or target.port is not None or target.scheme is not None:
        return None
    return http_decision(spec.l7_rules, target.name, tls=False, method=target.method, path=target.path)


@dataclass
class Explanation:
    target: Destination
    decision: Decision
    lines: list[tuple[str, str]] = field(default_factory=list)  # (layer, text)
    advice: Advice | None = None  # what a refusal of it offers (advice.refusal_advice)

    @property
    def allowed(self) -> bool:
        return self.decision.allowed

    @property
    def rule(self) -> str:
        return self.decision.sentence

    def as_json(self) -> dict[str, object]:
        answer: dict[str, object] = {
            "destination": self.target.text,
            "allowed": self.allowed,
            "rule": self.rule,
            "layer": self.decision.layer.value,
            "layers": [{"layer": layer, "text": text} for layer, text in self.lines],
        }
        if self.advice is not None:
            answer["advice"] = advice_json(self.advice)
        return answer


def advice_json(advice: Advice) -> dict[str, object]:
    """What a refusal offers, as the API answers it."""
    return {
        "offer": advice.offer.value,
        "can_approve": advice.can_approve,
        "entry": str(advice.entry) if advice.entry is not None else None,
        "text": advice.text,
    }


def explain(
    target: Destination,
    space_spec: NetworkSpec,
    *,
    session_spec: NetworkSpec | None = None,
    grants: tuple[str, ...] = (),
    backends: tuple[BackendView, ...] = (),
    reserved: Sequence[AddressClass] | None = None,
) -> Explanation:
    """The answer through every layer: space policy, session grants, HTTP rules, the backends."""
    reserved = reserved_of(backends) if reserved is None else tuple(reserved)
    space = decide(space_spec, target, reserved=reserved)
    final_spec = session_spec or space_spec
    final = decide(final_spec, target, reserved=reserved) if session_spec is not None else space
    answer = Explanation(target, final)
    verdict = "allowed" if space.allowed else "refused"
    answer.lines.append(("space policy", f"{verdict}: {space.sentence}"))
    if target.name is not None and not target.addresses and final.allowed:
        answer.lines.append(
            (
                "space policy",
                "matched by name: after resolution, the addresses it resolves to are checked too (deny CIDR"
                " entries, the always-denied and private ranges unless a CIDR entry inside one allows them)",
            )
        )
    if session_spec is not None:
        if not grants:
            answer.lines.append(("session grants", "none"))
        elif final.allowed != space.allowed:
            # The grant's own part: the lists, without the HTTP rules (their layer follows).
            listed = decide(dataclasses.replace(final_spec, l7_rules=()), target, reserved=reserved)
            answer.lines.append(("session grants", f"allowed by this session's grant: {listed.sentence}"))
        else:
            answer.lines.append(("session grants", f"{', '.join(grants)}: no change for this destination"))
    if final.layer.value in ("http", "tls"):
        answer.lines.append(("http rules", f"{'allowed' if final.allowed else 'refused'}: {final.sentence}"))
    elif final.allowed and (http := _http_line(final_spec, target)) is not None:
        answer.lines.append(("http rules", f"{'allowed' if http.allowed else 'refused'}: {http.sentence}"))
        if not http.allowed:
            answer.decision = http
    for view in backends:
        if view.capabilities is None:
            answer.lines.append(("backend", f"config {view.config} ({view.label}): did not answer; not checked"))
        elif view.problems:
            answer.lines.append(
                (
                    "backend",
                    f"config {view.config} ({view.label}) cannot enforce {'; '.join(view.problems)}:"
                    " its sessions are refused (409) until the policy or the config changes",
                )
            )
        else:
            live = "applied live to running sessions" if view.capabilities.live_update else "fixed at create"
            answer.lines.append(("backend", f"config {view.config} ({view.label}) honours this policy ({live})"))
    return answer
