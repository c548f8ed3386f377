"""Pages of the skills app."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def skill_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "inc/coming_soon.html",
        {"title": "Skills", "section": "skills", "what": "The skill catalog and skill images"},
    )
