"""Where audit rows are written: `record_audit` is called only from service functions.

A service function, here, is a module-level function of a service module: one of
`SERVICE_MODULES` below, each holding the writes of one subject (the `do_*` functions and
the few writes named otherwise, such as `start_job` or `start_command`). Views, pages, the
agent API's views, consumers, management commands and backends call those functions; they
never write an audit row themselves, so every write is audited the same way whichever door
it came through. A method, a class body or module-level code does not count, except where
`EXCEPTIONS` names it with its reason.

The check reads the source with the standard library's `ast`: every call whose callee is
named `record_audit`, in `console/`, `sandboxes/` and `skills/` (migrations aside).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = ("console", "sandboxes", "skills")

SERVICE_MODULES = {
    "console.services",  # spaces, members, network policy, login sessions, secrets; defines record_audit
    "console.users",  # users and invitations
    "console.jobs",  # starting and cancelling admin jobs
    "console.oidc",  # the writes a single sign-on makes (do_link_oidc_identity, do_create_oidc_user)
    "sandboxes.api.tokens",  # API tokens
    "sandboxes.catalog.services",  # sandbox configs and session images
    "sandboxes.catalog.platform",  # platform backends
    "sandboxes.catalog.templates",  # templates and snapshots
    "sandboxes.network.approvals",  # egress grants
    "sandboxes.network.live",  # applying a policy to running sandboxes
    "sandboxes.sessions.commands",  # background commands
    "sandboxes.inbound.links",  # inbound links
    "sandboxes.sessions.lookup",  # creating a session
    "sandboxes.sessions.retention",  # the retention pass
    "sandboxes.sessions.services",  # labels and keep-awake
    "sandboxes.sessions.teardown",  # releasing snapshots
    "sandboxes.sessions.unmanaged",  # deleting unmanaged resources
    "sandboxes.sessions.workspace",  # files in and out of a session
    "sandboxes.sessions.runtime",  # see EXCEPTIONS
    "sandboxes.terminal.shells",  # a terminal's open and close
    "sandboxes.pools.services",  # a config's pool size
    "sandboxes.pools.claim",  # a session taking a pooled sandbox (as a create records it)
    "skills.services",  # skills and their versions
    "skills.images",  # rolling back and cleaning skill images
    "skills.sources.services",  # the allowed git hosts (git imports are audited by skills.services)
    "skills.install.build",  # recording a built generation
}

# (module, enclosing class) -> why its methods may record audit rows.
EXCEPTIONS = {
    ("sandboxes.sessions.runtime", "Runtime"): (
        "Runtime is the session lifecycle service: its methods (sandbox creation, pause, "
        "resume, rebuild, delete) record their row under the session's lifecycle lock they "
        "hold; splitting them into module functions belongs to the session room's rework."
    ),
}

# Module names that handle requests or commands: never a service module.
HANDLER_MARKERS = ("views", "pages", "consumers", "urls", "management", "backends", "templatetags", "forms")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _callee(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def audit_call_sites(root: Path = ROOT) -> list[tuple[str, str, str | None, int]]:
    """(module, top-level definition, enclosing class or None, line) of each call."""
    sites: list[tuple[str, str, str | None, int]] = []
    for app in APPS:
        for path in sorted((root / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            module = _module_name(path, root)
            tree = ast.parse(path.read_text(), filename=str(path))
            for top in tree.body:
                for node in ast.walk(top):
                    if isinstance(node, ast.Call) and _callee(node) == "record_audit":
                        if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef):
                            sites.append((module, top.name, None, node.lineno))
                        elif isinstance(top, ast.ClassDef):
                            sites.append((module, top.name, top.name, node.lineno))
                        else:
                            sites.append((module, "<module>", None, node.lineno))
    return sites


def violations(sites: list[tuple[str, str, str | None, int]]) -> list[str]:
    wrong = []
    for module, where, cls, line in sites:
        if module not in SERVICE_MODULES:
            wrong.append(f"{module}:{line} is not a service module")
        elif cls is not None and (module, cls) not in EXCEPTIONS:
            wrong.append(f"{module}:{line} is in class {cls}, not a module-level service function")
        elif where == "<module>":
            wrong.append(f"{module}:{line} runs at import")
    return wrong


def test_record_audit_is_called_only_from_service_functions() -> None:
    sites = audit_call_sites()
    assert len(sites) > 40  # the walk found the project's call sites
    wrong = violations(sites)
    assert not wrong, "\n".join(wrong)


def test_the_service_modules_are_no_request_handlers_and_each_still_audits() -> None:
    for module in SERVICE_MODULES:
        assert not any(marker in module.split(".") for marker in HANDLER_MARKERS), module
    used = {module for module, *_ in audit_call_sites()}
    assert used == SERVICE_MODULES, f"listed but not calling record_audit: {SERVICE_MODULES - used}"
    assert {module for module, _ in EXCEPTIONS} <= used


def test_the_check_flags_a_view_a_method_and_module_code(tmp_path: Path) -> None:
    (tmp_path / "console").mkdir()
    (tmp_path / "console" / "views.py").write_text(
        "def page(request):\n    record_audit(actor, AuditAction.SPACE_UPDATE)\n"
    )
    (tmp_path / "console" / "services.py").write_text(
        "class Helper:\n    def go(self):\n        services.record_audit(SYSTEM, AuditAction.SPACE_UPDATE)\n\n"
        "record_audit(SYSTEM, AuditAction.SPACE_UPDATE)\n\n"
        "def do_it():\n    record_audit(SYSTEM, AuditAction.SPACE_UPDATE)\n"
    )
    wrong = violations(audit_call_sites(tmp_path))
    assert wrong == [
        "console.services:3 is in class Helper, not a module-level service function",
        "console.services:5 runs at import",
        "console.views:2 is not a service module",
    ]
