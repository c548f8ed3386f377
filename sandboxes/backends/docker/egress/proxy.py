"""HTTP rules and TLS by SNI for Docker sandboxes: a kept squid (Debian `squid-openssl`).

A space whose policy has L7 rules gets its sandboxes' TCP 80 and 443 redirected (nftables
table `inet sandbox_console_proxy`, prerouting nat; a squid with another state folder has a
table of its own, `redirect_table_name`) to squid on the space network's gateway:
port 3129 (`http_port … intercept`: host, method and path of plain HTTP) and 3130
(`https_port … intercept ssl-bump`: `peek` at the ClientHello, then `splice` or `terminate`
by SNI; nothing is decrypted). It is transparent: a program that ignores proxy variables is
redirected the same. UDP 443 (QUIC) from those sandboxes is dropped so clients fall back to
TCP, where the SNI is seen.

squid decides per sandbox, never per network: the Docker component gives it one
`SpaceProxyPolicy` per sandbox with HTTP rules, whose sources are that sandbox's own
addresses on the space network (a /32 and a /128), holding that sandbox's applied lists and
rules (a session's grants included). Only those addresses are redirected, so a sandbox of the
same space without rules (or with other grants) meets its own packet-filter chain or its own
squid ACLs, never another sandbox's; an address no policy names that reaches squid anyway is
refused (`http_access deny all`).

Semantics (per sandbox, `SpaceProxyPolicy`), in the order squid checks them:
1. the always-denied set: loopback, link-local/metadata, the host's own addresses, every
   sandbox network, and private ranges unless one of the space's allow CIDRs covers them —
   squid's upstream connections leave from the host (output hook), so the forward filter of
   `inet sandbox_console` never sees them and squid refuses these itself (`dst` ACLs);
2. HTTP: the rules in order, first match (host, method, path prefix) decides; a request to
   a host named by some rule that matches none is refused. TLS: only the host (SNI) can be
   checked: the first rule naming the host that is an `allow` (whatever its methods/path)
   or an unrestricted `deny` decides; a `deny` with methods or a path cannot be checked
   without decryption and is skipped; a host named by rules none of which allows it is refused;
3. hosts named by no rule follow the sandbox's allow/deny lists (deny entries win; with an
   allow list only its entries pass; without one everything else passes).

Every refusal line carries the rule in words (an `annotate_transaction` note) so
`proxy_refusals` reads the log back without knowing the policy of the time.

The meaning is `netpolicy`'s (`decide`, `http_decision`): a plain domain entry covers its
subdomains, `*.x` the subdomains only; private exceptions open their part of a private range;
each deny entry refuses with its own words ("deny entry x"), as the packet filter logs it.
The address classes come from `netpolicy.ADDRESS_CLASSES`; no range list is held here.

Running squid (state folder, start, live reconfigure) is in `squid`. Imports nothing of the
project but the contract and `netpolicy`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from netpolicy import ADDRESS_CLASSES, Cidr, Domain, Entry, Kind, L7Rule, Rule, Treatment, opened_range, parse_entry
from netpolicy.entries import parse_l7_rule

from ...capabilities import EgressRefusal

PROXY_HTTP_PORT = 3129
PROXY_TLS_PORT = 3130
# squid insists on one forward-proxy port; on loopback, and refusing everything (no source
# ACL matches 127.0.0.1), it serves nothing.
LOOPBACK_PORT = 3131
TABLE_FAMILY = "inet"
TABLE_NAME = "sandbox_console_proxy"
BRIDGE_PREFIX = "sbx-"  # the same prefix as firewall.BRIDGE_PREFIX (not imported: no coupling)
DEFAULT_STATE_DIR = "/var/lib/sandbox-console/proxy"

NOTE_KEY = "egress_rule"
RUN_TIMEOUT_S = 20

# The classes squid refuses itself (its upstream connections leave from the host's output
# hook, past the forward filter): netpolicy's NEVER and OPENABLE classes, but for the
# IPv4-mapped range, which squid never connects to (it holds IPv4 addresses in that form
# itself, so the ACL would match every IPv4 destination).
_MAPPED = ipaddress.ip_network("::ffff:0:0/96")


def _class_networks(treatment: Treatment, kind: Kind | None = None) -> list[str]:
    return _collapse(
        str(c.network)
        for c in ADDRESS_CLASSES
        if c.sandbox == treatment and c.network != _MAPPED and (kind is None or c.kind == kind)
    )


def _never_kinds() -> list[Kind]:
    return list(dict.fromkeys(c.kind for c in ADDRESS_CLASSES if c.sandbox == Treatment.NEVER and c.network != _MAPPED))


@dataclass(frozen=True)
class SpaceProxyPolicy:
    """What squid enforces for the sources of one sandbox on a space network (typed entries,
    `netpolicy`): that sandbox's applied lists and HTTP rules."""

    name: str  # unique key: the sandbox's id (the component), or any name (a render test)
    sources: tuple[str, ...]  # the sandbox's addresses on the network (/32, /128)
    gateways: tuple[str, ...]  # the network's gateway addresses: where squid listens
    rules: tuple[L7Rule, ...] = ()
    allow_out: tuple[Entry, ...] = ()
    deny_out: tuple[Entry, ...] = ()
    allow_private: tuple[Cidr, ...] = ()
    network: str = ""  # the space network's name ("": `name` is the network's)

    @property
    def network_name(self) -> str:
        return self.network or self.name

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "sources": list(self.sources),
            "gateways": list(self.gateways),
            "rules": [rule.as_json() for rule in self.rules],
            "allow_out": [str(e) for e in self.allow_out],
            "deny_out": [str(e) for e in self.deny_out],
            "allow_private": [str(e) for e in self.allow_private],
            "network": self.network,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpaceProxyPolicy:
        """Read back through netpolicy's one parser (the file was written by `as_json`)."""
        private = tuple(parse_entry(e) for e in data.get("allow_private") or ())
        return cls(
            name=str(data["name"]),
            sources=tuple(data.get("sources") or ()),
            gateways=tuple(data.get("gateways") or ()),
            rules=tuple(parse_l7_rule(r) for r in data.get("rules") or ()),
            allow_out=tuple(parse_entry(e) for e in data.get("allow_out") or ()),
            deny_out=tuple(parse_entry(e) for e in data.get("deny_out") or ()),
            allow_private=tuple(e for e in private if isinstance(e, Cidr)),
            network=str(data.get("network") or ""),
        )


