"""Routes of the inbound pages (namespace "sandboxes", joined in `sandboxes.urls`); the ASGI
proxy itself is mounted by `console.asgi`."""

from django.urls import path

from . import pages

urlpatterns = [
    path("sessions/<uuid:session_id>/inbound/link/", pages.session_inbound_link, name="session_inbound_link"),
]
