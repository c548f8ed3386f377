"""What the pages of the sandboxes app look up and say the same way: a config through the
access helper (outsider 404, too-low role 403; a session's is `sessions.access`), and a
`RemoteError` (or a service's refusal) in words.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404

from console.access import get_space_for_user
from console.models import Role
from console.services import ServiceError

from ..backends.base import RemoteError
from ..models import SandboxConfig
from .conflicts import Conflict
from .templates import visible_template_ids


def get_config_for_user(user: Any, config_id: Any, role: Role = Role.VIEWER) -> SandboxConfig:
    """A config of a space the user holds `role` in (404 for outsiders, 403 for low roles)."""
    config = get_object_or_404(SandboxConfig.objects.select_related("space", "backend"), pk=config_id)
    get_space_for_user(user, config.space_id, role)
    return config


def remote_error_message(exc: RemoteError) -> str:
    if isinstance(exc, Conflict):  # the space's settings or the session's state
        return exc.message
    hint = " (retry later)" if exc.retryable else ""
    return f"The backend said {exc.kind}: {exc.message}{hint}"


def failure_message(exc: RemoteError | ServiceError) -> str:
    """What a page says of a write that failed: the service's words, or the backend's."""
    return exc.message if isinstance(exc, ServiceError) else remote_error_message(exc)


def template_ids(config: SandboxConfig) -> list[str] | None:
    """Template ids the space may pick (the platform's and its own), or None when unlistable."""
    return visible_template_ids(config)