def squid_binary() -> str | None:
    return shutil.which("squid") or next((p for p in ("/usr/sbin/squid",) if os.path.exists(p)), None)


def squid_available() -> bool:
    """squid with TLS peeking (Debian's squid-openssl) is installed here."""
    binary = squid_binary()
    if binary is None:
        return False
    try:
        done = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--with-openssl" in done.stdout or "enable-ssl-crtd" in done.stdout


# ---------------------------------------------------------------------------------------
# Rule text


def _regex_escape(text: str) -> str:
    """POSIX extended regex literal (squid's regex ACLs)."""
    return "".join("\\" + ch if ch in ".[]()*+?{}|^$\\" else ch for ch in text)


def _domain_regex(domain: Domain) -> str:
    """`Domain.matches_name` as a regex: `x` the name and its subdomains, `*.x` the subdomains."""
    name = _regex_escape(domain.name)
    return f"^.+\\.{name}$" if domain.wildcard else f"^(.+\\.)?{name}$"


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _collapse(entries: Iterable[str]) -> list[str]:
    """Networks without overlaps (squid warns about an entry inside another one)."""
    networks = [ipaddress.ip_network(entry, strict=False) for entry in entries]
    collapsed: list[str] = []
    for version in (4, 6):
        same = [n for n in networks if n.version == version]
        collapsed += [str(n) for n in ipaddress.collapse_addresses(same)]  # type: ignore[type-var]
    return collapsed


def _note(acl: str, words: str) -> str:
    return f"acl {acl} annotate_transaction {NOTE_KEY}={quote(words, safe='')}"


# ---------------------------------------------------------------------------------------
# squid.conf


