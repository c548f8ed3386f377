"""Running the host's squid for HTTP rules: its state folder, start, live reconfigure, stop.

What squid enforces and how the access log reads back is in `proxy` (rendered there,
applied here). Imports nothing of the project but `proxy` and the contract's DTOs.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...capabilities import EgressRefusal
from .proxy import (
    BRIDGE_PREFIX,
    DEFAULT_STATE_DIR,
    PROXY_HTTP_PORT,
    RUN_TIMEOUT_S,
    TABLE_FAMILY,
    SpaceProxyPolicy,
    proxy_refusals,
    redirect_table_name,
    render_redirect_table,
    render_squid_conf,
    squid_available,
    squid_binary,
)

SQUID_USER = "proxy"  # Debian's cache_effective_user


@dataclass(frozen=True)
class ProxyResult:
    applied: bool
    detail: str


def _run(args: list[str], stdin: str | None = None) -> ProxyResult:
    try:
        done = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ProxyResult(False, f"{args[0]} could not run: {exc}")
    if done.returncode != 0:
        return ProxyResult(False, (done.stderr or done.stdout).strip()[-500:])
    return ProxyResult(True, done.stdout.strip())


def host_addresses() -> list[str]:
    """Every address of this host's interfaces, and every sandbox bridge's network (squid
    refuses them as destinations, whatever a space's allow CIDRs say)."""
    ip = shutil.which("ip") or "/usr/sbin/ip"
    result = _run([ip, "-j", "addr", "show"])
    if not result.applied:
        return []
    found = set()
    for link in json.loads(result.detail or "[]"):
        for info in link.get("addr_info", ()):
            if not info.get("local"):
                continue
            found.add(str(ipaddress.ip_address(info["local"])))
            if str(link.get("ifname", "")).startswith(BRIDGE_PREFIX):
                found.add(str(ipaddress.ip_interface(f"{info['local']}/{info.get('prefixlen', 32)}").network))
    return sorted(found)


def tentative_addresses() -> set[str]:
    """IPv6 addresses still in duplicate address detection (squid cannot bind them yet)."""
    ip = shutil.which("ip") or "/usr/sbin/ip"
    listed = _run([ip, "-j", "-6", "addr", "show", "tentative"])
    if not listed.applied:
        return set()
    return {
        str(info.get("local"))
        for link in json.loads(listed.detail or "[]")
        for info in link.get("addr_info", ())
        if info.get("local")
    }


@dataclass
class SquidProxy:
    """One squid for the console's host: its state folder holds the per-sandbox policies
    (`spaces/*.json`, one per sandbox with HTTP rules, keyed by its id, so every console
    process renders the same file), squid.conf, the
    peeking certificate, and the logs. Methods never raise for squid's own failures: they
    answer a `ProxyResult` and the caller decides what it means."""

    state_dir: str = DEFAULT_STATE_DIR
    dns_nameservers: tuple[str, ...] = ("127.0.0.1",)
    squid: str = field(default_factory=lambda: squid_binary() or "squid")
    apply_nftables: bool = True

    @property
    def state(self) -> Path:
        return Path(self.state_dir)

    @property
    def table(self) -> str:
        """This squid's nftables redirect table (family `inet`)."""
        return redirect_table_name(self.state_dir)

    @property
    def conf_path(self) -> Path:
        return self.state / "squid.conf"

    @property
    def access_log(self) -> Path:
        return self.state / "access.log"

    # Policies ------------------------------------------------------------------------

    def policies(self) -> list[SpaceProxyPolicy]:
        folder = self.state / "spaces"
        if not folder.is_dir():
            return []
        found = []
        for path in sorted(folder.glob("*.json")):
            try:
                found.append(SpaceProxyPolicy.from_json(json.loads(path.read_text())))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return found

    def _path(self, policy: SpaceProxyPolicy) -> Path:
        """`spaces/<network>.<name>.json` (the folder's entries name their network), or
        `spaces/<name>.json` for a policy without one."""
        key = f"{policy.network}.{policy.name}" if policy.network else policy.name
        return self.state / "spaces" / f"{_safe(key)}.json"

    def _files(self, name: str) -> list[Path]:
        """The files of the policy named `name`, whatever its network."""
        folder = self.state / "spaces"
        if not folder.is_dir():
            return []
        return [p for p in (folder / f"{_safe(name)}.json", *folder.glob(f"*.{_safe(name)}.json")) if p.exists()]

    def set_space(self, policy: SpaceProxyPolicy) -> ProxyResult:
        """Enforce `policy` for its sources now (a policy without rules is removed). A policy on
        file under another name whose sources overlap these is a gone sandbox's whose address
        was given again: it goes (an address is one sandbox's, and squid's first match decides)."""
        try:
            mine = [ipaddress.ip_network(source, strict=False) for source in policy.sources]
            for gateway in policy.gateways:
                ipaddress.ip_address(gateway)
        except ValueError as exc:
            return ProxyResult(False, f"not an address of the space network: {exc}")
        with self._locked():
            (self.state / "spaces").mkdir(parents=True, exist_ok=True)
            path = self._path(policy)
            stale = [
                found
                for other in self.policies()
                if other.name != policy.name and _overlap(mine, other.sources)
                for found in self._files(other.name)
            ]
            stale += [found for found in self._files(policy.name) if found != path]  # its network changed
            before = {p: p.read_text() for p in (path, *stale) if p.exists()}
            for old in stale:
                old.unlink(missing_ok=True)
            if policy.rules:
                _write(path, json.dumps(policy.as_json(), sort_keys=True))
            else:
                path.unlink(missing_ok=True)
            result = self._apply()
            if not result.applied:  # nothing half-applied is kept: the previous policies stay
                path.unlink(missing_ok=True)
                for old, text in before.items():
                    _write(old, text)
            return result

    def holds(self, name: str) -> bool:
        """A policy named `name` is on file."""
        return bool(self._files(name))

    def remove_space(self, name: str) -> ProxyResult:
        """The policy named `name` gone (a deleted sandbox's); squid reconfigured."""
        with self._locked():
            for path in self._files(name):
                path.unlink(missing_ok=True)
            return self._apply()

    def remove_network(self, network: str) -> ProxyResult | None:
        """Every policy of the space network `network` gone (the network was removed); None when
        it had none (squid left as it is)."""
        with self._locked():
            doomed = [p for p in self.policies() if p.network_name == network]
            if not doomed:
                return None
            for policy in doomed:
                for path in self._files(policy.name):
                    path.unlink(missing_ok=True)
            return self._apply()

    def apply(self) -> ProxyResult:
        with self._locked():
            return self._apply()

    # squid ---------------------------------------------------------------------------

    def _locked(self) -> _FileLock:
        self.state.mkdir(parents=True, exist_ok=True)
        return _FileLock(self.state / "lock")

    def _prepare_state(self) -> ProxyResult:
        self.state.mkdir(parents=True, exist_ok=True)
        key, cert = self.state / "bump.key", self.state / "bump.pem"
        if not (key.exists() and cert.exists()):
            # ssl-bump wants a certificate even though peek/splice/terminate never present it.
            made = _run(
                [
                    shutil.which("openssl") or "openssl",
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
                    "-subj", "/CN=sandbox-console egress proxy (never presented)",
                    "-keyout", str(key), "-out", str(cert),
                ]
            )  # fmt: skip
            if not made.applied:
                return ProxyResult(False, f"could not make the peeking certificate: {made.detail}")
        for path in (self.access_log, self.state / "cache.log"):
            path.touch(exist_ok=True)
        for path in (self.state, key, cert, self.access_log, self.state / "cache.log"):
            with _suppress_os():
                shutil.chown(path, user=SQUID_USER, group=SQUID_USER)
        key.chmod(0o600)
        return ProxyResult(True, "")

    def _pid(self) -> int | None:
        try:
            pid = int((self.state / "squid.pid").read_text().strip())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        return self._pid() is not None

    def _apply(self) -> ProxyResult:
        if not squid_available():
            return ProxyResult(False, "squid with TLS peeking (Debian package squid-openssl) is not installed")
        prepared = self._prepare_state()
        if not prepared.applied:
            return prepared
        addresses = host_addresses()
        # squid cannot bind the gateway of a network that is gone (and would stop for every
        # space): such a space is kept on file but not rendered until its network is back.
        present = {a.split("/")[0] for a in addresses}
        policies = [p for p in self.policies() if any(g in present for g in p.gateways)]
        conf = render_squid_conf(
            policies,
            state_dir=str(self.state),
            dns_nameservers=self.dns_nameservers,
            host_addresses=addresses,
        )
        tmp = self.conf_path.with_suffix(".new")
        tmp.write_text(conf)
        parsed = _run([self.squid, "-k", "parse", "-f", str(tmp)])
        if not parsed.applied:
            return ProxyResult(False, f"squid refused the configuration: {parsed.detail}")
        tmp.replace(self.conf_path)
        nft = shutil.which("nft") or "/usr/sbin/nft"
        if not policies:
            if self.apply_nftables:
                _run([nft, "delete", "table", TABLE_FAMILY, self.table])  # absent already: fine
            self.stop()
            return ProxyResult(True, "no space has HTTP rules: squid stopped")
        if self.apply_nftables:
            done = _run([nft, "-f", "-"], render_redirect_table(policies, table=self.table))
            if not done.applied:
                return ProxyResult(False, f"nft refused the redirect table: {done.detail}")
        if self.running():
            done = _run([self.squid, "-k", "reconfigure", "-f", str(self.conf_path)])
            return done if not done.applied else ProxyResult(True, "squid reconfigured")
        return self._start()

    def settle(self, wait_s: float = 15.0) -> ProxyResult | None:
        """A new bridge's IPv6 gateway stays tentative until its first sandbox is attached,
        so squid could not bind it: wait for it to settle, then reconfigure (None: nothing
        was waiting). Duplicate address detection was seen taking over 5 s on a loaded
        2-core host, hence the 15 s bound; it only runs for a sandbox with HTTP rules."""
        gateways = {g for p in self.policies() for g in p.gateways}
        if not tentative_addresses() & gateways:
            return None
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and tentative_addresses() & gateways:
            time.sleep(0.1)
        return self.apply()

    def _start(self) -> ProxyResult:
        started = _run([self.squid, "-f", str(self.conf_path)])
        if not started.applied:
            return ProxyResult(False, f"squid did not start: {started.detail}")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.running() and self._listening():
                return ProxyResult(True, "squid started")
            time.sleep(0.1)
        return ProxyResult(False, f"squid did not come up; see {self.state / 'cache.log'}")

    def _listening(self) -> bool:
        """squid listens on the HTTP port (read from /proc: a probe connection would be logged)."""
        wanted = f":{PROXY_HTTP_PORT:04X}"
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with _suppress_os(), open(table) as handle:
                for row in handle.readlines()[1:]:
                    fields = row.split()
                    if len(fields) > 3 and fields[3] == "0A" and fields[1].endswith(wanted):
                        return True
        return False

    def stop(self) -> None:
        pid = self._pid()
        if pid is None:
            return
        with _suppress_os():
            os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._pid() is not None:
            time.sleep(0.1)
        if self._pid() is not None:
            with _suppress_os():
                os.kill(pid, signal.SIGKILL)

    # Refusals ------------------------------------------------------------------------

    def refusals(self, cursor: str, sandbox_of: Callable[[str], str] | None = None) -> tuple[list[EgressRefusal], str]:
        return proxy_refusals(cursor, log_path=str(self.access_log), sandbox_of=sandbox_of)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _overlap(networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network], sources: tuple[str, ...]) -> bool:
    for source in sources:
        try:
            other = ipaddress.ip_network(source, strict=False)
        except ValueError:
            continue
        if any(n.version == other.version and n.overlaps(other) for n in networks):
            return True
    return False


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class _suppress_os:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, OSError | LookupError)


class _FileLock:
    """An exclusive lock on a file, across the console's processes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle: int | None = None

    def __enter__(self) -> _FileLock:
        self.handle = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            os.close(self.handle)
            self.handle = None
