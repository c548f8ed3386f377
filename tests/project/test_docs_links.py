"""The reader docs (README.md and docs/*.md) name nothing a clone lacks: every relative link
and every repository path written in backquotes exists.

A backquoted token is read as a path when it looks like one: a file of a known kind
(`sandboxes/backends/base.py`, `security.md`) or a folder (`tests/fakes/`). It is found from the
repository's root, from an app (`console/`, `sandboxes/`, `skills/`), from `templates/`, from
the doc's own folder, or beside the previous path on the same line (`sessions/store.py`,
`store_db.py`). Absolute paths (`/workspace/input/`) live inside a sandbox or on a host, and a
token with `<`, `*` or a space is a pattern, so neither is read. A path that leaves the
repository (`../shared/DESIGN.md`) is dangling for a clone. Code blocks are not read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
APPS = ("console", "sandboxes", "skills", "templates")
PATH_TOKEN = re.compile(
    r"^(?:\.\./)*\.?[A-Za-z0-9_][\w.-]*(?:/[\w.-]+)*"
    r"(?:\.(?:py|md|html|js|mjs|css|toml|txt|sh|json|yml|yaml|cfg|ini)|/)$"
)
BACKQUOTED = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# Paths the docs give as examples of what a user writes or a sandbox holds, not files of the
# repository: the folders of a session's workspace and of a skill's bundle, and a console's
# own state under var/. Built folders (`static/vendor/`, `node_modules/`) appear after `make start`.
EXAMPLES = {
    "input/",
    "output/",
    "tmp/",
    "workspace/",
    "assets/",
    "references/",
    "scripts/",
    "evals/",
    "__MACOSX/",
    "__pycache__/",
    "SKILL.md",
    "LICENSE.txt",
    "requirements.txt",
    "scripts/requirements.txt",
    "scripts/check.sh",
    "scripts/check.py",
    "top_level.txt",
    "daemon.json",
    "refusals.json",
}
BUILT = ("var/", "static/vendor/", "node_modules/", ".venv/")


def reader_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def inside(path: Path) -> bool:
    return Path(os.path.normpath(path)).is_relative_to(ROOT)


def dangling_links(doc: Path, text: str) -> list[str]:
    missing = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor of the same page
        path = doc.parent / target.split("#", 1)[0]
        if not (inside(path) and path.exists()):
            missing.append(f"link {target}")
    return missing


def dangling_paths(doc: Path, text: str) -> list[str]:
    missing = []
    bases = [ROOT, *(ROOT / app for app in APPS), doc.parent]
    for line in text.splitlines():
        neighbour: Path | None = None  # the folder of the line's last path
        for token in (t.strip() for t in BACKQUOTED.findall(line)):
            if not PATH_TOKEN.match(token) or token in EXAMPLES or token.startswith(BUILT):
                continue
            order = [neighbour, *bases] if neighbour is not None else bases
            found = next((b / token for b in order if inside(b / token) and (b / token).exists()), None)
            if found is None:
                missing.append(token)
                continue
            neighbour = found if found.is_dir() else found.parent
    return missing


def dangling(doc: Path) -> list[str]:
    text = FENCE.sub("", doc.read_text())
    return dangling_links(doc, text) + dangling_paths(doc, text)


def test_every_link_and_path_in_the_reader_docs_exists() -> None:
    problems = {str(PurePosixPath(d.relative_to(ROOT))): dangling(d) for d in reader_docs()}
    problems = {doc: names for doc, names in problems.items() if names}
    assert not problems, f"names in the docs that a clone does not have: {problems}"


def test_the_reading_finds_a_dangling_link_and_path(tmp_path: Path) -> None:
    """The rules on a made-up page inside the tree, so the check cannot pass by reading nothing."""
    doc = ROOT / "docs" / "architecture.md"
    text = "\n".join(
        [
            "See [security](security.md), [gone](no-such-page.md#x) and [web](https://a.test/x.md).",
            "The contract is `sandboxes/backends/base.py`, beside it `docker/`; `no_such_module.py`.",
            "Outside: `../shared/DESIGN.md`. Inside a sandbox: `/workspace/input/`. Pattern: `<app>/x.py`.",
            "Examples: `input/`, `var/secret-key`, built: `static/vendor/xterm/`.",
        ]
    )
    assert dangling_links(doc, text) == ["link no-such-page.md#x"]
    assert dangling_paths(doc, text) == ["no_such_module.py", "../shared/DESIGN.md"]


# --- Retired environment variables ----------------------------------------------------------
# docs/configuration.md is the one page that names the retired variables on purpose (its
# "replaces" column); every other reader doc names the knob or the variable that replaced each.
RETIRED_HOME = ROOT / "docs" / "configuration.md"


def retired_names(text: str, retired: Iterable[str]) -> list[str]:
    """The retired variables a text names, code blocks included (a sample `.env` is read too)."""
    return sorted(name for name in retired if re.search(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])", text))


def test_no_reader_doc_but_the_configuration_page_names_a_retired_variable() -> None:
    from console.environment import RETIRED

    problems = {
        str(PurePosixPath(d.relative_to(ROOT))): retired_names(d.read_text(), RETIRED)
        for d in reader_docs()
        if d != RETIRED_HOME
    }
    problems = {doc: names for doc, names in problems.items() if names}
    assert not problems, f"retired variables named as if read (see console/environment.py RETIRED): {problems}"


def test_the_retired_reading_finds_a_whole_name_only() -> None:
    """On made-up text, so the check above cannot pass by matching nothing."""
    retired = {"TERMINAL_IDLE_TIMEOUT_S", "EMAIL_HOST"}
    text = "Set `TERMINAL_IDLE_TIMEOUT_S=600`; EMAIL_HOST_NAME and CONSOLE_EMAIL_HOST are other names."
    assert retired_names(text, retired) == ["TERMINAL_IDLE_TIMEOUT_S"]
    assert retired_names("```\nEMAIL_HOST=smtp.test\n```", retired) == ["EMAIL_HOST"]
