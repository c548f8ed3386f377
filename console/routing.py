"""Websocket routes of every app, gathered for console.asgi."""

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
