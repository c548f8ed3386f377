"""The OpenAPI 3.1 description of the agent API, served at /api/v1/openapi.json.

Tests check it against the implementation both ways: every route is described with the
methods it accepts, and responses validate against the schemas below.
"""

from __future__ import annotations

from typing import Any

SESSION_PATH = "/spaces/{space_id}/sessions/{key}"

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "field": {"type": "string"},
                "retryable": {"type": "boolean"},
                "backend": {"type": "boolean"},
            },
        }
    },
}

SESSION = {
    "type": "object",
    "required": ["key", "id", "config", "state", "sandbox_id", "binding_version"],
    "properties": {
        "key": {"type": "string"},
        "id": {"type": "string", "format": "uuid"},
        "config": {"type": "string"},
        "state": {"type": "string", "enum": ["new", "running", "paused", "stopped", "gone", "starting", "pausing"]},
        "sandbox_id": {"type": ["string", "null"]},
        "binding_version": {"type": "integer"},
        "template_id": {"type": ["string", "null"]},
        "stale_at": {"type": ["string", "null"]},
        "last_activity": {"type": ["string", "null"]},
        "action": {"type": "string", "enum": ["bound", "claimed", "created", "rebuilt"]},
    },
}

TURN = {
    "type": "object",
    "required": ["key", "turn"],
    "properties": {"key": {"type": "string"}, "turn": {"type": "string"}},
}

EXEC_REQUEST = {
    "type": "object",
    "properties": {
        "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "shell": {"type": "string"},
        "cwd": {"type": "string"},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "stdin_b64": {"type": "string", "contentEncoding": "base64"},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        "max_output_bytes": {"type": "integer", "minimum": 1, "maximum": 16777216},
    },
    "description": "Exactly one of argv or shell. Runs as the session user (uid 1000).",
}

EXEC_RESULT = {
    "type": "object",
    "required": ["exit_code", "stdout", "stderr", "stdout_b64", "stderr_b64", "duration_s", "truncated", "timed_out"],
    "properties": {
        "exit_code": {"type": "integer"},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "stdout_b64": {"type": "string"},
        "stderr_b64": {"type": "string"},
        "duration_s": {"type": "number"},
        "truncated": {"type": "boolean"},
        "timed_out": {"type": "boolean"},
    },
}

FILE_WRITTEN = {
    "type": "object",
    "required": ["path", "size"],
    "properties": {"path": {"type": "string"}, "size": {"type": "integer"}, "mode": {"type": "string"}},
}

FILE_LIST = {
    "type": "object",
    "required": ["entries"],
    "properties": {
        "entries": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "path", "is_dir", "size", "mode"],
                "properties": {
                    "name": {"type": "string"},
                    "path": {"type": "string"},
                    "is_dir": {"type": "boolean"},
                    "size": {"type": "integer"},
                    "mode": {"type": "string"},
                    "is_symlink": {"type": "boolean"},
                },
            },
        }
    },
}

ARTIFACT = {
    "type": "object",
    "required": ["id", "path", "size", "sha256", "download_url"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "path": {"type": "string"},
        "size": {"type": "integer"},
        "sha256": {"type": "string"},
        "download_url": {"type": "string"},
    },
}

COLLECTION = {
    "type": "object",
    "required": ["collection", "artifacts", "refused"],
    "properties": {
        "collection": {"type": "string", "format": "uuid"},
        "artifacts": {"type": "array", "items": {"$ref": "#/components/schemas/Artifact"}},
        "refused": {"type": "array", "items": {"type": "string"}},
    },
}

ARTIFACT_LIST = {
    "type": "object",
    "required": ["artifacts", "next_cursor"],
    "properties": {
        "artifacts": {"type": "array", "items": {"$ref": "#/components/schemas/Artifact"}},
        "next_cursor": {
            "type": ["string", "null"],
            "description": "Pass as ?cursor= for the next page; null: last page",
        },
    },
}

COMMAND = {
    "type": "object",
    "required": ["id", "command", "status", "exit_code", "started", "finished"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "command": {"type": "string"},
        "status": {"type": "string", "enum": ["running", "exited", "killed", "lost"]},
        "exit_code": {"type": ["integer", "null"]},
        "started": {"type": "string"},
        "finished": {"type": ["string", "null"]},
    },
}

COMMAND_LIST = {
    "type": "object",
    "required": ["commands", "next_cursor"],
    "properties": {
        "commands": {"type": "array", "items": {"$ref": "#/components/schemas/Command"}},
        "next_cursor": {
            "type": ["string", "null"],
            "description": "Pass as ?cursor= for the next page; null: last page",
        },
    },
}

