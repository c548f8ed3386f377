"""The import graph of the project's own modules: no cycles, and arrows only one way.

    skills  ──►  sandboxes  ──►  console          sandboxes.backends ──► (nothing of ours)

The graph is built with the standard library's `ast` from the source of `console/`,
`sandboxes/` and `skills/` (migrations and the bundled example skills are not modules of the
running project; `sandboxes/sessions/workspace_helper.py` runs inside a sandbox and imports
nothing of ours anyway). What counts as an arrow:

- every `import` and `from ... import` that runs: at module level and inside a function or
  method. A function-level import is the usual way to hide a cycle from the interpreter;
  the two modules still need each other at run time, so it counts.
- not the imports under `if TYPE_CHECKING:`: they never run and carry no behaviour, only
  names for annotations. A part of a package split by responsibility names its whole that
  way (`docker/files.py`'s `DockerFiles(backend: DockerBackend)`, built by `backend.py`).
- `from package import name` is an arrow to `package.name` when that is a module of ours,
  else to `package`. Parent packages a dotted import executes on the way (`a/__init__.py`
  for `a.b`) are not arrows: they hold docstrings and the backend registry, not logic.

The project's wiring modules (`console.urls`, `console.routing`, `console.asgi`) assemble
every app's routes and may name them; they are the root of the graph, not part of the
`console` app, and nothing of ours imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("console", "sandboxes", "skills")
# Assemble every app's URLs and websocket routes; nothing imports them back.
WIRING = {"console.urls", "console.routing", "console.asgi"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_modules() -> dict[str, Path]:
    modules = {}
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            rel = path.relative_to(ROOT).parts
            if "migrations" in rel or "examples" in rel:
                continue
            modules[_module_name(path)] = path
    return modules


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of the tree but those under `if TYPE_CHECKING:` (its `else:` does run)."""
    found: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def build_graph() -> dict[str, set[str]]:
    modules = _project_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                # `import a.b.c` of a module of ours; drop third-party and stdlib imports.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _edges(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    members = set(component)
    return [f"{a} -> {b}" for a in component for b in sorted(graph[a]) if b in members]


def test_no_import_cycles():
    graph = build_graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join("  " + "; ".join(_edges(graph, c)) for c in cycles)


def _app(module: str) -> str:
    return module.split(".")[0]


def test_arrows_point_from_skills_to_sandboxes_to_console():
    # An app may import the apps to its right: skills -> sandboxes -> console.
    rank = {"skills": 0, "sandboxes": 1, "console": 2}
    wrong = [
        f"{module} -> {target}"
        for module, targets in build_graph().items()
        if module not in WIRING
        for target in sorted(targets)
        if rank[_app(target)] < rank[_app(module)]
    ]
    assert not wrong, "imports against skills -> sandboxes -> console:\n" + "\n".join(wrong)


def test_backends_import_nothing_of_the_project_but_themselves():
    wrong = [
        f"{module} -> {target}"
        for module, targets in build_graph().items()
        if module.startswith("sandboxes.backends")
        for target in sorted(targets)
        if not target.startswith("sandboxes.backends")
    ]
    assert not wrong, "backends importing the project:\n" + "\n".join(wrong)


def test_the_graph_sees_function_level_and_relative_imports():
    # The checks above are only as good as the graph: it must see the lazy imports that
    # hide cycles, and resolve relative imports in packages and modules alike.
    graph = build_graph()
    assert "sandboxes.backends.base" in graph["sandboxes.backends.docker.backend"]
    assert "sandboxes.sessions.runtime" in graph["sandboxes.sessions.reaper"]
    assert "console.jobs" in graph["console.diagnostics"]
    assert "sandboxes.backends.docker.files" in graph["sandboxes.backends.docker.backend"]
    # ...and not the type-only name a part gives its whole.
    assert "sandboxes.backends.docker.backend" not in graph["sandboxes.backends.docker.files"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Inside sandboxes/: what each capability package may import of its siblings (the docstring
# of each package says the same). The backends are a leaf (tested above); models import none.
_BASE = {"sandboxes.backends", "sandboxes.models"}
SANDBOXES_LAYERS = {
    "sandboxes.catalog": _BASE,
    "sandboxes.sessions": _BASE | {"sandboxes.catalog"},
    "sandboxes.egress": _BASE | {"sandboxes.catalog", "sandboxes.sessions"},
    "sandboxes.api": _BASE | {"sandboxes.catalog", "sandboxes.sessions", "sandboxes.egress"},
    "sandboxes.terminal": _BASE | {"sandboxes.catalog", "sandboxes.sessions"},
    # The pages sit on top: token writes live with the API, the terminal page with the terminal.
    "sandboxes.pages": _BASE
    | {"sandboxes.catalog", "sandboxes.sessions", "sandboxes.egress", "sandboxes.api", "sandboxes.terminal"},
}


def _room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "sandboxes" and len(parts) > 2 else module


def test_sandboxes_packages_import_only_the_layers_below():
    wrong = [
        f"{module} -> {target}"
        for module, targets in build_graph().items()
        if _room(module) in SANDBOXES_LAYERS
        for target in sorted(targets)
        if _app(target) == "sandboxes"
        and _room(target) != _room(module)
        and _room(target) not in SANDBOXES_LAYERS[_room(module)]
    ]
    assert not wrong, "imports against the sandboxes/ layers:\n" + "\n".join(wrong)
