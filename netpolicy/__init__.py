"""The network policy's one meaning: typed entries and their parser (`entries`), the special
address classes (`addresses`), a policy and its validation (`policy`), the decision for one
destination through every enforcing layer (`decide`), and what a refusal offers (`advice`).

A leaf below every app: pure Python, no Django, nothing of the project. The console validates
policies with it, explain and approvals decide with it, and each backend renders its own
enforcement (nftables sets, dnsmasq lines, squid ACLs, E2B/Cube lists) from its typed values;
no other module parses an entry or holds a range list. docs/network.md.
"""

from .addresses import ADDRESS_CLASSES, AddressClass, Kind, Treatment, reserved_class, sandbox_class, unmapped
from .advice import Advice, Offer, advise, with_entry
from .decide import (
    Decision,
    Destination,
    Layer,
    Rule,
    always_denied,
    decide,
    http_decision,
    never_reachable,
    parse_destination,
    parse_words,
)
from .entries import (
    Cidr,
    Domain,
    Entry,
    IPAddress,
    IPNetwork,
    L7Rule,
    PolicyError,
    entry_for,
    normalise_name,
    parse_domain,
    parse_entry,
    parse_l7_rule,
)
from .policy import (
    MAX_L7_RULES,
    MAX_LIST_ENTRIES,
    Policy,
    Validation,
    opened_parts,
    opened_range,
    private_problem,
    validate,
    warnings,
)

__all__ = [
    "ADDRESS_CLASSES",
    "MAX_L7_RULES",
    "MAX_LIST_ENTRIES",
    "AddressClass",
    "Advice",
    "Cidr",
    "Decision",
    "Destination",
    "Domain",
    "Entry",
    "IPAddress",
    "IPNetwork",
    "Kind",
    "L7Rule",
    "Layer",
    "Offer",
    "Policy",
    "PolicyError",
    "Rule",
    "Treatment",
    "Validation",
    "advise",
    "always_denied",
    "decide",
    "entry_for",
    "http_decision",
    "never_reachable",
    "normalise_name",
    "opened_parts",
    "opened_range",
    "parse_destination",
    "parse_domain",
    "parse_entry",
    "parse_l7_rule",
    "parse_words",
    "private_problem",
    "reserved_class",
    "sandbox_class",
    "unmapped",
    "validate",
    "warnings",
    "with_entry",
]
