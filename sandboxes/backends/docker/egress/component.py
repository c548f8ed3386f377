"""A Docker space's network policy enforced live, and its refusals read back.

`DockerEgress` is the adapter's `EgressCapability`:

- `update(sandbox_id, network)` applies a sandbox's `NetworkSpec` (the console has merged the
  session's grants into it) now, without a restart: outbound on connects the container to its
  space's network (outbound off disconnects it: no interface but loopback is left), its own
  nftables chain is swapped in one transaction (`egress_rules`), and its network's resolver
  (`dns`) is restarted when the names it must answer changed; the deny entries' names are
  resolved by the deny filler (`dns.DenyFiller`) into the sets the chain refuses first;
- `refusals(cursor)` reads what ulogd2 wrote for the table's NFLOG group (one JSON object a
  line) and the resolvers' query logs, maps each source address back to the sandbox that held
  it (the state files written here), and names the rule from the log prefix.

State lives in a folder of the host (`state_dir`, default `/var/lib/sandbox-console/egress`),
shared by every console process on it; a file lock serialises its writers.

Imports nothing of the project but the contract and the adapter's modules.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from netpolicy import Domain, PolicyError

from ...base import META_SPACE, ErrorKind, NetworkSpec, RemoteError
from ...capabilities import EgressCapability, EgressRefusal
from . import dns
from .firewall import LOG_PREFIX, MAP_V4, MAP_V6, NFLOG_GROUP, TABLE_FAMILY, TABLE_NAME, _nft
from .rules import (
    Binding,
    network_sets_of,
    render_network,
    render_removal,
    render_update,
)

if TYPE_CHECKING:
    from ..backend import DockerBackend

logger = logging.getLogger(__name__)

DEFAULT_STATE_DIR = "/var/lib/sandbox-console/egress"
# A name the lists allow, refused because the resolver has no upstream (the option dns_upstream).
NO_UPSTREAM_RULE = "no upstream resolver set (EGRESS_DNS_UPSTREAM)"
GONE_KEPT_S = 7 * 86400  # a deleted sandbox's addresses, for refusals read late
_HELD = threading.local()
PRUNE_EVERY_S = 60.0
_last_prune = 0.0  # the state folders this thread holds the lock of
# Denied names are resolved again this often (their addresses change; the sets only grow).
DENY_REFRESH_S = 300.0
_last_deny_refresh = 0.0
ULOGD_CANDIDATES = ("/usr/sbin/ulogd", "/sbin/ulogd")
ULOGD_PLUGINS = "/usr/lib/x86_64-linux-gnu/ulogd"


# ---------------------------------------------------------------------------------------
# State: what each sandbox was given, where it sits


@dataclass(frozen=True)
class SandboxState:
    sandbox_id: str
    bridge: str
    v4: tuple[str, ...]
    v6: tuple[str, ...]
    online: bool
    allow_out: tuple[str, ...]
    deny_out: tuple[str, ...]
    allow_private: tuple[str, ...] = ()

    @property
    def spec(self) -> NetworkSpec:
        return spec_of(self.online, self.allow_out, self.deny_out, self.allow_private)

    @property
    def binding(self) -> Binding | None:
        return Binding(self.bridge, self.v4, self.v6) if self.bridge and (self.v4 or self.v6) else None


class EgressState:
    """The state folder: one JSON file per sandbox, the resolvers' files, ulogd's files."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def path(self, *parts: str) -> str:
        return os.path.join(self.folder, *parts)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive across the host's console processes; re-entrant within a thread (a
        restore of the whole table may run inside an update)."""
        held: set[str] = _HELD.__dict__.setdefault("folders", set())
        if self.folder in held:
            yield
            return
        os.makedirs(self.path("sandboxes"), mode=0o700, exist_ok=True)
        with open(self.path("lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held.add(self.folder)
            try:
                yield
            finally:
                held.discard(self.folder)
                fcntl.flock(handle, fcntl.LOCK_UN)

    def read(self, sandbox_id: str) -> SandboxState | None:
        try:
            with open(self.path("sandboxes", f"{sandbox_id}.json")) as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return None
        return _state_from(data)

    def write(self, state: SandboxState) -> None:
        target = self.path("sandboxes", f"{state.sandbox_id}.json")
        with open(target + ".new", "w") as handle:
            json.dump(state.__dict__, handle)
        os.replace(target + ".new", target)

    def remove(self, sandbox_id: str) -> None:
        # Kept as "gone" so refusals logged just before the delete still find their sandbox;
        # gone ones older than GONE_KEPT_S are dropped here.
        self._prune_gone()
        state = self.read(sandbox_id)
        if state is not None:
            gone = self.path("sandboxes", f"{sandbox_id}.gone")
            with open(gone, "w") as handle:
                json.dump({**state.__dict__, "online": False}, handle)
            with contextlib.suppress(OSError):
                os.unlink(self.path("sandboxes", f"{sandbox_id}.json"))

    def _prune_gone(self) -> None:
        cutoff = time.time() - GONE_KEPT_S
        with contextlib.suppress(OSError):
            for name in os.listdir(self.path("sandboxes")):
                path = self.path("sandboxes", name)
                if name.endswith(".gone") and os.path.getmtime(path) < cutoff:
                    os.unlink(path)

    def all(self, include_gone: bool = False) -> list[SandboxState]:
        found = []
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(self.path("sandboxes"))):
                if not (name.endswith(".json") or (include_gone and name.endswith(".gone"))):
                    continue
                with contextlib.suppress(OSError, ValueError), open(self.path("sandboxes", name)) as handle:
                    found.append(_state_from(json.load(handle)))
        return found


def _state_from(data: dict[str, Any]) -> SandboxState:
    return SandboxState(
        sandbox_id=str(data["sandbox_id"]),
        bridge=str(data.get("bridge", "")),
        v4=tuple(data.get("v4", ())),
        v6=tuple(data.get("v6", ())),
        online=bool(data.get("online")),
        allow_out=tuple(data.get("allow_out", ())),
        deny_out=tuple(data.get("deny_out", ())),
        allow_private=tuple(data.get("allow_private", ())),
    )


def spec_of(
    online: bool, allow_out: tuple[str, ...], deny_out: tuple[str, ...], allow_private: tuple[str, ...]
) -> NetworkSpec:
    """The NetworkSpec a state file records (its texts read back through netpolicy's parser;
    a file no longer parseable is taken as outbound off, never as a wider policy)."""
    try:
        return NetworkSpec.parse(
            allow_internet_access=online,
            allow_public_traffic=False,
            allow_out=allow_out,
            deny_out=deny_out,
            allow_private=allow_private,
        )
    except PolicyError:
        return NetworkSpec(allow_internet_access=False, allow_public_traffic=False)


# ---------------------------------------------------------------------------------------
# ulogd2: the NFLOG group as JSON lines


def render_ulogd_config(state: EgressState) -> str:
    plugins = ("inppkt_NFLOG", "raw2packet_BASE", "filter_IFINDEX", "filter_IP2STR", "output_JSON")
    return "\n".join(
        [
            "# Rendered by sandboxes/backends/docker/egress/component.py; edits are lost.",
            "[global]",
            f'logfile="{state.path("ulogd.log")}"',
            "loglevel=5",
            *(f'plugin="{ULOGD_PLUGINS}/ulogd_{name}.so"' for name in plugins),
            "stack=log1:NFLOG,base1:BASE,ifi1:IFINDEX,ip2str1:IP2STR,json1:JSON",
            "[log1]",
            f"group={NFLOG_GROUP}",
            "[json1]",
            "sync=1",
            f'file="{state.path("refusals.json")}"',
            "",
        ]
    )


def _ulogd_pid(state: EgressState) -> int | None:
    try:
        with open(state.path("ulogd.pid")) as handle:
            pid = int(handle.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return pid if b"ulogd" in handle.read() else None
    except (OSError, ValueError):
        return None


def log_reader_running(state_dir: str = DEFAULT_STATE_DIR) -> bool:
    """Whether ulogd2 runs for this state folder (read-only)."""
    return _ulogd_pid(EgressState(state_dir)) is not None


def ensure_log_reader(state_dir: str = DEFAULT_STATE_DIR) -> str:
    """ulogd2 running on the table's NFLOG group (started when not). Returns words for status."""
    state = EgressState(state_dir)
    os.makedirs(state.folder, mode=0o700, exist_ok=True)
    if _ulogd_pid(state) is not None:
        return "ulogd2 reads refusals"
    binary = next((p for p in ULOGD_CANDIDATES if os.path.exists(p)), None)
    if binary is None:
        return "refusals are not read back: ulogd2 (Debian package ulogd2, ulogd2-json) is not installed"
    with open(state.path("ulogd.conf"), "w") as handle:
        handle.write(render_ulogd_config(state))
    done = subprocess.run(
        [binary, "-d", "-c", state.path("ulogd.conf"), "-p", state.path("ulogd.pid")],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if done.returncode != 0:
        return f"refusals are not read back: ulogd2 did not start: {(done.stderr or done.stdout).strip()[-200:]}"
    return "ulogd2 reads refusals"


# ---------------------------------------------------------------------------------------
# The capability


def present_keys() -> set[tuple[str, str]]:
    """The keys loaded in both sandbox maps now (`egress_rules.map_keys` form)."""
    keys: set[tuple[str, str]] = set()
    for family, name in (("4", MAP_V4), ("6", MAP_V6)):
        done = subprocess.run(
            ["nft", "-j", "list", "map", TABLE_FAMILY, TABLE_NAME, name], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            continue
        for item in json.loads(done.stdout).get("nftables", []):
            for element in (item.get("map") or {}).get("elem", []):
                key = element[0]["concat"] if isinstance(element, list) else None
                if key and len(key) == 2:
                    keys.add((family, f'"{key[0]}" . {key[1]}'))
    return keys


def table_set_names() -> list[str]:
    """The names of the table's sets now (terse: without their elements)."""
    done = subprocess.run(
        ["nft", "-j", "-t", "list", "sets", TABLE_FAMILY], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return []
    items = (item.get("set") or {} for item in json.loads(done.stdout).get("nftables", []))
    return [item["name"] for item in items if item.get("table") == TABLE_NAME and "name" in item]


def prune_network_sets(bridge: str) -> None:
    """A released network's per-network sets gone (`egress_rules.network_sets`); one still
    named by a chain stays (its delete fails alone)."""
    for name in network_sets_of(bridge, table_set_names()):
        with contextlib.suppress(RemoteError):
            apply(f"delete set {TABLE_FAMILY} {TABLE_NAME} {name}\n")


def apply(script: str) -> None:
    result = _nft(["-f", "-"], script)
    if not result.applied:
        raise RemoteError(ErrorKind.INTERNAL, f"the packet filter refused the policy: {result.detail}")


class DockerEgress(EgressCapability):
    """Live policy and refusals on a local engine (a part of `DockerBackend`)."""

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend
        self.state = EgressState(backend.egress_state_dir)

    def update(self, sandbox_id: str, network: NetworkSpec) -> None:
        self.backend._check_network_spec(network)
        container_id = self.backend._container_id(sandbox_id)
        if network.allow_internet_access:
            self.backend.ensure_firewall()
        space = self.backend.get(container_id).metadata.get(META_SPACE, "")
        name = self.backend.space_network_name(space)
        if network.allow_internet_access:
            self.backend.attach_space_network(container_id, name, space)
        else:
            self.backend.detach_space_network(container_id, name)
        self.apply_policy(container_id, name, network)
        if network.allow_internet_access:
            # HTTP rules and TLS by SNI: squid's part of the space network's policy (proxy.py).
            self.backend.update_http_rules(container_id, network)

    def apply_policy(self, container_id: str, network_name: str, network: NetworkSpec) -> None:
        """The nftables chain, the binding and the resolver for a container as it is now."""
        bridge, v4, v6 = self.backend.addresses_on(container_id, network_name)
        with self.state.locked():
            old = self.state.read(container_id)
            new = Binding(bridge, v4, v6) if network.allow_internet_access and (v4 or v6) else None
            self.backend.egress_apply(
                render_update(container_id, network, old.binding if old else None, new, present_keys())
            )
            self.state.write(
                SandboxState(
                    container_id,
                    bridge if new else (old.bridge if old else bridge),
                    v4 if new else (old.v4 if old else ()),
                    v6 if new else (old.v6 if old else ()),
                    new is not None,
                    tuple(str(e) for e in network.allow_out),
                    tuple(str(e) for e in network.deny_out),
                    tuple(str(e) for e in network.allow_private),
                )
            )
            gateway = self.backend.gateway_on(container_id, network_name)
            self._sync_resolver(bridge or (old.bridge if old else ""), gateway)
            port = self._sync_deny_filler()
            if new is not None and port is not None:
                # Before the policy is said to be in force: its denied names' addresses are refused.
                self._fill(port, network.domains("deny_out"))
        if new is not None:
            self.backend.point_resolver(container_id, gateway)

    def reapply(self, container_id: str) -> None:
        """The last policy again, on the container's current address (after a restart)."""
        state = self.state.read(container_id)
        space = self.backend.get(container_id).metadata.get(META_SPACE, "")
        name = self.backend.space_network_name(space)
        if state is None:
            # No policy recorded (a sandbox of an older console): on its space network it had
            # outbound on without lists, which is what it keeps until the console sends one.
            _, v4, v6 = self.backend.addresses_on(container_id, name)
            if not (v4 or v6):
                return
            spec = NetworkSpec(allow_internet_access=True, allow_public_traffic=False)
        else:
            spec = state.spec
        self.apply_policy(container_id, name, spec)

    def prune(self) -> None:
        """Forget the sandboxes whose containers are gone without the console (removed by
        hand or by a sweep): their chains, elements and resolver names."""
        with self.state.locked():  # a state written meanwhile is not judged on an older listing
            existing = self.backend.container_ids()
            for state in self.state.all():
                if state.sandbox_id not in existing:
                    with contextlib.suppress(RemoteError):
                        self.forget(state.sandbox_id)

    def restore(self) -> None:
        """Every known sandbox's chain and binding loaded again (after the table was lost)."""
        with contextlib.suppress(RemoteError):
            self.prune()
        networks = self.backend.console_networks()
        with self.state.locked():
            for bridge, (v4, v6) in networks.items():
                apply(render_network(bridge, v4, v6))
            present = present_keys()
            for state in self.state.all():
                binding = state.binding if state.online else None
                with contextlib.suppress(RemoteError):
                    apply(render_update(state.sandbox_id, state.spec, None, binding, present))
            with contextlib.suppress(RemoteError, OSError):
                self.refresh_deny_sets()  # the sets came back empty with the table

    def forget(self, container_id: str) -> None:
        """A deleted sandbox: its chain and elements gone, its resolver's names recomputed."""
        with self.state.locked():
            old = self.state.read(container_id)
            if old is None:
                return
            self.backend.egress_apply(render_removal(container_id, old.binding, present_keys()))
            self.state.remove(container_id)
            self._sync_resolver(old.bridge)
            self._sync_deny_filler()

    def _denied_domains(self) -> set[Domain]:
        return {domain for state in self.state.all() if state.online for domain in state.spec.domains("deny_out")}

    def _sync_deny_filler(self) -> int | None:
        """The deny filler running for every online sandbox's denied names (`dns.DenyFiller`):
        its port, None when there is nothing to resolve. Called with the state lock held."""
        return dns.DenyFiller(self.state.path("dns")).ensure(self.backend.dns_upstream, self._denied_domains())

    def _fill(self, port: int, domains: Iterable[Domain]) -> None:
        names = [d.name for d in dns.fillable(domains)]
        missing = set(names) - dns.lookup(port, names)
        if missing:  # the upstream did not answer in time: the next refresh asks again
            logger.warning("egress: denied names not resolved for the packet filter: %s", ", ".join(sorted(missing)))

    def refresh_deny_sets(self) -> None:
        """Every denied name resolved again into its sets (its addresses may have changed):
        after a restore, and every `DENY_REFRESH_S` while refusals are read."""
        with self.state.locked():
            port = self._sync_deny_filler()
            if port is not None:
                self._fill(port, self._denied_domains())

    def _sync_resolver(self, bridge: str, gateway: str = "") -> None:
        if not bridge:
            return
        members = [s for s in self.state.all() if s.bridge == bridge and s.online]
        resolver = dns.Resolver(self.state.path("dns"), bridge)
        if not members:
            resolver.stop()
            return
        specs = []
        for member in members:
            spec = member.spec
            specs.append((spec.allow_only, spec.domains("allow_out"), spec.domains("deny_out")))
        gateway = gateway or self.backend.gateway_of(bridge)
        if gateway:
            resolver.ensure(gateway, self.backend.dns_upstream, dns.policy_for(specs))

    # Refusals --------------------------------------------------------------------------

    def refusals(self, cursor: str) -> tuple[list[EgressRefusal], str]:
        positions = _decode_cursor(cursor)
        global _last_prune, _last_deny_refresh
        if time.monotonic() - _last_prune > PRUNE_EVERY_S:  # read every few seconds: prune now and then
            _last_prune = time.monotonic()
            with contextlib.suppress(RemoteError):
                self.prune()
        if time.monotonic() - _last_deny_refresh > DENY_REFRESH_S:
            _last_deny_refresh = time.monotonic()
            with contextlib.suppress(RemoteError, OSError):
                self.refresh_deny_sets()
        by_address: dict[tuple[str, str], SandboxState] = {}
        for state in self.state.all(include_gone=True):
            for address in (*state.v4, *state.v6):
                previous = by_address.get((state.bridge, address))
                if previous is None or state.online:
                    by_address[(state.bridge, address)] = state
        found: list[EgressRefusal] = []
        packets, positions["p"] = _read_packets(self.state.path("refusals.json"), positions.get("p", 0))
        for record in packets:
            prefix = str(record.get("oob.prefix", ""))
            source = by_address.get((str(record.get("oob.in", "")), str(record.get("src_ip", ""))))
            if not prefix.startswith(LOG_PREFIX) or source is None:
                continue
            destination = str(record.get("dest_ip", ""))
            if record.get("dest_port") is not None:
                port = record["dest_port"]
                destination = f"[{destination}]:{port}" if ":" in destination else f"{destination}:{port}"
            at = datetime.fromtimestamp(int(record.get("oob.time.sec", 0)), UTC)
            protocol = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6"}.get(int(record.get("ip.protocol", 0) or 0), "")
            found.append(
                EgressRefusal(at, source.sandbox_id, "packet", destination, prefix[len(LOG_PREFIX) :], protocol)
            )
        dns_positions = positions.setdefault("d", {})
        folder = self.state.path("dns")
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(folder)):
                if not name.endswith(".log"):
                    continue
                bridge = name[: -len(".log")]
                refused, dns_positions[bridge] = dns.read_refusals(
                    os.path.join(folder, name), dns_positions.get(bridge, 0)
                )
                last: tuple[str, str, datetime] | None = None
                for item in refused:
                    source = by_address.get((bridge, item.client))
                    if source is None or last == (source.sandbox_id, item.name, item.at):
                        continue  # unknown client, or the AAAA twin of the A query just seen
                    last = (source.sandbox_id, item.name, item.at)
                    found.append(
                        EgressRefusal(
                            item.at,
                            source.sandbox_id,
                            "dns",
                            item.name,
                            dns_refusal_rule(source, item.name, self.backend.dns_upstream),
                        )
                    )
        if self.backend._l7_possible():
            # Requests squid refused (HTTP rules, TLS by SNI): its log names the client address.
            by_client = {address: state.sandbox_id for (_, address), state in by_address.items()}
            refused_http, positions["h"] = self.backend.egress_proxy().refusals(
                str(positions.get("h", "")), sandbox_of=lambda address: by_client.get(address, "")
            )
            found += [refusal for refusal in refused_http if refusal.sandbox_id]
        found.sort(key=lambda r: r.at)
        return found, json.dumps(positions, separators=(",", ":"), sort_keys=True)


def dns_refusal_rule(state: SandboxState, name: str, upstream: str) -> str:
    """The words for a name the network's resolver refused, re-derived from the sandbox's lists.
    A name the lists let through was refused because no upstream resolver is set (the resolver
    then answers nothing): saying "not in the allow list" would send the admin to approve it."""
    spec = state.spec
    for pattern in spec.domains("deny_out"):
        if pattern.matches_name(name):
            return f"deny entry {pattern}"
    if not state.online:
        return "outbound off"
    if not upstream and (not spec.allow_only or any(p.matches_name(name) for p in spec.domains("allow_out"))):
        return NO_UPSTREAM_RULE
    return "not in the allow list"


def _decode_cursor(cursor: str) -> dict[str, Any]:
    if not cursor:
        return {"p": 0, "d": {}}
    try:
        data = json.loads(cursor)
    except ValueError:
        raise RemoteError(ErrorKind.INVALID, "malformed egress cursor") from None
    if not isinstance(data, dict):
        raise RemoteError(ErrorKind.INVALID, "malformed egress cursor")
    return data


def _read_packets(path: str, offset: int) -> tuple[list[dict[str, Any]], int]:
    try:
        size = os.path.getsize(path)
    except OSError:
        return [], 0
    if size < offset:
        offset = 0  # rotated
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n") + 1
    records = []
    for line in data[:end].splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records, offset + end


def main(argv: list[str] | None = None) -> int:
    """`python -m sandboxes.backends.docker.egress`: start ulogd2 on the table's NFLOG group
    (idempotent; `.ci/docker-up` and `make start` run it after loading the table)."""
    import argparse

    parser = argparse.ArgumentParser(description="Start the refusal log reader (ulogd2) of the Docker egress.")
    parser.add_argument("--state-dir", default=os.environ.get("EGRESS_STATE_DIR") or DEFAULT_STATE_DIR)
    args = parser.parse_args(argv)
    detail = ensure_log_reader(args.state_dir)
    print(detail)
    return 0 if detail == "ulogd2 reads refusals" else 1


if __name__ == "__main__":
    raise SystemExit(main())
