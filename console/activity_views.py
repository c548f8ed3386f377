"""The activity pages: charts over time of the console's own series (console/activity.py)
and the JSON they are drawn from. The series are platform-wide (no space label), so both are
for platform admins; anyone else gets 404, as for every platform page."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from .access import require_platform_admin
from .activity_charts import DEFAULT_WINDOW, WINDOWS, build_charts
from .retention import retention_days


def _window(request: HttpRequest) -> str:
    key = request.GET.get("window", DEFAULT_WINDOW)
    return key if key in WINDOWS else DEFAULT_WINDOW


@login_required
@require_safe
def activity_page(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request.user)
    window = _window(request)
    context = {
        "charts": build_charts(window),
        "windows": WINDOWS.values(),
        "window": window,
        "retention_days": retention_days("activity_samples"),
        "section": "activity",
    }
    return render(request, "console/activity.html", context)


@login_required
@require_safe
def activity_series(request: HttpRequest) -> JsonResponse:
    require_platform_admin(request.user)
    ids = [i for i in request.GET.get("charts", "").split(",") if i]
    return JsonResponse(build_charts(_window(request)).to_json(*ids))
