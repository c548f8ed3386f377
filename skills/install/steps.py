"""The install pipeline's steps inside a build sandbox, against the neutral contract.

Pure orchestration over a `Backend`: no ORM, no settings. `skills.image_builds` runs these
steps in order for a skill-image build (and `bench/skill_ready.py` runs the same steps on a
plain session sandbox for its baseline): `copy_skill`, the dependency step
(`skills.install_packages`, which builds on the command helpers here), `verify_skill`,
`clean_scratch`, `write_ledger`. May import `sandboxes.backends` only. Every step raises
`StepFailed(step, message)` with a message an admin can act on; the caller deletes the build
sandbox.

Layout inside the image:
  /opt/skills/<name>/          the skill's files, root-owned, modes kept minus group/other write
  /opt/skills/.ledger.json     what the image holds (written last, before the snapshot)
  /tmp/skill-build/            scratch (package source, requirement files), removed before
                               the snapshot

Verify (docs/skills.md, "Verification"): the entry checks (`entry_check.py`) run on every
entry script as the session user (uid 1000); then the skill's check script, when it has one:
frontmatter `metadata: {check: <path>}` names a file inside the skill, otherwise
`scripts/check.sh` or `scripts/check.py` when present. It runs with the skill folder as its
working directory and must exit 0.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
import shlex
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxes.backends.base import Backend, ExecRequest, ExecResult, RemoteError

SKILLS_ROOT = "/opt/skills"
LEDGER_PATH = f"{SKILLS_ROOT}/.ledger.json"
SCRATCH = "/tmp/skill-build"  # noqa: S108 - inside the build sandbox, removed before the snapshot
PACKAGES_DIR = f"{SCRATCH}/packages"
CHECK_CANDIDATES = ("scripts/check.sh", "scripts/check.py")
CHECK_TIMEOUT_S = 120.0

Log = Callable[[str], None]


class StepFailed(Exception):
    """A pipeline step failed; `message` says why in words an admin can act on."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message


@dataclass(frozen=True)
class SkillPayload:
    """One skill to copy into the image: its name, identity, files and declared dependencies."""

    name: str
    version_id: str
    content_hash: str
    files: tuple[tuple[str, int, bytes], ...]  # (path, mode, data)
    dependencies: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> str:
        return f"{SKILLS_ROOT}/{self.name}"

    @property
    def size(self) -> int:
        return sum(len(data) for _, _, data in self.files)

    @property
    def pip_requirements(self) -> list[str]:
        return [str(dep["requirement"]) for dep in self.dependencies.get("pip") or []]

    @property
    def pip_names(self) -> list[str]:
        return [str(dep["name"]) for dep in self.dependencies.get("pip") or []]

    @property
    def npm_packages(self) -> list[dict[str, str]]:
        return list(self.dependencies.get("npm") or [])

    @property
    def debian_packages(self) -> list[str]:
        return [str(name) for name in self.dependencies.get("debian") or []]

    def check_script(self) -> str | None:
        """The skill's own verification script (relative path), per the convention."""
        paths = {path for path, _, _ in self.files}
        declared = str((self.metadata or {}).get("check") or "").strip()
        if declared:
            normal = posixpath.normpath(declared)
            if normal.startswith(("/", "..")) or normal not in paths:
                raise StepFailed("verify", f"metadata 'check' names {declared!r}, which is not a file of the skill")
            return normal
        return next((candidate for candidate in CHECK_CANDIDATES if candidate in paths), None)


# --- Running commands -------------------------------------------------------------------


def run(
    backend: Backend,
    sandbox_id: str,
    step: str,
    shell: str,
    *,
    user: str = "root",
    timeout_s: float = 120.0,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    check: bool = True,
) -> ExecResult:
    """Run a shell line in the build sandbox; a non-zero exit fails `step` with its output."""
    try:
        result = backend.exec(
            sandbox_id, ExecRequest(shell=shell, user=user, timeout_s=timeout_s, env=dict(env or {}), cwd=cwd)
        )
    except RemoteError as exc:
        raise StepFailed(step, f"{exc.kind}: {exc.message}") from exc
    if check and result.exit_code != 0:
        raise StepFailed(step, f"exit {result.exit_code}: {output_tail(result)}")
    return result


def output_tail(result: ExecResult, limit: int = 1500) -> str:
    text = (result.stderr.decode(errors="replace") + "\n" + result.stdout.decode(errors="replace")).strip()
    if result.timed_out:
        text = f"timed out after {result.duration_s:.0f}s. {text}"
    return text[-limit:] or "(no output)"