def render_squid_conf(
    policies: Sequence[SpaceProxyPolicy],
    *,
    state_dir: str,
    dns_nameservers: Sequence[str],
    host_addresses: Sequence[str] = (),
    http_port: int = PROXY_HTTP_PORT,
    tls_port: int = PROXY_TLS_PORT,
) -> str:
    """The whole squid configuration (deterministic)."""
    state = Path(state_dir)
    sandbox_nets = sorted({src for policy in policies for src in policy.sources})
    lines = [
        "# Rendered by sandboxes/backends/docker/egress/proxy.py; edits are lost.",
        f"http_port 127.0.0.1:{LOOPBACK_PORT}",
        f"pid_filename {state / 'squid.pid'}",
        f"cache_log {state / 'cache.log'}",
        f"coredump_dir {state}",
        "logfile_rotate 0",
        f"logformat egress %ts.%03tu %>a %>lp %Ss/%03>Hs %rm %ru %ssl::>sni %{{{NOTE_KEY}}}note",
        f"access_log stdio:{state / 'access.log'} egress",
        "cache deny all",
        "cache_mem 8 MB",
        "memory_pools on",
        "read_ahead_gap 1 MB",
        "pinger_enable off",
        "shutdown_lifetime 1 seconds",
        "via off",
        "forwarded_for transparent",
        "httpd_suppress_version_string on",
        # A Host header that does not resolve to the address the client connected to is
        # refused (409): a client cannot name an allowed host and reach another address.
        "host_verify_strict on",
        "client_dst_passthru on",
        f"dns_nameservers {' '.join(dns_nameservers) if dns_nameservers else '127.0.0.1'}",
        # squid's lookups leave from a socket on loopback when its resolvers are there.
        *(["udp_incoming_address 127.0.0.1"] if all(_is_loopback(a) for a in dns_nameservers or ["127.0.0.1"]) else []),
        "icp_port 0",
        "htcp_port 0",
        "snmp_port 0",
        "positive_dns_ttl 30 seconds",
        "negative_dns_ttl 5 seconds",
        "acl step1 at_step SslBump1",
        "acl CONNECT method CONNECT",
        f"acl private_dst dst {' '.join(_class_networks(Treatment.OPENABLE))}",
        _note("n_private", f"{Rule.ALWAYS_DENIED.value}: {Kind.PRIVATE.value}"),
    ]
    never: list[str] = []
    for position, kind in enumerate(_never_kinds(), start=1):
        lines.append(f"acl never{position} dst {' '.join(_class_networks(Treatment.NEVER, kind))}")
        lines.append(_note(f"n_never{position}", f"{Rule.ALWAYS_DENIED.value}: {kind.value}"))
        never.append(f"http_access deny never{position} n_never{position}")
    # The host's own addresses, then the sandbox networks (their gateways are the host's).
    own_host = _collapse([a for a in host_addresses if "/" not in a])
    sandboxes = _collapse([*(a for a in host_addresses if "/" in a), *sandbox_nets])
    for acl, found, kind in (("host_dst", own_host, Kind.HOST), ("sandbox_dst", sandboxes, Kind.SANDBOX)):
        if found:
            lines.append(f"acl {acl} dst {' '.join(found)}")
            lines.append(_note(f"n_{acl}", f"{Rule.ALWAYS_DENIED.value}: {kind.value}"))
            never.append(f"http_access deny {acl} n_{acl}")
    # Several sandboxes share a network's gateways: squid listens on each once.
    listening = dict.fromkeys(g for policy in sorted(policies, key=lambda p: p.name) for g in policy.gateways)
    for gateway in listening:
        host = f"[{gateway}]" if ":" in gateway else gateway
        lines.append(f"http_port {host}:{http_port} intercept")
        lines.append(
            f"https_port {host}:{tls_port} intercept ssl-bump generate-host-certificates=off "
            f"tls-cert={state / 'bump.pem'} tls-key={state / 'bump.key'}"
        )

    access: list[str] = []
    bump: list[str] = ["ssl_bump peek step1"]
    for index, policy in enumerate(sorted(policies, key=lambda p: p.name), start=1):
        lines += _space_acls(index, policy, access, bump)
    lines += [
        "",
        *never,
        *access,
        "http_access deny all",
        "",
        *bump,
        "ssl_bump terminate all",
        "",
    ]
    return "\n".join(lines)