COMMAND_REQUEST = {
    "type": "object",
    "properties": {"argv": {"type": "array", "items": {"type": "string"}, "minItems": 1}, "shell": {"type": "string"}},
    "description": "Exactly one of argv or shell; runs as the session user in /workspace.",
}

COMMAND_OUTPUT = {
    "type": "object",
    "required": ["chunks", "next_after", "fell_behind", "finished", "status", "exit_code"],
    "properties": {
        "chunks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "data_b64", "text"],
                "properties": {"id": {"type": "integer"}, "data_b64": {"type": "string"}, "text": {"type": "string"}},
            },
        },
        "next_after": {"type": "integer", "description": "Pass back as `after` to read on"},
        "fell_behind": {"type": "boolean", "description": "Chunks after `after` were dropped from the buffer"},
        "finished": {"type": "boolean", "description": "The command ended and this page holds its last chunk"},
        "status": {"type": "string"},
        "exit_code": {"type": ["integer", "null"]},
    },
}

COMMAND_INPUT = {
    "type": "object",
    "properties": {"data_b64": {"type": "string"}, "eof": {"type": "boolean"}},
}

STDIN_RESULT = {
    "type": "object",
    "required": ["written", "eof"],
    "properties": {"written": {"type": "integer"}, "eof": {"type": "boolean"}},
}

EXPLANATION = {
    "type": "object",
    "required": ["destination", "allowed", "rule", "layer", "layers", "advice"],
    "properties": {
        "destination": {"type": "string"},
        "allowed": {"type": "boolean"},
        "rule": {"type": "string", "description": "The deciding rule, in words"},
        "layer": {
            "type": "string",
            "enum": ["policy", "dns", "packet", "http", "tls"],
            "description": "The enforcing layer that decides",
        },
        "advice": {
            "type": "object",
            "description": "What a refusal of this destination offers (the same as the Egress page)",
            "required": ["offer", "can_approve", "entry", "text"],
            "properties": {
                "offer": {"type": "string", "enum": ["allow", "private", "edit_deny", "edit_rules", "none"]},
                "can_approve": {"type": "boolean"},
                "entry": {"type": ["string", "null"], "description": "The entry an approval adds"},
                "text": {"type": "string"},
            },
        },
        "layers": {
            "type": "array",
            "description": "One line per layer: space policy, session grants, http rules, backend (one per config)",
            "items": {
                "type": "object",
                "required": ["layer", "text"],
                "properties": {"layer": {"type": "string"}, "text": {"type": "string"}},
            },
        },
    },
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "Explanation": EXPLANATION,
    "Command": COMMAND,
    "CommandList": COMMAND_LIST,
    "CommandRequest": COMMAND_REQUEST,
    "CommandOutput": COMMAND_OUTPUT,
    "CommandInput": COMMAND_INPUT,
    "StdinResult": STDIN_RESULT,
    "Error": ERROR,
    "Session": SESSION,
    "Turn": TURN,
    "ExecRequest": EXEC_REQUEST,
    "ExecResult": EXEC_RESULT,
    "FileWritten": FILE_WRITTEN,
    "FileList": FILE_LIST,
    "Artifact": ARTIFACT,
    "Collection": COLLECTION,
    "ArtifactList": ARTIFACT_LIST,
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_response(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ref(schema)}}}


ERRORS = {
    "400": json_response("Bad input; `field` names the offending field", "Error"),
    "401": json_response("Missing, unknown or revoked token", "Error"),
    "404": json_response("Unknown space (or a token of another space) or session", "Error"),
    "409": json_response(
        "Backend conflict or quota, or the space's network policy cannot be enforced by the config's backend"
        " (the message names what); code session_not_running when the call raced a pause, code"
        " sandbox_replaced when the sandbox was rebuilt or removed under it (run it again); code"
        " being_deleted when the space or config is being deleted and no new session starts on it",
        "Error",
    ),
    "429": json_response(
        "A space quota or rate limit (code limit_exceeded: `limit` names it, `maximum` its value, "
        "the Retry-After header and `retry_after_s` when to retry), or a backend rate limit (retryable)",
        "Error",
    ),
    "502": json_response("Backend failure", "Error"),
    "503": json_response("Backend, session store or database unavailable (retryable)", "Error"),
    "504": json_response("Backend timeout (retryable)", "Error"),
}


# A GET never creates, resumes or rebuilds a sandbox: the reads that need a running one say so.
NOT_RUNNING = {
    "409": json_response(
        "code session_not_running: the session's sandbox is paused, stopped or gone, and a GET never wakes it;"
        " the message names the POST that does (…/resolve, or any POST that runs in it such as …/exec)."
        " Otherwise a backend conflict or quota",
        "Error",
    )
}


