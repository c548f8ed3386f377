"""Celery entry points of the skills app: importing the modules here registers their periodic
tasks (`@periodic`, console/periodic.py); the install jobs run through `console.jobs`."""

from __future__ import annotations

from .sources import services  # noqa: F401  (periodic: skill-git-check)