def _space_acls(index: int, policy: SpaceProxyPolicy, access: list[str], bump: list[str]) -> list[str]:
    """The ACL definitions of one space; appends its http_access and ssl_bump lines in order."""
    s = f"s{index}"
    src = f"{s}_src"
    where = f" on space network {policy.network}" if policy.network else ""
    acls = [f"# sources {policy.name}{where}", f"acl {src} src {' '.join(policy.sources) or '0.0.0.0/32'}"]
    allow_nets = [str(e) for e in policy.allow_out if isinstance(e, Cidr)]
    allow_domains = [e for e in policy.allow_out if isinstance(e, Domain)]
    # Only an allow CIDR inside a private range, or a private exception, opens it (never a
    # wider one, 0.0.0.0/0).
    opened = [str(e) for e in policy.allow_out if isinstance(e, Cidr) and opened_range(e) is not None]
    opened += [str(e) for e in policy.allow_private if str(e) not in opened]
    if allow_nets:
        acls.append(f"acl {s}_allow_net dst {' '.join(allow_nets)}")
    if opened:
        acls.append(f"acl {s}_allow_private dst {' '.join(opened)}")
        access.append(f"http_access deny {src} private_dst !{s}_allow_private n_private")
    else:
        access.append(f"http_access deny {src} private_dst n_private")

    # Deny entries win over every HTTP rule (as over allow entries and grants elsewhere),
    # each refusing with its own words.
    for position, entry in enumerate(policy.deny_out, start=1):
        d = f"{s}_d{position}"
        acls.append(_note(f"{d}_note", f"{Rule.DENY_ENTRY.value} {entry}"))
        if isinstance(entry, Cidr):
            acls.append(f"acl {d}_net dst {entry}")
            access.append(f"http_access deny {src} {d}_net {d}_note")
            bump.append(f"ssl_bump terminate {src} {d}_net {d}_note")
        else:
            acls.append(f"acl {d}_dom dstdom_regex -i {_domain_regex(entry)}")
            acls.append(f"acl {d}_sni ssl::server_name_regex -i {_domain_regex(entry)}")
            access.append(f"http_access deny !CONNECT {src} {d}_dom {d}_note")
            bump.append(f"ssl_bump terminate {src} {d}_sni {d}_note")

    # An allow list bounds the HTTP rules too: they narrow what it lets through, never widen it
    # (the packet filter and explain say the same for every other port).
    if allow_nets or allow_domains:
        acls.append(_note(f"{s}_notallowed", Rule.NOT_ALLOWED.value))
        if allow_domains:
            regexes = " ".join(_domain_regex(d) for d in allow_domains)
            acls.append(f"acl {s}_allow_dom dstdom_regex -i {regexes}")
            acls.append(f"acl {s}_allow_sni ssl::server_name_regex -i {regexes}")
        outside = [f"!{s}_allow_net"] if allow_nets else []
        access.append(
            " ".join(["http_access deny !CONNECT", src, *outside, *([f"!{s}_allow_dom"] if allow_domains else [])])
            + f" {s}_notallowed"
        )
        bump.append(
            " ".join(["ssl_bump terminate", src, *outside, *([f"!{s}_allow_sni"] if allow_domains else [])])
            + f" {s}_notallowed"
        )

    named: list[str] = []
    for position, rule in enumerate(policy.rules, start=1):
        r = f"{s}_r{position}"
        pattern = _domain_regex(rule.domain)
        named.append(pattern)
        acls.append(f"acl {r}_host dstdom_regex -i {pattern}")
        acls.append(f"acl {r}_sni ssl::server_name_regex -i {pattern}")
        conditions = [src, f"{r}_host"]
        if rule.methods:
            acls.append(f"acl {r}_method method {' '.join(rule.methods)}")
            conditions.append(f"{r}_method")
        if rule.path_prefix != "/":
            acls.append(f"acl {r}_path urlpath_regex ^{_regex_escape(rule.path_prefix)}")
            conditions.append(f"{r}_path")
        # Only refusing lines carry a note: a noted log line is a refusal (see parse_access_line).
        note = ""
        if rule.action == "deny":
            acls.append(_note(f"{r}_note", rule.describe(position)))
            note = f" {r}_note"
        # The fake CONNECT of an intercepted TLS connection is decided by ssl_bump below.
        access.append(f"http_access {rule.action} !CONNECT {' '.join(conditions)}{note}")
        if rule.decides_tls:
            verdict = "splice" if rule.action == "allow" else "terminate"
            bump.append(f"ssl_bump {verdict} {src} {r}_sni{note}")
    if named:
        acls.append(f"acl {s}_named dstdom_regex -i {' '.join(named)}")
        acls.append(f"acl {s}_named_sni ssl::server_name_regex -i {' '.join(named)}")
        acls.append(_note(f"{s}_nomatch", Rule.HTTP_UNMATCHED.value))
        acls.append(_note(f"{s}_nomatch_tls", Rule.TLS_UNMATCHED.value))
        access.append(f"http_access deny !CONNECT {src} {s}_named {s}_nomatch")
        bump.append(f"ssl_bump terminate {src} {s}_named_sni {s}_nomatch_tls")

    # Hosts named by no rule: the space's allow list.
    if allow_nets or allow_domains:
        if allow_nets:
            access.append(f"http_access allow {src} {s}_allow_net")
            bump.append(f"ssl_bump splice {src} {s}_allow_net")
        if allow_domains:
            access.append(f"http_access allow !CONNECT {src} {s}_allow_dom")
            bump.append(f"ssl_bump splice {src} {s}_allow_sni")
        # The fake CONNECT passes here; its SNI is decided by ssl_bump.
        access.append(f"http_access allow CONNECT {src}")
        access.append(f"http_access deny {src} {s}_notallowed")
        bump.append(f"ssl_bump terminate {src} {s}_notallowed")
    else:
        access.append(f"http_access allow {src}")
        bump.append(f"ssl_bump splice {src}")
    return acls


