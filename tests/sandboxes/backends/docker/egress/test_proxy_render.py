"""The squid configuration and redirect table rendered for HTTP rules, and the access log read
back (no engine: squid itself parses what is rendered; sandboxes/backends/docker/proxy.py)."""

from __future__ import annotations

import ipaddress
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import netpolicy
from netpolicy import ADDRESS_CLASSES, Treatment, parse_entry, parse_l7_rule
from sandboxes.backends.base import NetworkSpec
from sandboxes.backends.docker.egress.proxy import (
    DEFAULT_STATE_DIR,
    SpaceProxyPolicy,
    parse_access_line,
    proxy_refusals,
    redirect_table_name,
    render_redirect_table,
    render_squid_conf,
    squid_available,
)
from sandboxes.backends.docker.egress.rules import (
    chain_rules,
)
from sandboxes.backends.docker.egress.squid import SquidProxy

POLICY = SpaceProxyPolicy(
    name="sandbox-console-a",
    sources=("172.30.0.0/16",),
    gateways=("172.30.0.1",),
    rules=(
        parse_l7_rule(
            {"domain": "api.example.test", "methods": ("GET", "HEAD"), "path_prefix": "/v1/", "action": "allow"}
        ),
        parse_l7_rule({"domain": "*.files.test", "methods": (), "path_prefix": "/", "action": "deny"}),
        parse_l7_rule({"domain": "api.example.test", "methods": ("POST",), "path_prefix": "/", "action": "deny"}),
    ),
    allow_out=(parse_entry("10.1.0.0/16"), parse_entry("*.pkg.test")),
    deny_out=(parse_entry("203.0.113.0/24"), parse_entry("bad.test")),
)


def _conf(*policies: SpaceProxyPolicy, state: str = "/var/lib/x") -> list[str]:
    return render_squid_conf(policies, state_dir=state, dns_nameservers=["127.0.0.77"]).splitlines()


def test_rules_keep_their_order_and_only_refusals_carry_a_note() -> None:
    access = [line for line in _conf(POLICY) if line.startswith("http_access")]
    rule_lines = [line for line in access if "_r" in line]
    assert rule_lines == [
        "http_access allow !CONNECT s1_src s1_r1_host s1_r1_method s1_r1_path",
        "http_access deny !CONNECT s1_src s1_r2_host s1_r2_note",
        "http_access deny !CONNECT s1_src s1_r3_host s1_r3_method s1_r3_note",
    ]
    # Always-denied first (one line per netpolicy class kind), private ranges next (the allow
    # CIDR exempts them), rules, then the named-but-unmatched refusal, then the lists with deny
    # entries before allow entries.
    assert access[:4] == [
        "http_access deny never1 n_never1",
        "http_access deny never2 n_never2",
        "http_access deny sandbox_dst n_sandbox_dst",
        "http_access deny s1_src private_dst !s1_allow_private n_private",
    ]
    order = [access.index(line) for line in access if "s1_named" in line or "deny_" in line or "allow_" in line]
    assert order == sorted(order)
    assert access[-1] == "http_access deny all"


def test_tls_rules_use_the_sni_and_skip_what_needs_decryption() -> None:
    bump = [line for line in _conf(POLICY) if line.startswith("ssl_bump")]
    assert bump[0] == "ssl_bump peek step1"
    assert bump[1:3] == [  # deny entries first, each with its own words: they win over every rule
        "ssl_bump terminate s1_src s1_d1_net s1_d1_note",
        "ssl_bump terminate s1_src s1_d2_sni s1_d2_note",
    ]
    assert bump[3:7] == [
        # the allow list bounds the rules: a host outside it is refused before any rule
        "ssl_bump terminate s1_src !s1_allow_net !s1_allow_sni s1_notallowed",
        "ssl_bump splice s1_src s1_r1_sni",  # allow with methods/path: allowed by name
        "ssl_bump terminate s1_src s1_r2_sni s1_r2_note",  # unrestricted deny
        # rule 3 (deny POST) cannot be checked by SNI: no line
        "ssl_bump terminate s1_src s1_named_sni s1_nomatch_tls",
    ]
    assert bump[-1] == "ssl_bump terminate all"


