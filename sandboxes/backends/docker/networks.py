"""Networks of Docker sandboxes: the space's own bridge network, the network capabilities, and
the host packet filter's state (the ruleset itself is in `firewall`).
"""

from __future__ import annotations

import ipaddress
import re
import threading
from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING

import docker
import docker.errors
import docker.tls

from ..base import (
    META_SPACE,
    BackendConfig,
    ErrorKind,
    NetworkCapabilities,
    NetworkSpec,
    RemoteError,
)
from .common import (
    KIND_NETWORK,
    LABEL_NETWORK_SPACE,
    _engine_call,
)
from .firewall import apply_ruleset, bridge_name, render_ruleset, table_present
from .image import (
    LABEL_KIND,
    LABEL_MANAGED,
)
from .proxy import DEFAULT_STATE_DIR, SpaceProxyPolicy, squid_available
from .squid import SquidProxy


class DockerNetworks:
    """Networks and the host packet filter (a part of `DockerBackend`)."""

    if TYPE_CHECKING:  # provided by DockerBackend
        config: BackendConfig
        host_firewall: str
        network_name: str
        _firewall_lock: threading.Lock

        @property
        def api(self) -> docker.APIClient: ...

        def engine_is_local(self) -> bool: ...

        def _container_id(self, sandbox_id: str) -> str: ...

    def firewall_status(self) -> str:
        """What keeps online sandboxes off the host's addresses, in words (never pretends).
        Read-only: it looks at the host's ruleset and changes nothing."""
        if self.host_firewall == "external":
            return "applied outside the console (host_firewall=external); not checked"
        if not self.engine_is_local():
            return "NOT in force: the engine is remote and the console can only filter its own host"
        present = table_present()
        if present.applied:
            return present.detail
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
            if table_present().applied:
                return
            result = apply_ruleset(render_ruleset())
            if not result.applied:
                raise RemoteError(
                    ErrorKind.UNSUPPORTED,
                    f"outbound needs the host packet filter, and it could not be applied: {result.detail} "
                    "(run the console as root with nftables installed, or apply it yourself and set "
                    "host_firewall=external; docs/security.md)",
                )

    def network_capabilities(self) -> NetworkCapabilities:
        return NetworkCapabilities(outbound_toggle=True, inbound_toggle=True, l7_rules=self._l7_possible())

    # HTTP rules and TLS by SNI (squid, see proxy.py) -----------------------------------

    def _l7_possible(self) -> bool:
        return self.host_firewall != "external" and self.engine_is_local() and squid_available()

    def egress_proxy(self) -> SquidProxy:
        """The host's squid (options `proxy_state_dir`, `proxy_dns`: comma-separated resolver
        addresses of this machine for squid's own lookups)."""
        proxy = getattr(self, "_egress_proxy", None)
        if proxy is None:
            options = self.config.options
            dns = tuple(a.strip() for a in options.get("proxy_dns", "127.0.0.1").split(",") if a.strip())
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
                self.api.remove_network(name)
            except docker.errors.APIError:
                return  # already gone, or in use again
        if self._l7_possible() and any(p.name == name for p in self.egress_proxy().policies()):
            self.egress_proxy().remove_space(name)  # squid stops listening on its gateway

    def _check_network_spec(self, network: NetworkSpec) -> None:
        unsupported = [
            name
            for name, value in (
                ("allow_out lists", network.allow_out),
                ("deny_out lists", network.deny_out),
                ("L7 rules", network.l7_rules and not self._l7_possible()),
            )
            if value
        ]
        if unsupported:
            raise RemoteError(
                ErrorKind.UNSUPPORTED,
                "the Docker backend only switches outbound internet on or off; it cannot honour "
                + ", ".join(unsupported),
            )

    def _network_mode(self, network: NetworkSpec, metadata: Mapping[str, str]) -> str:
        if not network.allow_internet_access:
            return "none"
        name = self.space_network_name(metadata.get(META_SPACE, ""))
        self._ensure_network(name, metadata.get(META_SPACE, ""))
        if network.l7_rules:
            self._apply_http_rules(name, network)
        return name

    def space_network_name(self, space: str) -> str:
        """The bridge network of one space's online sandboxes ("nospace" for none)."""
        return f"{self.network_name}-{re.sub(r'[^A-Za-z0-9_.-]', '_', space)[:64] or 'nospace'}"

    def _ensure_network(self, name: str, space: str) -> None:
        with _engine_call(f"network {name}"):
            try:
                self.api.inspect_network(name)
                return
            except docker.errors.NotFound:
                pass
            try:
                self.api.create_network(
                    name,
                    driver="bridge",
                    options={
                        # Sandboxes of one space do not talk to each other either.
                        "com.docker.network.bridge.enable_icc": "false",
                        # The name prefix is what the host packet filter matches on.
                        "com.docker.network.bridge.name": bridge_name(name),
                    },
                    labels={LABEL_MANAGED: "1", LABEL_KIND: KIND_NETWORK, LABEL_NETWORK_SPACE: space},
                )
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # created meanwhile by another worker
                    raise
