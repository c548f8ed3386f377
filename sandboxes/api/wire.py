"""The agent API's wire format: JSON bodies read into typed request schemas with a 400 naming
the field, query parameters, raw upload bodies, cursor pages, and `ApiError`, the one shape
of every error answer (`{"error": {"code", "message", "field"?, ...}}`).

A request body is read by the view, not by the router: a view answers its lookups (404) before
it reads its body (400), as the API always did. Its schema still sits beside the view and is
described in the OpenAPI document (`body_doc`).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, TypeVar

from django.db.models import Model, QuerySet
from django.http import HttpRequest, JsonResponse
from pydantic import BaseModel, ValidationError, WithJsonSchema
from pydantic_core import PydanticCustomError

from ..sessions.tuning import SESSIONS
from .pagination import InvalidPage, cursor_page

MAX_JSON_BODY = 2 * 1024 * 1024
M = TypeVar("M", bound=Model)
B = TypeVar("B", bound=BaseModel)


class ApiError(Exception):
    """An error answer: `status`, and the body `{"error": {code, message, field?, **extra}}`."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field, self.extra = status, code, message, field, extra
        self.headers = headers or {}

    def response(self) -> JsonResponse:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field:
            body["field"] = self.field
        body.update(self.extra)
        response = JsonResponse({"error": body}, status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        return response


# --- Bodies ------------------------------------------------------------------------------


def json_body(request: HttpRequest) -> dict[str, Any]:
    if not request.body:
        return {}
    if len(request.body) > MAX_JSON_BODY:
        raise ApiError(413, "too_large", f"JSON bodies are at most {MAX_JSON_BODY} bytes.")
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid", f"The body is not JSON: {exc}", field="body") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid", "The body must be a JSON object.", field="body")
    return data


def invalid(field: str, message: str) -> PydanticCustomError:
    """A request schema's own refusal, answered as is: 400 `message`, naming `field`."""
    return PydanticCustomError("invalid", "{message}", {"message": message, "field": field})


def read_body(request: HttpRequest, schema: type[B]) -> B:
    """The JSON body as `schema` (strict: JSON's types as they came, a bool is no number), or
    a 400 naming the first field in the schema's order that is missing, of the wrong type or
    refused by the schema in its own words."""
    try:
        return schema.model_validate(json_body(request), strict=True)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        context = first.get("ctx") or {}
        field = str(context.get("field") or (first["loc"][0] if first["loc"] else "body"))
        if first["type"] == "invalid":
            message = str(context["message"])
        elif first["type"] == "missing":
            message = f"'{field}' is required."
        else:
            message = f"'{field}' has the wrong type."
        raise ApiError(400, "invalid", message, field=field) from None


def body_doc(schema: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """The OpenAPI `requestBody` of a view that reads `schema` itself (`read_body`)."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": schema.model_json_schema()}},
        }
    }


ANY_OBJECT_DOC = {"requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}}}
RAW_BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def b64_bytes(text: str | None) -> bytes | None:
    """A base64 field's bytes (its schema checked it with `b64_checked`)."""
    return None if text is None else base64.b64decode(text, validate=True)


def b64_checked(name: str, text: str | None) -> str | None:
    """A schema's check of a base64 field: 400 naming it when it is not base64."""
    if text is not None:
        try:
            base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(name, f"'{name}' is not valid base64.") from None
    return text


def upload_body(request: HttpRequest) -> bytes:
    """A PUT's raw body up to sessions.workspace_upload_max_bytes, read from the stream.

    `request.body` refuses anything past DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB, meant for
    form fields) with an HTML 400, which made the workspace's own cap unreachable.
    """
    cap = SESSIONS.workspace_upload_max_bytes
    data = request.read(cap + 1)
    if len(data) > cap:
        raise ApiError(400, "invalid", f"The file is larger than {cap} bytes.", field="body")
    return data


# --- Query parameters and pages -----------------------------------------------------------

# A query parameter described as an integer but taken as text, so that the view reads it in
# its own order (after the lookups that answer 404) and words (`as_int`).
IntText = Annotated[str | None, WithJsonSchema({"type": "integer"})]


def as_int(name: str, raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ApiError(400, "invalid", f"'{name}' is an integer.", field=name) from None


def page_of(
    request: HttpRequest, rows: QuerySet[M], *, time_field: str, default_limit: int
) -> tuple[list[M], str | None]:
    try:
        return cursor_page(request, rows, time_field=time_field, default_limit=default_limit)
    except InvalidPage as exc:
        raise ApiError(400, "invalid", exc.message, field=exc.field) from None
