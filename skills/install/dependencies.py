"""Declared dependencies of a skill: pip, npm and Debian packages (pure: no ORM).

The convention (docs/skills.md):
- pip: `requirements.txt` at the skill root or in `scripts/`;
- npm: the `dependencies` of `package.json` at the skill root or in `scripts/` (one under
  `assets/` is a template the skill copies, not its own dependency list);
- Debian: frontmatter `metadata: {debian-packages: "jq poppler-utils"}` (the spec makes
  metadata values strings, so the list is one string, separated by spaces or commas).

Every entry is validated; an invalid one is left out with a warning, so the installer can
install the validated lists as they are instead of re-reading the raw files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEPENDENCY_DIRS = ("", "scripts/")
DEBIAN_METADATA_KEY = "debian-packages"

# PEP 508 name, optional extras, optional version specifiers, optional environment marker.
# URLs, paths, editable installs and pip options are deliberately not accepted: they would
# let an uploaded skill choose where the build fetches code from.
PIP_REQUIREMENT = re.compile(
    r"""^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)
    \s*(?:\[\s*[A-Za-z0-9._-]+(?:\s*,\s*[A-Za-z0-9._-]+)*\s*\])?
    \s*(?:(?:===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!_-]+
        (?:\s*,\s*(?:===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!_-]+)*)?
    \s*(?:;\s*[A-Za-z0-9_.'"<>=!~ ()-]+)?$""",
    re.VERBOSE,
)
NPM_NAME = re.compile(r"^(?:@[a-z0-9-~][a-z0-9-._~]*/)?[a-z0-9-~][a-z0-9-._~]*$")
NPM_NAME_MAX = 214
# Registry ranges only (^1.2, ~1, >=2 <3, 1.x, *, latest); git/file/http specs are refused.
NPM_VERSION = re.compile(r"^[A-Za-z0-9.^~<>=|*xX +-]{1,100}$")
# What npm reads as a path even within those characters: a folder ("..", ".") or a tarball.
NPM_PATH_SPEC = re.compile(r"^\.|\.(?:tgz|tar|tar\.gz)$", re.IGNORECASE)
DEBIAN_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")


@dataclass
class Dependencies:
    """Validated declarations, and warnings about what was left out."""

    pip: list[dict[str, str]] = field(default_factory=list)  # {"requirement", "name", "source"}
    npm: list[dict[str, str]] = field(default_factory=list)  # {"name", "version", "source"}
    debian: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"pip": self.pip, "npm": self.npm, "debian": self.debian}

    @property
    def empty(self) -> bool:
        return not (self.pip or self.npm or self.debian)


def find_dependencies(files: Mapping[str, bytes], metadata: Mapping[str, str]) -> Dependencies:
    """Read the declarations from a skill's files ({path: bytes}) and its frontmatter metadata."""
    deps = Dependencies()
    for folder in DEPENDENCY_DIRS:
        requirements = files.get(f"{folder}requirements.txt")
        if requirements is not None:
            _read_requirements(requirements, f"{folder}requirements.txt", deps)
        package_json = files.get(f"{folder}package.json")
        if package_json is not None:
            _read_package_json(package_json, f"{folder}package.json", deps)
    if DEBIAN_METADATA_KEY in metadata:
        _read_debian(metadata[DEBIAN_METADATA_KEY], deps)
    return deps


def _read_requirements(data: bytes, source: str, deps: Dependencies) -> None:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        deps.warnings.append(f"{source} is not UTF-8 text; ignored.")
        return
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        match = PIP_REQUIREMENT.match(line)
        if match is None:
            deps.warnings.append(
                f"{source} line {number}: {line[:80]!r} is not a plain requirement (name, extras, versions); left out."
            )
            continue
        deps.pip.append({"requirement": line, "name": match.group("name"), "source": source})


def _read_package_json(data: bytes, source: str, deps: Dependencies) -> None:
    try:
        document = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as exc:
        deps.warnings.append(f"{source} is not valid JSON ({exc}); ignored.")
        return
    except RecursionError:  # a few KB of nested arrays: json raises this, not ValueError
        deps.warnings.append(f"{source} is not valid JSON (nested too deeply); ignored.")
        return
    if not isinstance(document, dict):
        deps.warnings.append(f"{source} is not a JSON object; ignored.")
        return
    declared = document.get("dependencies") or {}
    if not isinstance(declared, dict):
        deps.warnings.append(f"{source}: 'dependencies' is not an object; ignored.")
        return
    for name, version in declared.items():
        if not (isinstance(name, str) and len(name) <= NPM_NAME_MAX and NPM_NAME.match(name)):
            deps.warnings.append(f"{source}: {str(name)[:80]!r} is not a valid npm package name; left out.")
        elif not (isinstance(version, str) and NPM_VERSION.match(version)) or NPM_PATH_SPEC.search(version):
            deps.warnings.append(
                f"{source}: {name} {str(version)[:80]!r} is not a registry version range (git, file and URL "
                "specs are not installed); left out."
            )
        else:
            deps.npm.append({"name": name, "version": version, "source": source})


def _read_debian(value: str, deps: Dependencies) -> None:
    for name in re.split(r"[\s,]+", value.strip()):
        if not name:
            continue
        if DEBIAN_NAME.match(name) and name not in deps.debian:
            deps.debian.append(name)
        elif name not in deps.debian:
            deps.warnings.append(f"metadata {DEBIAN_METADATA_KEY}: {name[:80]!r} is not a valid Debian package name.")
