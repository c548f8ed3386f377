"""Code above the adapters never compares with a backend's kind.

What a kind takes comes from the settings its adapter package declares (`describe(kind)`,
`sandboxes/backends/settings.py`) and what a backend offers from the contract's capability
accessors. This reads the source above the adapters (Python with `ast`, templates as text)
for a comparison or `match` with a kind's value, label or `BackendKind` member, and for an
import of one kind's package.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sandboxes.backends import BACKEND_CLASSES, describe
from sandboxes.models import BackendKind

ROOT = Path(__file__).resolve().parents[2]
KINDS = set(BACKEND_CLASSES)
WORDS = {w.casefold() for w in KINDS | {describe(k).label for k in KINDS} | {str(x) for x in BackendKind.labels}}
# Commands named after one kind by their purpose (register the local engine, build its image).
ALLOWED = {
    "sandboxes/management/commands/register_local_engine.py",
    "sandboxes/management/commands/build_base_image.py",
}


def _above_the_adapters() -> list[Path]:
    return [
        path
        for app in ("console", "sandboxes", "skills")
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.parts
        and not path.relative_to(ROOT).as_posix().startswith(("sandboxes/backends/", "sandboxes/models/"))
        and path.relative_to(ROOT).as_posix() not in ALLOWED
    ]


def _is_kind(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.casefold() in WORDS
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name | ast.Attribute):
        owner = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
        return owner == "BackendKind"
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_kind(element) for element in node.elts)
    return False


def kind_branches(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        compared = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        if isinstance(node, ast.MatchValue):
            compared = [node.value]
        if any(_is_kind(side) for side in compared):
            lines.append(getattr(node, "lineno", 0))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom):
                modules += [f"{node.module or ''}.{alias.name}" for alias in node.names]
            if any(re.search(rf"(^|\.)backends\.({'|'.join(KINDS)})(\.|$)", module) for module in modules):
                lines.append(node.lineno)
    return sorted(set(lines))


_TEMPLATE_BRANCH = re.compile(r"{%[^%]*\b(kind|get_kind_display)\b\s*(==|!=|in\b)[^%]*%}")


def test_no_python_above_the_adapters_compares_with_a_kind() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}" for p in _above_the_adapters() for n in kind_branches(p.read_text())]
    assert not found, "branches on the backend kind (declare a setting, or use a capability):\n" + "\n".join(found)


def test_no_template_compares_with_a_kind() -> None:
    folders = [ROOT / "templates", *ROOT.glob("*/templates"), *ROOT.glob("sandboxes/*/templates")]
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in folders
        for path in folder.rglob("*.html")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _TEMPLATE_BRANCH.search(line)
    ]
    assert not found, "templates branching on the backend kind:\n" + "\n".join(found)


def test_the_check_sees_a_branch_and_not_a_use() -> None:
    assert kind_branches('if config.kind == "cube":\n    pass\n') == [1]
    assert kind_branches('ok = backend.get_kind_display() in ("E2B", "Cube Sandbox")\n') == [1]
    assert kind_branches("if kind in (BackendKind.E2B, models.BackendKind.CUBE):\n    pass\n") == [1]
    assert kind_branches('match kind:\n    case "docker":\n        pass\n') == [2]
    assert kind_branches("from sandboxes.backends.docker.settings import DockerOptions\n") == [1]
    assert kind_branches("from ..backends import e2b\n") == [1]
    assert kind_branches('ok = exc.kind == "gone"\nschema = describe(kind)\nx = schema.takes("api_key")\n') == []
    assert _TEMPLATE_BRANCH.search('{% if config.kind == "docker" %}')
    assert not _TEMPLATE_BRANCH.search('{% if "pids_limit" in backend_kind.config_names %}')
