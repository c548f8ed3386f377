"""The Docker adapter: one long-lived container per sandbox on a local or remote engine.

`backend` is the adapter, `image` the base template image builder (mmdebstrap +
`docker import`), `firewall` the host's packet filter for sandbox networks (nftables),
`egress_rules` each sandbox's chain, `dns` the space networks' resolvers (dnsmasq), `egress`
the live policy and the refusals read back (ulogd2); docs/network.md.

`settings` declares what it takes from the admins (`SCHEMA`) and its typed options.

Imports nothing of the project but `sandboxes.backends` (the contract and the guard).
"""

from .settings import SCHEMA as SCHEMA
from .settings import DockerOptions as DockerOptions
