"""Websocket routes of the sandboxes app (gathered by console.routing)."""

from django.urls import path

from .consumer import TerminalConsumer

websocket_urlpatterns = [
    path("ws/terminals/<uuid:terminal_id>/", TerminalConsumer.as_asgi()),
]
