"""The import graph of the project's own modules: no cycles, and arrows only one way.

    skills  ──►  sandboxes  ──►  console  ──►  netpolicy      sandboxes.backends ──► netpolicy

and, inside those, rooms (`ROOMS`): every module sits in one, and a room imports only the
rooms of `sandboxes/` its entry names; a backend package imports only the contract (and no
Django at all).

`netpolicy` (the network policy's one meaning) is a leaf below every app: it imports nothing
of ours and no Django, and the backends may import it besides the contract.

The graph is built with the standard library's `ast` from the source of `netpolicy/`,
`console/`, `sandboxes/` and `skills/` (migrations and the bundled example skills are not modules of the
running project; `sandboxes/sessions/workspace_helper.py` runs inside a sandbox and imports
nothing of ours anyway). What counts as an arrow:

- every `import` and `from ... import` that runs: at module level and inside a function or
  method. A function-level import is the usual way to hide a cycle from the interpreter;
  the two modules still need each other at run time, so it counts.
- not the imports under `if TYPE_CHECKING:`: they never run and carry no behaviour, only
  names for annotations. A part of a package split by responsibility names its whole that
  way (`docker/files.py`'s `DockerFiles(engine: DockerEngine)`, built by `backend.py`).
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

ROOT = Path(__file__).resolve().parents[2]
APPS = ("netpolicy", "console", "sandboxes", "skills")
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


def _rebinds_type_checking(tree: ast.AST) -> bool:
    """`TYPE_CHECKING = True` (or any binding of the name): its `if` runs, and counts."""
    return any(
        isinstance(node, ast.Name) and node.id == "TYPE_CHECKING" and isinstance(node.ctx, ast.Store)
        for node in ast.walk(tree)
    )


def _runtime_nodes(tree: ast.AST, *, type_checking: bool = False) -> list[ast.AST]:
    """Every node of the tree but those under `if TYPE_CHECKING:` (its `else:` does run);
    `type_checking=True`: those too."""
    found: list[ast.AST] = []
    todo = [tree]
    skip_type_checking = not type_checking and not _rebinds_type_checking(tree)
    while todo:
        node = todo.pop()
        found.append(node)
        if skip_type_checking and isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


# Calls that import the module their first argument names: `importlib.import_module("a.b")`,
# `__import__("a.b")`, Django's `import_string("a.b.C")`. Only a literal name is an arrow; a
# computed one (the backend registry's, `settings.SESSION_ENGINE`) names no module of ours here.
_IMPORT_CALLS = {"import_module", "__import__", "import_string"}


def dynamic_imports(node: ast.AST) -> list[str]:
    if not (isinstance(node, ast.Call) and node.args):
        return []
    func = node.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    first = node.args[0]
    if called in _IMPORT_CALLS and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return [first.value]
    return []


def build_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    """The arrows that run; `type_checking=True` adds those under `if TYPE_CHECKING:`."""
    modules = _project_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path)), type_checking=type_checking):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            else:
                targets = dynamic_imports(node)
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
    rank = {"skills": 0, "sandboxes": 1, "console": 2, "netpolicy": 3}
    wrong = [
        f"{module} -> {target}"
        for module, targets in build_graph().items()
        if module not in WIRING
        for target in sorted(targets)
        if rank[_app(target)] < rank[_app(module)]
    ]
    assert not wrong, "imports against skills -> sandboxes -> console -> netpolicy:\n" + "\n".join(wrong)


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


def test_the_graph_sees_imports_by_call_and_a_rebound_type_checking():
    # An import by a call with a literal name is an arrow like any other...
    for source in (
        "import importlib\nm = importlib.import_module('sandboxes.pages')\n",
        "m = __import__('sandboxes.pages')\n",
        "from django.utils.module_loading import import_string\nf = import_string('sandboxes.pages.x')\n",
    ):
        calls = [name for node in ast.walk(ast.parse(source)) for name in dynamic_imports(node)]
        assert calls, source
        assert calls[0].startswith("sandboxes.pages"), source
    assert _django_imports("import importlib\ns = importlib.import_module('django.conf')\n") == [2]
    assert _django_imports("d = __import__('channels.db')\n") == [1]
    assert _django_imports("m = importlib.import_module(name)\n") == []  # computed: not ours to tell
    # ...and `if TYPE_CHECKING:` is skipped only when the name is typing's, not a module's own flag.
    kept = "TYPE_CHECKING = True\nif TYPE_CHECKING:\n    import sandboxes.pages\n"
    assert any(isinstance(n, ast.Import) for n in _runtime_nodes(ast.parse(kept)))
    skipped = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sandboxes.pages\n"
    assert not any(isinstance(n, ast.Import) for n in _runtime_nodes(ast.parse(skipped)))
    assert any(isinstance(n, ast.Import) for n in _runtime_nodes(ast.parse(skipped), type_checking=True))
    # The backends' rule reads type-only imports too: the real tree passes it so.
    assert "sandboxes.backends.docker.engine" in build_graph(type_checking=True)["sandboxes.backends.docker.files"]


# --- Rooms -------------------------------------------------------------------------------
# Every module of ours sits in a room, and a room's entry says which rooms of `sandboxes/` it
# may import (the docstring of each package says the same). `console` and `skills` are flat
# apps, one room each (their arrows into `sandboxes/` are checked here, the rest by the app
# rule above); `sandboxes/` is split by capability: a package is a room with its subtree, a
# top-level module a room of its own. A module in no room fails `test_every_module_is_in_a_room`,
# so a new package or top-level module says where it stands before its arrows go unchecked.
_BASE = {"sandboxes.backends", "sandboxes.models"}
_CATALOG = _BASE | {"sandboxes.catalog"}
_SESSIONS = _CATALOG | {"sandboxes.sessions"}
_NETWORK = _SESSIONS | {"sandboxes.network"}
_ROOMS = _NETWORK | {"sandboxes.inbound", "sandboxes.terminal", "sandboxes.pools"}
ROOMS: dict[str, set[str]] = {
    "netpolicy": set(),
    "console": set(),
    # The skill builder installs into sessions and builds images on a config's backend.
    "skills": _NETWORK,
    "sandboxes": set(),  # the app's package itself: empty
    "sandboxes.backends": set(),  # the leaf: nothing of ours but itself (see the backend rules)
    "sandboxes.models": set(),  # Django and console.models only
    # Configs, templates, platform backends, `get_backend`, and their pages.
    "sandboxes.catalog": _BASE,
    # Sessions and their pages; other rooms' cards on the session page come by registration.
    "sandboxes.sessions": _CATALOG,
    # A space's policy in use: explain, advice, checks, live, approvals, the refusal log, and
    # their pages.
    "sandboxes.network": _SESSIONS,
    # Inbound links, hosts, the ASGI route to sandbox ports and its page.
    "sandboxes.inbound": _SESSIONS,
    # Tickets, access, shells and the terminal's pages.
    "sandboxes.terminal": _SESSIONS,
    # Warm pools: keeping them filled, the claim (a warm source the runtime asks by
    # registration), their numbers and pages.
    "sandboxes.pools": _SESSIONS,
    # The agent API's own part, below the rooms' API routes: authentication, wire format and
    # error mapping (it names the services' exceptions, so it sits above the sessions), and
    # the token page beside its tokens.
    "sandboxes.api": _SESSIONS,
    # Each room's API routes stand on the API's part; no other module of a room does.
    "sandboxes.sessions.api": _SESSIONS | {"sandboxes.api"},
    "sandboxes.network.api": _NETWORK | {"sandboxes.api"},
    "sandboxes.inbound.api": _SESSIONS | {"sandboxes.api", "sandboxes.inbound", "sandboxes.sessions.api"},
    # The API's wiring: the NinjaAPI mounting every room's routes (nothing imports it back).
    "sandboxes.api.urls": {"sandboxes.api", "sandboxes.sessions.api", "sandboxes.network.api", "sandboxes.inbound.api"},
    # Entry points: Celery tasks and management commands call the rooms that do the work.
    "sandboxes.tasks": _NETWORK | {"sandboxes.terminal", "sandboxes.pools"},
    "sandboxes.management": _SESSIONS,
    # The app's URLconf joins every room's `urls.py` (and the token page's routes).
    "sandboxes.urls": _ROOMS | {"sandboxes.api"},
    # AppConfig.ready(): registers jobs, checks, signals, getting-started steps and page
    # panels of every room (and the API tokens as credentials a deactivated user's
    # revocation reaches).
    "sandboxes.apps": _ROOMS | {"sandboxes.api"},
    **{name: {"*"} for name in WIRING},  # the root: names every app's routes
}


def _room(module: str) -> str:
    """The room a module sits in: the longest entry of `ROOMS` naming it or a package above it
    (a room's API routes, `sandboxes.<room>.api`, are rooms of their own)."""
    if module in WIRING:
        return module
    parts = module.split(".")
    if parts[0] != "sandboxes":
        return parts[0]
    for end in range(len(parts), 2, -1):
        if ".".join(parts[:end]) in ROOMS:
            return ".".join(parts[:end])
    return ".".join(parts[:2])


def _unassigned(graph: dict[str, set[str]]) -> list[str]:
    return sorted(module for module in graph if _room(module) not in ROOMS)


def _against_the_rooms(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        allowed = ROOMS.get(_room(module), set())
        for target in sorted(targets):
            room = _room(target)
            if _app(target) == "sandboxes" and room != _room(module) and room not in allowed and "*" not in allowed:
                wrong.append(f"{module} -> {target}")
    return wrong


def test_every_module_is_in_a_room():
    unassigned = _unassigned(build_graph())
    assert not unassigned, "modules in no room (add them to ROOMS):\n" + "\n".join(unassigned)


def test_rooms_import_only_the_rooms_they_may():
    wrong = _against_the_rooms(build_graph())
    assert not wrong, "imports against the rooms of sandboxes/:\n" + "\n".join(wrong)


# --- Backends ------------------------------------------------------------------------------
# The contract every adapter implements (its settings schema included), and the endpoint guard
# every remote adapter dials through: the shared part of `sandboxes/backends/`, itself importing
# only the contract.
CONTRACT = {"sandboxes.backends.base", "sandboxes.backends.capabilities", "sandboxes.backends.settings"}
# The policy's meaning, below every app: the contract and every adapter read it.
POLICY = "netpolicy"
# The endpoint guard and the unix:// socket check: what any adapter dials through.
SHARED = CONTRACT | {"sandboxes.backends.guard", "sandboxes.backends.unix_socket"}
# A kind built on another's protocol: Cube serves the E2B API, so its adapter extends E2B's.
BUILT_ON = {"cube": {"e2b"}}
# Packages that need Django (its settings, ORM or apps) to import.
DJANGO = ("django", "channels")


def _kind(module: str) -> str | None:
    """`docker` for `sandboxes.backends.docker.*`; None for the registry and shared modules."""
    parts = module.split(".")
    if parts[:2] == ["sandboxes", "backends"] and len(parts) > 2 and module not in SHARED:
        return parts[2]
    return None


def _backend_arrows_against_the_contract(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        if not module.startswith("sandboxes.backends"):
            continue
        kind = _kind(module)
        for target in sorted(targets):
            if target.split(".")[0] == POLICY:
                ok = True
            elif kind is not None:
                ok = target in SHARED or _kind(target) in {kind, *BUILT_ON.get(kind, ())}
            else:  # the registry and the shared modules: only the contract
                ok = target in CONTRACT
            if not ok:
                wrong.append(f"{module} -> {target}")
    return wrong


def _django_imports(source: str) -> list[int]:
    """Lines importing Django (anywhere: module level, a function, under TYPE_CHECKING)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Call):
            names = dynamic_imports(node)
        else:
            continue
        if any(name.split(".")[0].startswith(DJANGO) for name in names):
            lines.append(node.lineno)
    return lines


def test_backends_import_nothing_of_ours_but_the_contract():
    # Type-only imports count here: an adapter's annotations name the contract or its own
    # kind, never a model or a room of sandboxes/ (like its Django imports, below).
    wrong = _backend_arrows_against_the_contract(build_graph(type_checking=True))
    assert not wrong, "backends importing more of the project than the contract:\n" + "\n".join(wrong)


def test_backends_import_no_django():
    # No ORM, no settings, no tenancy: an adapter runs anywhere, a test builds it bare.
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for name, path in _project_modules().items()
        if name.startswith(("sandboxes.backends", "netpolicy"))
        for line in _django_imports(path.read_text())
    ]
    assert not found, "backends importing Django (pass what they need in BackendConfig):\n" + "\n".join(found)


def test_the_new_rules_can_fail():
    # Each rule above, shown a graph or a source that breaks it, says so.
    graph = build_graph()
    # (The real graph breaks none, so each mutation below is the one finding.)
    assert "sandboxes.inbound.websocket" in graph

    def with_arrow(module: str, target: str) -> dict[str, set[str]]:
        mutated = {name: set(targets) for name, targets in graph.items()}
        mutated.setdefault(module, set()).add(target)
        mutated.setdefault(target, set())
        return mutated

    # A module nobody placed: a new package of sandboxes/ or a new top-level module.
    assert _unassigned(with_arrow("sandboxes.newroom.thing", "sandboxes.models")) == ["sandboxes.newroom.thing"]
    assert _unassigned(with_arrow("sandboxes.signals", "sandboxes.models")) == ["sandboxes.signals"]
    # Arrows against the rooms: up from a room, across between rooms, from skills into a page.
    for module, target in [
        ("sandboxes.inbound.websocket", "sandboxes.terminal.pages"),
        ("sandboxes.models.sessions", "sandboxes.catalog.services"),
        ("sandboxes.tasks", "sandboxes.inbound.pages"),
        ("sandboxes.management.commands.build_base_image", "sandboxes.api.auth"),
        # The API's part sits below the rooms' routes, and a room's other modules below it.
        ("sandboxes.api.wire", "sandboxes.sessions.api"),
        ("sandboxes.sessions.runtime", "sandboxes.api.errors"),
        ("sandboxes.network.explain", "sandboxes.api.wire"),
        ("skills.views", "sandboxes.terminal.pages"),
        ("sandboxes.sessions.pages", "sandboxes.network.advice"),
        ("sandboxes.catalog.config_pages", "sandboxes.sessions.access"),
        ("sandboxes.catalog.services", "sandboxes.sessions.runtime"),
    ]:
        assert _against_the_rooms(with_arrow(module, target)) == [f"{module} -> {target}"], (module, target)
    # Backends: a kind reaching past the contract, into another kind, or the shared part
    # reaching into a kind.
    for module, target in [
        ("sandboxes.backends.docker.exec", "sandboxes.models"),
        ("sandboxes.backends.docker.exec", "console.models"),
        ("sandboxes.backends.docker.exec", "sandboxes.backends.e2b.common"),
        ("sandboxes.backends.e2b.backend", "sandboxes.backends.cube.common"),
        ("sandboxes.backends.base", "sandboxes.backends.docker.common"),
        ("sandboxes.backends.capabilities", "sandboxes.backends.guard"),
    ]:
        assert _backend_arrows_against_the_contract(with_arrow(module, target)) == [f"{module} -> {target}"]
    # Django, however it is imported.
    assert _django_imports("from django.conf import settings\n") == [1]
    assert _django_imports("def f():\n    import django.db.models as m\n") == [2]
    assert _django_imports("if TYPE_CHECKING:\n    from channels.db import x\n") == [2]
    assert _django_imports("import json, django_htmx\nfrom .django import x\n") == [1]
    assert _django_imports("import json\nfrom ..base import RemoteError\n") == []
