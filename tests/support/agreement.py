"""Turning the agreement table's rows (tests/support/agreement_table.py) into the
values each consumer takes: the policy with its `$NAME`s replaced by real places, the
destination as `netpolicy` parses it (a name with the address the test's resolver gives it),
and the Docker host's never-reachable classes for `decide`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

import netpolicy
from netpolicy import Kind, reserved_class
from sandboxes.backends.base import NetworkSpec
from tests.support.agreement_table import NAMES, Case, Spec

ZONE = "$ZONE"  # in `places`: the names under `.test` move to `.<zone>.test` (a run's own)
_TEST_SUFFIX = re.compile(r"(?i)\.test(?=\.?(?:$|[/:\s]))")


def substitute(text: str, places: Mapping[str, str]) -> str:
    """`$NAME`s replaced, longest first ($GW_NET before $GW), and names moved to the run's own
    zone when `places` has one (so that sets named after a pattern are the run's alone)."""
    for token in sorted((t for t in places if t != ZONE), key=len, reverse=True):
        text = text.replace(token, places[token])
    if ZONE in places:
        text = _TEST_SUFFIX.sub(lambda m: f".{places[ZONE]}{m.group(0)}", text)
    return text


def unzoned(name: str, places: Mapping[str, str]) -> str:
    if ZONE in places:
        return re.sub(rf"(?i)\.{re.escape(places[ZONE])}(?=\.test\.?$)", "", name)
    return name


def network_spec(spec: Spec, places: Mapping[str, str]) -> NetworkSpec:
    if not spec.outbound:
        return NetworkSpec.parse(allow_internet_access=False, allow_public_traffic=False)
    return NetworkSpec.parse(
        allow_internet_access=True,
        allow_public_traffic=False,
        allow_out=[substitute(t, places) for t in spec.allow_out],
        deny_out=[substitute(t, places) for t in spec.deny_out],
        allow_private=[substitute(t, places) for t in spec.allow_private],
        l7_rules=[substitute(t, places) for t in spec.l7_rules],
    )


def resolved_address(name: str, places: Mapping[str, str]) -> str | None:
    """What the test's upstream answers for `name`: the longest NAMES entry it is or is below."""
    name = netpolicy.normalise_name(unzoned(name, places))
    best = max((n for n in NAMES if name == n or name.endswith("." + n)), key=len, default=None)
    return substitute(NAMES[best], places) if best is not None else None


@dataclass(frozen=True)
class Asked:
    """One case made concrete: the text asked about and the parsed destination (a name with
    the address it resolves to)."""

    text: str
    destination: netpolicy.Destination

    @property
    def name(self) -> str | None:
        return self.destination.name

    @property
    def address(self) -> str:
        return str(self.destination.addresses[0])

    @property
    def original_name(self) -> str:
        """The name as the case spells it (case and trailing dot kept)."""
        host = self.text.split("://", 1)[-1].split("/", 1)[0]
        return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def asked(case: Case, places: Mapping[str, str]) -> Asked:
    text = substitute(case.destination, places)
    destination = netpolicy.parse_destination(text)
    if case.method is not None:
        from dataclasses import replace

        destination = replace(destination, method=case.method)
    if destination.name is not None:
        address = resolved_address(destination.name, places)
        assert address is not None, f"{case.label}: the table's resolver has no answer for it"
        destination = destination.resolved(address)
    return Asked(text, destination)


def upstream_answers(places: Mapping[str, str]) -> dict[str, str]:
    """NAMES as the test's upstream resolver answers them (in the run's zone)."""
    return {substitute(name, places): substitute(address, places) for name, address in NAMES.items()}


def reserved(places: Mapping[str, str]) -> tuple[netpolicy.AddressClass, ...]:
    """The Docker host's addresses and the sandbox networks, as `decide` takes them."""
    host = [reserved_class(ipaddress.ip_network(places[k]), Kind.HOST, "the Docker host") for k in ("$GW", "$DOCKER0")]
    sandboxes = [
        reserved_class(ipaddress.ip_network(places[k]), Kind.SANDBOX, "other sandbox")
        for k in ("$GW_NET", "$OTHER_NET")
    ]
    return (*host, *sandboxes)
