"""The Docker egress configuration renderers and log readers, pure (no engine, no root): the
chain a policy becomes, the resolver's configuration, its refusal lines, and nft accepting
what is rendered (`nft -c`, a check that changes nothing, when nft runs here)."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import netpolicy
from netpolicy import Domain, PolicyError, parse_domain
from sandboxes.backends.base import NetworkSpec
from sandboxes.backends.docker.egress.dns import DnsPolicy, policy_for, read_refusals, render_config, render_fill_config
from sandboxes.backends.docker.egress.firewall import render_ruleset
from sandboxes.backends.docker.egress.rules import (
    Binding,
    chain_rules,
    deny_rules,
    domain_sets,
    network_sets,
    network_sets_of,
    render_removal,
    render_update,
)

SANDBOX = "ab" * 32


def d(*names: str) -> tuple[Domain, ...]:
    return tuple(parse_domain(n) for n in names)


def spec(allow: tuple[str, ...] = (), deny: tuple[str, ...] = ()) -> NetworkSpec:
    return NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=allow, deny_out=deny)


def index(rules: list[str], fragment: str) -> int:
    return next(i for i, rule in enumerate(rules) if fragment in rule)


def test_deny_entries_come_first_and_the_list_ends_the_chain() -> None:
    rules = chain_rules(spec(allow=("198.51.100.0/24", "*.example.com"), deny=("198.51.100.7", "bad.example.com")))
    deny_cidr = index(rules, "deny entry 198.51.100.7/32")
    deny_domain = index(rules, "deny entry bad.example.com")
    allow_cidr = index(rules, "ip daddr 198.51.100.0/24 accept")  # one set rule per family
    allow_domain = index(rules, f"@{domain_sets('*.example.com')[0]} accept")
    private = index(rules, "always denied: private range")
    assert deny_cidr < deny_domain < private < allow_cidr < allow_domain
    assert rules[-1].endswith('log prefix "egress: not in the allow list" group 51 reject with icmpx admin-prohibited')
    assert chain_rules(spec())[-1] == "accept"  # no allow list: everything else


def test_only_a_cidr_inside_a_private_range_opens_it() -> None:
    rules = chain_rules(spec(allow=("10.1.0.0/16", "0.0.0.0/0", "internal.example", "10.1.2.0/24")))
    private = index(rules, "always denied: private range")
    assert index(rules, "ip daddr 10.1.0.0/16 accept") < private  # opened (10.1.2.0/24 merged into it)
    assert index(rules, "ip daddr 0.0.0.0/0 accept") > private  # the public part only
    many = chain_rules(spec(allow=tuple(f"203.0.113.{i}/32" for i in range(1, 11))))
    assert sum("accept" in rule for rule in many) == 1  # one set lookup, not ten rules
    assert index(rules, "always denied: link-local/metadata") < index(rules, "ip daddr 10.1.0.0/16 accept")


def test_entries_that_are_neither_cidr_nor_domain_never_reach_a_renderer() -> None:
    for bad in ("a b", "x; drop", '"quoted"', "-x.example", "*.*.example.com", "10.0.0.0/33"):
        with pytest.raises(PolicyError):
            spec(allow=(bad,))
    rules = chain_rules(spec(allow=("2001:DB8::1", "Example.COM.", "10.0.0.1")))
    assert index(rules, "ip6 daddr 2001:db8::1/128 accept") >= 0
    assert index(rules, f"@{domain_sets('example.com')[0]} accept") >= 0


def test_an_update_moves_the_binding_and_removal_cleans_up() -> None:
    old = Binding("sbx-aaaaaaaaaaa", ("172.20.0.2",), ())
    new = Binding("sbx-aaaaaaaaaaa", ("172.20.0.3",), ("fd00:1::3",))
    present = {("4", '"sbx-aaaaaaaaaaa" . 172.20.0.2')}
    text = render_update(SANDBOX, spec(allow=("198.51.100.0/24",)), old, new, present)
    assert 'delete element inet sandbox_console sandboxes_v4 { "sbx-aaaaaaaaaaa" . 172.20.0.2 }' in text
    assert (
        'add element inet sandbox_console sandboxes_v4 { "sbx-aaaaaaaaaaa" . 172.20.0.3 : jump s_abababababab }' in text
    )
    assert (
        'add element inet sandbox_console sandboxes_v6 { "sbx-aaaaaaaaaaa" . fd00:1::3 : jump s_abababababab }' in text
    )
    off = render_update(SANDBOX, NetworkSpec(allow_internet_access=False, allow_public_traffic=False), new, None, set())
    assert "jump s_" not in off
    assert 'log prefix "egress: outbound off"' in off
    removal = render_removal(SANDBOX, new, set())
    assert "delete chain inet sandbox_console s_abababababab\n" in removal
    assert removal.rstrip().endswith("delete chain inet sandbox_console s_abababababab_d")


@pytest.mark.skipif(shutil.which("nft") is None, reason="nft is not installed")
def test_nft_accepts_what_is_rendered() -> None:
    rendered = render_ruleset() + render_update(
        SANDBOX,
        spec(allow=("198.51.100.0/24", "2001:db8::/32", "*.example.com", "10.9.0.0/16"), deny=("bad.example.com",)),
        None,
        Binding("sbx-aaaaaaaaaaa", ("172.20.0.3",), ("fd00:1::3",)),
        set(),
    )
    done = subprocess.run(["nft", "-c", "-f", "-"], input=rendered, capture_output=True, text=True, check=False)
    if done.returncode != 0 and "Operation not permitted" in done.stderr:
        pytest.skip("nft -c needs CAP_NET_ADMIN here")
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("nft") is None, reason="nft is not installed")
@pytest.mark.parametrize(("allowed", "denied"), [(499, 1), (250, 250), (100, 1)])
def test_nft_accepts_a_policy_of_500_entries_with_denied_names(allowed: int, denied: int) -> None:
    """The console accepts 500 entries a list; each denied name's rule once named every allowed
    name's exemption set, and past ~60 allowed names nft refused the rule (too many
    expressions): the sandbox got no chain at all. The exemptions are one rule each now."""
    rendered = render_ruleset() + render_update(
        SANDBOX,
        spec(
            allow=tuple(f"a{i}.example.test" for i in range(allowed)), deny=tuple(f"d{i}.test" for i in range(denied))
        ),
        None,
        Binding("sbx-aaaaaaaaaaa", ("172.20.0.3",), ("fd00:1::3",)),
        set(),
    )
    done = subprocess.run(["nft", "-c", "-f", "-"], input=rendered, capture_output=True, text=True, check=False)
    if done.returncode != 0 and "Operation not permitted" in done.stderr:
        pytest.skip("nft -c needs CAP_NET_ADMIN here")
    assert done.returncode == 0, done.stderr[-500:]


def test_the_resolver_answers_only_allowed_names_under_an_allow_list() -> None:
    listed = render_config(
        "172.20.0.1",
        "127.0.0.1#5353",
        DnsPolicy(answer_all=False, allowed=d("*.example.com", "pypi.test"), denied=d("bad.example.com")),
        "/tmp/log",
        "/tmp/pid",
    )
    lines = listed.splitlines()
    assert "address=/#/" in lines
    assert "server=/*.example.com/127.0.0.1#5353" in lines
    assert "server=/pypi.test/127.0.0.1#5353" in lines
    assert "address=/bad.example.com/" in lines
    set4, set6 = domain_sets("*.example.com")
    assert f"nftset=/example.com/4#inet#sandbox_console#{set4},6#inet#sandbox_console#{set6}" in lines
    assert "listen-address=172.20.0.1" in lines
    everything = render_config("172.20.0.1", "127.0.0.1", DnsPolicy(answer_all=True, denied=d("x.test")), "l", "p")
    assert "server=127.0.0.1" in everything.splitlines()
    assert "address=/x.test/" in everything.splitlines()
    assert "address=/#/" in render_config("172.20.0.1", "", DnsPolicy(answer_all=True), "l", "p").splitlines()


def test_the_resolver_policy_of_a_network_is_the_union_of_its_sandboxes() -> None:
    assert policy_for([(True, d("a.test"), d("x.test")), (True, d("b.test"), d("x.test", "y.test"))]) == DnsPolicy(
        answer_all=False, allowed=d("a.test", "b.test"), denied=d("x.test"), denied_by_some=d("y.test")
    )
    assert policy_for([(True, d("a.test"), ()), (False, (), ())]).answer_all


def test_refused_queries_are_read_from_the_query_log(tmp_path: Path) -> None:
    log = tmp_path / "q.log"
    log.write_text(
        "Dec  1 12:20:59 dnsmasq[2292]: 1 192.168.192.2/40627 query[A] api.name.test from 192.168.192.2\n"
        "Dec  1 12:20:59 dnsmasq[2292]: 1 192.168.192.2/40627 reply api.name.test is 198.51.100.82\n"
        "Dec  1 12:21:00 dnsmasq[2292]: 2 192.168.192.2/40628 config x.other.test is NXDOMAIN\n"
        "Dec  1 12:21:00 dnsmasq[2292]: 3 fd00:1::2/40629 config Y.test is NODATA\n"
        "Dec  1 12:21:01 dnsmasq[2292]: 4 192.168.192.2/40630 config partial"
    )
    found, offset = read_refusals(str(log), 0)
    assert [(r.client, r.name) for r in found] == [("192.168.192.2", "x.other.test"), ("fd00:1::2", "y.test")]
    assert found[0].at.hour == 12
    assert offset == log.read_bytes().rfind(b"\n") + 1  # the unfinished line is read next time
    assert read_refusals(str(log), offset) == ([], offset)
    log.write_text("")  # rotated
    assert read_refusals(str(log), offset) == ([], 0)


def test_a_deny_entry_covering_an_allowed_name_leaves_it_unforwarded() -> None:
    """Deny wins at the resolver too: dnsmasq picks the longest match, so a `server=` line
    for an allowed name inside a denied domain would forward it past the deny entry."""
    config = render_config(
        "172.20.0.1",
        "127.0.0.1#5353",
        policy_for([(True, d("api.example.test", "*.wild.test", "ok.test"), d("example.test", "wild.test"))]),
        "/tmp/log",
        "/tmp/pid",
    ).splitlines()
    assert not any(line.startswith("server=/api.example.test/") for line in config)
    assert not any(line.startswith("server=/*.wild.test/") for line in config)
    assert not any(line.startswith("nftset=/api.example.test/") for line in config)
    assert "server=/ok.test/127.0.0.1#5353" in config
    assert "address=/example.test/" in config


def test_the_chain_refuses_every_class_netpolicy_says_is_never_or_only_opened() -> None:
    """The always-denied ranges come from netpolicy's one table, with its words."""
    import ipaddress

    from netpolicy import ADDRESS_CLASSES, Treatment

    rules = chain_rules(spec())
    for found in ADDRESS_CLASSES:
        if found.sandbox == Treatment.PUBLIC:
            continue
        words = f"always denied: {found.kind.value}"
        family = "ip" if found.network.version == 4 else "ip6"
        covering = [
            ipaddress.ip_network(word.strip("{},"))
            for rule in rules
            if rule.startswith(f"{family} daddr ") and words in rule
            for word in rule.split(" log prefix ")[0].split()[2:]
            if word.strip("{},")
        ]
        assert any(found.network.subnet_of(c) for c in covering), (found.network, words)  # type: ignore[arg-type]


