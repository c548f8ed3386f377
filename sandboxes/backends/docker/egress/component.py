"""`DockerEgress`, the façade of the Docker egress component: a space's network policy enforced
on the engine's host, live, and its refusals read back.

What it enforces with (each a part of this package, rendering `netpolicy`'s typed entries):
the host's packet filter (`firewall`, each sandbox's chain from `rules`), one resolver per
space network and the deny filler (`dns`), squid for HTTP rules (`proxy`, `squid`), ulogd2
for the refusals (`logs`), and the state folder saying who holds which address (`state`).

The façade (the adapter calls nothing else of the package):

- before a sandbox exists: `check(spec)`, `ensure_firewall()`, `prepare(space, spec)` (its
  space network made and known to the filter, its HTTP rules in squid), `settle(spec)`;
- a sandbox: `attach(container, network, spec)` after its start, `update(sandbox, spec)`
  (the contract's live switch), `resume(container)` after a restart, `detach(container)`
  at its delete;
- a network: `release(network, v4, v6)` once it is gone (chains' elements, set copies, its
  resolver process and files, squid's entry, the deny filler's lines);
- reads: `refusals(cursor)` (changes nothing), `reserved()`, `status()`, `capabilities()`;
- upkeep: `housekeeping()`, a periodic job (the console's beat, `egress_housekeeping`): gone
  containers' chains pruned, released networks' leftovers removed, denied names resolved
  again, resolvers that died restarted, logs rotated by size. Never a side effect of a read.

What runs as root and why: `nft` (the table of the host's packet filter needs
CAP_NET_ADMIN), each dnsmasq (its `nftset=` additions need CAP_NET_ADMIN, which dnsmasq
keeps as root only; it binds a gateway's port 53), ulogd2 (the NFLOG netlink group), squid
(started as root, it drops to `proxy`). The console process that calls this façade runs them,
so it runs as root on the engine's host (docs/network.md, docs/security.md).

Imports nothing of the project but the contract, `netpolicy` and the adapter's `engine` and
`networks` (for types: the façade receives them).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from netpolicy import AddressClass, Domain, Kind, reserved_class

from ...base import META_SPACE, ErrorKind, NetworkCapabilities, NetworkSpec, RemoteError
from ...capabilities import EgressCapability, EgressRefusal
from ..settings import DockerOptions
from . import dns, logs, refusals
from .firewall import (
    TABLE_FAMILY,
    TABLE_NAME,
    apply_ruleset,
    bridge_name,
    gateways_of,
    present_keys,
    render_ruleset,
    run_nft,
    table_current,
    table_present,
    table_set_names,
)
from .proxy import DEFAULT_STATE_DIR as DEFAULT_PROXY_STATE_DIR
from .proxy import SpaceProxyPolicy, squid_available
from .rules import (
    Binding,
    domain_sets,
    is_domain_set,
    network_sets_of,
    render_network,
    render_removal,
    render_update,
)
from .squid import SquidProxy, host_addresses
from .state import EgressState, SandboxState

if TYPE_CHECKING:
    from ..engine import DockerEngine
    from ..networks import DockerNetworks

logger = logging.getLogger(__name__)

DEFAULT_STATE_DIR = "/var/lib/sandbox-console/egress"
HOST_FIREWALL_MODES = ("auto", "external")
# Denied names are resolved again this often (their addresses change; the sets only grow).
DENY_REFRESH_S = 300.0
_DENY_STAMP = "deny-refresh.stamp"


@dataclass(frozen=True)
class EgressSettings:
    """The adapter options the component reads (docs/network.md, README's table)."""

    host_firewall: str = "auto"
    dns_upstream: str = ""
    state_dir: str = DEFAULT_STATE_DIR
    proxy_state_dir: str = DEFAULT_PROXY_STATE_DIR
    proxy_dns: tuple[str, ...] = ("127.0.0.1",)
    log_max_bytes: int = logs.DEFAULT_LOG_MAX_BYTES

    @classmethod
    def from_options(cls, given: DockerOptions | Mapping[str, str]) -> EgressSettings:
        options = DockerOptions.parse(given)
        host_firewall = options.host_firewall
        if host_firewall not in HOST_FIREWALL_MODES:
            raise RemoteError(
                ErrorKind.INVALID, f"option 'host_firewall' must be one of {', '.join(HOST_FIREWALL_MODES)}"
            )
        upstream = dns.check_upstream(options.dns_upstream)
        # squid asks port 53 only: the operator's upstream when it is a plain address.
        default_dns = upstream if upstream and "#" not in upstream else "127.0.0.1"
        proxy_dns = options.proxy_dns or (default_dns,)
        log_max = logs.DEFAULT_LOG_MAX_BYTES if options.egress_log_max_bytes is None else options.egress_log_max_bytes
        return cls(
            host_firewall=host_firewall,
            dns_upstream=upstream,
            state_dir=options.egress_state_dir or DEFAULT_STATE_DIR,
            proxy_state_dir=options.proxy_state_dir or DEFAULT_PROXY_STATE_DIR,
            proxy_dns=proxy_dns,
            log_max_bytes=max(log_max, 1024),
        )


def apply(script: str) -> None:
    """One `nft -f` transaction; RemoteError when the packet filter refuses it."""
    result = run_nft(["-f", "-"], script)
    if not result.applied:
        raise RemoteError(ErrorKind.INTERNAL, f"the packet filter refused the policy: {result.detail}")


class DockerEgress(EgressCapability):
    """The Docker egress component (see the module docstring). Receives the engine (container
    inspection, commands) and the networks part (the space networks, addresses, gateways)."""

    def __init__(self, engine: DockerEngine, networks: DockerNetworks, settings: EgressSettings) -> None:
        self.engine = engine
        self.networks = networks
        self.settings = settings
        self.state = EgressState(settings.state_dir)
        self.proxy = SquidProxy(state_dir=settings.proxy_state_dir, dns_nameservers=settings.proxy_dns)
        self._firewall_lock = threading.Lock()
        self._firewall_loaded = False

    # What it can do ----------------------------------------------------------------------

    def enforces_lists(self) -> bool:
        """Whether the console itself applies each sandbox's chain (a local engine it filters)."""
        return self.settings.host_firewall == "auto" and self.engine.is_local()

    def l7_possible(self) -> bool:
        return self.settings.host_firewall != "external" and self.engine.is_local() and squid_available()

    def capabilities(self) -> NetworkCapabilities:
        if not self.enforces_lists():
            return NetworkCapabilities(outbound_toggle=True, inbound_toggle=True)
        return NetworkCapabilities(
            outbound_toggle=True,
            allow_out_cidr=True,
            allow_out_domain=True,
            deny_out_cidr=True,
            deny_out_domain=True,
            inbound_toggle=True,
            live_update=True,
            l7_rules=self.l7_possible(),
            allow_private=True,
        )

    def check(self, spec: NetworkSpec) -> None:
        """Refuse (`unsupported`) a spec this host cannot honour, before anything is made."""
        unsupported = []
        if not self.enforces_lists():
            unsupported += [
                name
                for name, value in (
                    ("allow_out lists", spec.allow_out),
                    ("deny_out lists", spec.deny_out),
                    ("private exceptions", spec.allow_private),
                )
                if value
            ]
        if spec.l7_rules and not self.l7_possible():
            unsupported.append("L7 rules")
        if unsupported:
            what = "" if self.enforces_lists() else " (lists need a local engine with host_firewall=auto)"
            raise RemoteError(
                ErrorKind.UNSUPPORTED, "the Docker backend cannot honour " + ", ".join(unsupported) + what
            )

    def status(self) -> str:
        """What keeps online sandboxes off the host's addresses, in words (never pretends).
        Read-only: it looks at the host's ruleset and changes nothing."""
        if self.settings.host_firewall == "external":
            return "applied outside the console (host_firewall=external); not checked"
        if not self.engine.is_local():
            return "NOT in force: the engine is remote and the console can only filter its own host"
        present = table_present()
        if present.applied:
            upstream = self.settings.dns_upstream or "none set: no name resolves (option dns_upstream)"
            reader = "ulogd2 running" if logs.log_reader_running(self.state.folder) else "ulogd2 NOT running"
            return f"{present.detail}; resolver upstream: {upstream}; refusal log: {reader}"
        return f"NOT in force: {present.detail} (applied at the next sandbox with outbound on, as root)"

    # Before a sandbox exists ----------------------------------------------------------------

    def ensure_firewall(self) -> None:
        """Make sure the host ruleset is loaded before an online sandbox exists (it names no
        network: new ones are covered by their bridge-name prefix). Loaded only when missing,
        so live set elements of the same table survive. In "auto" mode a ruleset that cannot
        be loaded refuses the online sandbox: its network would otherwise reach the host's
        own addresses and the metadata range."""
        if self.settings.host_firewall == "external":
            return
        if not self.engine.is_local():
            raise RemoteError(
                ErrorKind.UNSUPPORTED,
                "outbound needs the host packet filter, which the console applies only to a "
                "local engine; apply it on the engine's host and set host_firewall=external "
                "(docs/security.md)",
            )
        with self._firewall_lock:
            present = table_current()
            if self._firewall_loaded and present:
                return
            # Idempotent and keeping live elements: loaded once per process, so a table of an
            # older console gains the sets and maps this one needs.
            result = apply_ruleset(render_ruleset())
            if not result.applied:
                raise RemoteError(
                    ErrorKind.UNSUPPORTED,
                    f"outbound needs the host packet filter, and it could not be applied: {result.detail} "
                    "(run the console as root with nftables installed, or apply it yourself and set "
                    "host_firewall=external; docs/security.md)",
                )
            logs.ensure_log_reader(self.state.folder)
            if self.enforces_lists():
                # Flushed behind the console's back (a firewall reload, an older console's
                # table, the ruleset loaded again by hand): once per process, and whenever the
                # table is found missing, every sandbox's chain and address comes back from
                # the state files (idempotent).
                self._restore()
            self._firewall_loaded = True

    def _apply(self, script: str) -> None:
        """One nftables transaction of the egress state; when the table is gone or is an
        older console's, it is loaded (and restored) first and the transaction tried again."""
        try:
            apply(script)
        except RemoteError as exc:
            if "No such file or directory" not in exc.message:
                raise
            self._firewall_loaded = False
            self.ensure_firewall()
            apply(script)

    def prepare(self, space: str, spec: NetworkSpec) -> tuple[str, str]:
        """The space network of an online sandbox about to be made: created when missing,
        known to the packet filter. (name, the sandboxes' resolver). The sandbox's HTTP rules
        reach squid at `attach`, once it has its addresses (until its chain is in, the bridge
        drops everything from a new address)."""
        name, v4, v6 = self.networks.ensure_space_network(space)
        if not self.enforces_lists():
            return name, "127.0.0.1"  # host_firewall=external: no console-managed resolver
        # Under the state lock: a late `release` of the network's previous incarnation either
        # sees this one on the engine and leaves it, or is done before these lines.
        with self.state.locked():
            self._apply(render_network(bridge_name(name), v4, v6))
        return name, (v4[0] if v4 else "127.0.0.1")

    def settle(self, spec: NetworkSpec) -> None:
        """After a sandbox started: squid binds a new network's IPv6 gateway once it settled."""
        if spec.l7_rules and self.l7_possible():
            self.proxy.settle()

    # Sandboxes ------------------------------------------------------------------------------

    def attach(self, container_id: str, network_name: str, spec: NetworkSpec) -> None:
        """The nftables chain, the binding and the resolver for a container as it is now."""
        bridge, v4, v6 = self.networks.addresses_on(container_id, network_name)
        with self.state.locked():
            old = self.state.read(container_id)
            new = Binding(bridge, v4, v6) if spec.allow_internet_access and (v4 or v6) else None
            # squid first: refused, nothing of the new policy is in (squid keeps the old one).
            self._sync_http_rules(container_id, network_name, spec, new)
            self._apply(render_update(container_id, spec, old.binding if old else None, new, present_keys()))
            # Offline: the last binding is kept (refusals logged before still find it).
            self.state.write(
                SandboxState.of(
                    container_id,
                    bridge if new else (old.bridge if old else bridge),
                    v4 if new else (old.v4 if old else ()),
                    v6 if new else (old.v6 if old else ()),
                    new is not None,
                    spec,
                )
            )
            gateway = self.networks.gateway_on(container_id, network_name)
            self._sync_resolver(bridge or (old.bridge if old else ""), gateway)
            port = self._sync_deny_filler()
            if new is not None and port is not None:
                # Before the policy is said to be in force: its denied names' addresses are refused.
                self._fill(port, spec.domains("deny_out"))
        if new is not None:
            self._point_resolver(container_id, gateway)

    def update(self, sandbox_id: str, network: NetworkSpec) -> None:
        self.check(network)
        container_id = self.engine.container_id(sandbox_id)
        if network.allow_internet_access:
            self.ensure_firewall()
        space = self.engine.inspect_sandbox(container_id).metadata.get(META_SPACE, "")
        name = self.networks.space_network_name(space)
        if network.allow_internet_access:
            self.prepare(space, NetworkSpec(allow_internet_access=True, allow_public_traffic=False))
            self.networks.attach(container_id, name)
        else:
            self.networks.detach(container_id, name)
        self.attach(container_id, name, network)
        if not network.allow_internet_access:
            # The network it left is released as at a delete when no container is on it.
            gateways = self.networks.remove_if_unused(name)
            if gateways is not None:
                self.release(name, *gateways)

    def recorded(self, container_id: str) -> bool:
        """Whether a policy was ever attached to the sandbox (its record is on this host, for
        every process). Without one it was made on no network and never switched on: there
        is nothing to re-apply at a resume, nor a network to release at its delete."""
        return self.enforces_lists() and self.state.read(container_id) is not None

    def resume(self, container_id: str) -> None:
        """The last policy again, on the container's current address (after a restart)."""
        state = self.state.read(container_id)
        space = self.engine.inspect_sandbox(container_id).metadata.get(META_SPACE, "")
        name = self.networks.space_network_name(space)
        if state is None:
            # No policy recorded (a sandbox of an older console): on its space network it had
            # outbound on without lists, which is what it keeps until the console sends one.
            _, v4, v6 = self.networks.addresses_on(container_id, name)
            if not (v4 or v6):
                return
            spec = NetworkSpec(allow_internet_access=True, allow_public_traffic=False)
        else:
            spec = state.spec
        self.attach(container_id, name, spec)

    def detach(self, container_id: str) -> None:
        """A deleted sandbox: its chain and elements gone, its resolver's names recomputed."""
        with self.state.locked():
            self._drop_http_rules(container_id)
            old = self.state.read(container_id)
            if old is None:
                return
            self._apply(render_removal(container_id, old.binding, present_keys()))
            self.state.remove(container_id)
            self._sync_resolver(old.bridge)
            self._sync_deny_filler()

    def _point_resolver(self, container_id: str, gateway: str) -> None:
        """A container created offline (resolver 127.0.0.1) and switched on live: its
        resolv.conf names the network's resolver directly (the engine wrote it anew when it
        connected or restarted the container)."""
        with contextlib.suppress(RemoteError):
            info = self.engine.api.inspect_container(container_id)
            configured = info["HostConfig"].get("Dns") or []
            if not gateway or configured == [gateway] or info["State"].get("Paused"):
                return  # a paused one is pointed when it resumes (connect re-applies its policy)
        text = f"nameserver {gateway}\noptions ndots:0\n"
        result = self.engine.run(container_id, ("sh", "-c", 'printf "%s" "$0" > /etc/resolv.conf', text), user="root")
        if result.exit_code != 0:
            raise RemoteError(ErrorKind.INTERNAL, f"could not point sandbox {container_id} at its resolver")

    # HTTP rules and TLS by SNI (squid) ---------------------------------------------------

    def _sync_http_rules(
        self, container_id: str, network_name: str, spec: NetworkSpec, binding: Binding | None
    ) -> None:
        """Make squid enforce this sandbox's own HTTP rules and lists (a session's grants
        included) for its own addresses on the space network; a sandbox without rules, or
        offline, leaves squid (its ports 80/443 are no longer redirected). Squid decides per
        sandbox: another sandbox of the space never gets these lists."""
        if not (spec.l7_rules and binding is not None):
            self._drop_http_rules(container_id)
            return
        _, gateways = self.networks.subnets(network_name)
        policy = SpaceProxyPolicy(
            name=container_id,
            sources=(*(f"{a}/32" for a in binding.v4), *(f"{a}/128" for a in binding.v6)),
            gateways=gateways,
            rules=spec.l7_rules,
            allow_out=spec.allow_out,
            deny_out=spec.deny_out,
            allow_private=spec.allow_private,
            network=network_name,
        )
        result = self.proxy.set_space(policy)
        if not result.applied:
            raise RemoteError(ErrorKind.UNSUPPORTED, f"HTTP rules need the host's squid: {result.detail}")

    def _drop_http_rules(self, container_id: str) -> None:
        """The sandbox's squid policy gone, when it had one (nothing is run otherwise)."""
        if self.proxy.holds(container_id):
            result = self.proxy.remove_space(container_id)
            if not result.applied:
                logger.warning("egress: squid kept sandbox %s's HTTP rules: %s", container_id, result.detail)

    def update_http_rules(self, sandbox_id: str, spec: NetworkSpec) -> None:
        """Apply a changed policy's HTTP rules to the running sandbox now (squid reconfigures
        live); the packet filter's chain is `attach`'s."""
        if spec.l7_rules and not self.l7_possible():
            self.check(spec)
        container_id = self.engine.container_id(sandbox_id)
        for name in self.engine.networks_of(container_id):
            if self.networks.is_space_network(name):
                bridge, v4, v6 = self.networks.addresses_on(container_id, name)
                online = spec.allow_internet_access and (v4 or v6)
                with self.state.locked():
                    self._sync_http_rules(container_id, name, spec, Binding(bridge, v4, v6) if online else None)

    # Networks -------------------------------------------------------------------------------

    def release(self, network_name: str, v4: Iterable[str] = (), v6: Iterable[str] = ()) -> None:
        """A space network that is gone: everything the host kept for it removed — its bridge's
        elements (managed, gateways, any sandbox binding left), the chains of sandboxes still
        recorded on it, its per-network set copies and the shared sets no chain names any
        more, its resolver (process and files), its squid entry, and the deny filler's names
        only its sandboxes denied. Idempotent.

        A network made again under the same name (a create of the space ran between the
        network's removal and this call) is left alone: the bridge, its chains and its
        resolver are the new network's now."""
        bridge = bridge_name(network_name)
        with self.state.locked():
            if self.networks.exists(network_name):
                logger.info("egress: network %s exists again; its host state is kept", network_name)
                return
            for sandbox in self.state.all(include_gone=True):
                if sandbox.bridge != bridge:
                    continue
                with contextlib.suppress(RemoteError):
                    self._apply(render_removal(sandbox.sandbox_id, sandbox.binding, present_keys()))
                self.state.drop(sandbox.sandbox_id)
            if self.enforces_lists() or table_present().applied:
                known4, known6 = gateways_of(bridge)
                with contextlib.suppress(RemoteError):
                    apply(
                        render_network(
                            bridge, [*dict.fromkeys([*v4, *known4])], [*dict.fromkeys([*v6, *known6])], remove=True
                        )
                    )
                self._prune_sets(bridge)
            dns.Resolver(self.state.path("dns"), bridge).remove()
            self._sync_deny_filler()
            self.proxy.remove_network(network_name)  # its sandboxes' policies; squid stops listening there

    def _prune_sets(self, bridge: str = "") -> int:
        """`bridge`'s per-network sets, and the shared domain sets no recorded sandbox names,
        deleted (one a chain still names stays: its delete fails alone). How many went."""
        names = table_set_names()
        wanted = {
            name
            for sandbox in self.state.all()
            for domain in (*sandbox.spec.domains("allow_out"), *sandbox.spec.domains("deny_out"))
            for name in domain_sets(domain)
        }
        doomed = network_sets_of(bridge, names) if bridge else []
        doomed += [n for n in names if is_domain_set(n) and n not in wanted]
        gone = 0
        for name in doomed:
            with contextlib.suppress(RemoteError):
                apply(f"delete set {TABLE_FAMILY} {TABLE_NAME} {name}\n")
                gone += 1
        return gone

    # Resolvers ------------------------------------------------------------------------------

    def _denied_domains(self) -> set[Domain]:
        return {domain for sandbox in self.state.all() if sandbox.online for domain in sandbox.spec.domains("deny_out")}

    def _sync_deny_filler(self) -> int | None:
        """The deny filler running for every online sandbox's denied names (`dns.DenyFiller`):
        its port, None (and its files gone) when there is nothing to resolve. Called with the
        state lock held."""
        return dns.DenyFiller(self.state.path("dns")).ensure(self.settings.dns_upstream, self._denied_domains())

    def _fill(self, port: int, domains: Iterable[Domain]) -> set[str]:
        names = [d.name for d in dns.fillable(domains)]
        answered = dns.lookup(port, names)
        missing = set(names) - answered
        if missing:  # the upstream did not answer in time: the next refresh asks again
            logger.warning("egress: denied names not resolved for the packet filter: %s", ", ".join(sorted(missing)))
        return answered

    def refresh_deny_sets(self) -> int:
        """Every denied name resolved again into its sets (its addresses may have changed):
        after a restore, and from housekeeping every `DENY_REFRESH_S`. How many answered."""
        with self.state.locked():
            port = self._sync_deny_filler()
            if port is None:
                return 0
            return len(self._fill(port, self._denied_domains()))

    def _sync_resolver(self, bridge: str, gateway: str = "") -> bool:
        """The resolver of `bridge` running for its online members (stopped, its files gone,
        without one); whether it was (re)started."""
        if not bridge:
            return False
        members = [s for s in self.state.all() if s.bridge == bridge and s.online]
        resolver = dns.Resolver(self.state.path("dns"), bridge)
        if not members:
            resolver.remove()
            return False
        specs = [(m.spec.allow_only, m.spec.domains("allow_out"), m.spec.domains("deny_out")) for m in members]
        gateway = gateway or self.networks.gateway_of(bridge)
        if not gateway:
            return False
        return resolver.ensure(gateway, self.settings.dns_upstream, dns.policy_for(specs))

    # Reads ----------------------------------------------------------------------------------

    def refusals(self, cursor: str) -> tuple[list[EgressRefusal], str]:
        proxy = self.proxy.refusals if self.l7_possible() else None
        return refusals.read(self.state, cursor, upstream=self.settings.dns_upstream, proxy=proxy)

    def reserved(self) -> tuple[AddressClass, ...]:
        """The host's own addresses (`the Docker host`) and every sandbox bridge's network
        (`other sandbox`), as this host has them now. Read-only."""
        found: list[AddressClass] = []
        for text in host_addresses():
            network = ipaddress.ip_network(text, strict=False)
            if "/" in text:
                found.append(reserved_class(network, Kind.SANDBOX, "a sandbox network of this host"))
            else:
                found.append(reserved_class(network, Kind.HOST, "an address of the Docker host"))
        return tuple(found)

    # Upkeep ---------------------------------------------------------------------------------

    def housekeeping(self) -> str:
        """The periodic upkeep (see the module docstring); one line for the log."""
        if not self.enforces_lists():
            return "egress housekeeping: nothing to do (the console enforces no lists here)"
        pruned = released = restarted = refreshed = rotated = 0
        with self.state.locked():
            existing = self.networks.container_ids()
            for sandbox in self.state.all():
                if sandbox.sandbox_id not in existing:
                    with contextlib.suppress(RemoteError):
                        self.detach(sandbox.sandbox_id)
                        pruned += 1
            # squid policies of sandboxes gone without a record left (written by this backend:
            # they name their network).
            for policy in self.proxy.policies():
                if policy.network and policy.name not in existing:
                    self._drop_http_rules(policy.name)
            self.state.prune_gone()
            live = self.networks.console_networks()
            for bridge in self._known_bridges() - set(live):
                self.release_bridge(bridge)
                released += 1
            for bridge in {s.bridge for s in self.state.all() if s.online and s.bridge in live}:
                with contextlib.suppress(RemoteError):
                    restarted += self._sync_resolver(bridge, live[bridge][0][0] if live[bridge][0] else "")
            stamp = self.state.path(_DENY_STAMP)
            if not os.path.exists(stamp) or time.time() - os.path.getmtime(stamp) > DENY_REFRESH_S:
                with contextlib.suppress(RemoteError, OSError):
                    refreshed = self.refresh_deny_sets()
                    with open(stamp, "w"):
                        pass
            for path in self._logs():
                rotated += logs.rotate(path, self.settings.log_max_bytes)
        return (
            f"egress housekeeping: pruned {pruned} sandbox(es), released {released} network(s), "
            f"restarted {restarted} resolver(s), refreshed {refreshed} denied name(s), rotated {rotated} log(s)"
        )

    def release_bridge(self, bridge: str) -> None:
        """`release` for a bridge whose network is gone already (its name is not known)."""
        with self.state.locked():
            for sandbox in self.state.all(include_gone=True):
                if sandbox.bridge == bridge:
                    with contextlib.suppress(RemoteError):
                        apply(render_removal(sandbox.sandbox_id, sandbox.binding, present_keys()))
                    self.state.drop(sandbox.sandbox_id)
            with contextlib.suppress(RemoteError):
                apply(render_network(bridge, *gateways_of(bridge), remove=True))
            self._prune_sets(bridge)
            dns.Resolver(self.state.path("dns"), bridge).remove()
            self._sync_deny_filler()
            for policy in self.proxy.policies():
                if policy.network and bridge_name(policy.network) == bridge:
                    self._drop_http_rules(policy.name)

    def _known_bridges(self) -> set[str]:
        """Bridges the host keeps state for: recorded sandboxes, resolvers' files."""
        bridges = {s.bridge for s in self.state.all(include_gone=True) if s.bridge}
        with contextlib.suppress(OSError):
            bridges |= {
                name.split(".", 1)[0]
                for name in os.listdir(self.state.path("dns"))
                if name.startswith("sbx-") and "." in name
            }
        return bridges

    def _logs(self) -> list[str]:
        found = [self.state.path(logs.REFUSALS), str(self.proxy.access_log)]
        with contextlib.suppress(OSError):
            folder = self.state.path("dns")
            found += [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith((".log", ".events"))]
        return found

    def _restore(self) -> None:
        """Every known sandbox's chain and binding loaded again (after the table was lost)."""
        networks = self.networks.console_networks()
        with self.state.locked():
            existing = self.networks.container_ids()
            for bridge, (v4, v6) in networks.items():
                apply(render_network(bridge, v4, v6))
            present = present_keys()
            for sandbox in self.state.all():
                if sandbox.sandbox_id not in existing:
                    continue  # housekeeping prunes it
                binding = sandbox.binding if sandbox.online else None
                with contextlib.suppress(RemoteError):
                    apply(render_update(sandbox.sandbox_id, sandbox.spec, None, binding, present))
            with contextlib.suppress(RemoteError, OSError):
                self.refresh_deny_sets()  # the sets came back empty with the table


def main(argv: list[str] | None = None) -> int:
    """`python -m sandboxes.backends.docker.egress`: start ulogd2 on the table's NFLOG group
    (idempotent; `.ci/docker-up` and `make start` run it after loading the table)."""
    import argparse

    parser = argparse.ArgumentParser(description="Start the refusal log reader (ulogd2) of the Docker egress.")
    parser.add_argument("--state-dir", default=os.environ.get("EGRESS_STATE_DIR") or DEFAULT_STATE_DIR)
    args = parser.parse_args(argv)
    detail = logs.ensure_log_reader(args.state_dir)
    print(detail)
    return 0 if detail == "ulogd2 reads refusals" else 1
