"""metav1.Status bodies, the one error shape of the Kubernetes API.

Every refusal of the fake is an `ApiError` carrying the Status the real apiserver would send
(k8s.io/apimachinery/pkg/api/errors: NewNotFound, NewAlreadyExists, NewConflict, NewInvalid,
NewForbidden, NewResourceExpired, NewBadRequest, ...), worded the same way, so a client's
error handling meets what it will meet on a cluster.
"""

from __future__ import annotations

from typing import Any

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
}


def status_body(
    code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason if reason is not None else REASONS.get(code, ""),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    """A refusal answered as a metav1.Status with HTTP status `code`."""

    def __init__(
        self, code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.body = status_body(code, message, reason, details)


def qualified(plural: str, group: str) -> str:
    """`pods` for the core group, `sandboxclaims.extensions.agents.x-k8s.io` otherwise."""
    return f"{plural}.{group}" if group else plural


def _details(plural: str, group: str, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return details


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(404, f'{qualified(plural, group)} "{name}" not found', "NotFound", _details(plural, group, name))


def no_such_path() -> ApiError:
    return ApiError(404, "the server could not find the requested resource", "NotFound", {})


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        409, f'{qualified(plural, group)} "{name}" already exists', "AlreadyExists", _details(plural, group, name)
    )


def conflict(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {qualified(plural, group)} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        "Conflict",
        _details(plural, group, name),
    )


def invalid(kind: str, group: str, name: str, causes: list[dict[str, str]]) -> ApiError:
    """422 Invalid: `SandboxClaim.extensions.agents.x-k8s.io "x" is invalid: [spec.a: Required value, ...]`."""
    qualified_kind = f"{kind}.{group}" if group else kind
    parts = [f"{c['field']}: {c['message']}" for c in causes]
    listed = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    details: dict[str, Any] = {"name": name, "kind": kind, "causes": causes}
    if group:
        details["group"] = group
    return ApiError(422, f'{qualified_kind} "{name}" is invalid: {listed}', "Invalid", details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, message, "BadRequest")


def expired(message: str) -> ApiError:
    return ApiError(410, message, "Expired")


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def method_not_allowed(method: str) -> ApiError:
    return ApiError(
        405, f"the server does not allow this method on the requested resource ({method})", "MethodNotAllowed"
    )
