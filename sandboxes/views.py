"""Pages of the sandboxes app."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def config_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "inc/coming_soon.html",
        {
            "title": "Sandboxes",
            "section": "sandboxes",
            "what": "Sandbox configs, templates and snapshots",
        },
    )


@login_required
def session_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "inc/coming_soon.html",
        {
            "title": "Sessions",
            "section": "sessions",
            "what": "Session sandboxes, their bindings and terminals",
        },
    )
