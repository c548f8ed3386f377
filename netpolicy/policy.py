"""A space's outbound policy as typed values, and its validation for the admin (errors that
block saving, warnings shown on save).

The meaning (the policy form and docs/network.md say the same):
- outbound off: no network at all; lists and rules must then be empty;
- outbound on, empty allow list: every destination but the always-denied classes and the
  deny entries;
- outbound on, allow list: ONLY its CIDRs and domains;
- deny entries win over allow entries, private exceptions and session grants;
- always denied: link-local and metadata, loopback, the host and other sandboxes; the private
  ranges unless a CIDR allow entry inside one or a private exception (`allow_private`, which
  never makes the list allow-only) opens that part;
- HTTP rules are checked in order, first match wins, within what the lists let through.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from .addresses import Treatment, classes
from .entries import Cidr, Domain, Entry, IPNetwork, L7Rule, PolicyError, parse_entry, parse_l7_rule

MAX_LIST_ENTRIES = 500
MAX_L7_RULES = 200


@dataclass(frozen=True, kw_only=True)
class Policy:
    """The outbound half of a space's network switches, every entry parsed."""

    allow_internet_access: bool
    allow_out: tuple[Entry, ...] = ()
    deny_out: tuple[Entry, ...] = ()
    # CIDRs inside the private ranges also allowed, whatever allow_out says; they never switch
    # a space to allow-only. deny_out still wins.
    allow_private: tuple[Cidr, ...] = ()
    l7_rules: tuple[L7Rule, ...] = ()

    @classmethod
    def parse(
        cls,
        *,
        allow_out: Iterable[str | Entry] = (),
        deny_out: Iterable[str | Entry] = (),
        allow_private: Iterable[str | Cidr] = (),
        l7_rules: Iterable[object] = (),
        **switches: Any,
    ) -> Self:
        """From the stored or sent text (each entry through the one parser); PolicyError names
        the first entry that is not one. Other keyword arguments are the switches."""
        return cls(
            allow_out=_entries(allow_out, "allow_out"),
            deny_out=_entries(deny_out, "deny_out"),
            allow_private=tuple(_private(e) for e in _entries(allow_private, "allow_private")),
            l7_rules=tuple(parse_l7_rule(rule) for rule in l7_rules),
            **switches,
        )

    @property
    def allow_only(self) -> bool:
        """Whether ONLY the allow list's destinations are reachable."""
        return bool(self.allow_out)

    def domains(self, which: str) -> tuple[Domain, ...]:
        return tuple(e for e in getattr(self, which) if isinstance(e, Domain))

    def cidrs(self, which: str) -> tuple[Cidr, ...]:
        return tuple(e for e in getattr(self, which) if isinstance(e, Cidr))

    def texts(self) -> dict[str, Any]:
        """The policy as the plain values it is stored and fingerprinted as."""
        return {
            "allow_internet_access": self.allow_internet_access,
            "allow_out": [str(e) for e in self.allow_out],
            "deny_out": [str(e) for e in self.deny_out],
            "allow_private": [str(e) for e in self.allow_private],
            "l7_rules": [rule.as_json() for rule in self.l7_rules],
        }


def _entries(values: Iterable[str | Entry], what: str) -> tuple[Entry, ...]:
    parsed: list[Entry] = []
    for value in values:
        if isinstance(value, Cidr | Domain):
            parsed.append(value)
            continue
        try:
            parsed.append(parse_entry(value))
        except PolicyError as exc:
            raise PolicyError(f"{what}: {exc}") from None
    return tuple(dict.fromkeys(parsed))


def _private(entry: Entry) -> Cidr:
    problem = private_problem(entry)
    if problem:
        raise PolicyError(f"allow_private: {problem}")
    assert isinstance(entry, Cidr)
    return entry


