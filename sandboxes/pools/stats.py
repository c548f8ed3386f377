"""What the Pools pages and /metrics say about each pool, from the rows: size (declared and
in force), ready, refilling, claimed; over the last `pools.stats_window_s`: hits, misses, hit
rate, claim latency p50/p95, what an agent waited for a pooled resolve (the whole resolve,
from its request's start to its answer: "ready in") p50/p95, and why resolves missed. One
reading per config, a few queries for any number of configs."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Count, OuterRef, Q, Subquery
from django.utils import timezone

from console.models import NetworkPolicy, Space

from ..models import MemberState, PoolClaim, PoolMember, SandboxConfig
from ..sessions.limits import limits_of
from ..sessions.provisioning import EffectiveTemplate, effective_templates
from .tuning import POOLS


@dataclass
class PoolReading:
    config: SandboxConfig
    size: int  # in force: the declared size within the backend's limit
    ready: int = 0
    refilling: int = 0
    claimed: int = 0
    hits: int = 0
    misses: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    # A pooled resolve as its caller waited for it (hits only): the goal is under 90 ms.
    ready_p50_ms: float | None = None
    ready_p95_ms: float | None = None
    reasons: list[tuple[str, int]] = field(default_factory=list)  # why resolves missed, most first
    native: bool = False  # the backend keeps the pool itself: ready and refilling are its own counts
    # The images the ready sandboxes run (template, how many, whether it is the config's current
    # one): a skill install shows as the old image draining and the new one filling.
    images: list[tuple[str, int, bool]] = field(default_factory=list)
    unread: str = ""  # why the backend's own counts could not be read

    @property
    def hit_rate(self) -> float | None:
        total = self.hits + self.misses
        return self.hits / total if total else None


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]


def read_pools(configs: Iterable[SandboxConfig], *, every: bool = False) -> list[PoolReading]:
    """A reading for each config that has a pool or pool members (`every`: each config)."""
    configs = list(configs)
    ids = [c.pk for c in configs]
    counts: dict[object, Counter[str]] = defaultdict(Counter)
    ready_images: dict[object, Counter[str]] = defaultdict(Counter)
    members = PoolMember.objects.filter(config_id__in=ids).values("config_id", "state", "template_id")
    for row in members.annotate(n=Count("pk")).order_by():
        counts[row["config_id"]][row["state"]] += row["n"]
        if row["state"] == MemberState.READY:
            ready_images[row["config_id"]][row["template_id"]] += row["n"]
    since = timezone.now() - timedelta(seconds=POOLS.stats_window_s)
    claims = PoolClaim.objects.filter(config_id__in=ids, at__gte=since).values_list(
        "config_id", "hit", "reason", "duration_ms", "resolve_ms"
    )
    latencies: dict[object, list[float]] = defaultdict(list)
    waits: dict[object, list[float]] = defaultdict(list)
    outcomes: dict[object, Counter[bool]] = defaultdict(Counter)
    reasons: dict[object, Counter[str]] = defaultdict(Counter)
    for config_id, hit, reason, duration, waited in claims:
        outcomes[config_id][hit] += 1
        if hit:
            latencies[config_id].append(duration)
            if waited is not None:
                waits[config_id].append(waited)
        else:
            reasons[config_id][reason] += 1
    listed = [c for c in configs if every or c.pool_size > 0 or counts[c.pk].total() or outcomes[c.pk].total()]
    templates = effective_templates(listed)
    readings = []
    for config in listed:
        state = counts[config.pk]
        readings.append(
            PoolReading(
                config=config,
                size=min(config.pool_size, config.backend.max_pool_size),
                ready=state[MemberState.READY],
                refilling=state[MemberState.REFILLING],
                claimed=state[MemberState.CLAIMED],
                hits=outcomes[config.pk][True],
                misses=outcomes[config.pk][False],
                p50_ms=percentile(latencies[config.pk], 0.5),
                p95_ms=percentile(latencies[config.pk], 0.95),
                ready_p50_ms=percentile(waits[config.pk], 0.5),
                ready_p95_ms=percentile(waits[config.pk], 0.95),
                reasons=reasons[config.pk].most_common(5),
                images=_images(templates[config.pk].template_id, ready_images[config.pk]),
            )
        )
    _read_native(readings, templates)
    return readings


def _images(current: str, ready: Counter[str]) -> list[tuple[str, int, bool]]:
    """The ready sandboxes' images, the config's current one (`current`) first."""
    return sorted(((t, n, t == current) for t, n in ready.items()), key=lambda i: (not i[2], i[0]))


def _read_native(readings: list[PoolReading], templates: dict[object, EffectiveTemplate]) -> None:
    """Ready and being made of the pools a backend keeps itself (`Backend.warm_pools()`), as
    it counts them: one listing per platform backend and account (it names every pool kept
    for the console), the config's current pool looked up in it."""
    from ..backends.base import RemoteError
    from ..catalog.bridge import config_fingerprint, get_backend
    from ..catalog.network import network_spec_for, spec_fingerprint
    from .keeper import pool_name

    native = []
    for reading in readings:
        try:
            backend = get_backend(reading.config)
        except RemoteError:
            continue  # the rows' counts stand; the config's page says what is wrong
        capability = backend.warm_pools()
        if capability is not None:
            reading.native = True
            native.append((reading, capability))
    if not native:
        return
    policies = {p.space_id: p for p in NetworkPolicy.objects.filter(space__in={r.config.space_id for r, _ in native})}
    networks: dict[object, str] = {}
    listed: dict[tuple[object, str], dict[str, tuple[int, int]] | RemoteError] = {}
    for reading, capability in native:
        config = reading.config
        account = (config.backend_id, config_fingerprint(config))
        if account not in listed:
            try:
                listed[account] = capability.pools()
            except RemoteError as exc:
                listed[account] = exc
        pools = listed[account]
        if isinstance(pools, RemoteError):
            reading.unread = f"{pools.kind}: {pools.message}"
            continue
        if config.space_id not in networks:  # as `keeper.wanted` names the current pool
            network = network_spec_for(config.space, policy=policies.get(config.space_id))
            networks[config.space_id] = spec_fingerprint(network)
        name = pool_name(config, templates[config.pk].template_id, networks[config.space_id])
        reading.ready, reading.refilling = pools.get(name, (0, 0))


