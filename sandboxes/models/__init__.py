"""The sandboxes app's models, one submodule per responsibility; every model is re-exported
here, so `from sandboxes.models import X` is the way to name one.

- `catalog`: `PlatformBackend`, `SandboxConfig`, `TemplateRecord` (+ `BackendKind`, `IdleMode`,
  `IDENTITY_FIELDS`, `BACKEND_IDENTITY_FIELDS`)
- `sessions`: `Session` (+ `SessionState`), `SessionImage`, `ApiToken` (+ `TokenScope`), `Artifact`, `ExecSlot`,
  `BackgroundCommand` (+ `CommandStatus`), `Terminal`, `SessionBinding`, `SessionLease`,
  `list_activity` (the sessions list's sort key, which its indexes hold)
- `egress`: `SessionGrant`, `EgressEvent`, `EgressCursor`, `WatchedSandbox`
- `pools`: `PoolMember` (+ `MemberState`), `PoolClaim` (warm pools)

The submodules import Django, `console.models` and each other (catalog <- sessions <- egress, pools),
nothing else of the project.
"""

from .catalog import (
    BACKEND_IDENTITY_FIELDS,
    IDENTITY_FIELDS,
    BackendKind,
    IdleMode,
    PlatformBackend,
    SandboxConfig,
    TemplateRecord,
)
from .egress import EgressCursor, EgressEvent, SessionGrant, WatchedSandbox
from .pools import MemberState, PoolClaim, PoolMember, is_native_pool_of, native_pool_name
from .sessions import (
    ApiToken,
    Artifact,
    BackgroundCommand,
    CommandStatus,
    ExecSlot,
    Session,
    SessionBinding,
    SessionImage,
    SessionLease,
    SessionState,
    Terminal,
    TokenScope,
    list_activity,
)

__all__ = [
    "BACKEND_IDENTITY_FIELDS",
    "IDENTITY_FIELDS",
    "ApiToken",
    "Artifact",
    "BackendKind",
    "BackgroundCommand",
    "CommandStatus",
    "EgressCursor",
    "EgressEvent",
    "ExecSlot",
    "IdleMode",
    "MemberState",
    "PlatformBackend",
    "PoolClaim",
    "PoolMember",
    "SandboxConfig",
    "Session",
    "SessionBinding",
    "SessionGrant",
    "SessionImage",
    "SessionLease",
    "SessionState",
    "TemplateRecord",
    "Terminal",
    "TokenScope",
    "WatchedSandbox",
    "is_native_pool_of",
    "list_activity",
    "native_pool_name",
]
