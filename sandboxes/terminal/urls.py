"""Routes of the terminal's pages (namespace "sandboxes", joined in `sandboxes.urls`); its
websocket route is `routing.py` (docs/terminal-protocol.md)."""

from django.urls import path

from . import pages

urlpatterns = [
    path("sessions/<uuid:session_id>/terminal/", pages.terminal_page, name="terminal_page"),
    path("sessions/<uuid:session_id>/terminals/", pages.terminal_create, name="terminal_create"),
]
