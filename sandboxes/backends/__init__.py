"""Backend registry: a config's kind names the adapter class that serves it.

Adapters are imported lazily so a deployment without (say) the e2b SDK still serves Docker.
"""

from __future__ import annotations

import importlib

from .base import Backend, BackendConfig, ErrorKind, RemoteError
from .settings import Scope, Setting, SettingsSchema

BACKEND_CLASSES: dict[str, str] = {
    "docker": "sandboxes.backends.docker.backend.DockerBackend",
    "e2b": "sandboxes.backends.e2b.backend.E2BBackend",
    "cube": "sandboxes.backends.cube.backend.CubeBackend",
    "kubernetes": "sandboxes.backends.kubernetes.backend.KubernetesBackend",
}


def backend_class(kind: str) -> type[Backend]:
    try:
        dotted = BACKEND_CLASSES[kind]
    except KeyError:
        raise RemoteError(ErrorKind.INVALID, f"unknown backend kind {kind!r}") from None
    module_name, _, class_name = dotted.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RemoteError(ErrorKind.UNSUPPORTED, f"backend {kind!r} is not available: {exc}") from exc
    cls: type[Backend] = getattr(module, class_name)
    return cls


def build_backend(config: BackendConfig) -> Backend:
    return backend_class(config.kind)(config)


def describe(kind: str) -> SettingsSchema:
    """The settings a kind declares (its package's `SCHEMA`); imports no adapter SDK."""
    try:
        dotted = BACKEND_CLASSES[kind]
    except KeyError:
        raise RemoteError(ErrorKind.INVALID, f"unknown backend kind {kind!r}") from None
    package = importlib.import_module(dotted.rsplit(".", 2)[0])
    schema: SettingsSchema = package.SCHEMA
    return schema


def all_settings(scope: Scope) -> dict[str, list[tuple[str, Setting]]]:
    """Every setting name any kind declares in `scope`, with each declaring kind's setting."""
    found: dict[str, list[tuple[str, Setting]]] = {}
    for kind in BACKEND_CLASSES:
        for setting in describe(kind).of(scope):
            found.setdefault(setting.name, []).append((kind, setting))
    return found
