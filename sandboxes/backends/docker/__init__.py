"""The Docker adapter: one long-lived container per sandbox on a local or remote engine.

`backend` is the adapter, `image` the base template image builder (mmdebstrap +
`docker import`), `firewall` the host's packet filter for sandbox networks (nftables),
`egress_rules` each sandbox's chain, `dns` the space networks' resolvers (dnsmasq), `egress`
the live policy and the refusals read back (ulogd2); docs/network.md.

Imports nothing of the project but `sandboxes.backends` (the contract and the guard).
"""

from ..base import KindDescription

DESCRIPTION = KindDescription(
    label="Docker",
    endpoint_schemes=("tcp://", "unix://", "ssh://"),
    endpoint_rule="A Docker endpoint is empty (local socket), unix:///path, tcp://host:port or ssh://.",
    takes_dns_upstream=True,
    limits_processes=True,
    limits_disk=True,
    takes_disk_dir=True,
    takes_tls_client_cert=True,
)
