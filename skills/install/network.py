"""The network a skill-image build sandbox gets: off, unless a package source must be reached.

A build sandbox runs the console's own install steps, not an agent's code, so its network
follows what those steps need and never the space's network policy (that policy is for the
space's sessions; docs/skills.md, "The build sandbox's network"):

- no pip index URL, npm registry URL or apt URL the skills need: outbound off, as always
  (a wheel folder or an apt repository folder is copied in);
- otherwise outbound to the sources' hosts, as tightly as the backend allows: with allow
  lists `allow_out=[host]` (a non-empty allow list lets out only its entries, so nothing
  else is reachable; the adapters translate it, e.g. E2B adds its deny-all); with only
  the on/off switch outbound on, and the job log says it could not be limited.

Pure: the backend's capabilities and the package sources in, a `NetworkSpec` and the
sentence for the job log out. Decided from capabilities, never from the backend's kind.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from netpolicy import Cidr, Entry, PolicyError, entry_for, opened_range, parse_domain
from sandboxes.backends.base import NetworkCapabilities, NetworkSpec

from .packages import PackageSources, redact_userinfo, source_host_port
from .steps import SkillPayload, StepFailed

OFFLINE = NetworkSpec(allow_internet_access=False, allow_public_traffic=False)


@dataclass(frozen=True)
class SourceHost:
    """A package source the build must reach: what it is, its URL and the host it names."""

    what: str  # "the pip index", "the npm registry"
    url: str
    host: str  # a name or an IP literal (no brackets), as in the URL

    @property
    def address(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    @property
    def allow_entry(self) -> Entry:
        """The allow-list entry: a one-address CIDR, else the name (netpolicy's parser: the name
        and its subdomains)."""
        address = self.address
        return entry_for(address) if address is not None else parse_domain(self.host)


@dataclass(frozen=True)
class BuildNetwork:
    spec: NetworkSpec
    description: str  # one line for the job log: which network, and why


def sources_to_reach(sources: PackageSources, skills: Sequence[SkillPayload]) -> list[SourceHost]:
    """The package sources these skills' dependencies will be fetched from over the network.

    The pip index only when a skill declares pip dependencies and no find-links folder is set
    (the folder wins: it is copied in and needs no network); the npm registry and the apt URL
    likewise, only when a skill declares npm dependencies (Debian packages) and no tarball
    (repository) folder is set. A source the skills do not need is never opened.
    """
    needed = []
    if sources.pip_uses_index and any(skill.pip_requirements for skill in skills):
        needed.append(_source("the pip index", sources.pip_index_url))
    if sources.npm_uses_registry and any(skill.npm_packages for skill in skills):
        needed.append(_source("the npm registry", sources.npm_registry_url))
    if sources.apt_uses_url and any(skill.debian_packages for skill in skills):
        needed.append(_source("the apt source", sources.apt_url))
    return needed


def _source(what: str, url: str) -> SourceHost:
    try:
        host, _ = source_host_port(url)
    except ValueError as exc:
        raise StepFailed("create", f"{what} URL {redact_userinfo(url)!r} cannot be used: {exc}") from None
    return SourceHost(what, url, host)


def build_network(caps: NetworkCapabilities, backend_label: str, needed: Sequence[SourceHost]) -> BuildNetwork:
    """The build sandbox's network for these sources on a backend with these capabilities."""
    if not needed:
        return BuildNetwork(OFFLINE, "build sandbox: outbound network off (no package source to reach over it)")
    hosts = ", ".join(dict.fromkeys(source.host for source in needed))
    reason = "to reach " + " and ".join(f"{source.what} {redact_userinfo(source.url)}" for source in needed)
    if can_limit(caps, needed):
        spec = NetworkSpec(
            allow_internet_access=True,
            allow_public_traffic=False,
            allow_out=tuple(dict.fromkeys(source.allow_entry for source in needed)),
        )
        return BuildNetwork(spec, f"build sandbox: outbound network limited to {hosts}, all else denied, {reason}")
    # No allow list for this kind of host: outbound is all or nothing here. The sources are
    # still the only places the install steps fetch from (pip runs with --index-url only).
    spec = NetworkSpec(allow_internet_access=True, allow_public_traffic=False)
    return BuildNetwork(
        spec, f"build sandbox: outbound network on ({backend_label} cannot limit it to {hosts}) {reason}"
    )


def can_limit(caps: NetworkCapabilities, needed: Sequence[SourceHost]) -> bool:
    """Whether the backend can allow exactly these hosts (an allow list denies everything else)."""
    if not caps.outbound_toggle:
        return False
    for source in needed:
        try:
            entry = source.allow_entry
        except PolicyError:
            return False  # a host no allow entry can name (a single-label name): not limitable
        if isinstance(entry, Cidr):
            # An address in a private range is reached only where the backend opens one.
            if not caps.allow_out_cidr or (opened_range(entry) is not None and not caps.allow_private):
                return False
        elif not caps.allow_out_domain:
            return False
    return True
