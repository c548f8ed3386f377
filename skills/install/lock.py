"""The pip lock of a skill image generation: the exact Python distributions its skills got.

A skill's requirements are often unpinned (`tinydep>=1.0`). The first build resolves them;
the versions that build installed are the generation's lock (`SkillImage.lock`). A later
build carries the lock on, and a rebuild from the base template (an uninstall) installs
with it as a pip constraints file, so the same skills come back at the same versions even
when the source has newer ones.

How a build's lock is made: the Python distributions of the image are listed before the
dependency step and after it (`importlib.metadata`, no pip needed). The lock holds each
distribution the build added or changed, plus those of the parent's lock still present, at
the version now installed. The base template's own distributions stay out.

Pure orchestration over a `Backend`, like `install.packages`: no ORM, no settings.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from typing import Protocol

from sandboxes.backends.base import Backend

from .steps import SCRATCH, Log, StepFailed, run

CONSTRAINTS_PATH = f"{SCRATCH}/lock-constraints.txt"

# Lists the interpreter's distributions as {normalised name: version}, as JSON.
LIST_DISTRIBUTIONS = """
import json, re, importlib.metadata as m
found = {}
for dist in m.distributions():
    name = dist.metadata.get("Name") if dist.metadata else None
    if name and dist.version:
        found[re.sub(r"[-_.]+", "-", name).lower()] = dist.version
print(json.dumps(found, sort_keys=True))
"""

# A version as pip writes it in `name==version` (PEP 440, local part included).
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]{0,99}$")
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,199}$")


def distributions(backend: Backend, sandbox_id: str, step: str = "dependencies") -> dict[str, str] | None:
    """The build sandbox's Python distributions, or None when the image has no python3."""
    result = run(backend, sandbox_id, step, shlex.join(["python3", "-c", LIST_DISTRIBUTIONS]), check=False)
    if result.exit_code == 127:
        return None
    if result.exit_code != 0:
        raise StepFailed(step, "could not list the image's Python distributions for the lock")
    try:
        found = json.loads(result.stdout.decode(errors="replace"))
    except ValueError:
        raise StepFailed(step, "the image's Python distributions could not be read for the lock") from None
    return {str(name): str(version) for name, version in found.items() if isinstance(version, str)}


def lock_after_build(
    parent_lock: Mapping[str, str], before: Mapping[str, str] | None, after: Mapping[str, str] | None
) -> dict[str, str]:
    """The new generation's lock: what this build added or changed, and what of the parent's
    lock is still installed, each at its installed version (names normalised, sorted)."""
    if after is None:
        return dict(sorted(parent_lock.items()))
    earlier = before or {}
    lock = {name: version for name, version in after.items() if name in parent_lock or earlier.get(name) != version}
    return dict(sorted(lock.items()))


def constraints_text(lock: Mapping[str, str]) -> str:
    """A pip constraints file pinning every locked distribution (`name==version`)."""
    lines = [
        f"{name}=={version}" for name, version in sorted(lock.items()) if NAME.match(name) and VERSION.match(version)
    ]
    return "".join(f"{line}\n" for line in lines)


def write_constraints(backend: Backend, sandbox_id: str, lock: Mapping[str, str], generation: int, log: Log) -> str:
    """Put the lock into the build sandbox as a constraints file; returns its path ('' if empty)."""
    text = constraints_text(lock)
    if not text:
        return ""
    files = backend.files()
    if files is None:
        raise StepFailed("dependencies", "this backend cannot write files into a sandbox")
    files.write(sandbox_id, CONSTRAINTS_PATH, text.encode(), mode=0o644, user="root")
    log(f"pip installs with the lock of generation {generation}: {', '.join(text.split())}")
    return CONSTRAINTS_PATH


class _Generation(Protocol):
    generation: int


def explain_failure(exc: StepFailed, parent: _Generation | None, constraints: str) -> StepFailed:
    """The dependency step's failure, saying that it installed with a lock when it did: a
    locked version the source no longer has fails pip, and the admin should know why."""
    if not constraints or parent is None:
        return exc
    return StepFailed(
        exc.step,
        f"{exc.message} (pip installed with the lock of generation {parent.generation}; "
        "a locked version the package source no longer has fails here)",
    )