# The per-network exemption copies (network_sets), as rendered: one dnsmasq answers all online
# sandboxes of a space network, and a name is NXDOMAIN there only when every member denies it
# (dns.policy_for), so a co-member's presence must not put a denied name's answer into the
# exemption copy the denying sandbox's deny rule reads.

TAG = secrets.token_hex(3)
ZONE = f"zone-{TAG}.test"
ZONE_EVIL = f"evil.{ZONE}"
BRIDGE = "sbx-0123456789a"


def _sets_filled_for(config: str, name: str) -> set[str] | None:
    """The sets dnsmasq adds `name`'s answers to under `config` (its longest-matching
    `nftset=` line), or None when the name is answered locally (`address=/name/`)."""
    best, sets = -1, set[str]()
    for line in config.splitlines():
        local = re.fullmatch(r"address=/([^/]+)/", line)
        if local and (name == local[1] or name.endswith("." + local[1])):
            return None
        found = re.fullmatch(r"nftset=/([^/]+)/(.*)", line)
        if found and (name == found[1] or name.endswith("." + found[1])) and len(found[1]) > best:
            best, sets = len(found[1]), {t.rsplit("#", 1)[1] for t in found[2].split(",")}
    return sets


@pytest.mark.parametrize(
    "other",
    [
        ((True, (f"*.{ZONE}",), ())),  # the helper's case: the same wildcard, nothing denied
        ((True, ("other.test",), ())),  # broader: any allow list that does not deny the name
    ],
)
def test_a_co_members_presence_puts_the_denied_names_answer_into_the_exemption_copy(
    other: tuple[bool, tuple[str, ...], tuple[str, ...]],
) -> None:
    denying = NetworkSpec.parse(
        allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",), deny_out=(ZONE_EVIL,)
    )
    copy4, copy6 = network_sets(f"*.{ZONE}", BRIDGE)
    # The denying sandbox's deny rule is exempted by that copy ...
    assert f"ip daddr @{copy4} return" in deny_rules(denying, BRIDGE)
    assert "jump s_d" in chain_rules(denying, BRIDGE)
    # ... and alone on its network, its denied name never reaches the copy (NXDOMAIN).
    alone = policy_for([(True, denying.domains("allow_out"), denying.domains("deny_out"))])
    assert _sets_filled_for(render_config("172.30.0.1", "127.0.0.1", alone, "/l", "/p", BRIDGE), ZONE_EVIL) is None
    # With another sandbox online on the same network, the name is forwarded and its answer
    # must still not fill the copy the denying sandbox's exemption reads.
    has_list, allowed, denied = other
    shared = policy_for(
        [
            (True, denying.domains("allow_out"), denying.domains("deny_out")),
            (has_list, tuple(parse_domain(a) for a in allowed), tuple(parse_domain(d) for d in denied)),
        ]
    )
    filled = _sets_filled_for(render_config("172.30.0.1", "127.0.0.1", shared, "/l", "/p", BRIDGE), ZONE_EVIL)
    assert filled is not None
    assert not {copy4, copy6} & filled


