"""docs/architecture.md stays the map of the tree: every module of the apps is named in it,
and every path it names exists.

How the page names a module (what a newcomer reads): a path in backquotes, from the
repository's root (`sandboxes/sessions/reaper.py`) or from the app of its section
(`sessions/reaper.py` under "Modules of `sandboxes/`"); a bare file name after a path on the
same line is that path's neighbour (`sessions/store.py`, `store_db.py`); and a package named
in a row (`api/`, `backends/docker/`) names its modules by their bare names in that row
(`views`, `listing`), which in the package's own row must be its modules. Migrations,
`__init__.py` files, the tests and the example skills' scripts are not listed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
APPS = ("console", "sandboxes", "skills")
# A backquoted token that reads as a path of the tree: a file of a known kind or a folder.
PATH_TOKEN = re.compile(r"^[A-Za-z0-9_.][\w./-]*(?:\.(?:py|md|html|js|css|toml|txt)|/)$")
# Folders of data that happen to hold Python: the bundled example skills' own scripts.
DATA = {("skills", "examples")}
BARE_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
# A module listed in its package's row: after ": " or ", ", before " (", "," or the cell's end.
LISTED = re.compile(r"(?:: |, )`([a-z_][a-z0-9_]*)`(?= \(|,| *\|| *$)")
SECTION = re.compile(r"^## Modules of `(\w+)/`")
BACKQUOTED = re.compile(r"`([^`]+)`")


@dataclass
class Reading:
    named: set[str] = field(default_factory=set)  # module paths from the root, e.g. "console/oidc.py"
    missing: list[str] = field(default_factory=list)  # path tokens that match nothing of the tree


def app_modules() -> set[str]:
    """Every module of the apps that the page must name."""
    modules = set()
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            relative = path.relative_to(ROOT)
            if "migrations" in relative.parts or path.name == "__init__.py" or relative.parts[:2] in DATA:
                continue
            modules.add(relative.as_posix())
    return modules


def resolve(token: str, bases: list[PurePosixPath]) -> PurePosixPath | None:
    """The first of `bases / token` that exists (relative to the repository's root)."""
    for base in bases:
        candidate = base / token.rstrip("/")
        if (ROOT / candidate).exists():
            return candidate
    return None


def read_line(line: str, app: str | None, reading: Reading) -> None:
    tokens = [t.strip() for t in BACKQUOTED.findall(line)]
    app_bases = [PurePosixPath(".")] + [PurePosixPath(a) for a in sorted(APPS, key=lambda a: a != app)]
    bases = [*app_bases, PurePosixPath("templates")]
    neighbour: PurePosixPath | None = None  # the folder of the line's last path
    packages: list[PurePosixPath] = []
    for token in tokens:
        if not PATH_TOKEN.match(token) or "<" in token or token.startswith("../"):
            continue  # "../shared/DESIGN.md" lies beside the repository, not in a clean clone
        bare_file = "/" not in token.rstrip("/")
        found = resolve(token, [neighbour, *bases] if bare_file and neighbour is not None else bases)
        if found is None:
            reading.missing.append(token)
            continue
        is_dir = (ROOT / found).is_dir()
        neighbour = found if is_dir else found.parent
        if is_dir:
            packages.append(found)
        elif found.suffix == ".py":
            reading.named.add(found.as_posix())
    bare = {t for t in tokens if BARE_NAME.match(t)}
    cells = line.split("|")
    if len(packages) == 1 and len(cells) > 3 and BACKQUOTED.findall(cells[1]) == [f"{packages[0].name}/"]:
        # A package's own row lists its modules ("`views` (…), `urls`"): each must be one.
        stems = {
            p.relative_to(ROOT / packages[0]).with_suffix("").as_posix() for p in (ROOT / packages[0]).rglob("*.py")
        }
        for listed in LISTED.findall("|".join(cells[2:])):
            if listed not in stems:
                reading.missing.append(f"{packages[0]}/{listed}")
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT)
            if path.stem in bare or relative.relative_to(package).with_suffix("").as_posix() in bare:
                reading.named.add(relative.as_posix())


def read_doc(text: str) -> Reading:
    reading = Reading()
    app: str | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            match = SECTION.match(line)
            app = match.group(1) if match else None
        read_line(line, app, reading)
    return reading


def test_every_module_of_the_apps_is_named_in_the_architecture_page() -> None:
    unnamed = sorted(app_modules() - read_doc(DOC.read_text()).named)
    assert not unnamed, f"modules docs/architecture.md does not name (add a line each): {unnamed}"


def test_every_path_the_architecture_page_names_exists() -> None:
    missing = read_doc(DOC.read_text()).missing
    assert not missing, f"paths named in docs/architecture.md that do not exist: {missing}"


def test_the_reading_finds_names_and_misses() -> None:
    """The rules above on a made-up page, so the two tests cannot pass by reading nothing."""
    page = "\n".join(
        [
            "## Modules of `console/`",
            "| `settings/base.py`, `dev.py` | x |",
            "| `no_such_module.py` | y |",
            "## Modules of `sandboxes/`",
            "| `api/` | the API: `auth`, `urls`, `no_such_part` (x) |",
            "Prose naming `skills/parsing.py` from the root.",
        ]
    )
    reading = read_doc(page)
    assert {
        "console/settings/base.py",
        "console/settings/dev.py",
        "sandboxes/api/auth.py",
        "sandboxes/api/urls.py",
        "skills/parsing.py",
    } <= reading.named
    assert "sandboxes/api/openapi.py" not in reading.named
    assert reading.missing == ["no_such_module.py", "sandboxes/api/no_such_part"]
