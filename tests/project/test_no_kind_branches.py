"""No code above the adapters branches on the backend's kind.

What a kind takes (fields, features) comes from its adapter package's `DESCRIPTION`
(`sandboxes.backends.describe(kind)`) and what a backend offers from the contract's
capability accessors; services, forms, pages and templates only read those. This test reads
the source (`ast` for Python, the template text) and fails on a branch on a kind however it is
spelt: a comparison or `in` with a kind's value or label (`get_kind_display() == "Docker"`),
with a `BackendKind` constant under any alias (`BK.DOCKER`), with a name bound to a kind or a
collection of kinds in this module or another (`kind in REMOTE_KINDS`), and `match`/`case` on any
of those.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sandboxes.backends import BACKEND_CLASSES, describe
from sandboxes.models import BackendKind

ROOT = Path(__file__).resolve().parents[2]
KINDS = set(BACKEND_CLASSES)
# Registers the local Docker engine by name: a choice of kind, not a branch on one.
ALLOWED = {
    "sandboxes/management/commands/register_local_engine.py",
    # Builds the Docker base image: a command of one kind's by its purpose.
    "sandboxes/management/commands/build_base_image.py",
}


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


# The names a kind goes by: its value, its label (`get_kind_display()`, `describe(kind).label`)
# and its constant on `BackendKind` (`BackendKind.DOCKER`, or an alias's `BK.DOCKER`).
LABELS = {describe(kind).label for kind in KINDS} | {str(label) for label in BackendKind.labels}
WORDS = {word.casefold() for word in KINDS | LABELS}
CONSTANTS = set(BackendKind.names) | {kind.upper() for kind in KINDS}
_COLLECTIONS = (ast.Tuple, ast.List, ast.Set)


def _values(node: ast.expr) -> list[ast.expr]:
    """A side of a comparison, a collection's elements (also `frozenset({...})`) one by one."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"set", "frozenset", "tuple"}:
        return [value for arg in node.args for value in _values(arg)]
    return list(node.elts) if isinstance(node, _COLLECTIONS) else [node]