def test_a_network_answering_every_name_still_fills_its_allow_lists_sets() -> None:
    # One sandbox of the network without an allow list makes its resolver answer every name;
    # the other's allowed names must still reach their sets, or its packet filter refuses
    # every address of its allowed domains ("not in the allow list").
    listing = NetworkSpec.parse(
        allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",), deny_out=(ZONE_EVIL,)
    )
    policy = policy_for([(True, listing.domains("allow_out"), listing.domains("deny_out")), (False, (), ())])
    config = render_config("172.30.0.1", "127.0.0.1", policy, "/l", "/p", BRIDGE)
    filled = _sets_filled_for(config, f"api.{ZONE}")
    assert filled is not None
    assert set(network_sets(f"*.{ZONE}", BRIDGE)) <= filled
    assert not set(network_sets(f"*.{ZONE}", BRIDGE)) & (_sets_filled_for(config, ZONE_EVIL) or set())


# The denied names' sets and the per-network copies as rendered: which resolver fills them, what
# they spare, their names within nft's limit, and no entry injecting into the resolver's
# configuration or the chain.

ON: dict[str, Any] = {"allow_internet_access": True, "allow_public_traffic": False}


def entries(*texts: str) -> tuple[netpolicy.Entry, ...]:
    return tuple(netpolicy.parse_entry(t) for t in texts)


