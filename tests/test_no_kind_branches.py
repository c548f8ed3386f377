"""No code above the adapters branches on the backend's kind.

What a kind takes (fields, features) comes from its adapter package's `DESCRIPTION`
(`sandboxes.backends.describe(kind)`) and what a backend offers from the contract's
capability accessors; services, forms, pages and templates only read those. This test reads
the source (`ast` for Python, the template text) and fails on a comparison with a kind.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sandboxes.backends import BACKEND_CLASSES, describe

ROOT = Path(__file__).resolve().parent.parent
KINDS = set(BACKEND_CLASSES)
# Registers the local Docker engine by name: a choice of kind, not a branch on one.
ALLOWED = {"sandboxes/management/commands/register_local_engine.py"}


def _above_the_adapters() -> list[Path]:
    paths = []
    for app in ("console", "sandboxes", "skills"):
        for path in (ROOT / app).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" in rel or rel.startswith("sandboxes/backends/") or rel.startswith("sandboxes/models/"):
                continue
            if rel not in ALLOWED:
                paths.append(path)
    return paths


def _kind_branches(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "BackendKind":
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                if any(isinstance(v, ast.Constant) and v.value in KINDS for v in values):
                    lines.append(node.lineno)
    return lines


def test_no_python_above_the_adapters_compares_with_a_kind():
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _above_the_adapters()
        for line in _kind_branches(path.read_text())
    ]
    assert not found, "branches on the backend kind (use describe(kind) or a capability):\n" + "\n".join(found)


def test_no_template_compares_with_a_kind():
    pattern = re.compile(r"\.kind\s*(==|!=|in\b)|[\"'](" + "|".join(sorted(KINDS)) + r")[\"']")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in (ROOT / "templates").rglob("*.html")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "templates branching on the backend kind:\n" + "\n".join(found)


def test_the_checks_see_a_branch_and_every_kind_is_described():
    assert _kind_branches('if config.kind == "cube":\n    pass\n') == [1]
    assert _kind_branches("if kind in (BackendKind.E2B, BackendKind.CUBE):\n    pass\n") == [1, 1]  # each BackendKind.X
    for kind in KINDS:
        assert describe(kind).label
