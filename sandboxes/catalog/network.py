"""What the space's network policy becomes for one backend: the `NetworkSpec` sent (space
policy plus a session's grants), its fingerprint (which policy version a sandbox runs with),
and the parts a backend's capabilities cannot honour, in words (docs/network.md).

Imports the models and the backends' contract only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence

from console.models import NetworkPolicy, Space
from netpolicy import Cidr, Entry, PolicyError, opened_range, parse_entry

from ..backends.base import Backend, ErrorKind, NetworkCapabilities, NetworkSpec
from ..models import Session, SessionGrant
from .conflicts import Conflict


def policy_spec(policy: NetworkPolicy) -> NetworkSpec:
    """The stored policy (text, validated on save) as the typed spec sent to a backend.

    A private exception saved by an earlier console may hold an address that is never
    reachable (100.64.0.0/10 holds a metadata address, fd00::/8 another): it is kept as it is
    (`decide` and every backend refuse the never-reachable classes before any exception), so
    the space keeps working; the policy form asks for a narrower one on the next save."""
    spec = NetworkSpec.parse(
        allow_internet_access=policy.allow_internet_access,
        allow_public_traffic=policy.allow_public_traffic,
        allow_out=policy.allow_out,
        deny_out=policy.deny_out,
        l7_rules=policy.l7_rules,
    )
    private = tuple(dict.fromkeys(e for e in map(parse_entry, policy.allow_private) if isinstance(e, Cidr)))
    return dataclasses.replace(spec, allow_private=private) if private else spec


def merge_grants(spec: NetworkSpec, grants: list[SessionGrant]) -> NetworkSpec:
    """A session's grants on top of its space's spec. A grant has the shape of an approval
    for this one session: an `allow` entry joins the allow list only where the space already
    allows only listed destinations (else it would cut everything else off), a `private`
    entry joins the private exceptions. Deny entries still win. Outbound off stays off."""
    if not spec.allow_internet_access or not grants:
        return spec
    allow: list[Entry] = list(spec.allow_out)
    private: list[Cidr] = list(spec.allow_private)
    for grant in grants:
        try:
            entry = parse_entry(grant.entry)
        except PolicyError:
            continue  # written by an approval, so parsed once already; never a half-applied grant
        if grant.kind == SessionGrant.Kind.ALLOW and spec.allow_out:
            allow.append(entry)
        elif isinstance(entry, Cidr) and (grant.kind == SessionGrant.Kind.PRIVATE or opened_range(entry) is not None):
            private.append(entry)
        # else: the space allows every destination now, nothing to add
    return dataclasses.replace(spec, allow_out=tuple(dict.fromkeys(allow)), allow_private=tuple(dict.fromkeys(private)))


def space_policy(space: Space) -> NetworkPolicy:
    """The space's policy row, read only. Every space is made with its row
    (`do_create_space`); one without it reads as the closed policy an unsaved row holds, and
    nothing is written: a read path (a page, a refill racing the space's deletion) must never
    insert a row, least of all for a space deleted meanwhile."""
    return NetworkPolicy.objects.filter(space_id=space.pk).first() or NetworkPolicy(space=space)


def network_spec_for(
    space: Space, session: Session | None = None, *, policy: NetworkPolicy | None = None
) -> NetworkSpec:
    """The space's policy as sent to a backend (every switch explicit), with the session's
    grants; `policy` is the space's row when the caller has just read it."""
    spec = policy_spec(policy if policy is not None else space_policy(space))
    if session is None:
        return spec
    return merge_grants(spec, list(SessionGrant.objects.filter(session=session).order_by("created")))


def spec_fingerprint(spec: NetworkSpec) -> str:
    """A short, stable name for a NetworkSpec: equal specs, equal fingerprints. The material
    is the spec as text, in the shape the string-typed spec of earlier consoles had, so a
    sandbox's stored fingerprint stays current across the change to typed entries."""
    material = json.dumps({**spec.texts(), "allow_public_traffic": spec.allow_public_traffic}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def _inside(deny: Entry, allow: Entry) -> bool:
    if isinstance(deny, Cidr) and isinstance(allow, Cidr):
        return deny.overlaps(allow)
    return allow.covers(deny)


def _texts(entries: Sequence[Entry]) -> str:
    return ", ".join(str(e) for e in entries)


def unsupported_policy_switches(network: NetworkSpec | NetworkPolicy, caps: NetworkCapabilities) -> list[str]:
    """The parts of a network spec (or a space's policy) this backend cannot honour, in words."""
    spec = policy_spec(network) if isinstance(network, NetworkPolicy) else network
    problems = []
    if spec.allow_internet_access:
        for verb, which, cidr_ok, domain_ok in (
            ("deny", "deny_out", caps.deny_out_cidr, caps.deny_out_domain),
            ("allow", "allow_out", caps.allow_out_cidr, caps.allow_out_domain),
        ):
            cidrs, domains = spec.cidrs(which), spec.domains(which)
            if cidrs and not cidr_ok:
                problems.append(f"CIDR {verb} entries ({_texts(cidrs)})")
            if domains and not domain_ok:
                problems.append(f"domain {verb} entries ({_texts(domains)})")
        if not caps.allow_private:
            # This backend never opens a private address: neither a private exception nor
            # an allow entry inside a private range would reach it.
            if spec.allow_private:
                problems.append(f"private addresses also allowed ({_texts(spec.allow_private)})")
            inside = [e for e in spec.cidrs("allow_out") if opened_range(e) is not None]
            if inside:
                problems.append(f"allow entries inside a private range ({_texts(inside)})")
        if not caps.deny_wins:
            # Where an allow entry beats a deny entry, a deny entry inside an allowed range is
            # lost, and so is a deny CIDR beside allowed names (a name's addresses get through).
            allowed: list[Entry] = [*spec.allow_out, *spec.allow_private]
            for deny in spec.deny_out:
                holder = next((a for a in allowed if _inside(deny, a)), None)
                if holder is not None:
                    problems.append(
                        f"deny entry {deny} inside allow entry {holder} (on this backend allow entries win)"
                    )
                elif isinstance(deny, Cidr) and spec.domains("allow_out"):
                    problems.append(
                        f"deny entry {deny} beside allowed domains ({_texts(spec.domains('allow_out'))}):"
                        " on this backend an allowed name's addresses are let through whatever the deny list says"
                    )
        if spec.l7_rules and not caps.l7_rules:
            problems.append(f"{len(spec.l7_rules)} HTTP (L7) rule(s)")
        elif caps.max_l7_rules is not None and len(spec.l7_rules) > caps.max_l7_rules:
            problems.append(f"more than {caps.max_l7_rules} HTTP (L7) rules ({len(spec.l7_rules)})")
        if spec.l7_rules and caps.l7_rules and not caps.l7_within_deny and spec.cidrs("deny_out"):
            problems.append(
                f"deny entries ({_texts(spec.cidrs('deny_out'))}) beside HTTP (L7) rules (on this backend a host "
                "a rule names is reached on ports 80 and 443 whatever the deny list says)"
            )
    if caps.inbound_always_public and not caps.inbound_toggle:
        if not spec.allow_public_traffic:
            problems.append("private sandbox ports (this backend serves every sandbox's ports publicly)")
    elif spec.allow_public_traffic and not caps.inbound_toggle:
        problems.append("public inbound traffic")
    return problems


class PolicyConflict(Conflict):
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