def dom(*names: str) -> tuple[Domain, ...]:
    return tuple(parse_domain(n) for n in names)


# --- the resolver and the deny sets ----------------------------------------------------------


def test_a_denied_domains_set_is_filled_by_some_resolver() -> None:
    # Was: a deny entry's set was never filled (nftset= lines for allowed patterns only), so a
    # denied name resolved elsewhere (a hard-coded address) passed the packet filter. Now the
    # deny filler, the console's own dnsmasq on loopback, resolves denied names into their
    # sets (the network's resolver still answers the sandbox NXDOMAIN for them).
    rules = chain_rules(NetworkSpec.parse(**ON, deny_out=("evil.test",)))
    set4, set6 = domain_sets("evil.test")
    assert any(f"@{set4}" in rule for rule in rules)  # the chain refuses by the set
    first_accept = next(i for i, rule in enumerate(rules) if rule.endswith("accept"))
    assert max(i for i, rule in enumerate(rules) if f"@{set4}" in rule or f"@{set6}" in rule) < first_accept
    # This network (NXDOMAIN for it), another space's network answering every name, the filler:
    network = render_config("172.30.0.1", "127.0.0.1#5353", DnsPolicy(True, (), dom("evil.test")), "/l", "/p")
    configs = [
        network,
        render_config("172.31.0.1", "127.0.0.1#5353", DnsPolicy(True), "/l", "/p"),
        render_fill_config(35353, "127.0.0.1#5353", dom("evil.test", "*.wild.test"), "/l", "/p"),
    ]
    assert any(set4 in text for text in configs)
    assert set4 not in network
    assert "address=/evil.test/" in network.splitlines()
    fill = configs[2].splitlines()
    assert "listen-address=127.0.0.1" in fill
    assert "server=/evil.test/127.0.0.1#5353" in fill
    assert not any("wild.test" in line for line in fill)  # a wildcard names no name to resolve


