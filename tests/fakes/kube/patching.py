"""The PATCH bodies the apiserver accepts: JSON merge patch (RFC 7386), JSON patch (RFC 6902)
and strategic merge patch, which the fake applies as a merge patch (lists replaced whole, the
way a merge patch treats them; the real server merges some lists by key).
"""

from __future__ import annotations

import copy
from typing import Any

from tests.fakes.kube.errors import ApiError, bad_request

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
ACCEPTED = (JSON_PATCH, MERGE, STRATEGIC, APPLY)


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _walk(doc: Any, pointer: str) -> tuple[Any, str]:
    """The container holding the pointer's last token, and that token."""
    if not pointer.startswith("/"):
        raise bad_request(f"the server rejected our request due to an error in our request: invalid path {pointer!r}")
    tokens = [_unescape(t) for t in pointer.split("/")[1:]]
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, list):
            node = node[_index(token, node, False)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            raise _missing(pointer)
    return node, tokens[-1]


def _index(token: str, node: list[Any], adding: bool) -> int:
    if token == "-" and adding:
        return len(node)
    if not token.isdigit() or int(token) > len(node) - (0 if adding else 1):
        raise bad_request(f"the server rejected our request due to an error in our request: index {token} out of range")
    return int(token)


def _missing(pointer: str) -> ApiError:
    return ApiError(
        422,
        f'the server rejected our request due to an error in our request: doc is missing path: "{pointer}"',
        "Invalid",
    )


def _get(doc: Any, pointer: str) -> Any:
    if pointer == "":
        return doc
    parent, token = _walk(doc, pointer)
    if isinstance(parent, list):
        return parent[_index(token, parent, False)]
    if not isinstance(parent, dict) or token not in parent:
        raise _missing(pointer)
    return parent[token]


def _remove(doc: Any, pointer: str) -> Any:
    parent, token = _walk(doc, pointer)
    if isinstance(parent, list):
        return parent.pop(_index(token, parent, False))
    if not isinstance(parent, dict) or token not in parent:
        raise _missing(pointer)
    return parent.pop(token)


def _add(doc: Any, pointer: str, value: Any, replace: bool = False) -> Any:
    if pointer == "":
        return value
    parent, token = _walk(doc, pointer)
    if isinstance(parent, list):
        if replace:
            parent[_index(token, parent, False)] = value
        else:
            parent.insert(_index(token, parent, True), value)
    elif isinstance(parent, dict):
        if replace and token not in parent:
            raise _missing(pointer)
        parent[token] = value
    else:
        raise _missing(pointer)
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise bad_request("the server rejected our request due to an error in our request: json patch is not a list")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request("the server rejected our request due to an error in our request: malformed operation")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "move":
            doc = _add(doc, path, _remove(doc, op["from"]))
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(
                    422,
                    f"the server rejected our request due to an error in our request: testing value {path} failed",
                    "Invalid",
                )
        else:
            raise bad_request(f"the server rejected our request due to an error in our request: unknown op {kind!r}")
    return doc


def apply_patch(content_type: str, target: dict[str, Any], body: Any, *, custom: bool = False) -> dict[str, Any]:
    """`target` patched by `body` as `content_type` says; 415 for a type the server does not
    take. Custom resources take no strategic merge patch (the apiserver answers 415: the
    official client sends one for a dict body unless told `_content_type`)."""
    kind = content_type.split(";")[0].strip()
    accepted = tuple(t for t in ACCEPTED if not (custom and t == STRATEGIC))
    if kind not in accepted:
        raise ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types include: {', '.join(accepted)}",
            "UnsupportedMediaType",
        )
    result = json_patch(target, body) if kind == JSON_PATCH else merge_patch(target, body)
    if not isinstance(result, dict):
        raise bad_request(
            "the server rejected our request due to an error in our request: patch result is not an object"
        )
    return result