def upload_tree(backend: Backend, sandbox_id: str, step: str, archive: bytes, destination: str) -> None:
    """Write one tar into the sandbox and extract it there as root (modes and owners kept).

    One upload plus one extraction, on every backend: envd's file API has no mode parameter,
    and one file per call would cost a round trip per file.
    """
    files = backend.files()
    if files is None:
        raise StepFailed(step, "this backend cannot write files into a sandbox")
    staged = f"{SCRATCH}/upload-{time.monotonic_ns()}.tar"
    try:
        files.write(sandbox_id, staged, archive, mode=0o600, user="root")
    except RemoteError as exc:
        raise StepFailed(step, f"upload failed: {exc.kind}: {exc.message}") from exc
    quoted = shlex.quote(destination)
    run(
        backend,
        sandbox_id,
        step,
        f"mkdir -p {quoted} && tar -x --no-overwrite-dir -p --numeric-owner -f {shlex.quote(staged)} -C {quoted}"
        f" && rm -f {shlex.quote(staged)}",
    )


def tar_of(entries: Iterable[tuple[str, int, bytes]]) -> bytes:
    """A tar of (relative path, mode, bytes), owned by root, with every parent folder 0755."""
    buffer = io.BytesIO()
    seen_dirs: set[str] = set()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, mode, data in entries:
            parts = path.split("/")
            for depth in range(1, len(parts)):
                folder = "/".join(parts[:depth])
                if folder not in seen_dirs:
                    seen_dirs.add(folder)
                    archive.addfile(_member(folder, 0o755, tarfile.DIRTYPE))
            member = _member(path, mode & 0o755, tarfile.REGTYPE)  # no group/other write, no setuid
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def _member(name: str, mode: int, kind: bytes) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = kind
    member.mode = mode
    member.uid = member.gid = 0
    member.uname = member.gname = "root"
    member.mtime = int(time.time())
    return member


# --- Steps ------------------------------------------------------------------------------


def copy_skill(backend: Backend, sandbox_id: str, skill: SkillPayload, log: Log) -> None:
    """Replace /opt/skills/<name> with the skill's files: root-owned, read-only to uid 1000."""
    root = shlex.quote(skill.root)
    run(
        backend,
        sandbox_id,
        "copy",
        f"mkdir -p {SKILLS_ROOT} {SCRATCH} && chown root:root {SKILLS_ROOT} && chmod 0755 {SKILLS_ROOT}"
        f" && chmod 0700 {SCRATCH} && rm -rf -- {root}",
    )
    upload_tree(backend, sandbox_id, "copy", tar_of(skill.files), skill.root)
    run(backend, sandbox_id, "copy", f"chown -R root:root {root} && chmod -R go-w {root} && chmod 0755 {root}")
    log(f"copied {len(skill.files)} file(s), {skill.size} bytes, to {skill.root}")


# The entry checks (entry_check.py), sent as source to the image's python3: never imported here.
ENTRY_CHECK_SOURCE = (Path(__file__).with_name("entry_check.py")).read_text()
SCRIPT_SUFFIXES = (".py", ".js", ".mjs", ".cjs", ".sh", ".bash")


def entry_scripts(skill: SkillPayload) -> list[str]:
    """The scripts a skill runs: every script under scripts/ (by suffix, exec bit or `#!`), and
    any executable or script-suffixed file that SKILL.md names by its path."""
    skill_md = next((data for path, _, data in skill.files if path == "SKILL.md"), b"").decode(errors="replace")
    entries = []
    for path, mode, data in skill.files:
        runnable = path.endswith(SCRIPT_SUFFIXES) or bool(mode & 0o111) or data.startswith(b"#!")
        if not runnable or path == "SKILL.md":
            continue
        named = re.search(r"(?<![\w.-])" + re.escape(path) + r"(?![\w/-])", skill_md) is not None
        if (path.startswith("scripts/") and (path.endswith(SCRIPT_SUFFIXES) or mode & 0o111)) or named:
            entries.append(path)
    return entries


def verify_skill(backend: Backend, sandbox_id: str, skill: SkillPayload, log: Log) -> str:
    """As uid 1000: the entry checks on every entry script, then the skill's own check script
    when it has one. Returns what ran; raises StepFailed naming each script and what it lacks."""
    check = skill.check_script()  # a bad metadata 'check' fails before anything runs
    entries = entry_scripts(skill)
    spec = json.dumps({"root": skill.root, "pip": skill.pip_names, "entries": entries})
    result = run(
        backend,
        sandbox_id,
        "verify",
        shlex.join(["python3", "-c", ENTRY_CHECK_SOURCE, spec]),
        user="user",
        cwd="/",
        timeout_s=CHECK_TIMEOUT_S,
        check=False,
    )
    report = default_checks_report(result)
    for warning in report.get("warnings", []):
        log(f"{skill.name}: warning: {warning}")
    if result.exit_code != 0:
        problems = report.get("problems") or [output_tail(result)]
        raise StepFailed("verify", f"{skill.name}: " + "; ".join(str(p) for p in problems))
    counts = report.get("checked") or []
    log(f"{skill.name}: entry checks passed ({len(entries)} script(s): {', '.join(counts) or 'nothing to check'})")
    verified = f"entry checks ({len(entries)} script(s))"
    if check is None:
        return verified
    path = f"{skill.root}/{check}"
    mode, data = next((mode, data) for name, mode, data in skill.files if name == check)
    if mode & 0o100 and data.startswith(b"#!"):
        command = shlex.quote(path)  # its own interpreter
    else:
        command = f"{'python3' if check.endswith('.py') else 'bash'} {shlex.quote(path)}"
    result = run(
        backend,
        sandbox_id,
        "verify",
        command,
        user="user",
        cwd=skill.root,
        env={"SKILL_DIR": skill.root},
        timeout_s=CHECK_TIMEOUT_S,
        check=False,
    )
    if result.exit_code != 0:
        raise StepFailed("verify", f"{skill.name}: check script {check} failed: {output_tail(result)}")
    log(f"{skill.name}: check script {check} passed")
    return f"{verified} and check script {check}"