def operation(
    summary: str,
    responses: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    query: list[dict[str, Any]] | None = None,
    errors: dict[str, Any] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {**responses, **ERRORS, **(errors or {})}}
    if body is not None:
        op["requestBody"] = body
    if query:
        op["parameters"] = query
    return op


def query_param(name: str, description: str, *, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "description": description, "schema": {"type": "string"}}


PAGE_QUERY = [
    query_param("limit", "Page size, 1 to 500 (default: 500 artifacts, 50 commands)"),
    query_param("cursor", "The `next_cursor` of the page before"),
]

JSON_BODY = {"content": {"application/json": {"schema": {"type": "object"}}}}
RAW_BODY = {
    "required": True,
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}

PATHS: dict[str, dict[str, Any]] = {
    "/spaces/{space_id}/network/explain": {
        "get": operation(
            "Would a destination be allowed for the space (or one of its sessions), and by which rule?"
            " Names are matched as names, never resolved; the address checks apply after resolution.",
            {"200": json_response("The answer through every layer", "Explanation")},
            query=[
                query_param("destination", "A domain, an address, host:port or an http(s) URL", required=True),
                query_param("session", "A session key of the space: its grants are included"),
            ],
        )
    },
    SESSION_PATH: {
        "get": operation("The session's last known state", {"200": json_response("The session", "Session")}),
        "delete": operation(
            "Delete the session, its sandbox, binding and persistent workspace", {"204": {"description": "Deleted"}}
        ),
    },
    SESSION_PATH + "/resolve": {
        "post": operation(
            "Resolve the session to a live sandbox (created, claimed, resumed or rebuilt as needed):"
            " what wakes a paused, stopped or gone session for the GETs",
            {"200": json_response("The session and what resolving did", "Session")},
            body=JSON_BODY,
        )
    },
    SESSION_PATH + "/pause": {
        "post": operation(
            "Pause the session's sandbox (the next resolve or exec resumes it)",
            {"200": json_response("The session, paused (or stopped, per its config's idle mode)", "Session")},
            body=JSON_BODY,
            errors={
                "409": json_response(
                    "code session_busy: an exec, file call, background command or open terminal is in flight"
                    " (the message says which); nothing was paused. Otherwise a backend conflict",
                    "Error",
                )
            },
        )
    },
    SESSION_PATH + "/turns/begin": {
        "post": operation(
            "Begin a turn: its first resolve may rebuild a stale sandbox",
            {"200": json_response("Begun", "Turn")},
            body=JSON_BODY,
        )
    },
    SESSION_PATH + "/turns/end": {"post": operation("End the turn", {"200": json_response("Ended", "Turn")})},
    SESSION_PATH + "/exec": {
        "post": operation(
            "Run a command in the session's sandbox",
            {"200": json_response("The command's result", "ExecResult")},
            body={"required": True, "content": {"application/json": {"schema": ref("ExecRequest")}}},
        )
    },
    SESSION_PATH + "/input/{path}": {
        "put": operation(
            "Upload an attachment to /workspace/input (read-only to the session user)",
            {"201": json_response("Written", "FileWritten")},
            body=RAW_BODY,
        )
    },
    SESSION_PATH + "/files": {
        "get": operation(
            "List a folder of /workspace of the running sandbox (reads only: never wakes it)",
            {"200": json_response("Entries", "FileList")},
            query=[query_param("path", "Folder, relative to /workspace (default: /workspace)")],
            errors=NOT_RUNNING,
        )
    },
    SESSION_PATH + "/files/content": {
        "get": operation(
            "Read a file of /workspace of the running sandbox (reads only: never wakes it)",
            {"200": {"description": "The bytes", "content": {"application/octet-stream": {}}}},
            query=[query_param("path", "File, relative to /workspace", required=True)],
            errors={
                **NOT_RUNNING,
                "404": json_response(
                    "Unknown space or session, or (code not_found, field path) no such file in /workspace", "Error"
                ),
            },
        ),
        "put": operation(
            "Write a file of /workspace as the session user",
            {"201": json_response("Written", "FileWritten")},
            body=RAW_BODY,
            query=[query_param("path", "File, relative to /workspace", required=True)],
        ),
    },
    SESSION_PATH + "/artifacts": {
        "get": operation(
            "Collected artifacts (newest first, a page at a time)",
            {"200": json_response("Artifacts", "ArtifactList")},
            query=PAGE_QUERY,
        )
    },
    SESSION_PATH + "/artifacts/collect": {
        "post": operation(
            "Copy /workspace/output to storage (size caps; symlinks and traversal refused)",
            {"200": json_response("What was collected and what was refused", "Collection")},
        )
    },
    SESSION_PATH + "/artifacts/{artifact_id}": {
        "get": operation(
            "Download one artifact", {"200": {"description": "The bytes", "content": {"application/octet-stream": {}}}}
        )
    },
}