# ---------------------------------------------------------------------------------------
# nftables: the transparent redirect


def redirect_table_name(state_dir: str) -> str:
    """The redirect table of the squid whose state folder is `state_dir`: the default folder's
    is `sandbox_console_proxy`; any other folder's (a second console or a test run on the same
    host) is its own, so one squid applying or dropping its redirects never replaces or deletes
    another's (which would send that one's port 80/443 past its squid)."""
    folder = os.path.normpath(os.path.abspath(state_dir))
    if folder == os.path.normpath(DEFAULT_STATE_DIR):
        return TABLE_NAME
    return f"{TABLE_NAME}_{hashlib.sha256(folder.encode()).hexdigest()[:12]}"


def render_redirect_table(policies: Sequence[SpaceProxyPolicy], table: str = TABLE_NAME) -> str:
    """The redirect table (`inet sandbox_console_proxy` by default) as an `nft -f` file
    (deterministic)."""
    v4 = sorted({s for p in policies for s in p.sources if ipaddress.ip_network(s, strict=False).version == 4})
    v6 = sorted({s for p in policies for s in p.sources if ipaddress.ip_network(s, strict=False).version == 6})
    sandbox_in = f'iifname "{BRIDGE_PREFIX}*"'
    lines = [
        "# Rendered by sandboxes/backends/docker/egress/proxy.py and applied with `nft -f`; edits are lost.",
        f"table {TABLE_FAMILY} {table}",
        f"delete table {TABLE_FAMILY} {table}",
        f"table {TABLE_FAMILY} {table} {{",
    ]
    for name, kind, elements in (("l7_sources4", "ipv4_addr", v4), ("l7_sources6", "ipv6_addr", v6)):
        lines.append(f"\tset {name} {{")
        lines.append(f"\t\ttype {kind}; flags interval;")
        if elements:
            lines.append(f"\t\telements = {{ {', '.join(elements)} }}")
        lines.append("\t}")
    lines += [
        "\tchain prerouting {",
        "\t\ttype nat hook prerouting priority dstnat; policy accept;",
        f"\t\t{sandbox_in} ip saddr @l7_sources4 tcp dport 80 redirect to :{PROXY_HTTP_PORT}",
        f"\t\t{sandbox_in} ip saddr @l7_sources4 tcp dport 443 redirect to :{PROXY_TLS_PORT}",
        f"\t\t{sandbox_in} ip6 saddr @l7_sources6 tcp dport 80 redirect to :{PROXY_HTTP_PORT}",
        f"\t\t{sandbox_in} ip6 saddr @l7_sources6 tcp dport 443 redirect to :{PROXY_TLS_PORT}",
        "\t}",
        "",
        "\t# QUIC would carry HTTP/3 past the SNI check: refused, clients fall back to TCP.",
        "\tchain forward {",
        "\t\ttype filter hook forward priority filter; policy accept;",
        f"\t\t{sandbox_in} ip saddr @l7_sources4 udp dport 443 counter drop",
        f"\t\t{sandbox_in} ip6 saddr @l7_sources6 udp dport 443 counter drop",
        "\t}",
        "}",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The access log read back


def parse_access_line(line: str, sandbox_of: Callable[[str], str] | None = None) -> EgressRefusal | None:
    """One `egress` logformat line, as an EgressRefusal when squid refused it."""
    parts = line.split()
    if len(parts) < 8:
        return None
    stamp, client, local_port, status, method, url, sni, note = parts[:8]
    # A refusal: squid's own TCP_DENIED (http_access), a connection ssl_bump terminated (only
    # refusing lines carry a note), or a Host header that is not the address connected to.
    verify_failed = status.endswith("/409")
    if not (status.startswith("TCP_DENIED") or note != "-" or verify_failed):
        return None
    try:
        at = datetime.fromtimestamp(float(stamp), tz=UTC)
    except ValueError:
        return None
    tls = method == "CONNECT" or local_port in ("443", str(PROXY_TLS_PORT))
    if tls:
        destination = sni if sni != "-" else url
        layer = "tls"
    else:
        split = urlsplit(url)
        destination = f"{split.scheme}://{split.netloc}{split.path}" if split.netloc else url.split("?", 1)[0]
        layer = "http"
    if note != "-":
        rule = unquote(note.split(",")[0])
    elif verify_failed:
        rule = f"the name sent ({'SNI' if tls else 'Host header'}) does not resolve to the address connected to"
    else:
        rule = "refused by the proxy"
    return EgressRefusal(
        at=at,
        sandbox_id=sandbox_of(client) if sandbox_of else client,
        layer=layer,
        destination=destination,
        rule=rule,
        detail=f"{method} from {client}; squid {status}",
    )


def proxy_refusals(
    cursor: str,
    *,
    log_path: str = str(Path(DEFAULT_STATE_DIR) / "access.log"),
    sandbox_of: Callable[[str], str] | None = None,
    limit: int = 5000,
) -> tuple[list[EgressRefusal], str]:
    """Refusals logged after `cursor` ("" = the whole log kept), and the next cursor
    ("<inode>:<offset>"; a rotated or truncated log starts again from its beginning).
    `sandbox_of` maps a client address to a sandbox id (default: the address itself)."""
    try:
        stat = os.stat(log_path)
    except OSError:
        return [], cursor
    offset = 0
    inode, _, seen = cursor.partition(":")
    if inode == str(stat.st_ino) and seen.isdigit() and int(seen) <= stat.st_size:
        offset = int(seen)
    found: list[EgressRefusal] = []
    with open(log_path, "rb") as handle:
        handle.seek(offset)
        while len(found) < limit:
            raw = handle.readline()
            if not raw or not raw.endswith(b"\n"):
                break  # a line squid is still writing is read next time
            offset += len(raw)
            refusal = parse_access_line(raw.decode("utf-8", "replace"), sandbox_of)
            if refusal is not None:
                found.append(refusal)
    return found, f"{stat.st_ino}:{offset}"
