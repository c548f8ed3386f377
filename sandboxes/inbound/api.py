"""The agent API's inbound routes: the URL of a port of the session's sandbox (with the
traffic token and the header it goes in), and signed links for browsers."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from django.http import HttpRequest
from ninja import Field, Path, Query, Router, Schema, Status
from pydantic import BaseModel, field_validator

from console.crypto import decrypt

from ..api.auth import caller
from ..api.errors import JSON_BODY, documented
from ..api.wire import ApiError, IntText, as_int, body_doc, invalid, read_body
from ..sessions.api import SESSION, existing_session
from ..sessions.tuning import SESSIONS
from .links import do_issue_inbound_link, inbound_on, inbound_url

router = Router(tags=["inbound"], exclude_unset=True)  # a key a view leaves out stays out


def _port(value: int | None) -> int:
    if value is None:
        raise ApiError(400, "invalid", "'port' is required.", field="port")
    if not 1 <= value <= 65535:
        raise ApiError(400, "invalid", "'port' is from 1 to 65535.", field="port")
    return value


class InboundOut(Schema):
    port: int
    url: str = Field(description="The port's URL; send the token in `token_header`")
    token_header: str | None
    traffic_token: str | None
    signed_links: bool = Field(description="Whether signed links (for browsers) can be made")
    inbound_on: bool = Field(description="The space's inbound switch; off: the URL is refused")

    model_config = {"title": "Inbound"}


@router.get(
    SESSION + "/inbound",
    url_name="inbound",
    summary="The URL of a port of the session's sandbox, with the traffic token and its header",
    **documented({200: InboundOut}),
)
def inbound(
    request: HttpRequest,
    space_id: Annotated[UUID, Path()],
    key: str,
    port: Annotated[IntText, Query(None, description="A port of the sandbox (1-65535; required)")] = None,
) -> dict[str, Any]:
    space = caller(request).space
    session = existing_session(space, key)
    number = _port(as_int("port", port))
    url = inbound_url(session, number)
    return {
        "port": number,
        "url": request.build_absolute_uri(url.url),
        "token_header": url.token_header or None,
        "traffic_token": decrypt(session.traffic_token_encrypted) or None,
        "signed_links": url.signed_links,
        "inbound_on": inbound_on(space.pk),
    }


class InboundLinkRequest(BaseModel):
    port: int = Field(json_schema_extra={"minimum": 1, "maximum": 65535})
    ttl_s: int | None = Field(
        None, description="Lifetime in seconds (default one hour)", json_schema_extra={"minimum": 60}
    )

    @field_validator("port", mode="before")
    @classmethod
    def _given(cls, value: Any) -> Any:
        if value is None:
            raise invalid("port", "'port' is required.")
        return value

    @field_validator("port")
    @classmethod
    def _in_range(cls, value: int) -> int:
        if not 1 <= value <= 65535:
            raise invalid("port", "'port' is from 1 to 65535.")
        return value


class InboundLink(Schema):
    port: int
    url: str = Field(description="Opened in a browser, it sets a cookie for the port's URL path")
    expires_at: int = Field(description="Unix time")


@router.post(
    SESSION + "/inbound/links",
    url_name="inbound_links",
    summary="A signed link to a port for a browser (audited; refused while inbound is off)",
    **documented({201: InboundLink}, errors=JSON_BODY, body=body_doc(InboundLinkRequest)),
)
def inbound_link(request: HttpRequest, space_id: Annotated[UUID, Path()], key: str) -> Any:
    who = caller(request)
    session = existing_session(who.space, key)
    wanted = read_body(request, InboundLinkRequest)
    ttl_s = SESSIONS.inbound_link_default_ttl_s if wanted.ttl_s is None else wanted.ttl_s
    link, expires_at = do_issue_inbound_link(session, wanted.port, ttl_s, actor=who.actor)
    return Status(201, {"port": wanted.port, "url": request.build_absolute_uri(link), "expires_at": expires_at})
