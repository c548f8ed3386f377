"""CubeSandbox releases as the adapter tells them apart, and what each one does.

No CubeAPI release has a version endpoint of its own (`GET /health` answers `{status,
sandboxes}` on every release; `/cubeapi/v1/cluster/versions`, v0.4.0 to v0.5.1, reports
CubeMaster's build, not the release). So a release is told by the routes each one
introduced, read from TencentCloud/CubeSandbox `CubeAPI/src/routes.rs` at each release-note
commit. Every probe is a GET (or a PUT on a sandbox id that cannot exist) and changes nothing:

| probe | answered by |
|---|---|
| `GET /snapshots?limit=1` | v0.3.0 and later (6e482266) |
| `GET /cubeapi/v1/cluster/versions` | v0.4.0 to v0.5.1 (870a2463 .. a164417f) |
| `GET /cubeapi/v1/auth/session` | v0.5.0 and v0.5.1 (30b4e25a, a164417f) |
| `GET /templates/aliases/<name>` | v0.6.0 and later (08f2f5d7) |

A route "answers" when the server says anything but axum's empty 404/405 (`NoRoute`). A
release with the v0.6.0 route is "v0.6.0 or later": its behaviours are v0.6.0's, and the
features a later release may add (network update, metrics) are probed, never assumed.

Behaviours (each a capability the adapter derives and advertises):

- egress switch: before v0.5.0 `network.allowPublicTraffic`, when sent, overrides
  `allow_internet_access` (services/sandboxes.rs build_cubevs_context, build_cube_network_config
  @870a2463); from v0.5.0 `allow_internet_access` alone, and `allowPublicTraffic` gates inbound.
- inbound: before v0.5.0 nothing gates CubeProxy's per-sandbox URL (no AllowPublicTraffic in
  CubeMaster or CubeProxy @870a2463): every sandbox's ports are public.
- idle pause: before v0.5.0 `autoPause` is parsed (models NewSandbox) and never forwarded; from
  v0.5.0 only `lifecycle {onTimeout, autoResume}` is read (models SandboxLifecycleConfig).
- L7 rules: before v0.4.0 `SandboxNetworkConfig` has no `rules` (serde drops them silently).
- snapshots: listed from v0.3.0; v0.2.2 has no `GET /snapshots`.
- network update (`PUT /sandboxes/{id}/network`) and metrics (`GET /sandboxes/{id}/metrics`):
  no release through v0.6.0 routes them.

Imports nothing of the project.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class CubeRelease:
    """One release family and what the adapter may rely on there."""

    name: str  # as shown: "v0.4.0", "v0.6.0 or later"
    protocol: str  # recorded in SandboxConfig.backend_protocol, pinnable: "cube-0.4"
    commit: str  # the release-note commit its facts were read at
    public_traffic_is_egress: bool
    inbound_toggle: bool
    idle_pause: bool
    l7_rules: bool
    snapshots: bool
    template_id_required: bool
    network_update: bool = False
    stats: bool = False

    def capabilities(self) -> list[str]:
        """The behaviours in words, for Test connection."""
        egress = "allowPublicTraffic" if self.public_traffic_is_egress else "allow_internet_access"
        return [
            f"egress switch {egress}",
            "inbound toggle" if self.inbound_toggle else "inbound always public (no toggle)",
            "idle pause" if self.idle_pause else "no idle pause (killed at the TTL)",
            "L7 rules" if self.l7_rules else "no L7 rules",
            "snapshots" if self.snapshots else "no snapshots",
            "network update" if self.network_update else "no network update",
            "metrics" if self.stats else "no metrics",
        ]


_BEFORE_05 = {"public_traffic_is_egress": True, "inbound_toggle": False, "idle_pause": False}
_FROM_05 = {
    "public_traffic_is_egress": False,
    "inbound_toggle": True,
    "idle_pause": True,
    "l7_rules": True,
    "snapshots": True,
    "template_id_required": False,
}
V022 = CubeRelease(
    "v0.2.2", "cube-0.2", "b1b7ec65", l7_rules=False, snapshots=False, template_id_required=True, **_BEFORE_05
)
V030 = CubeRelease(
    "v0.3.0", "cube-0.3", "6e482266", l7_rules=False, snapshots=True, template_id_required=False, **_BEFORE_05
)
V040 = CubeRelease(
    "v0.4.0", "cube-0.4", "870a2463", l7_rules=True, snapshots=True, template_id_required=False, **_BEFORE_05
)
V05 = CubeRelease("v0.5.0/v0.5.1", "cube-0.5", "30b4e25a, a164417f", **_FROM_05)
V06 = CubeRelease("v0.6.0 or later", "cube-0.6", "08f2f5d7", **_FROM_05)
RELEASES = (V022, V030, V040, V05, V06)
BY_PROTOCOL = {r.protocol: r for r in RELEASES}
# Older recorded or pinned values: "may" was CubeSandbox 1ef7499 (before v0.2.2), "later" v0.5+.
BY_PROTOCOL_ALIASES = {"may": V022, "later": V05}


def release_for(value: str) -> CubeRelease | None:
    """The release a recorded or pinned `protocol` names, None for "" (detect)."""
    if not value:
        return None
    release = BY_PROTOCOL.get(value) or BY_PROTOCOL_ALIASES.get(value)
    if release is None:
        raise ValueError(value)
    return release


def with_probed(release: CubeRelease, *, network_update: bool, stats: bool) -> CubeRelease:
    """`release` with the features probed on the server itself."""
    return replace(release, network_update=network_update, stats=stats)
