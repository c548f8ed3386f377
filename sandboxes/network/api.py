"""The agent API's network route: "would this destination be allowed, and by which rule, and
what would a refusal of it offer?" (`GET /api/v1/spaces/{space_id}/network/explain`), answered
as on the policy page (`advice.explain_for`). Reads only; names are matched, never resolved.
"""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from django.http import HttpRequest
from ninja import Field, Path, Query, Router, Schema

from netpolicy import PolicyError, parse_destination

from ..api.auth import caller
from ..api.errors import documented
from ..api.wire import ApiError
from ..models import Session
from .advice import explain_for

router = Router(tags=["network"], exclude_unset=True)  # a key the answer leaves out stays out


class AdviceOut(Schema):
    """What a refusal of this destination offers (the same as the Egress page)."""

    offer: str = Field(json_schema_extra={"enum": ["allow", "private", "edit_deny", "edit_rules", "none"]})
    can_approve: bool
    entry: str | None = Field(description="The entry an approval adds")
    text: str

    model_config = {"title": "Advice"}


class LayerLine(Schema):
    layer: str
    text: str


class Explanation(Schema):
    destination: str
    allowed: bool
    rule: str = Field(description="The deciding rule, in words")
    layer: str = Field(
        description="The enforcing layer that decides",
        json_schema_extra={"enum": ["policy", "dns", "packet", "http", "tls"]},
    )
    layers: list[LayerLine] = Field(
        description="One line per layer: space policy, session grants, http rules, backend (one per config)"
    )
    advice: AdviceOut | None = None


@router.get(
    "/spaces/{uuid:space_id}/network/explain",
    url_name="network_explain",
    summary="Would a destination be allowed for the space (or one of its sessions), and by which rule?"
    " Names are matched as names, never resolved; the address checks apply after resolution.",
    **documented({200: Explanation}),
)
def explain(
    request: HttpRequest,
    space_id: Annotated[UUID, Path()],
    destination: Annotated[str, Query("", description="A domain, an address, host:port or an http(s) URL")] = "",
    session: Annotated[str, Query("", description="A session key of the space: its grants are included")] = "",
) -> dict[str, Any]:
    space = caller(request).space
    try:
        target = parse_destination(destination)
    except PolicyError as exc:
        raise ApiError(400, "invalid", str(exc), field="destination") from None
    granted = None
    if session:
        # A NUL byte is in no key, and the database cannot compare one: no lookup, not a 500.
        granted = None if "\x00" in session else Session.objects.filter(space=space, key=session).first()
        if granted is None:
            raise ApiError(404, "not_found", f"No session {session!r} in this space.")
    return explain_for(space, target, granted).as_json()
