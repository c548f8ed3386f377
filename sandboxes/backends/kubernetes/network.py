"""A space's network switches as the NetworkPolicy of a sandbox's template, and what of them a
cluster can hold (`capabilities`).

agent-sandbox (commit 2fd412d55ecae90861a101a5424a75473de97c36,
`extensions/api/v1beta1/sandboxtemplate_types.go`, `controllers/sandboxtemplate_controller.go`)
makes one NetworkPolicy per SandboxTemplate from `spec.networkPolicy` when
`networkPolicyManagement` is `Managed`: its pod selector and policy types (Ingress and
Egress, so default deny both ways) are the controller's, the rules ours. The adapter makes
a template per network spec (`templates.py`), so each sandbox's policy is its spec's:

- outbound off: no egress rule (nothing leaves the pod);
- outbound on: one egress rule whose peers are `ipBlock`s, all ports: the allow list's CIDRs
  (or 0.0.0.0/0 and ::/0 when it is empty), each cut by netpolicy (`opened_parts`: never the
  link-local/metadata and other never-reachable classes, the private ranges only for an
  entry inside one), plus the private exceptions; a deny CIDR inside a part is its `except`,
  a deny CIDR holding a whole part drops it (deny wins). Like upstream's default, cluster DNS
  is a private address and stays closed unless allowed;
- inbound: no ingress rule (the console offers no inbound route to pods).

What a NetworkPolicy cannot say: domain names (allow or deny) need a CNI with FQDN policies
(Cilium's `toFQDNs`, Calico Enterprise); HTTP (L7) rules need an L7 proxy (Cilium's
`rules.http`). Those are refused (`problems`), never dropped silently. A policy holds only
where the cluster's CNI enforces NetworkPolicy (Calico, Cilium, ...; kindnet and flannel do
not): the platform admin vouches for that.

May import: the contract and `netpolicy`.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from netpolicy import Cidr, opened_parts

from ..base import NetworkCapabilities, NetworkSpec

EVERYWHERE = (Cidr(ipaddress.ip_network("0.0.0.0/0")), Cidr(ipaddress.ip_network("::/0")))


def capabilities() -> NetworkCapabilities:
    return NetworkCapabilities(
        outbound_toggle=True,
        allow_out_cidr=True,
        allow_out_domain=False,  # needs an FQDN-capable CNI (Cilium toFQDNs): not a NetworkPolicy
        deny_out_cidr=True,
        deny_out_domain=False,
        l7_rules=False,
        inbound_toggle=False,
        live_update=False,  # a changed spec is a new template: new sandboxes get it
        deny_wins=True,  # a deny CIDR is an ipBlock's except
        allow_private=True,
    )


def problems(network: NetworkSpec) -> list[str]:
    """What of `network` a NetworkPolicy cannot hold, in words (empty: all of it)."""
    if not network.allow_internet_access:
        return []
    found = []
    for which, verb in (("allow_out", "allow"), ("deny_out", "deny")):
        names = network.domains(which)
        if names:
            found.append(
                f"domain {verb} entries ({', '.join(str(n) for n in names)}): a NetworkPolicy takes addresses only; "
                "names need a CNI with FQDN policies (e.g. Cilium)"
            )
    if network.l7_rules:
        found.append(f"{len(network.l7_rules)} HTTP (L7) rule(s): a NetworkPolicy has no HTTP rules")
    return found


def _parts(network: NetworkSpec) -> list[Cidr]:
    allowed = network.cidrs("allow_out") if network.allow_out else EVERYWHERE
    parts: list[Cidr] = []
    for entry in (*allowed, *network.allow_private):
        parts.extend(opened_parts(entry))
    return list(dict.fromkeys(parts))


def _peer(part: Cidr, denied: list[Cidr]) -> dict[str, Any] | None:
    holes = []
    for deny in denied:
        if deny.version != part.version or not deny.network.overlaps(part.network):
            continue
        if part.network.subnet_of(deny.network):  # type: ignore[arg-type]
            return None  # denied whole
        holes.append(str(deny))
    block: dict[str, Any] = {"cidr": str(part)}
    if holes:
        block["except"] = holes
    return {"ipBlock": block}


def policy_spec(network: NetworkSpec) -> dict[str, Any]:
    """The template's `spec.networkPolicy` (ingress and egress rules) for `network`."""
    if not network.allow_internet_access:
        return {"ingress": [], "egress": []}
    denied = list(network.cidrs("deny_out"))
    peers = [peer for part in _parts(network) if (peer := _peer(part, denied)) is not None]
    return {"ingress": [], "egress": [{"to": peers}] if peers else []}
