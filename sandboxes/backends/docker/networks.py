"""Networks of Docker sandboxes: the space's own bridge network (IPv4, and IPv6 on a ULA
subnet derived from its name), attaching a container to it and detaching it live, the network
capabilities, and the host packet filter's state (the ruleset itself is in `firewall`, each
sandbox's chain in `egress_rules`, applying them in `egress`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import threading
from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import docker.tls

from ..base import (
    META_SPACE,
    BackendConfig,
    ErrorKind,
    ExecResult,
    NetworkCapabilities,
    NetworkSpec,
    RemoteError,
)
from .common import (
    KIND_NETWORK,
    KIND_SANDBOX,
    LABEL_NETWORK_SPACE,
    _engine_call,
)
from .egress.component import DockerEgress, apply, ensure_log_reader, log_reader_running, prune_network_sets
from .egress.firewall import apply_ruleset, bridge_name, render_ruleset, table_current, table_present
from .egress.proxy import DEFAULT_STATE_DIR, SpaceProxyPolicy, squid_available
from .egress.rules import render_network
from .egress.squid import SquidProxy
from .image import (
    LABEL_KIND,
    LABEL_MANAGED,
)


class DockerNetworks:
    """Networks and the host packet filter (a part of `DockerBackend`)."""

    if TYPE_CHECKING:  # provided by DockerBackend
        config: BackendConfig
        host_firewall: str
        network_name: str
        dns_upstream: str
        egress_state_dir: str
        _firewall_lock: threading.Lock
        _firewall_loaded: bool

        @property
        def api(self) -> docker.APIClient: ...

        def engine_is_local(self) -> bool: ...

        def _container_id(self, sandbox_id: str) -> str: ...

        def _run(self, container_id: str, command: tuple[str, ...], *, user: str = "user") -> ExecResult: ...

    def firewall_status(self) -> str:
        """What keeps online sandboxes off the host's addresses, in words (never pretends).
        Read-only: it looks at the host's ruleset and changes nothing."""
        if self.host_firewall == "external":
            return "applied outside the console (host_firewall=external); not checked"
        if not self.engine_is_local():
            return "NOT in force: the engine is remote and the console can only filter its own host"
        present = table_present()
        if present.applied:
            upstream = self.dns_upstream or "none set: no name resolves (option dns_upstream)"
            reader = "ulogd2 running" if log_reader_running(self.egress_state_dir) else "ulogd2 NOT running"
            return f"{present.detail}; resolver upstream: {upstream}; refusal log: {reader}"
        return f"NOT in force: {present.detail} (applied at the next sandbox with outbound on, as root)"

    def ensure_firewall(self) -> None:
        """Make sure the host ruleset is loaded before an online sandbox exists (it names no
        network: new ones are covered by their bridge-name prefix). Loaded only when missing,
        so live set elements of the same table survive. In "auto" mode a ruleset that cannot
        be loaded refuses the online sandbox: its network would otherwise reach the host's
        own addresses and the metadata range."""
        if self.host_firewall == "external":
            return
        if not self.engine_is_local():
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
            ensure_log_reader(self.egress_state_dir)
            if self.enforces_lists():
                # Flushed behind the console's back (a firewall reload, an older console's
                # table, the ruleset loaded again by hand): once per process, and whenever the
                # table is found missing, every sandbox's chain and address comes back from
                # the state files (idempotent).
                DockerEgress(self).restore()  # type: ignore[arg-type]
            self._firewall_loaded = True

    def egress_apply(self, script: str) -> None:
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

    def enforces_lists(self) -> bool:
        """Whether the console itself applies each sandbox's chain (a local engine it filters)."""
        return self.host_firewall == "auto" and self.engine_is_local()

    def network_capabilities(self) -> NetworkCapabilities:
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
            l7_rules=self._l7_possible(),
            allow_private=True,
        )

    # HTTP rules and TLS by SNI (squid, see proxy.py) -----------------------------------

    def _l7_possible(self) -> bool:
        return self.host_firewall != "external" and self.engine_is_local() and squid_available()

    def egress_proxy(self) -> SquidProxy:
        """The host's squid (options `proxy_state_dir`, `proxy_dns`: comma-separated resolver
        addresses of this machine for squid's own lookups)."""
        proxy = getattr(self, "_egress_proxy", None)
        if proxy is None:
            options = self.config.options
            # squid asks port 53 only: the operator's upstream when it is a plain address.
            upstream = options.get("dns_upstream", "")
            default = upstream if upstream and "#" not in upstream else "127.0.0.1"
            dns = tuple(a.strip() for a in options.get("proxy_dns", default).split(",") if a.strip())
            proxy = SquidProxy(state_dir=options.get("proxy_state_dir", DEFAULT_STATE_DIR), dns_nameservers=dns)
            self._egress_proxy = proxy
        return proxy

    def _apply_http_rules(self, name: str, network: NetworkSpec) -> None:
        """Make squid enforce the space network's HTTP rules (before its sandbox starts)."""
        if not network.l7_rules and not self._l7_possible():
            return  # nothing to enforce, and no squid that could hold an older policy
        with _engine_call(f"network {name}"):
            ipam = self.api.inspect_network(name).get("IPAM", {}).get("Config") or []
        sources = tuple(c["Subnet"] for c in ipam if c.get("Subnet"))
        # The engine leaves Gateway out when it chose it: the subnet's first address.
        gateways = tuple(
            c.get("Gateway") or str(next(ipaddress.ip_network(c["Subnet"], strict=False).hosts()))
            for c in ipam
            if c.get("Subnet")
        )
        policy = SpaceProxyPolicy(
            name=name,
            sources=sources,
            gateways=gateways,
            rules=network.l7_rules,
            allow_out=network.allow_out,
            deny_out=network.deny_out,
            allow_private=network.allow_private,
        )
        result = self.egress_proxy().set_space(policy)  # no rules: the space leaves the proxy
        if not result.applied:
            raise RemoteError(ErrorKind.UNSUPPORTED, f"HTTP rules need the host's squid: {result.detail}")

    def _settle_http_rules(self, network: NetworkSpec) -> None:
        """After a sandbox started: squid binds a new network's IPv6 gateway once it settled."""
        if network.l7_rules and self._l7_possible():
            self.egress_proxy().settle()

    def update_http_rules(self, sandbox_id: str, network: NetworkSpec) -> None:
        """Apply a changed policy's HTTP rules to the running sandbox's space network now
        (squid reconfigures live; the lead wires this into the egress capability)."""
        if network.l7_rules and not self._l7_possible():
            self._check_network_spec(network)
        with _engine_call(f"sandbox {sandbox_id}"):
            networks = self.api.inspect_container(self._container_id(sandbox_id))["NetworkSettings"]["Networks"]
        for name in networks:
            if name.startswith(self.network_name + "-"):
                self._apply_http_rules(name, network)

    def _release_network(self, space: str) -> None:
        """Remove the space's network once no container is on it, stopped ones included.
        The engine's address pools hold a few dozen networks and spaces can be many more;
        best effort, since a create may be using it again by now (then it stays)."""
        name = self.space_network_name(space)
        with suppress(RemoteError), _engine_call(f"releasing network {name}"):
            try:
                if self.api.containers(all=True, filters={"network": name}):
                    return
                v4, v6 = _gateways(self.api.inspect_network(name))
                self.api.remove_network(name)
            except docker.errors.APIError:
                return  # already gone, or in use again
        if self._l7_possible() and any(p.name == name for p in self.egress_proxy().policies()):
            self.egress_proxy().remove_space(name)  # squid stops listening on its gateway

        if self.enforces_lists():
            with suppress(RemoteError):
                self.egress_apply(render_network(bridge_name(name), v4, v6, remove=True))
            prune_network_sets(bridge_name(name))

    def _check_network_spec(self, network: NetworkSpec) -> None:
        unsupported = []
        if not self.enforces_lists():
            unsupported += [
                name
                for name, value in (("allow_out lists", network.allow_out), ("deny_out lists", network.deny_out))
                if value
            ]
        if network.l7_rules and not self._l7_possible():
            unsupported.append("L7 rules")
        if unsupported:
            what = "" if self.enforces_lists() else " (lists need a local engine with host_firewall=auto)"
            raise RemoteError(
                ErrorKind.UNSUPPORTED, "the Docker backend cannot honour " + ", ".join(unsupported) + what
            )

    def _network_mode(self, network: NetworkSpec, metadata: Mapping[str, str]) -> tuple[str, str]:
        """(network mode, resolver address). Offline: no network at all (none is made for it:
        the engine's address pools are small); switched on later, `point_resolver` gives it
        its space network's resolver."""
        if not network.allow_internet_access:
            return "none", "127.0.0.1"
        name, gateway = self.space_network(metadata.get(META_SPACE, ""))
        if not self.enforces_lists():
            return name, "127.0.0.1"  # host_firewall=external: no console-managed resolver
        if network.l7_rules:
            self._apply_http_rules(name, network)
        return name, gateway or "127.0.0.1"

    def point_resolver(self, container_id: str, gateway: str) -> None:
        """A container created offline (resolver 127.0.0.1) and switched on live: its
        resolv.conf names the network's resolver directly (the engine wrote it anew when it
        connected or restarted the container)."""
        with _engine_call(f"sandbox {container_id}"):
            attrs = self.api.inspect_container(container_id)
        configured = attrs["HostConfig"].get("Dns") or []
        if not gateway or configured == [gateway] or attrs["State"].get("Paused"):
            return  # a paused one is pointed when it resumes (connect re-applies its policy)
        text = f"nameserver {gateway}\noptions ndots:0\n"
        result = self._run(container_id, ("sh", "-c", 'printf "%s" "$0" > /etc/resolv.conf', text), user="root")
        if result.exit_code != 0:
            raise RemoteError(ErrorKind.INTERNAL, f"could not point sandbox {container_id} at its resolver")

    def space_network_name(self, space: str) -> str:
        """The bridge network of one space's online sandboxes ("nospace" for none)."""
        return f"{self.network_name}-{re.sub(r'[^A-Za-z0-9_.-]', '_', space)[:64] or 'nospace'}"

    def _ensure_network(self, name: str, space: str) -> dict[str, Any]:
        """The space's network, made when missing; its inspection."""
        with _engine_call(f"network {name}"):
            try:
                return dict(self.api.inspect_network(name))
            except docker.errors.NotFound:
                pass
            options = {
                # Sandboxes of one space do not talk to each other either.
                "com.docker.network.bridge.enable_icc": "false",
                # The name prefix is what the host packet filter matches on.
                "com.docker.network.bridge.name": bridge_name(name),
            }
            labels = {LABEL_MANAGED: "1", LABEL_KIND: KIND_NETWORK, LABEL_NETWORK_SPACE: space}
            try:
                try:
                    self.api.create_network(
                        name,
                        driver="bridge",
                        options=options,
                        labels=labels,
                        enable_ipv6=True,
                        ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=ula_subnet(name))]),
                    )
                except docker.errors.APIError as exc:
                    if exc.status_code == 409:
                        raise
                    # No IPv6 on this engine (or the subnet is taken): IPv4 only.
                    self.api.create_network(name, driver="bridge", options=options, labels=labels)
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # created meanwhile by another worker
                    raise
            return dict(self.api.inspect_network(name))

    def space_network(self, space: str) -> tuple[str, str]:
        """The space's network (made when missing, and known to the packet filter): its name
        and its IPv4 gateway (the sandboxes' resolver)."""
        name = self.space_network_name(space)
        attrs = self._ensure_network(name, space)
        v4, v6 = _gateways(attrs)
        if self.enforces_lists():
            self.egress_apply(render_network(bridge_name(name), v4, v6))
        return name, (v4[0] if v4 else "")

    def container_ids(self) -> set[str]:
        """Full ids of every console sandbox container on the engine, stopped ones included."""
        with _engine_call("listing sandboxes"):
            rows = self.api.containers(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}={KIND_SANDBOX}"]}
            )
        return {str(row["Id"]) for row in rows}

    def console_networks(self) -> dict[str, tuple[list[str], list[str]]]:
        """Bridge → (IPv4 gateways, IPv6 gateways) of every console network on the engine."""
        with _engine_call("listing networks"):
            found = self.api.networks(filters={"label": f"{LABEL_KIND}={KIND_NETWORK}"})
        networks = {}
        for row in found:
            with suppress(RemoteError), _engine_call(f"network {row['Name']}"):
                networks[bridge_name(row["Name"])] = _gateways(self.api.inspect_network(row["Id"]))
        return networks

    def gateway_of(self, bridge: str) -> str:
        """The IPv4 gateway of the console network behind a bridge ("" when none is found)."""
        with _engine_call("listing networks"):
            found = self.api.networks(filters={"label": f"{LABEL_KIND}={KIND_NETWORK}"})
        for row in found:
            if bridge_name(row["Name"]) == bridge:
                with _engine_call(f"network {row['Name']}"):
                    v4, _ = _gateways(self.api.inspect_network(row["Id"]))
                return v4[0] if v4 else ""
        return ""

    def gateway_on(self, container_id: str, name: str) -> str:
        """The IPv4 gateway of a container's endpoint on a network ("" when not on it)."""
        with _engine_call(f"sandbox {container_id}"):
            attached = self.api.inspect_container(container_id)["NetworkSettings"]["Networks"] or {}
        return str((attached.get(name) or {}).get("Gateway") or "")

    def attach_space_network(self, container_id: str, name: str, space: str) -> None:
        """On the space's network now (leaving "none" first): outbound switched on live."""
        self.space_network(space)
        with _engine_call(f"sandbox {container_id}"):
            attached = self.api.inspect_container(container_id)["NetworkSettings"]["Networks"] or {}
        if name in attached:
            return
        with _engine_call(f"connecting sandbox {container_id} to {name}"):
            if "none" in attached:
                self.api.disconnect_container_from_network(container_id, "none")
            self.api.connect_container_to_network(container_id, name)

    def detach_space_network(self, container_id: str, name: str) -> None:
        """Off the space's network: outbound switched off live (an inbound-only internal
        network, if the sandbox is on one, stays)."""
        with _engine_call(f"sandbox {container_id}"):
            attached = self.api.inspect_container(container_id)["NetworkSettings"]["Networks"] or {}
        if name in attached:
            with _engine_call(f"disconnecting sandbox {container_id}"):
                self.api.disconnect_container_from_network(container_id, name, force=True)

    def addresses_on(self, container_id: str, name: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """(bridge, IPv4 addresses, IPv6 addresses) of a container on a network ((bridge, (), ())
        when it is not on it)."""
        with _engine_call(f"sandbox {container_id}"):
            attached = self.api.inspect_container(container_id)["NetworkSettings"]["Networks"] or {}
        endpoint = attached.get(name) or {}
        v4 = (endpoint["IPAddress"],) if endpoint.get("IPAddress") else ()
        v6 = (endpoint["GlobalIPv6Address"],) if endpoint.get("GlobalIPv6Address") else ()
        return bridge_name(name), v4, v6


def ula_subnet(name: str) -> str:
    """A unique-local /64 for a network, derived from its name (fd + 56 bits of a hash)."""
    digest = hashlib.sha256(b"sandbox-console:" + name.encode()).hexdigest()
    groups = ["fd" + digest[0:2], digest[2:6], digest[6:10], digest[10:14]]
    return ":".join(groups) + "::/64"


def _gateways(attrs: dict[str, Any]) -> tuple[list[str], list[str]]:
    v4: list[str] = []
    v6: list[str] = []
    for pool in (attrs.get("IPAM") or {}).get("Config") or []:
        subnet = pool.get("Subnet") or ""
        try:
            network = ipaddress.ip_network(subnet)
        except ValueError:
            continue
        gateway = pool.get("Gateway") or str(next(network.hosts()))
        (v4 if network.version == 4 else v6).append(gateway.split("/")[0])
    return v4, v6