def private_problem(entry: Entry) -> str | None:
    """Why an entry cannot be a private exception (a CIDR inside one private range), or None."""
    if not isinstance(entry, Cidr):
        return f"{entry} is not a CIDR (names go in the allow list)"
    if any(c.network.version == entry.version and c.network.overlaps(entry.network) for c in NEVER_CLASSES):
        return f"{entry} holds addresses that are always denied (link-local, metadata, loopback)"
    if opened_range(entry) is None:
        ranges = ", ".join(str(c.network) for c in OPENABLE_CLASSES)
        return f"{entry} is not inside a private range ({ranges})"
    return None


NEVER_CLASSES = classes(sandbox=Treatment.NEVER)
OPENABLE_CLASSES = classes(sandbox=Treatment.OPENABLE)


def opened_range(entry: Cidr) -> Cidr | None:
    """The private range (an OPENABLE class) that holds all of `entry`, if one does: only such
    an allow entry opens private addresses, never a wider one (0.0.0.0/0)."""
    for found in OPENABLE_CLASSES:
        if found.network.version == entry.version and entry.network.subnet_of(found.network):  # type: ignore[arg-type]
            return Cidr(found.network)
    return None


def opened_parts(entry: Cidr, *, private: bool = True) -> tuple[Cidr, ...]:
    """The parts of an allow CIDR that `decide` lets through: the entry without the
    never-reachable classes, and without the private ranges unless the entry lies inside one
    (`private` False: a backend that cannot open private addresses, never those either). What
    a backend whose allow entries beat everything else is sent instead of the entry itself."""
    opens_private = private and opened_range(entry) is not None
    holes = [
        c.network
        for c in (*NEVER_CLASSES, *(() if opens_private else OPENABLE_CLASSES))
        if c.network.version == entry.version
    ]
    parts: list[IPNetwork] = [entry.network]
    for hole in holes:
        kept: list[IPNetwork] = []
        for part in parts:
            if not part.overlaps(hole):
                kept.append(part)
            elif not part.subnet_of(hole):  # type: ignore[arg-type]
                kept.extend(part.address_exclude(hole))  # type: ignore[arg-type]
        parts = kept
    return tuple(Cidr(n) for n in ipaddress.collapse_addresses(parts))  # type: ignore[type-var]


# --- Validation for the admin -----------------------------------------------------------------


@dataclass
class Validation:
    """The parsed policy (None when an error blocks saving), field errors and warnings."""

    policy: Policy | None = None
    errors: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def error(self, field_name: str, message: str) -> None:
        self.errors.setdefault(field_name, []).append(message)

    @property
    def texts(self) -> Mapping[str, Any]:
        """The cleaned values to store (empty lists while there are errors)."""
        if self.policy is None:
            return {"allow_out": [], "deny_out": [], "allow_private": [], "l7_rules": []}
        return self.policy.texts()


def validate(
    *,
    allow_internet_access: bool,
    allow_out: list[str],
    deny_out: list[str],
    l7_rules: list[object],
    allow_private: list[str] | None = None,
) -> Validation:
    """Every entry and rule checked, each problem named with its position."""
    result = Validation()
    allow_private = allow_private or []
    if not allow_internet_access:
        off = (
            "Outbound access is off, so sandboxes have no network at all and this would have no effect:"
            " clear it or turn outbound on."
        )
        for name, given in (
            ("allow_out", allow_out),
            ("deny_out", deny_out),
            ("allow_private", allow_private),
            ("l7_rules", l7_rules),
        ):
            if given:
                result.error(name, off)
        if not result.errors:
            result.policy = Policy(allow_internet_access=False)
        return result

    allowed = _parse_list("allow_out", allow_out, result)
    denied = _parse_list("deny_out", deny_out, result)
    exceptions: list[Cidr] = []
    for position, entry in enumerate(_parse_list("allow_private", allow_private, result), start=1):
        problem = private_problem(entry)
        if problem:
            result.error("allow_private", f"entry {position}: {problem}")
        else:
            assert isinstance(entry, Cidr)
            exceptions.append(entry)
    rules = _parse_rules(l7_rules, result)
    if result.errors:
        return result
    result.policy = Policy(
        allow_internet_access=True,
        allow_out=tuple(allowed),
        deny_out=tuple(denied),
        allow_private=tuple(exceptions),
        l7_rules=tuple(rules),
    )
    result.warnings.extend(warnings(result.policy))
    return result