PATHS[SESSION_PATH + "/commands"] = {
    "get": operation(
        "The session's background commands (newest first, a page at a time)",
        {"200": json_response("Commands", "CommandList")},
        query=PAGE_QUERY,
    ),
    "post": operation(
        "Start a background command; read its output incrementally",
        {"201": json_response("Started", "Command")},
        body={"required": True, "content": {"application/json": {"schema": ref("CommandRequest")}}},
    ),
}
PATHS[SESSION_PATH + "/commands/{command_id}/output"] = {
    "get": operation(
        "Output after a chunk id (a ring buffer: a reader that fell behind is told so)",
        {"200": json_response("A page of output", "CommandOutput")},
        query=[
            query_param("after", "The last chunk id read (omit: from the start)"),
            query_param("max_bytes", "At most this many bytes in the page"),
        ],
    )
}
PATHS[SESSION_PATH + "/commands/{command_id}/stdin"] = {
    "post": operation(
        "Send bytes (and optionally end-of-file) to the command's stdin",
        {"200": json_response("Queued", "StdinResult")},
        body={"required": True, "content": {"application/json": {"schema": ref("CommandInput")}}},
    )
}
PATHS[SESSION_PATH + "/commands/{command_id}/kill"] = {
    "post": operation("Kill the command's process group in the sandbox", {"200": json_response("Killed", "Command")})
}

INBOUND = {
    "type": "object",
    "required": ["port", "url", "token_header", "traffic_token", "signed_links", "inbound_on"],
    "properties": {
        "port": {"type": "integer"},
        "url": {"type": "string", "description": "The port's URL; send the token in `token_header`"},
        "token_header": {"type": ["string", "null"]},
        "traffic_token": {"type": ["string", "null"]},
        "signed_links": {"type": "boolean", "description": "Whether signed links (for browsers) can be made"},
        "inbound_on": {"type": "boolean", "description": "The space's inbound switch; off: the URL is refused"},
    },
}
INBOUND_LINK_REQUEST = {
    "type": "object",
    "required": ["port"],
    "properties": {
        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "ttl_s": {"type": "integer", "minimum": 60, "description": "Lifetime in seconds (default one hour)"},
    },
}
INBOUND_LINK = {
    "type": "object",
    "required": ["port", "url", "expires_at"],
    "properties": {
        "port": {"type": "integer"},
        "url": {"type": "string", "description": "Opened in a browser, it sets a cookie for the port's URL path"},
        "expires_at": {"type": "integer", "description": "Unix time"},
    },
}
SCHEMAS.update({"Inbound": INBOUND, "InboundLinkRequest": INBOUND_LINK_REQUEST, "InboundLink": INBOUND_LINK})
PATHS[SESSION_PATH + "/inbound"] = {
    "get": operation(
        "The URL of a port of the session's sandbox, with the traffic token and its header",
        {"200": json_response("The port's URL", "Inbound")},
        query=[query_param("port", "A port of the sandbox (1-65535)", required=True)],
    )
}
PATHS[SESSION_PATH + "/inbound/links"] = {
    "post": operation(
        "A signed link to a port for a browser (audited; refused while inbound is off)",
        {"201": json_response("The link", "InboundLink")},
        body={"required": True, "content": {"application/json": {"schema": ref("InboundLinkRequest")}}},
    )
}

PATH_PARAMETERS = {
    "space_id": {"name": "space_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}},
    "key": {
        "name": "key",
        "in": "path",
        "required": True,
        "description": "The platform's session id: letters, digits, '.', '_', ':' and '-', at most 128",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"},
    },
    "path": {"name": "path", "in": "path", "required": True, "schema": {"type": "string"}},
    "artifact_id": {
        "name": "artifact_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "format": "uuid"},
    },
    "command_id": {
        "name": "command_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "format": "uuid"},
    },
}


def openapi_document(server_url: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for template, operations in PATHS.items():
        names = [part[1:-1] for part in template.split("/") if part.startswith("{")]
        paths[template] = {"parameters": [PATH_PARAMETERS[name] for name in names], **operations}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Sandbox Console agent API",
            "version": "1",
            "description": "Resolve session sandboxes, run commands, move files and collect artifacts. "
            "Authenticate with a space API token: `Authorization: Bearer sck_…`. "
            "A GET never creates, resumes or rebuilds a sandbox (a read that needs a running one answers "
            "409 session_not_running); POST …/resolve wakes a session.",
        },
        "servers": [{"url": server_url}],
        "security": [{"spaceToken": []}],
        "components": {
            "securitySchemes": {"spaceToken": {"type": "http", "scheme": "bearer"}},
            "schemas": SCHEMAS,
        },
        "paths": paths,
    }
