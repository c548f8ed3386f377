"""Docker egress as a component of its own: what a Docker sandbox may reach, enforced on the
engine's host, and the refusals read back.

Parts: `firewall` (the fixed nftables table), `rules` (each sandbox's chain), `dns` (one
dnsmasq per space network, and the deny filler), `proxy` and `squid` (HTTP rules and TLS by
SNI), `component` (the façade `DockerEgress`, the state folder, ulogd2 and the refusals).
Every part renders `netpolicy`'s typed entries; none parses an entry or holds a range list.
docs/network.md.
"""
