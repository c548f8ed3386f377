"""The console-managed resolver of a Docker space network: one dnsmasq per network, listening
on the bridge's gateway address only, forwarding to the operator's upstream resolver.

- a network whose online sandboxes all have allow lists answers only the names those lists
  name (`server=/example.com/<upstream>`, everything else `address=/#/`: NXDOMAIN), and every
  address it gives for such a name goes into that pattern's nftables sets (`nftset=`), which
  the sandboxes' chains accept: a domain entry opens exactly the addresses it resolved to;
- otherwise every name is forwarded but the deny list's (NXDOMAIN);
- without an upstream nothing resolves (and `status` says so).

The deny entries' names are resolved too, but never for a sandbox: the deny filler
(`DenyFiller`, one dnsmasq on the host's loopback per state folder, asked by the console
alone) forwards them to the same upstream and puts their addresses into their nftables sets,
which the denying sandboxes' chains refuse first. So an address of a denied name that a
sandbox learnt elsewhere (hard-coded, another resolver) is refused by the packet filter too.

Changed `server`/`nftset` lines need a restart (a SIGHUP re-reads hosts files only); dnsmasq
starts in a few milliseconds, and the nftables sets keep their elements across it. Queries
are logged (`log-queries=extra`) to a file per network; `refusals_since` reads the NXDOMAIN
answers it gave from configuration back as (time, client address, name).

A domain entry is `netpolicy.Domain`, matched as dnsmasq matches (`/example.com/` the name and
its subdomains, `/*.example.com/` the subdomains only): the same meaning. A deny entry wins
over every allowed name it covers: such a name gets no `server=` line, so it is never
forwarded. Imports nothing of the project but the contract, `netpolicy` and `rules`.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from netpolicy import Domain

from ...base import ErrorKind, RemoteError
from .firewall import DNS_PORT, TABLE_FAMILY, TABLE_NAME, run_nft
from .rules import domain_sets, network_sets

DNSMASQ_CANDIDATES = ("/usr/sbin/dnsmasq", "/sbin/dnsmasq")
START_TIMEOUT_S = 10
# The deny filler (`DenyFiller`): its files' name, and how its lookups are sent.
FILLER = "deny-fill"
FILL_TIMEOUT_S = 1.5
FILL_BATCH = 64  # names in flight at once (A and AAAA each): under dnsmasq's dns-forward-max of 150
_QTYPES = (1, 28)  # A, AAAA
# A name the filler answers itself (NXDOMAIN, `address=/#/`), whatever the upstream does:
# asked to tell a filler that hangs from a slow upstream. One label: no deny entry names it.
ALIVE = "deny-filler-alive"
ALIVE_TIMEOUT_S = 0.5
# `upstream`: an address, optionally "#port" (dnsmasq's own syntax), e.g. 127.0.0.1#5353.
_UPSTREAM = re.compile(r"^[0-9a-fA-F:.]+(#[0-9]{1,5})?$")
_REFUSED = re.compile(
    r"^(?P<stamp>\w{3} +\d+ [\d:]{8}) dnsmasq\[\d+\]: \d+ (?P<client>[0-9a-fA-F:.]+)/\d+ "
    r"config (?P<name>\S+) is (NXDOMAIN|NODATA)"
)


@dataclass(frozen=True)
class DnsPolicy:
    """What one network's resolver answers: every name but `denied`, or only `allowed`."""

    answer_all: bool
    allowed: tuple[Domain, ...] = ()
    denied: tuple[Domain, ...] = ()
    # Denied by some online sandbox but not all: forwarded, their answers never fill the
    # per-network copies (`rules.network_sets`) that the denying one's exemption reads.
    denied_by_some: tuple[Domain, ...] = ()

    @property
    def forwarded(self) -> tuple[Domain, ...]:
        """The allowed entries no deny entry (of every member) covers: deny wins."""
        return tuple(a for a in self.allowed if not any(d.covers(a) for d in self.denied))


def check_upstream(upstream: str) -> str:
    if upstream and not _UPSTREAM.match(upstream):
        raise RemoteError(
            ErrorKind.INVALID, f"option 'dns_upstream' must be an address, optionally #port: {upstream!r}"
        )
    return upstream


def _domain(pattern: Domain) -> str:
    """dnsmasq's form: /example.com/ matches the name and its subdomains, /*.example.com/
    only the subdomains (`Domain.matches_name`'s meaning)."""
    return str(pattern)


