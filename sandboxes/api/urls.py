"""The agent API (namespace "api", mounted at /api/v1/): the NinjaAPI that mounts each room's
routes, answers errors through `errors.ANSWERS`, and serves its generated OpenAPI description.

The routes live in their rooms, beside their schemas: `sandboxes.sessions.api` (the session,
its sandbox, files, artifacts and background commands), `sandboxes.inbound.api` (ports and
signed links) and `sandboxes.network.api` (explain). This module is the API's wiring: the one
module of `sandboxes.api` that names the rooms' routes.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, path
from ninja import NinjaAPI, Router

from ..inbound.api import router as inbound_routes
from ..network.api import router as network_routes
from ..sessions.api import router as session_routes
from . import errors
from .auth import SpaceToken
from .wire import ApiError

app_name = "api"

# Every method a client may send: a route answers those it does not take with the API's 405.
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT")
DESCRIPTION = (
    "Resolve session sandboxes, run commands, move files and collect artifacts. "
    "Authenticate with a space API token: `Authorization: Bearer sck_…`. "
    "A GET never creates, resumes or rebuilds a sandbox (a read that needs a running one answers "
    "409 session_not_running); POST …/resolve wakes a session."
)


class AgentApi(NinjaAPI):
    def get_content_type(self) -> str:
        return "application/json"  # as Django's JsonResponse says it

    def get_operation_url_name(self, operation: Any, router: Router) -> str:
        return ""  # only the names the routes give themselves (`api:resolve`, ...)


def refuse_other_methods(router: Router) -> None:
    """Each path of `router` answers the methods it does not take with a JSON 405 naming those
    it does, before any authentication (as a wrong method is no secret)."""
    for route, view in list(router.path_operations.items()):
        allowed = [method for operation in view.operations for method in operation.methods]
        with warnings.catch_warnings():  # it takes no path parameter: it reads none
            warnings.simplefilter("ignore", UserWarning)
            router.add_api_operation(
                route,
                [m for m in HTTP_METHODS if m not in allowed],
                _refusal(allowed),
                auth=None,
                include_in_schema=False,
            )


def _refusal(allowed: list[str]) -> Callable[[HttpRequest], HttpResponse]:
    def refuse(request: HttpRequest) -> HttpResponse:  # no parameter but the request: it reads nothing
        raise ApiError(405, "method_not_allowed", f"Use {', '.join(allowed)}.")

    return refuse


api = AgentApi(
    title="Sandbox Console agent API",
    version="1",
    description=DESCRIPTION,
    urls_namespace="api",
    auth=SpaceToken(),
    openapi_url=None,
    docs_url=None,
)
errors.install(api)
for routes in (network_routes, session_routes, inbound_routes):
    refuse_other_methods(routes)
    api.add_router("", routes)


def openapi_document(server_url: str) -> dict[str, Any]:
    """The OpenAPI 3.1 description Django Ninja generates from the routes and their schemas,
    as JSON reads it (status codes as strings), with `server_url` as its server."""
    document = json.loads(json.dumps(api.get_openapi_schema(path_prefix=""), cls=api.renderer.encoder_class))  # type: ignore[attr-defined]
    document["servers"] = [{"url": server_url}]
    return document


def openapi_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse(openapi_document(request.build_absolute_uri("/api/v1")))


def _routes() -> list[URLPattern]:
    """Ninja's patterns, one per route (it makes one per method of a route, each dispatching
    all of them), keeping the route's name; without its root page (no docs are served)."""
    kept: dict[str, URLPattern] = {}
    for pattern in api.urls[0]:
        assert isinstance(pattern, URLPattern)
        route = str(pattern.pattern)
        if route == "":
            continue
        if route not in kept or (pattern.name and not kept[route].name):
            kept[route] = pattern
    for pattern in kept.values():
        pattern.name = pattern.name or None  # unnamed, as a route that gives itself no name is
    return list(kept.values())


urlpatterns = [path("openapi.json", openapi_view, name="openapi"), *_routes()]