def last_json_line(result: ExecResult) -> dict[str, Any]:
    """The JSON object a helper run in the sandbox printed last; empty when there is none."""
    try:
        report = json.loads(result.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return report if isinstance(report, dict) else {}


def default_checks_report(result: ExecResult) -> dict[str, list[str]]:
    """The entry checks' last output line: problems, warnings and what was checked."""
    report = last_json_line(result)
    if not report:
        return {}
    parsed = {key: [str(item) for item in report.get(key) or []] for key in ("problems", "warnings")}
    checked = report.get("checked")
    counts = checked if isinstance(checked, dict) else {}
    parsed["checked"] = [f"{counts[key]} {key}" for key in ("imports", "programs") if key in counts]
    return parsed


# verify runs the skill as the session user; what that leaves must not go into every session.
SESSION_HOME_SAVED = f"{SCRATCH}/session-home.tar"
VERIFY_STARTED = f"{SCRATCH}/verify-started"
SESSION_HOME = 'home=$(getent passwd user | cut -d: -f6); case "$home" in /?*) ;; *) home="";; esac'


def save_session_state(backend: Backend, sandbox_id: str) -> None:
    """Before verify: the session user's home as the template has it, and the time verify began."""
    run(
        backend,
        sandbox_id,
        "verify",
        f"{SESSION_HOME}; mkdir -p {SCRATCH} && touch {VERIFY_STARTED}"
        f' && if [ -n "$home" ] && [ -d "$home" ]; then tar -C "$home" -cpf {SESSION_HOME_SAVED} .; fi',
    )


def restore_session_state(backend: Backend, sandbox_id: str, log: Log) -> None:
    """After verify: stop what the checks left running as the session user, put the home back
    as it was (caches, a line added to .bashrc, a user-site .pth are gone) and remove the
    session user's new files in the temporary folders. A check script runs what the skill
    runs; its leftovers would otherwise be in every session of the image, and a .pth planted
    in the user site would run in the next skill's entry checks."""
    run(
        backend,
        sandbox_id,
        "verify",
        f"{SESSION_HOME}; pkill -KILL -u user; "
        f'if [ -n "$home" ] && [ -f {SESSION_HOME_SAVED} ]; then'
        f' find "$home" -mindepth 1 -delete && tar -C "$home" -xpf {SESSION_HOME_SAVED}; fi'
        f" && find /tmp /var/tmp /dev/shm -xdev -mindepth 1 -user user -newer {VERIFY_STARTED} -delete 2>/dev/null;"
        " true",
    )
    log("the session user's home put back as the template has it; what verify left running stopped")


def clean_scratch(backend: Backend, sandbox_id: str, log: Log) -> None:
    """Remove scratch and caches. /opt/skills is made when missing: an uninstall of the last
    skill starts from the default template and copies nothing, yet the ledger goes there."""
    run(
        backend,
        sandbox_id,
        "clean",
        f"rm -rf {SCRATCH} /root/.cache/pip /root/.npm /tmp/pip-*"
        f" && mkdir -p {SKILLS_ROOT} && chown root:root {SKILLS_ROOT} && chmod 0755 {SKILLS_ROOT}"
        f" && find {SKILLS_ROOT} -name __pycache__ -prune -exec rm -rf {{}} +",
    )
    log("scratch removed")


def write_ledger(backend: Backend, sandbox_id: str, ledger: Mapping[str, Any], log: Log) -> None:
    files = backend.files()
    if files is None:
        raise StepFailed("ledger", "this backend cannot write files into a sandbox")
    data = json.dumps(ledger, indent=2, sort_keys=True).encode()
    try:
        files.write(sandbox_id, LEDGER_PATH, data, mode=0o644, user="root")
    except RemoteError as exc:
        raise StepFailed("ledger", f"{exc.kind}: {exc.message}") from exc
    run(backend, sandbox_id, "ledger", f"chown root:root {LEDGER_PATH} && chmod 0644 {LEDGER_PATH}")
    log(f"ledger written to {LEDGER_PATH} ({len(ledger.get('skills', []))} skill(s))")


def remove_skill(backend: Backend, sandbox_id: str, name: str) -> None:
    run(backend, sandbox_id, "copy", f"rm -rf -- {shlex.quote(f'{SKILLS_ROOT}/{name}')}")