def _nftset(pattern: Domain, bridge: str = "") -> str:
    # nftset= takes no "*." pattern: the wildcard's set is filled for its parent domain's
    # names, of which the server= lines forward only the subdomains. A network's resolver
    # (`bridge`) fills the pattern's per-network sets too: those alone exempt an address
    # from its sandboxes' deny entries.
    sets = [domain_sets(pattern), *([network_sets(pattern, bridge)] if bridge else [])]
    return f"nftset=/{pattern.name}/" + ",".join(_targets(s) for s in sets)


def _targets(sets: tuple[str, str]) -> str:
    table = f"{TABLE_FAMILY}#{TABLE_NAME}"
    return f"4#{table}#{sets[0]},6#{table}#{sets[1]}"


def render_config(
    gateway: str, upstream: str, policy: DnsPolicy, log_file: str, pid_file: str, bridge: str = ""
) -> str:
    """dnsmasq's configuration file for one network (deterministic); `bridge`: the network's,
    whose per-network sets its answers fill besides the shared ones."""
    lines = [
        "# Rendered by sandboxes/backends/docker/egress/dns.py; edits are lost.",
        f"listen-address={gateway}",
        "bind-interfaces",
        "except-interface=lo",
        f"port={DNS_PORT}",
        "no-resolv",
        "no-hosts",
        "no-poll",
        "cache-size=1000",
        "log-queries=extra",
        f"log-facility={log_file}",
        f"pid-file={pid_file}",
        "user=root",  # the nftset additions need CAP_NET_ADMIN, which dnsmasq keeps as root only
    ]
    if not upstream:
        lines.append("address=/#/")
        return "\n".join(lines) + "\n"
    if policy.answer_all:
        lines.append(f"server={upstream}")
        lines += [f"address=/{_domain(p)}/" for p in policy.denied]
    else:
        lines.append("address=/#/")
        # An allowed name a deny entry covers gets no server= line (deny wins: the longest
        # match would forward allow api.x.test under deny x.test otherwise).
        lines += [f"server=/{_domain(p)}/{upstream}" for p in policy.forwarded]
        lines += [f"address=/{_domain(p)}/" for p in policy.denied]
    # The allow lists' sets, also when one sandbox without a list makes it answer every name
    # (the others' packet filters accept their allowed names by these sets alone).
    lines += [_nftset(p, bridge) for p in policy.forwarded]
    # dnsmasq fills the longest-matching nftset= line's sets only: a name some sandbox
    # denies fills the shared sets of the allowed patterns covering it, no copy.
    forwarded = policy.forwarded
    for denied in policy.denied_by_some:
        covering = [p for p in forwarded if p.matches_name(denied.name)]
        if covering:
            lines.append(f"nftset=/{denied.name}/" + ",".join(_targets(domain_sets(p)) for p in covering))
    return "\n".join(lines) + "\n"


def dnsmasq_binary() -> str | None:
    return shutil.which("dnsmasq") or next((p for p in DNSMASQ_CANDIDATES if os.path.exists(p)), None)


