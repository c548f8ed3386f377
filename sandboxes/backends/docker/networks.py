"""Networks of Docker sandboxes on the engine: each space's own bridge network (IPv4, and IPv6
on a ULA subnet derived from its name) and its internal one for inbound-only sandboxes,
attaching a container to it and detaching it live, the addresses and gateways the egress
component needs, and removing a network no container uses any more.

Nothing here touches the host: the packet filter, resolvers and squid are the egress
component's (`egress`), which receives this part. Imports nothing of the project but the
contract and the adapter's `engine`, `common` and `egress.firewall` (the bridge names).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from contextlib import suppress
from typing import Any

import docker
import docker.errors
import docker.types

from ..base import RemoteError
from .common import KIND_NETWORK, KIND_SANDBOX, LABEL_NETWORK_SPACE, _engine_call
from .egress.firewall import bridge_name
from .engine import DockerEngine
from .image import LABEL_KIND, LABEL_MANAGED

INBOUND_NETWORK_SUFFIX = "-in"


class DockerNetworks:
    """The console's networks on one engine (receives the engine; `prefix`: the option
    `network`, the start of every network's name)."""

    def __init__(self, engine: DockerEngine, prefix: str) -> None:
        self.engine = engine
        self.prefix = prefix

    def space_network_name(self, space: str) -> str:
        """The bridge network of one space's online sandboxes ("nospace" for none)."""
        return f"{self.prefix}-{re.sub(r'[^A-Za-z0-9_.-]', '_', space)[:64] or 'nospace'}"

    def inbound_network_name(self, space: str) -> str:
        """The internal bridge network of one space's inbound-only sandboxes."""
        return self.space_network_name(space) + INBOUND_NETWORK_SUFFIX

    def is_space_network(self, name: str) -> bool:
        return name.startswith(self.prefix + "-") and not name.endswith(INBOUND_NETWORK_SUFFIX)

    def ensure_space_network(self, space: str) -> tuple[str, list[str], list[str]]:
        """The space's network, made when missing: (name, IPv4 gateways, IPv6 gateways)."""
        name = self.space_network_name(space)
        api = self.engine.api
        with _engine_call(f"network {name}"):
            try:
                return (name, *_gateways(dict(api.inspect_network(name))))
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
                    api.create_network(
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
                    api.create_network(name, driver="bridge", options=options, labels=labels)
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # created meanwhile by another worker
                    raise
            return (name, *_gateways(dict(api.inspect_network(name))))

    def ensure_internal_network(self, space: str) -> str:
        """The space's internal network (no route off the bridge), made when missing."""
        name = self.inbound_network_name(space)
        api = self.engine.api
        with _engine_call(f"network {name}"):
            try:
                api.inspect_network(name)
                return name
            except docker.errors.NotFound:
                pass
            try:
                api.create_network(
                    name,
                    driver="bridge",
                    internal=True,
                    options={
                        "com.docker.network.bridge.enable_icc": "false",
                        "com.docker.network.bridge.name": bridge_name(name),
                    },
                    labels={LABEL_MANAGED: "1", LABEL_KIND: KIND_NETWORK, LABEL_NETWORK_SPACE: space},
                )
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # created meanwhile by another worker
                    raise
        return name

    def subnets(self, name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(subnets, gateways) of a network (the gateway of a pool the engine chose: its
        subnet's first address)."""
        with _engine_call(f"network {name}"):
            ipam = self.engine.api.inspect_network(name).get("IPAM", {}).get("Config") or []
        sources = tuple(c["Subnet"] for c in ipam if c.get("Subnet"))
        gateways = tuple(
            c.get("Gateway") or str(next(ipaddress.ip_network(c["Subnet"], strict=False).hosts()))
            for c in ipam
            if c.get("Subnet")
        )
        return sources, gateways

    def remove_if_unused(self, name: str) -> tuple[list[str], list[str]] | None:
        """Remove a network once no container is on it, stopped ones included: its gateways
        (IPv4, IPv6) when it was removed now, None when it is in use, or gone already. The
        engine's address pools hold a few dozen networks and spaces can be many more; best
        effort, since a create may be using it again by now (then it stays)."""
        api = self.engine.api
        with suppress(RemoteError), _engine_call(f"releasing network {name}"):
            try:
                if api.containers(all=True, filters={"network": name}):
                    return None
                gateways = _gateways(api.inspect_network(name))
                api.remove_network(name)
            except docker.errors.APIError:
                return None  # already gone, or in use again
            return gateways
        return None

    def exists(self, name: str) -> bool:
        """Whether a network of this name is on the engine now."""
        with _engine_call(f"network {name}"):
            try:
                self.engine.api.inspect_network(name)
            except docker.errors.NotFound:
                return False
        return True

    def container_ids(self) -> set[str]:
        """Full ids of every console sandbox container on the engine, stopped ones included."""
        with _engine_call("listing sandboxes"):
            rows = self.engine.api.containers(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}={KIND_SANDBOX}"]}
            )
        return {str(row["Id"]) for row in rows}

    def console_networks(self) -> dict[str, tuple[list[str], list[str]]]:
        """Bridge → (IPv4 gateways, IPv6 gateways) of every console network on the engine."""
        with _engine_call("listing networks"):
            found = self.engine.api.networks(filters={"label": f"{LABEL_KIND}={KIND_NETWORK}"})
        networks = {}
        for row in found:
            with suppress(RemoteError), _engine_call(f"network {row['Name']}"):
                networks[bridge_name(row["Name"])] = _gateways(self.engine.api.inspect_network(row["Id"]))
        return networks

    def gateway_of(self, bridge: str) -> str:
        """The IPv4 gateway of the console network behind a bridge ("" when none is found)."""
        v4, _ = self.console_networks().get(bridge, ([], []))
        return v4[0] if v4 else ""

    def gateway_on(self, container_id: str, name: str) -> str:
        """The IPv4 gateway of a container's endpoint on a network ("" when not on it)."""
        return str((self.engine.networks_of(container_id).get(name) or {}).get("Gateway") or "")

    def attach(self, container_id: str, name: str) -> None:
        """On the network now (leaving "none" first): outbound switched on live."""
        attached = self.engine.networks_of(container_id)
        if name in attached:
            return
        with _engine_call(f"connecting sandbox {container_id} to {name}"):
            if "none" in attached:
                self.engine.api.disconnect_container_from_network(container_id, "none")
            self.engine.api.connect_container_to_network(container_id, name)

    def detach(self, container_id: str, name: str) -> None:
        """Off the network: outbound switched off live (an inbound-only internal network, if
        the sandbox is on one, stays)."""
        if name in self.engine.networks_of(container_id):
            with _engine_call(f"disconnecting sandbox {container_id}"):
                self.engine.api.disconnect_container_from_network(container_id, name, force=True)

    def addresses_on(self, container_id: str, name: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """(bridge, IPv4 addresses, IPv6 addresses) of a container on a network ((bridge, (), ())
        when it is not on it)."""
        endpoint = self.engine.networks_of(container_id).get(name) or {}
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
