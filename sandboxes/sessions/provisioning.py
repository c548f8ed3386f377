"""What a session's sandbox is made from and run on.

Its backend is `catalog.bridge.get_backend(config)`. Here: `effective_template`: the space's
skill image on a config when valid, else the config's default template (`effective_templates`:
of many configs, in one query); `prepare_workspace`: the /workspace layout every new sandbox
gets, through the helper that runs inside it (`WORKSPACE_HELPER_SOURCE`), or made by the
create itself (`WORKSPACE_LAYOUT`, `ready_workspace`); `from_warm_pool`: a ready sandbox for
a session that has none, from the sources registered with `register_warm_source` (the pools
room registers its own in `SandboxesConfig.ready()`; this room never imports it).

May import `sandboxes.backends`, `sandboxes.models`, `sandboxes.catalog` and `console`;
nothing else of `sessions` (the runtime, the reaper and the workspace build on it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from console.models import Space

from ..backends.base import (
    Backend,
    ErrorKind,
    ExecRequest,
    RemoteError,
    SandboxInfo,
    WorkspaceFolder,
    WorkspaceLayout,
)
from ..catalog.bridge import config_fingerprint
from ..models import SandboxConfig, Session, SessionImage

# --- Effective template -----------------------------------------------------------------


@dataclass(frozen=True)
class EffectiveTemplate:
    template_id: str
    source: str  # "skill image" | "default template"
    note: str = ""


def effective_template(space: Space, config: SandboxConfig) -> EffectiveTemplate:
    """The space's current skill image on this config when valid, else the default template."""
    return _effective(config, SessionImage.objects.filter(space=space, config=config).first())


def effective_templates(configs: Sequence[SandboxConfig]) -> dict[object, EffectiveTemplate]:
    """`effective_template` of each config in its own space, by config id: one query for all
    (a page listing many configs)."""
    images = {(i.space_id, i.config_id): i for i in SessionImage.objects.filter(config__in=[c.pk for c in configs])}
    return {c.pk: _effective(c, images.get((c.space_id, c.pk))) for c in configs}


def _effective(config: SandboxConfig, image: SessionImage | None) -> EffectiveTemplate:
    if image is None:
        return EffectiveTemplate(config.default_template, "default template")
    if image.fingerprint != config_fingerprint(config):
        return EffectiveTemplate(
            config.default_template,
            "default template",
            f"the skill image {image.snapshot_id} belongs to another backend account; "
            "sessions start from the default template",
        )
    return EffectiveTemplate(image.snapshot_id, "skill image", image.label)


# Run inside sandboxes for every file operation on /workspace (docs/security.md).
WORKSPACE_HELPER_SOURCE = Path(__file__).with_name("workspace_helper.py").read_text()
# The workspace layout every new sandbox gets: input/ read-only to the session user. Set by
# the helper on descriptors opened without following links: a persistent workspace may hold
# links its user planted (output -> /etc), which a plain chown would follow as root.
SESSION_UID = 1000
PREPARE_WORKSPACE = ExecRequest(
    argv=("python3", "-I", "-c", WORKSPACE_HELPER_SOURCE, "prepare", ".", str(SESSION_UID)),
    user="root",
    cwd="/",
    timeout_s=30,
)


# The same layout, for a backend that makes it at create (SandboxSpec.workspace_layout): the
# folder the user's, input/ root's and 0755, output/ the user's (its mode kept).
WORKSPACE_LAYOUT = WorkspaceLayout(
    owner_uid=SESSION_UID,
    folders=(WorkspaceFolder("input", 0, 0o755), WorkspaceFolder("output", SESSION_UID)),
)


def ready_workspace(backend: Backend, info: SandboxInfo) -> None:
    """After a create: lay out /workspace unless the create did (`workspace_ready`)."""
    if not info.workspace_ready:
        prepare_workspace(backend, info.sandbox_id)


def prepare_workspace(backend: Backend, sandbox_id: str) -> None:
    """Lay out /workspace; a layout that failed is an error, not a sandbox handed out with
    input/ still the session user's or a link. A template without python3 (127) has no file
    access at all (the file operations say so), so it is not refused here."""
    result = backend.exec(sandbox_id, PREPARE_WORKSPACE)
    if result.exit_code not in (0, 127):
        message = result.stderr.decode(errors="replace").strip()[:300] or f"exit code {result.exit_code}"
        raise RemoteError(ErrorKind.INTERNAL, f"laying out /workspace failed: {message}")


# --- Warm pools ---------------------------------------------------------------------------

# (session, its backend, the binding version it will get) -> a running sandbox made the
# session's (workspace, network and session row applied), or None: none to give.
WarmSource = Callable[[Session, Backend, int], SandboxInfo | None]
_warm_sources: list[WarmSource] = []  # registrations (state, not a cache)


def register_warm_source(source: WarmSource) -> None:
    if source not in _warm_sources:
        _warm_sources.append(source)


def from_warm_pool(session: Session, backend: Backend, version: int) -> SandboxInfo | None:
    """A ready sandbox for a session with no binding, under its lifecycle lock; None: create one."""
    for source in _warm_sources:
        info = source(session, backend, version)
        if info is not None:
            return info
    return None