def _parse_list(name: str, entries: list[str], result: Validation) -> list[Entry]:
    parsed: list[Entry] = []
    seen: dict[str, int] = {}
    if len(entries) > MAX_LIST_ENTRIES:
        result.error(name, f"at most {MAX_LIST_ENTRIES} entries")
        return parsed
    for position, text in enumerate(entries, start=1):
        try:
            entry = parse_entry(text)
        except PolicyError as exc:
            result.error(name, f"entry {position}: {exc}")
            continue
        if str(entry) in seen:
            result.error(name, f"entry {position}: {entry} duplicates entry {seen[str(entry)]}")
            continue
        seen[str(entry)] = position
        parsed.append(entry)
    return parsed


def _parse_rules(raw_rules: list[object], result: Validation) -> list[L7Rule]:
    rules: list[L7Rule] = []
    if len(raw_rules) > MAX_L7_RULES:
        result.error("l7_rules", f"at most {MAX_L7_RULES} rules")
        return rules
    seen: dict[tuple[str, tuple[str, ...], str], int] = {}
    for position, raw in enumerate(raw_rules, start=1):
        try:
            rule = parse_l7_rule(raw)
        except PolicyError as exc:
            result.error("l7_rules", f"rule {position}: {exc}")
            continue
        key = (str(rule.domain), tuple(sorted(rule.methods)), rule.path_prefix)
        if key in seen:
            result.error("l7_rules", f"rule {position}: repeats the match of rule {seen[key]}")
            continue
        seen[key] = position
        rules.append(rule)
    return rules


def _overlap(a: Entry, b: Entry) -> bool:
    if isinstance(a, Cidr) and isinstance(b, Cidr):
        return a.overlaps(b)
    return a.covers(b) or b.covers(a)


def _every_address(entry: Entry) -> bool:
    return isinstance(entry, Cidr) and entry.network.prefixlen == 0


def warnings(policy: Policy) -> list[str]:
    """Entries that do nothing or more than they seem to, under the meaning above."""
    found: list[str] = []
    allowed, denied = policy.allow_out, policy.deny_out
    for allow in allowed:
        deny = next((d for d in denied if d.covers(allow)), None)
        if deny is not None:
            found.append(f"Allow entry {allow} has no effect: deny entry {deny} covers it and deny entries win.")
    for deny in denied:
        if _every_address(deny) and allowed:
            assert isinstance(deny, Cidr)
            found.append(
                f"Deny entry {deny} refuses every IPv{deny.version} destination, the allowed ones too"
                " (deny entries win). The allow list alone already lets out only the listed destinations."
            )
    if allowed:
        same_kind_only = all(isinstance(a, Cidr) for a in allowed) or all(isinstance(a, Domain) for a in allowed)
        for deny in denied:
            inside = any(_overlap(allow, deny) for allow in allowed)
            if not inside and same_kind_only and isinstance(deny, Cidr) == isinstance(allowed[0], Cidr):
                found.append(
                    f"Deny entry {deny} has no effect: with an allow list only the listed destinations are"
                    " reachable, and it is inside none of them."
                )
    for allow in allowed:
        if not isinstance(allow, Cidr):
            continue
        if any(c.network.version == allow.version and c.network.overlaps(allow.network) for c in NEVER_CLASSES):
            found.append(f"Allow entry {allow}: link-local, metadata and loopback addresses inside it stay denied.")
        opened = [
            str(c.network)
            for c in OPENABLE_CLASSES
            if c.network.version == allow.version and c.network.overlaps(allow.network)
        ]
        if opened and opened_range(allow) is None:
            found.append(
                f"Allow entry {allow} does not open the private addresses inside it ({', '.join(opened)}):"
                " only an entry inside a private range, or a private exception, opens one."
                " To allow everything but the always-denied set, leave the allow list empty."
            )
    for exception in policy.allow_private:
        if any(a.covers(exception) and isinstance(a, Cidr) and opened_range(a) for a in allowed):
            found.append(f"Private exception {exception} repeats an allow entry that covers it already.")
    return found