def test_domains_become_anchored_regexes() -> None:
    """netpolicy's meaning: a plain domain covers its subdomains, `*.x` the subdomains only."""
    conf = _conf(POLICY)
    assert "acl s1_r1_host dstdom_regex -i ^(.+\\.)?api\\.example\\.test$" in conf
    assert "acl s1_d2_dom dstdom_regex -i ^(.+\\.)?bad\\.test$" in conf
    assert "acl s1_r2_host dstdom_regex -i ^.+\\.files\\.test$" in conf  # subdomains, not the apex
    assert "acl s1_r1_path urlpath_regex ^/v1/" in conf
    assert "acl s1_r1_method method GET HEAD" in conf


def test_squid_listens_only_on_the_gateways_and_loopback() -> None:
    ports = [line for line in _conf(POLICY) if line.startswith(("http_port", "https_port"))]
    assert [line.split()[1] for line in ports] == ["127.0.0.1:3131", "172.30.0.1:3129", "172.30.0.1:3130"]


def test_each_deny_entry_refuses_in_its_own_words() -> None:
    conf = _conf(POLICY)
    assert "acl s1_d1_note annotate_transaction egress_rule=deny%20entry%20203.0.113.0%2F24" in conf
    assert "acl s1_d2_note annotate_transaction egress_rule=deny%20entry%20bad.test" in conf
    assert "acl s1_notallowed annotate_transaction egress_rule=not%20in%20the%20allow%20list" in conf


def test_private_exceptions_open_their_part_of_a_private_range() -> None:
    policy = SpaceProxyPolicy(
        name="sandbox-console-p",
        sources=("172.30.0.0/16",),
        gateways=("172.30.0.1",),
        rules=POLICY.rules,
        allow_private=(parse_entry("192.168.7.0/24"),),  # type: ignore[arg-type]
    )
    conf = _conf(policy)
    assert "acl s1_allow_private dst 192.168.7.0/24" in conf
    assert "http_access deny s1_src private_dst !s1_allow_private n_private" in conf
    assert SpaceProxyPolicy.from_json(policy.as_json()) == policy


