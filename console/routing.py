"""Websocket routes of every app, gathered for console.asgi."""

from django.urls import URLPattern

from sandboxes.terminal.routing import websocket_urlpatterns as sandboxes_websockets

websocket_urlpatterns: list[URLPattern] = [*sandboxes_websockets]