def pooled_configs_of(space: Space | None = None) -> list[SandboxConfig]:
    rows = SandboxConfig.objects.select_related("space", "backend").order_by("space__name", "name")
    if space is not None:
        rows = rows.filter(space=space)
    else:
        rows = rows.filter(Q(pool_size__gt=0) | Q(pool_members__isnull=False)).distinct()
    return list(rows)


@dataclass(frozen=True)
class QuotaLine:
    """The space's quota of live sessions and how pools count in it."""

    maximum: int
    live_sessions: int
    pooled: int  # unclaimed: ready, and being made (`pooled_unclaimed`)
    being_made: int

    @property
    def ready(self) -> int:
        return self.pooled - self.being_made


def quota_line(space: Space) -> QuotaLine:
    from ..models import Session, SessionState

    live = Session.objects.filter(space=space).exclude(state=SessionState.GONE).count()
    unclaimed = PoolMember.objects.filter(space=space).exclude(state=MemberState.CLAIMED)
    counts = Counter(dict(unclaimed.values_list("state").annotate(n=Count("pk")).order_by()))
    return QuotaLine(
        maximum=limits_of(space)["live_sessions"],
        live_sessions=live,
        pooled=sum(counts.values()),
        being_made=counts[MemberState.REFILLING],
    )


def ready_memory_mb(configs: list[SandboxConfig]) -> dict[object, float | None]:
    """Memory one ready sandbox of each pool uses now (MiB), by config id: read from the
    backend's stats of its longest ready member (one query for all, one backend call each);
    None when it has none ready or cannot tell."""
    longest = PoolMember.objects.filter(config=OuterRef("pk"), state=MemberState.READY).order_by("ready_at")
    members = (
        SandboxConfig.objects.filter(pk__in=[c.pk for c in configs])
        .annotate(member=Subquery(longest.values("sandbox_id")[:1]))  # not DISTINCT ON: SQLite too
        .values_list("pk", "member")
    )
    ready = {pk: sandbox_id for pk, sandbox_id in members if sandbox_id is not None}
    return {c.pk: _memory_mb(c, ready[c.pk]) if c.pk in ready else None for c in configs}


def _memory_mb(config: SandboxConfig, sandbox_id: str) -> float | None:
    from ..backends.base import RemoteError
    from ..catalog.bridge import get_backend

    stats = get_backend(config).stats()
    if stats is None:
        return None
    try:
        used = stats.memory_bytes(sandbox_id)
    except RemoteError:
        return None
    return round(used / 2**20, 1) if used is not None else None