def test_the_redirect_table_covers_only_sources_with_rules() -> None:
    table = render_redirect_table([POLICY])
    assert "elements = { 172.30.0.0/16 }" in table
    assert 'iifname "sbx-*" ip saddr @l7_sources4 tcp dport 80 redirect to :3129' in table
    assert 'iifname "sbx-*" ip saddr @l7_sources4 tcp dport 443 redirect to :3130' in table
    assert "udp dport 443 counter drop" in table
    done = subprocess.run(["nft", "-c", "-f", "-"], input=table, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_squid_accepts_the_rendered_configuration(tmp_path: Path) -> None:
    if not squid_available():
        if os.environ.get("CI"):
            pytest.fail("squid-openssl is not installed (.ci/docker-up installs it)")
        pytest.skip("needs squid-openssl")
    for name in ("bump.pem", "bump.key"):
        (tmp_path / name).touch()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=t",
         "-keyout", str(tmp_path / "bump.key"), "-out", str(tmp_path / "bump.pem")],
        capture_output=True, check=True,
    )  # fmt: skip
    other = SpaceProxyPolicy(
        "sandbox-console-b",
        ("172.31.0.0/16",),
        ("172.31.0.1",),
        (parse_l7_rule({"domain": "x.test", "action": "allow"}),),
    )
    # Two sandboxes of one network: one gateway, each its own sources.
    shared = [
        SpaceProxyPolicy(key * 64, (f"172.29.0.{n}/32",), ("172.29.0.1",), other.rules, network="sandbox-console-c")
        for n, key in ((2, "c"), (3, "d"))
    ]
    conf = tmp_path / "squid.conf"
    conf.write_text("\n".join(_conf(POLICY, other, *shared, state=str(tmp_path))))
    done = subprocess.run(["squid", "-k", "parse", "-f", str(conf)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # `via off` (transparency) is the one warning squid gives.
    assert "WARNING" not in done.stderr.replace("WARNING: HTTP requires the use of Via", ""), done.stderr[-2000:]


DENIED_HTTP = (
    "1796127373.427 172.27.0.2 80 TCP_DENIED/403 GET http://web.test/admin/x? - "
    "HTTP%20rule%202%20%28deny%20GET%20web.test%2Fadmin%29\n"
)
TERMINATED_TLS = (
    "1796127373.516 172.27.0.2 443 NONE_NONE/000 CONNECT 198.51.100.2:443 tls-bad.test "
    "HTTP%20rule%204%20%28deny%20any%20method%20tls-bad.test%29\n"
)
ALLOWED = "1796127373.426 172.27.0.2 80 TCP_MISS/200 GET http://web.test/public/a - -\n"
SPLICED = "1796127373.487 172.27.0.2 443 TCP_TUNNEL/500 CONNECT tls-ok.test:443 tls-ok.test -\n"


def test_access_lines_become_refusals_with_their_rule() -> None:
    http = parse_access_line(DENIED_HTTP, sandbox_of=lambda address: {"172.27.0.2": "sbx-1"}.get(address, address))
    assert http is not None
    assert (http.sandbox_id, http.layer, http.destination, http.rule) == (
        "sbx-1",
        "http",
        "http://web.test/admin/x",
        "HTTP rule 2 (deny GET web.test/admin)",
    )
    assert http.at.year == 2026
    tls = parse_access_line(TERMINATED_TLS)
    assert tls is not None
    assert (tls.sandbox_id, tls.layer, tls.destination) == ("172.27.0.2", "tls", "tls-bad.test")
    assert parse_access_line(ALLOWED) is None
    assert parse_access_line(SPLICED) is None
    assert parse_access_line("garbage\n") is None


def test_the_cursor_reads_each_refusal_once_and_survives_truncation(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    assert proxy_refusals("", log_path=str(log)) == ([], "")  # no log yet
    log.write_text(ALLOWED + DENIED_HTTP + TERMINATED_TLS[:40])  # the last line half written
    found, cursor = proxy_refusals("", log_path=str(log))
    assert [r.layer for r in found] == ["http"]
    with log.open("a") as handle:
        handle.write(TERMINATED_TLS[40:])
    found, cursor = proxy_refusals(cursor, log_path=str(log))
    assert [r.layer for r in found] == ["tls"]
    assert proxy_refusals(cursor, log_path=str(log))[0] == []
    log.write_text(DENIED_HTTP)  # truncated (same inode, shorter): read again from the start
    found, _ = proxy_refusals(cursor, log_path=str(log))
    assert [r.destination for r in found] == ["http://web.test/admin/x"]


def test_a_policy_that_cannot_be_applied_is_not_kept(tmp_path: Path) -> None:
    proxy = SquidProxy(state_dir=str(tmp_path), apply_nftables=False)
    bad = SpaceProxyPolicy(
        "sandbox-console-x",
        ("172.300.0.0/16",),
        ("172.30.0.1",),
        (parse_l7_rule({"domain": "x.test", "action": "allow"}),),
    )
    result = proxy.set_space(bad)
    assert not result.applied
    assert "not an address of the space network" in result.detail
    assert proxy.policies() == []
    assert not proxy.running()


def test_each_state_folder_has_its_own_redirect_table() -> None:
    assert redirect_table_name(DEFAULT_STATE_DIR) == "sandbox_console_proxy"
    first, second = redirect_table_name("/tmp/egress-a"), redirect_table_name("/tmp/egress-b")
    assert len({first, second, "sandbox_console_proxy"}) == 3
    assert redirect_table_name("/tmp/egress-a/") == first  # the same folder, however spelled
    assert f"table inet {first} {{" in render_redirect_table([POLICY], table=first)


def test_a_squid_without_rules_leaves_another_folders_redirects_alone(tmp_path: Path) -> None:
    """Two consoles (or test runs) on one host: the one whose last rule goes deletes its own
    redirect table, never the other's (which would send the other's port 80 past squid)."""
    if not squid_available():
        if os.environ.get("CI"):
            pytest.fail("squid-openssl is not installed (.ci/docker-up installs it)")
        pytest.skip("needs squid-openssl")
    # TEST-NET-1 sources: no sandbox bridge on this host carries them, so nothing is redirected.
    other = SpaceProxyPolicy(
        "sandbox-console-t",
        ("192.0.2.0/30",),
        ("192.0.2.1",),
        (parse_l7_rule({"domain": "x.test", "action": "allow"}),),
    )
    theirs, mine = redirect_table_name(str(tmp_path / "theirs")), redirect_table_name(str(tmp_path / "mine"))
    for table in (theirs, mine):  # mine: left over from before its last rule went
        rendered = render_redirect_table([other], table=table)
        loaded = subprocess.run(["nft", "-f", "-"], input=rendered, capture_output=True, text=True)
        assert loaded.returncode == 0, loaded.stderr
    try:
        assert SquidProxy(state_dir=str(tmp_path / "mine")).apply().applied
        listed = subprocess.run(["nft", "list", "table", "inet", theirs], capture_output=True, text=True)
        assert listed.returncode == 0, f"the other folder's redirect table was deleted: {listed.stderr}"
        assert "192.0.2.0/30" in listed.stdout
        gone = subprocess.run(["nft", "list", "table", "inet", mine], capture_output=True, text=True)
        assert gone.returncode != 0, "a squid without rules kept its own redirect table"
    finally:
        for table in (theirs, mine):
            subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, check=False)


def _first_access(conf: list[str], client: str, method: str, host: str, address: str, path: str = "/") -> str:
    """The first `http_access` line of `conf` that matches a plain HTTP request, read the way
    squid reads it (every ACL of a line must match; `!` negates; `annotate_transaction` always
    matches). Only the ACL types the renderer writes are known; any other fails the test."""
    import ipaddress
    import re

    acls: dict[str, tuple[str, list[str]]] = {}
    for line in conf:
        if line.startswith("acl "):
            _, name, kind, *values = line.split()
            acls[name] = (kind, values)

    def matches(token: str) -> bool:
        if token.startswith("!"):
            return not matches(token[1:])
        if token == "all":
            return True
        kind, values = acls[token]
        if kind == "annotate_transaction":
            return True
        if kind in ("src", "dst"):
            probe = ipaddress.ip_address(client if kind == "src" else address)
            return any(probe in ipaddress.ip_network(v, strict=False) for v in values)
        if kind == "dstdom_regex":
            return any(re.search(v, host, re.IGNORECASE) for v in values if v != "-i")
        if kind == "method":
            return method in values
        if kind == "urlpath_regex":
            return any(re.search(v, path) for v in values)
        raise AssertionError(f"the test does not know the ACL type {kind} ({token})")

    for line in conf:
        if line.startswith("http_access ") and all(matches(token) for token in line.split()[2:]):
            return line
    raise AssertionError("no http_access line matched (squid's last line is `deny all`)")


def test_two_sandboxes_of_one_network_are_decided_by_their_own_lists() -> None:
    """One space network, two sandboxes with the same HTTP rules and different lists (a
    session grant adds other.test to the second): each is decided by its own addresses'
    policy, so other.test is refused to the first and let through for the second, as
    netpolicy.decide says for each spec; squid listens on the shared gateway once."""
    from netpolicy import decide, parse_destination
    from sandboxes.backends.base import NetworkSpec

    rules = (parse_l7_rule({"domain": "web.test", "methods": ("GET",), "action": "allow"}),)
    plain = NetworkSpec.parse(
        allow_internet_access=True, allow_public_traffic=False, allow_out=("web.test",), l7_rules=rules
    )
    granted = NetworkSpec.parse(
        allow_internet_access=True, allow_public_traffic=False, allow_out=("web.test", "other.test"), l7_rules=rules
    )
    common = {"gateways": ("172.30.0.1",), "rules": rules, "network": "sandbox-console-shared"}
    first = SpaceProxyPolicy("a" * 64, ("172.30.0.2/32", "fd00:30::2/128"), allow_out=plain.allow_out, **common)  # type: ignore[arg-type]
    second = SpaceProxyPolicy("b" * 64, ("172.30.0.3/32", "fd00:30::3/128"), allow_out=granted.allow_out, **common)  # type: ignore[arg-type]
    conf = _conf(first, second)
    ports = [line.split()[1] for line in conf if line.startswith(("http_port", "https_port"))]
    assert ports == ["127.0.0.1:3131", "172.30.0.1:3129", "172.30.0.1:3130"]
    assert "acl s1_src src 172.30.0.2/32 fd00:30::2/128" in conf
    assert "acl s2_src src 172.30.0.3/32 fd00:30::3/128" in conf

    # other.test resolves to a documentation address (public: no always-denied class).
    other = parse_destination("http://other.test/").resolved("198.51.100.9")
    assert not decide(plain, other).allowed
    assert decide(granted, other).allowed
    refused = _first_access(conf, "172.30.0.2", "GET", "other.test", "198.51.100.9")
    allowed = _first_access(conf, "172.30.0.3", "GET", "other.test", "198.51.100.9")
    assert refused == "http_access deny !CONNECT s1_src !s1_allow_dom s1_notallowed", refused
    assert allowed == "http_access allow !CONNECT s2_src s2_allow_dom", allowed
    assert _first_access(conf, "fd00:30::2", "GET", "other.test", "2001:db8::9").startswith("http_access deny ")
    # The rule they share holds for both; an address no sandbox has is refused.
    for client in ("172.30.0.2", "172.30.0.3"):
        assert _first_access(conf, client, "GET", "web.test", "198.51.100.7").startswith("http_access allow ")
        assert _first_access(conf, client, "POST", "web.test", "198.51.100.7").startswith("http_access deny ")
    assert _first_access(conf, "172.30.0.4", "GET", "web.test", "198.51.100.7") == "http_access deny all"
    # Every line of a sandbox's part names its own sources: no line of one decides for the other.
    for line in conf:
        if line.startswith(("http_access", "ssl_bump")):
            spaces = {
                token.lstrip("!").split("_")[0] for token in line.split()[2:] if token.lstrip("!")[:2] in ("s1", "s2")
            }
            assert all(f"{s}_src" in line.split() for s in spaces), line
    # Only the two sandboxes' own addresses are redirected to squid.
    table = render_redirect_table([first, second])
    assert "elements = { 172.30.0.2/32, 172.30.0.3/32 }" in table
    assert "elements = { fd00:30::2/128, fd00:30::3/128 }" in table


# squid against the packet filter: squid's and nftables' configurations are what squid and the
# kernel enforce, so an inconsistency between them is a bypass on the ports that go through squid
# (80/443 of a space with HTTP rules, redirected before the forward filter). And nothing an HTTP
# rule's path prefix holds changes squid's configuration.

ON: dict[str, Any] = {"allow_internet_access": True, "allow_public_traffic": False}


def entries(*texts: str) -> tuple[netpolicy.Entry, ...]:
    return tuple(netpolicy.parse_entry(t) for t in texts)


def _squid(policy: SpaceProxyPolicy) -> list[str]:
    return render_squid_conf([policy], state_dir="/var/lib/x", dns_nameservers=["127.0.0.77"]).splitlines()


def _is_network(word: str) -> bool:
    try:
        ipaddress.ip_network(word)
    except ValueError:
        return False
    return "/" in word


def _access(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("http_access")]


# --- squid vs the packet filter: the always-denied set ---------------------------------------


@pytest.mark.parametrize("always", [str(c.network) for c in ADDRESS_CLASSES if c.sandbox != Treatment.PUBLIC])
def test_squid_refuses_every_range_the_packet_filter_always_refuses(always: str) -> None:
    # Was: squid knew 5 private ranges; 198.18/15, 224/4, 240/4, 192.0.0/24, NAT64
    # 64:ff9b::/96 (a private IPv4 address behind a NAT64 gateway), fec0::/10, ff00::/8 passed
    # through squid on ports 80/443 while the nft chain refuses them on every other port.
    if always == "::ffff:0:0/96":
        pytest.skip("squid holds IPv4 destinations in mapped form: its IPv4 ACLs judge them")
    network = ipaddress.ip_network(always)
    conf = " ".join(
        line for line in _squid(SpaceProxyPolicy("n", ("172.30.0.0/16",), ("172.30.0.1",))) if " dst " in line
    )
    covering = [ipaddress.ip_network(word) for word in conf.split() if _is_network(word)]
    assert any(network.version == c.version and network.subnet_of(c) for c in covering), always  # type: ignore[arg-type]


def test_an_allow_entry_wider_than_a_private_range_does_not_open_it_through_squid() -> None:
    # allow_out 0.0.0.0/0 plus an HTTP rule: the nft chain keeps 10/8 closed (docs/network.md:
    # "nor does an entry wider than the range"), squid opened it ("!allow_net" matched 0/0), so
    # http://10.x/ from the sandbox went through squid.
    policy = SpaceProxyPolicy(
        name="n",
        sources=("172.30.0.0/16",),
        gateways=("172.30.0.1",),
        rules=(parse_l7_rule({"domain": "web.test", "methods": ("GET",), "path_prefix": "/", "action": "allow"}),),
        allow_out=entries("0.0.0.0/0", "10.1.0.0/16"),
    )
    lines = _squid(policy)
    private = next(line for line in _access(lines) if "private_dst" in line)
    exempt = private.split("!")[1].split()[0] if "!" in private else None
    assert exempt is not None
    acl = next(line for line in lines if line.startswith(f"acl {exempt} dst "))
    assert acl.split(" dst ")[1].split() == ["10.1.0.0/16"]
    # And the nft chain agrees: 0.0.0.0/0 is accepted after the private ranges only.
    rules = chain_rules(NetworkSpec.parse(**ON, allow_out=("0.0.0.0/0", "10.1.0.0/16")))
    private_rule = next(i for i, r in enumerate(rules) if "always denied: private range" in r)
    assert next(i for i, r in enumerate(rules) if "0.0.0.0/0 accept" in r) > private_rule


def test_a_deny_cidr_wins_over_an_http_allow_rule() -> None:
    policy = SpaceProxyPolicy(
        name="n",
        sources=("172.30.0.0/16",),
        gateways=("172.30.0.1",),
        rules=(parse_l7_rule({"domain": "web.test", "methods": (), "path_prefix": "/", "action": "allow"}),),
        deny_out=entries("198.51.100.0/24"),
    )
    access = _access(_squid(policy))
    deny = next(i for i, line in enumerate(access) if "s1_d1_net" in line)
    allow_rule = next(i for i, line in enumerate(access) if "s1_r1_host" in line)
    assert deny < allow_rule


def test_an_http_allow_rule_does_not_widen_the_allow_list() -> None:
    policy = SpaceProxyPolicy(
        name="n",
        sources=("172.30.0.0/16",),
        gateways=("172.30.0.1",),
        rules=(parse_l7_rule({"domain": "other.test", "methods": (), "path_prefix": "/", "action": "allow"}),),
        allow_out=entries("pkg.test"),
    )
    spec = NetworkSpec.parse(**ON, allow_out=("pkg.test",), l7_rules=policy.rules)
    assert netpolicy.decide(spec, netpolicy.parse_destination("http://other.test/")).allowed is False
    access = _access(_squid(policy))
    rule = next(i for i, line in enumerate(access) if "s1_r1_host" in line)
    not_allowed = next(i for i, line in enumerate(access) if "s1_notallowed" in line)
    assert not_allowed < rule  # squid: the rule line comes first and allows it


# --- HTTP rule paths: nothing a path prefix holds changes squid's configuration -------------


def test_a_path_prefix_with_a_control_character_is_refused() -> None:
    # Was accepted: NUL is no whitespace; squid.conf (and PostgreSQL's jsonb) would cut it.

    for bad in ("/a\x00b", "/a\x07", "/a\x7f"):
        with pytest.raises(ValueError, match="control characters"):
            parse_l7_rule({"action": "allow", "domain": "web.test", "path_prefix": bad})


@pytest.mark.parametrize("path", ["/a#b", '/a"b', "/a;b", "/a\\b", "/${process_number}/", "/a'b", "/%0a"])
def test_odd_path_prefixes_stay_one_literal_regex_for_squid(path: str, tmp_path: Any) -> None:
    import shutil
    import subprocess

    from sandboxes.backends.docker.egress.proxy import squid_available

    rule = parse_l7_rule({"action": "deny", "domain": "web.test", "path_prefix": path})
    policy = SpaceProxyPolicy(name="n", sources=("172.30.0.0/16",), gateways=("172.30.0.1",), rules=(rule,))
    text = render_squid_conf([policy], state_dir=str(tmp_path), dns_nameservers=["127.0.0.77"])
    (acl,) = [line for line in text.splitlines() if "urlpath_regex" in line]
    assert len(acl.split()) == 4  # acl NAME urlpath_regex REGEX: one value
    if not squid_available() or shutil.which("openssl") is None:
        pytest.skip("needs squid-openssl")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=t",
         "-keyout", str(tmp_path / "bump.key"), "-out", str(tmp_path / "bump.pem")],
        capture_output=True, check=True,
    )  # fmt: skip
    conf = tmp_path / "squid.conf"
    conf.write_text(text)
    done = subprocess.run(["squid", "-k", "parse", "-f", str(conf)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-1500:]
    # squid read the regex as written (its parse trace echoes each line it processed).
    assert acl in done.stderr, done.stderr[-1500:]
