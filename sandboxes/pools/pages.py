"""The Pools pages: a space's (its configs' pools, their sizes set by the space's admins) and
the platform's (every pool, platform admins only; anyone else gets 404)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from console.access import get_space_for_user, has_role, require_platform_admin
from console.models import Role
from console.panels import SpaceAction
from console.services import ServiceError, actor_from_request
from console.views import is_htmx

from ..models import SandboxConfig
from .services import do_set_pool_size
from .stats import PoolReading, pooled_configs_of, quota_line, read_pools, ready_memory_mb
from .tuning import POOLS


@dataclass(frozen=True)
class Row:
    reading: PoolReading
    memory: float | None  # MiB one ready sandbox uses, read from the backend now
    kept: bool  # a follow of the page keeps the figure it shows (hx-preserve)


def _rows(request: HttpRequest, readings: list[PoolReading]) -> tuple[list[Row], str]:
    """The table's rows, and the query its HTMX follow asks with. The backend answers a memory
    reading at its next stats tick (about a second on Docker): a load reads one for each pool
    with a ready sandbox, at most `pools.memory_reads` of them, and a follow keeps those the
    page shows (`shown`) and reads the next ones (after the last it read, `after`)."""
    follow = is_htmx(request)
    shown = set(request.GET.getlist("shown")) if follow else set()
    after = request.GET.get("after", "") if follow else ""
    ids = [str(r.config.id) for r in readings]
    start = ids.index(after) + 1 if after in ids else 0  # around the table, after the last read
    waiting = [r.config for r in readings[start:] + readings[:start] if r.ready and str(r.config.id) not in shown]
    to_read = waiting[: max(0, POOLS.memory_reads)]
    memory = ready_memory_mb(to_read) if to_read else {}
    rows = []
    for reading in readings:
        kept = bool(reading.ready) and str(reading.config.id) in shown
        rows.append(Row(reading, memory.get(reading.config.pk), kept))
    query = [("shown", str(r.reading.config.id)) for r in rows if r.kept or r.memory is not None]
    if len(to_read) < len(waiting):
        query.append(("after", str(to_read[-1].id) if to_read else after))
    return rows, urlencode(query)


def _filling(readings: list[PoolReading]) -> bool:
    """Whether a pool is not at its size or holds an outdated image yet: the page then follows
    it every 3 s, else every 10 s (a skill install or policy change drains a full pool)."""
    return any(r.refilling or r.ready < r.size or not all(i[2] for i in r.images) for r in readings)


@login_required
@require_safe
def space_pools(request: HttpRequest, space_id: uuid.UUID) -> HttpResponse:
    space = get_space_for_user(request.user, space_id)
    readings = read_pools(pooled_configs_of(space), every=True)
    rows, follow = _rows(request, readings)
    return render(
        request,
        "sandboxes/pool_list.html",
        {
            "space": space,
            "rows": rows,
            "follow": follow,
            "quota": quota_line(space),
            "can_edit": has_role(request.user, space, Role.ADMIN),
            "refilling": _filling(readings),
            "window_min": POOLS.stats_window_s // 60,
            "section": "spaces",
        },
    )


@login_required
@require_POST
def pool_size(request: HttpRequest, space_id: uuid.UUID, config_id: uuid.UUID) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    config = get_object_or_404(SandboxConfig.objects.select_related("backend", "space"), pk=config_id, space=space)
    try:
        do_set_pool_size(config, request.POST.get("pool_size", ""), actor=actor_from_request(request))
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"The pool of {config.name} keeps {config.pool_size} sandbox(es) ready.")
    url = reverse("sandboxes:space_pools", args=[space.id])
    if is_htmx(request):
        response = HttpResponse(status=204)
        response["HX-Redirect"] = url
        return response
    return redirect(url)


@login_required
@require_safe
def platform_pools(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request.user)
    readings = read_pools(pooled_configs_of())
    rows, follow = _rows(request, readings)
    return render(
        request,
        "sandboxes/pool_list.html",
        {
            "rows": rows,
            "follow": follow,
            "refilling": _filling(readings),
            "platform": True,
            "window_min": POOLS.stats_window_s // 60,
            "section": "pools",
        },
    )


SPACE_ACTION = SpaceAction("Pools", lambda space: reverse("sandboxes:space_pools", args=[space.id]), order=20)