def test_a_denied_names_set_spares_only_the_addresses_of_allowed_names_it_does_not_cover() -> None:
    spec = NetworkSpec.parse(**ON, allow_out=("*.web.test", "a.evil.test", "198.51.100.0/24"), deny_out=("evil.test",))
    rules = chain_rules(spec, "sbx-aaaaaaaaaaa")
    deny4, _ = domain_sets("evil.test")
    # The denied names' rules are a sub-chain: exemptions return from it first, one a rule.
    sub = deny_rules(spec, "sbx-aaaaaaaaaaa")
    refusal = next(i for i, rule in enumerate(sub) if rule.startswith(f"ip daddr @{deny4} "))
    exempt = sub[:refusal]
    # An allowed name on its address, as the sandbox's own network's resolver answered it:
    assert f"ip daddr @{network_sets('*.web.test', 'sbx-aaaaaaaaaaa')[0]} return" in exempt
    # never the pattern's shared set, which every space's resolver fills:
    assert not any(f"@{domain_sets('*.web.test')[0]} " in rule for rule in sub)
    assert not any(network_sets("a.evil.test", "sbx-aaaaaaaaaaa")[0] in rule for rule in sub)  # covered
    assert rules.index("jump s_d") < next(i for i, rule in enumerate(rules) if "198.51.100.0/24" in rule)
    # No network known (no binding: the chain is jumped to by nothing): no exception at all.
    (unbound,) = [rule for rule in chain_rules(spec) if rule.startswith(f"ip daddr @{deny4} ")]
    assert "!=" not in unbound


def test_the_per_network_sets_are_one_networks_and_fit_nfts_name_limit() -> None:
    a4, a6 = network_sets("*.web.test", "sbx-aaaaaaaaaaa")
    b4, _ = network_sets("*.web.test", "sbx-bbbbbbbbbbb")
    assert len({a4, a6, b4, *domain_sets("*.web.test")}) == 5
    assert max(len(n) for n in (a4, a6, b4)) <= 31
    names = [a4, a6, b4, *domain_sets("*.web.test"), "managed"]
    assert network_sets_of("sbx-aaaaaaaaaaa", names) == [a4, a6]
    # A network's resolver fills the shared sets (the allow rules) and its own copy:
    text = render_config(
        "172.30.0.1", "127.0.0.1#5353", DnsPolicy(False, dom("*.web.test")), "/l", "/p", "sbx-aaaaaaaaaaa"
    )
    (line,) = [line for line in text.splitlines() if line.startswith("nftset=")]
    assert line.startswith("nftset=/web.test/")
    assert line.split("/")[2].split(",") == [
        f"{family}#inet#sandbox_console#{name}"
        for family, name in zip("4646", (*domain_sets("*.web.test"), a4, a6), strict=True)
    ]
    # and the chain's transaction declares the copy for the binding's bridge.
    update = render_update(
        "ab" * 32,
        NetworkSpec.parse(**ON, allow_out=("*.web.test",), deny_out=("evil.test",)),
        None,
        Binding("sbx-aaaaaaaaaaa", ("172.20.0.3",), ()),
    )
    assert f"add set inet sandbox_console {a4} {{ type ipv4_addr; }}" in update.splitlines()
    assert b4 not in update


@pytest.mark.parametrize(
    ("deny", "allow", "covered"),
    [
        ("evil.test", "evil.test", True),
        ("evil.test", "a.evil.test", True),
        ("evil.test", "*.evil.test", True),
        ("*.evil.test", "a.evil.test", True),
        ("*.evil.test", "*.evil.test", True),
        ("*.evil.test", "evil.test", False),
        ("a.evil.test", "*.evil.test", False),
        ("evil.test", "notevil.test", False),
    ],
)
def test_which_allow_entries_a_deny_entry_covers(deny: str, allow: str, covered: bool) -> None:
    assert parse_domain(deny).covers(parse_domain(allow)) is covered


@pytest.mark.parametrize("bad", ["a.test\nserver=/#/8.8.8.8", "a.test#x", 'a"b.test', "a;b.test", "a/b.test"])
def test_no_entry_can_inject_into_the_resolver_or_the_chain(bad: str) -> None:
    from netpolicy import PolicyError

    with pytest.raises(PolicyError):
        NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=[bad])
