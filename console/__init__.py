"""Sandbox Console: the project package and the app for spaces, policies, audit and jobs."""

from .celery import app as celery_app

__all__ = ["celery_app"]