def process_exited(pid: int) -> bool:
    """Whether `pid` has exited: gone, or a zombie waiting for its parent to reap it. A
    daemonized dnsmasq's parent is the host's init, which may reap late (seconds on some
    hosts, never when the console itself is a container's pid 1): its port is free already."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return True
    # The state follows the command name's closing parenthesis (the name may hold spaces).
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")


@dataclass(frozen=True)
class Resolver:
    """The files of one network's dnsmasq under the egress state folder."""

    folder: str
    bridge: str

    @property
    def conf(self) -> str:
        return os.path.join(self.folder, f"{self.bridge}.conf")

    @property
    def pid_file(self) -> str:
        return os.path.join(self.folder, f"{self.bridge}.pid")

    @property
    def log_file(self) -> str:
        return os.path.join(self.folder, f"{self.bridge}.log")

    def running_pid(self) -> int | None:
        """The pid of this network's dnsmasq when it runs (checked against /proc, not trusted)."""
        try:
            with open(self.pid_file) as handle:
                pid = int(handle.read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if b"dnsmasq" in cmdline[0] and self.conf.encode() in b" ".join(cmdline) else None

    def ensure(self, gateway: str, upstream: str, policy: DnsPolicy) -> bool:
        """Running with this configuration: started, or restarted when it changed (or died);
        whether it was."""
        return self.run(render_config(gateway, upstream, policy, self.log_file, self.pid_file, self.bridge))

    def run(self, text: str) -> bool:
        """Running with the configuration `text`: started, or restarted when it changed;
        whether it was."""
        pid = self.running_pid()
        with contextlib.suppress(OSError), open(self.conf) as handle:
            if handle.read() == text and pid is not None:
                return False
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        with open(self.conf + ".new", "w") as handle:
            handle.write(text)
        os.replace(self.conf + ".new", self.conf)
        self.stop()
        # The per-network copies start again with the new process's empty cache: the copies
        # keep their elements, and answers the old configuration filled in (a name a member
        # denies now, or one joining with it) would go on exempting that name's address.
        for copy in sorted(set(re.findall(r"#(n[46]_[0-9a-f]{16}_[0-9a-f]{11})\b", text))):
            run_nft(["-f", "-"], f"flush set {TABLE_FAMILY} {TABLE_NAME} {copy}\n")
        binary = dnsmasq_binary()
        if binary is None:
            raise RemoteError(
                ErrorKind.UNSUPPORTED, "the resolver needs dnsmasq (Debian package dnsmasq-base) on the console's host"
            )
        # dnsmasq forks once it has bound its address: the exit code says whether it could.
        done = subprocess.run(
            [binary, f"--conf-file={self.conf}"], capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            raise RemoteError(
                ErrorKind.UNAVAILABLE,
                f"the resolver for {self.bridge} did not start: {(done.stderr or '').strip()[-300:]}",
            )
        return True

    def files(self) -> list[str]:
        """Every file of this resolver in the folder (configuration, pid, logs, extras)."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        return [os.path.join(self.folder, n) for n in sorted(names) if n.split(".", 1)[0] == self.bridge]

    def remove(self) -> None:
        """Stopped, and its files gone (its network was released, or it has nothing to do)."""
        self.stop()
        for path in self.files():
            with contextlib.suppress(OSError):
                os.unlink(path)

    def stop(self, *, force: bool = False) -> None:
        """Stopped (`force`: killed, for one that hangs and would not act on a SIGTERM)."""
        pid = self.running_pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL if force else signal.SIGTERM)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not process_exited(pid):
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            os.unlink(self.pid_file)


# ---------------------------------------------------------------------------------------
# The deny filler: the addresses of denied names, for the packet filter


def fillable(denied: Iterable[Domain]) -> tuple[Domain, ...]:
    """The denied entries the filler can resolve: names, not `*.` wildcards (no name is
    known to ask for; their subdomains are refused at the resolver and by squid only)."""
    return tuple(sorted({p for p in denied if not p.wildcard}, key=str))


def render_fill_config(port: int, upstream: str, denied: Iterable[Domain], log_file: str, pid_file: str) -> str:
    """The deny filler's dnsmasq (deterministic). It listens on the host's loopback, where no
    sandbox reaches (the input hook refuses the host but for the gateway's ports), and only
    the console asks it: it forwards each denied name to the upstream and puts every address
    it gets into that name's nftables sets, which each denying sandbox's chain refuses before
    anything it accepts. The sandboxes' own resolvers still answer those names NXDOMAIN. No
    cache: every lookup goes upstream, so each refresh adds the addresses the name has now."""
    patterns = fillable(denied)
    lines = [
        "# Rendered by sandboxes/backends/docker/egress/dns.py; edits are lost.",
        "listen-address=127.0.0.1",
        "bind-interfaces",
        f"port={int(port)}",
        "no-resolv",
        "no-hosts",
        "no-poll",
        "cache-size=0",
        f"log-facility={log_file}",
        f"pid-file={pid_file}",
        "user=root",  # the nftset additions need CAP_NET_ADMIN, which dnsmasq keeps as root only
        "address=/#/",
        *(f"server=/{p}/{upstream}" for p in patterns),
        *(_nftset(p) for p in patterns),
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class DenyFiller:
    """The deny filler's dnsmasq for one egress state folder (files `deny-fill.*` beside the
    networks' resolvers; its port is kept in `deny-fill.port`)."""

    folder: str

    @property
    def resolver(self) -> Resolver:
        return Resolver(self.folder, FILLER)

    def ensure(self, upstream: str, denied: Iterable[Domain]) -> int | None:
        """Running for these denied names (restarted when they changed): its port. None, and
        stopped, without an upstream or a name to resolve."""
        patterns = fillable(denied)
        resolver = self.resolver
        if not upstream or not patterns:
            resolver.remove()  # its configuration, port and events files too
            return None
        port = self._port(fresh=False)
        events = os.path.join(self.folder, f"{FILLER}.events")
        try:
            resolver.run(render_fill_config(port, upstream, patterns, events, resolver.pid_file))
        except RemoteError as exc:
            if exc.kind != ErrorKind.UNAVAILABLE:
                raise
            port = self._port(fresh=True)  # its port was taken meanwhile: another one
            resolver.run(render_fill_config(port, upstream, patterns, events, resolver.pid_file))
        if lookup(port, [ALIVE], timeout_s=ALIVE_TIMEOUT_S) != {ALIVE}:
            # Running but answering nothing (hung): its pid and configuration look fine, so
            # nothing else would ever replace it, and every lookup would time out.
            resolver.stop(force=True)
            resolver.run(render_fill_config(port, upstream, patterns, events, resolver.pid_file))
        return port

    def _port(self, *, fresh: bool) -> int:
        path = os.path.join(self.folder, f"{FILLER}.port")
        if not fresh:
            with contextlib.suppress(OSError, ValueError), open(path) as handle:
                return int(handle.read().strip())
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        with open(path, "w") as handle:
            handle.write(f"{port}\n")
        return port


def _question(ident: int, name: str, qtype: int) -> bytes:
    labels = b"".join(bytes([len(label)]) + label.encode("ascii") for label in name.split("."))
    return (
        ident.to_bytes(2, "big")
        + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
        + labels
        + b"\x00"
        + qtype.to_bytes(2, "big")
        + b"\x00\x01"
    )


def lookup(port: int, names: Iterable[str], timeout_s: float = FILL_TIMEOUT_S) -> set[str]:
    """Ask the filler on 127.0.0.1:`port` for every name's A and AAAA records, `FILL_BATCH`
    names' questions in flight at once (each answer lets the next question go: a name that is
    never answered holds its own slot only, not the names behind it), within `timeout_s` in
    all. Returns the names both answers came back for (whatever they said): dnsmasq has put
    the addresses into the sets before it answers."""
    questions = deque((name, qtype) for name in dict.fromkeys(names) for qtype in _QTYPES)
    answered: dict[str, int] = {}
    pending: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("127.0.0.1", port))  # only the filler's answers come in
        try:
            while questions or pending:
                while questions and len(pending) < FILL_BATCH * len(_QTYPES):
                    name, qtype = questions.popleft()
                    ident = secrets.randbelow(0x10000)
                    while ident in pending:
                        ident = secrets.randbelow(0x10000)
                    pending[ident] = name
                    sock.send(_question(ident, name, qtype))
                if (left := deadline - time.monotonic()) <= 0:
                    break
                sock.settimeout(left)
                reply = sock.recv(4096)
                name = pending.pop(int.from_bytes(reply[:2], "big"), "") if len(reply) >= 12 else ""
                if name:
                    answered[name] = answered.get(name, 0) + 1
        except OSError:  # timed out, or nothing listens there (the filler was restarted)
            pass
    return {name for name, count in answered.items() if count == len(_QTYPES)}


@dataclass(frozen=True)
class DnsRefusal:
    at: datetime
    client: str
    name: str


def read_refusals(path: str, offset: int) -> tuple[list[DnsRefusal], int]:
    """NXDOMAIN answers from configuration after `offset` bytes of a query log, and the offset
    after the last whole line (a shorter file than `offset` was rotated: read from 0)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return [], 0
    if size < offset:
        offset = 0
    found = []
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n") + 1
    year = datetime.now(UTC).year
    for line in data[:end].decode(errors="replace").splitlines():
        match = _REFUSED.match(line)
        if match is None:
            continue
        try:
            at = datetime.strptime(f"{year} {match['stamp']}", "%Y %b %d %H:%M:%S").replace(tzinfo=UTC)
        except ValueError:
            continue
        found.append(DnsRefusal(at, match["client"], match["name"].lower()))
    return found, offset + end


def policy_for(specs: Iterable[tuple[bool, tuple[Domain, ...], tuple[Domain, ...]]]) -> DnsPolicy:
    """One network's resolver policy from its online sandboxes' (has allow list, allowed
    domains, denied domains): all names when one of them may reach everything, else the
    union of their allowed names; denied are the names every sandbox denies (a sandbox's
    own extra denials still hold at its packet filter)."""
    answer_all = False
    allowed: list[Domain] = []
    denied: set[Domain] | None = None
    some: set[Domain] = set()
    for has_allow_list, allow, deny in specs:
        answer_all = answer_all or not has_allow_list
        allowed += allow
        denied = set(deny) if denied is None else denied & set(deny)
        some |= set(deny)
    every = denied or set()
    return DnsPolicy(
        answer_all,
        tuple(sorted(set(allowed), key=str)),
        tuple(sorted(every, key=str)),
        tuple(sorted(some - every, key=str)),
    )
