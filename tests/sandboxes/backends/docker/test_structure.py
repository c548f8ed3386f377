"""The Docker adapter's shape: composition, no mixins, no module state, no reach into another
object's private members, and the egress component behind one façade (read from the source
with `ast` and from the imported classes; no engine needed)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import sandboxes.backends.docker as docker_adapter
from sandboxes.backends.base import Backend
from sandboxes.backends.capabilities import EgressCapability
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.egress.component import DockerEgress

ROOT = Path(docker_adapter.__file__).parent
MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages([str(ROOT)], prefix="sandboxes.backends.docker.")
    if not info.name.endswith("__main__")
)
PARTS = {"backend", "engine", "networks", "listing", "outbound", "egress", "proxy", "state"}
CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")


def _sources() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text()) for path in sorted(ROOT.rglob("*.py"))}


def test_the_backend_holds_its_parts_instead_of_inheriting_them() -> None:
    assert DockerBackend.__bases__ == (Backend,)
    assert DockerEgress.__bases__ == (EgressCapability,)
    for name in MODULES:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name:
                assert len(cls.__bases__) == 1, f"{name}.{cls.__name__} has several bases: {cls.__bases__}"
                assert not cls.__name__.endswith("Mixin"), cls
    backend = DockerBackend.__new__(DockerBackend)
    assert not hasattr(backend, "_container_id")
    assert not hasattr(backend, "ensure_firewall")


def test_no_module_keeps_state() -> None:
    """Only constants (UPPER_CASE), the logger and type aliases at module level; no `global`."""
    for path, tree in _sources().items():
        for node in tree.body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for target in targets:
                names = [t.id for t in ast.walk(target) if isinstance(t, ast.Name)]
                for name in names:
                    assert CONSTANT.match(name) or name in ("logger", "log", "ProxyReader"), (
                        f"{path.name}: module variable {name}"
                    )
        for found in ast.walk(tree):
            assert not isinstance(found, ast.Global | ast.Nonlocal), f"{path.name}: global state"
            if isinstance(found, ast.Call) and isinstance(found.func, ast.Attribute) and found.func.attr == "local":
                # threading.local() only as an instance attribute (EgressState), never a module's.
                assert path.name == "state.py", f"{path.name}: threading.local"


def test_no_part_reaches_into_anothers_private_members() -> None:
    for path, tree in _sources().items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
            assert name not in PARTS, f"{path.relative_to(ROOT)}:{node.lineno}: {name}.{node.attr}"


def test_the_egress_component_is_its_own_package_behind_one_facade() -> None:
    """Nothing outside `egress/` imports an egress part but the façade (and the bridge names)."""
    allowed = {"sandboxes.backends.docker.egress.component", "sandboxes.backends.docker.egress.firewall"}
    for path, tree in _sources().items():
        if "egress" in path.relative_to(ROOT).parts[:1]:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("egress"):
                assert f"sandboxes.backends.docker.{node.module}" in allowed, f"{path.name} imports {node.module}"
    public = {name for name, _ in inspect.getmembers(DockerEgress, inspect.isfunction) if not name.startswith("_")}
    assert {
        "attach",
        "update",
        "resume",
        "detach",
        "release",
        "refusals",
        "reserved",
        "housekeeping",
        "status",
    } <= public


def test_the_shims_of_parallel_branches_are_gone() -> None:
    text = "\n".join(path.read_text() for path in ROOT.rglob("*.py"))
    assert "__dataclass_fields__" not in text
    assert 'getattr(network, "allow_private"' not in text
    for gone in ("parse_entries", "patterns_matching", "PRIVATE_V4", "PRIVATE_V6", "PRIVATE_RANGES", "def covers"):
        assert gone not in text, gone