def _is_word(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.casefold() in WORDS


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _bound_to_kinds(nodes: list[ast.AST]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if targets and any(_is_word(v) or _name(v) in CONSTANTS for v in _values(value)):
            names.update(name for target in targets if (name := _name(target)))
    return names


def kind_names(source: str) -> set[str]:
    """Names a module binds at its top level to a kind or a collection of kinds
    (`REMOTE = {"e2b", "cube"}`): other modules may import them."""
    return _bound_to_kinds(list(ast.parse(source).body))


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def _mentions_kind(node: ast.expr) -> bool:
    return any(_name(part) == "kind" for part in ast.walk(node) if isinstance(part, ast.expr))


def _dispatches_on_kind(call: ast.Call) -> bool:
    """`getattr(x, <something computed from a kind>)`: a lookup by kind is a branch on it."""
    return (
        _name(call.func) == "getattr"
        and len(call.args) > 1
        and not isinstance(call.args[1], ast.Constant)
        and _mentions_kind(call.args[1])
    )


def _imports_an_adapter(node: ast.Import | ast.ImportFrom) -> bool:
    """An import of one kind's package (`sandboxes.backends.docker...`, `from ..backends import
    docker`): code above the adapters reaches a kind through `build_backend` and `describe`."""
    if isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        modules = [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return any(
        f".backends.{kind}" in f".{module}." or module.endswith(f"backends.{kind}")
        for module in modules
        for kind in KINDS
    )


def _kind_branches(source: str, known: set[str] | frozenset[str] = frozenset()) -> list[int]:
    """Lines that branch on a kind: compare with it, test `in` a collection of kinds, `case` it.

    `known`: names other modules bind to kinds (`kind_names`), as they may be imported here.
    """
    tree = ast.parse(source)
    docstrings = _docstring_lines(tree)
    named = _bound_to_kinds(list(ast.walk(tree))) | set(known)
    enum_names = {"BackendKind"}  # ...and the names BackendKind goes by here
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.asname and alias.name in named:
                    named.add(alias.asname)
                if alias.asname and alias.name == "BackendKind":
                    enum_names.add(alias.asname)
        elif isinstance(node, ast.Assign) and _name(node.value) == "BackendKind":
            enum_names.update(name for target in node.targets if (name := _name(target)))

    def is_kind(value: ast.expr) -> bool:
        return _is_word(value) or _name(value) in named | CONSTANTS

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _name(node.value) in enum_names:
            lines.append(node.lineno)  # any use of a BackendKind member
        elif isinstance(node, ast.Constant) and _is_word(node) and node.lineno not in docstrings:
            # A kind's name anywhere but a docstring: a dict keyed by kind, a default, a
            # `startswith`, `BackendKind("docker")`, `BACKEND_CLASSES["docker"]`.
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and _dispatches_on_kind(node):
            lines.append(node.lineno)  # getattr(module, config.kind), getattr(self, f"_{kind}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and _imports_an_adapter(node):
            lines.append(node.lineno)  # isinstance(backend, DockerBackend) starts here
        elif isinstance(node, ast.Compare):
            if any(is_kind(value) for side in [node.left, *node.comparators] for value in _values(side)):
                lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and is_kind(node.value):
            lines.append(node.lineno)
    return sorted(set(lines))


def _known_kind_names() -> set[str]:
    # Bound anywhere, the models and adapters included: a constant defined below the
    # adapters and imported above them is a branch all the same.
    return {
        name
        for app in ("console", "sandboxes", "skills")
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.parts and path.relative_to(ROOT).as_posix() not in ALLOWED
        for name in kind_names(path.read_text())
    }


def test_no_python_above_the_adapters_compares_with_a_kind():
    known = _known_kind_names()
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _above_the_adapters()
        for line in _kind_branches(path.read_text(), known)
    ]
    assert not found, "branches on the backend kind (use describe(kind) or a capability):\n" + "\n".join(found)


_TEMPLATE_BRANCH = re.compile(
    r"\.(kind|get_kind_display)\s*(==|!=|in\b)|[\"'](" + "|".join(sorted(map(re.escape, KINDS | LABELS))) + r")[\"']",
    re.IGNORECASE,
)
# In a tag (`{% if %}`, `{% with %}`, `{% include %}`...), a kind is a branch however it is then
# spelt: `{% with k=config.kind %}`, `{% include "x_"|add:config.kind %}`, `{% if kind in remote %}`.
# Output (`{{ config.get_kind_display }}`) is not.
_TAG = re.compile(r"{%.*?%}")
_KIND_IN_TAG = re.compile(r"\.(kind|get_kind_display)\b|(?<![\w.])kind\s*(==|!=|in\b)")


def _template_branches(text: str) -> list[int]:
    return [
        number
        for number, line in enumerate(text.splitlines(), 1)
        if _TEMPLATE_BRANCH.search(line) or any(_KIND_IN_TAG.search(tag) for tag in _TAG.findall(line))
    ]


def test_no_template_compares_with_a_kind():
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in [ROOT / "templates", *ROOT.glob("*/templates"), *ROOT.glob("sandboxes/*/templates")]
        if "tests" not in folder.relative_to(ROOT).parts
        for path in folder.rglob("*.html")
        for number in _template_branches(path.read_text())
    ]
    assert not found, "templates branching on the backend kind:\n" + "\n".join(found)


def test_the_checks_see_a_branch_and_every_kind_is_described():
    assert _kind_branches('if config.kind == "cube":\n    pass\n') == [1]
    assert _kind_branches("if kind in (BackendKind.E2B, BackendKind.CUBE):\n    pass\n") == [1]
    for kind in KINDS:
        assert describe(kind).label


def test_the_checks_see_aliased_branches():
    # match/case on a value, a label or a constant.
    assert _kind_branches('match kind:\n    case "docker":\n        pass\n') == [2]
    assert _kind_branches('match kind:\n    case "e2b" | "cube":\n        pass\n') == [2]
    assert _kind_branches("match config.kind:\n    case BK.DOCKER:\n        pass\n") == [2]
    # BackendKind by another name, its constants compared or tested with `in`.
    imported = "from sandboxes.models import BackendKind as BK\n"
    assert _kind_branches(imported + "if kind == BK.DOCKER:\n    pass\n") == [2]
    assert _kind_branches("BK = models.BackendKind\nx = BK.E2B\n") == [2]
    assert _kind_branches("if config.kind in {models.BackendKind.DOCKER}:\n    pass\n") == [1]
    assert _kind_branches("if kind != self.kinds.CUBE:\n    pass\n") == [1]
    # A collection (or one kind) bound to a name, then tested: here, or in another module.
    remote = 'REMOTE = frozenset({"e2b", "cube"})\n'
    assert kind_names(remote) == {"REMOTE"}
    # (The binding is a finding of its own too: a kind's name above the adapters.)
    assert _kind_branches(remote + "def f(kind):\n    return kind in REMOTE\n") == [1, 3]
    assert _kind_branches("LOCAL: str = 'docker'\nok = config.kind == LOCAL\n") == [1, 2]
    assert _kind_branches("from .kinds import REMOTE as R\nok = kind not in R\n", {"REMOTE"}) == [2]
    assert _kind_branches("ok = kind in kinds.REMOTE\n", {"REMOTE"}) == [1]
    # The label a kind is shown by.
    assert _kind_branches('if config.get_kind_display() == "Docker":\n    pass\n') == [1]
    assert _kind_branches('ok = backend.get_kind_display() in ("E2B", "Cube Sandbox")\n') == [1]
    # ...and not the other kinds of the project (errors, grants, file types) or a kind's use.
    assert _kind_branches("ok = exc.kind in GONE_KINDS or grant.kind == SessionGrant.Kind.ALLOW\n") == []
    assert _kind_branches('ok = kind == "l"\nbackend = build_backend(config)\nlabel = describe(kind).label\n') == []
    assert _template_branches('{% if config.get_kind_display == "Docker" %}') == [1]
    assert _template_branches("{% if backend.kind in remote %}\n{{ config.get_kind_display }}") == [1]
    assert _template_branches("{% if 'Cube Sandbox' == label %}") == [1]


def test_the_checks_see_lookups_by_kind():
    # A kind's name outside a comparison, a lookup by kind, an adapter's
    # class, and a kind in a template tag other than a comparison.
    for source in (
        'ok = config.kind.startswith("docker")\n',
        'run = {"docker": f, "e2b": g}[config.kind]\n',
        'HANDLERS = {"docker": f}\nrun = HANDLERS.get(config.kind)\n',
        'cls = BACKEND_CLASSES["docker"]\n',
        'ok = config.kind == models.BackendKind("docker")\n',
        'def f(kind, local="docker"):\n    return kind == local\n',
        'for k in ("docker",):\n    ok = config.kind == k\n',
        'ok = operator.eq(config.kind, "Docker")\n',
        "run = getattr(module, config.kind)\n",
        'run = getattr(self, f"_setup_{kind}")\n',
        "from sandboxes.backends.docker import DockerBackend\n",
        "from ..backends import e2b\n",
        "import sandboxes.backends.cube.backend\n",
    ):
        assert _kind_branches(source), source
    assert _kind_branches('"""Runs on Docker, E2B or Cube.\n\ndocker\n"""\nx = 1\n') == []  # a docstring
    assert _kind_branches("kind = getattr(exc, 'kind', '')\nfrom sandboxes.backends import describe\n") == []
    for text in (
        "{% with k=config.kind %}{% if k == d %}x{% endif %}{% endwith %}",
        '{% include "sandboxes/kind_"|add:config.kind|add:".html" %}',
        '{% if config.kind|slice:":4" == x %}y{% endif %}',
        "{% if kind in remote_kinds %}x{% endif %}",
    ):
        assert _template_branches(text) == [1], text
    assert _template_branches("{{ config.get_kind_display }} {% if backend.kind_description.limits_processes %}") == []
    assert _template_branches("{% if status or kind %}{% if value == kind %}") == []  # the job list's kinds
