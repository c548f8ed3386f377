"""Debian packages for skills, from the platform backend's apt source, in a build sandbox.

The source (`PackageSources`, set by the platform admin per backend) is one of:
- a local repository folder: `.deb` files and a `Packages` (or `Packages.gz`) index, under the
  package sources root. The console copies the index into the sandbox, lets apt work out
  which files the install needs (`apt-get -s`), and copies only those `.deb` files. The build
  sandbox stays offline.
- a mirror or proxy URL with its suite and components (none: a flat repository). The build
  sandbox reaches that host and nothing else (`install.network`).

apt reads only what this module writes under the build's scratch folder: one sources.list
line, no sources.list.d, its own lists, caches and logs (removed with the scratch before the
snapshot), never recommends or suggests. Signing: a folder is `[trusted=yes]`: it is on the
console's own disk, put there by the platform admin, and apt still checks each file's
SHA256 against the index. A URL is checked against the keyrings in the template, unless the
admin marked it trusted unsigned (an internal repository without a signed Release).

`apt_install` is the one way to install Debian packages in a build sandbox (the dependency
step and any installer that needs a program, such as Node.js for npm, call it);
`check_debian` is the sources check's part (present in the image or the source, with the
version apt would install, and installable together). Pure orchestration over a `Backend`
like `install.packages`: no ORM, no settings.
"""

from __future__ import annotations

import gzip
import posixpath
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxes.backends.base import Backend

from .steps import SCRATCH, Log, StepFailed, output_tail, run, tar_of, upload_tree

if TYPE_CHECKING:
    from .packages import PackageSources  # which imports this module to install

APT_ROOT = f"{SCRATCH}/apt"
REPO_DIR = f"{APT_ROOT}/repo"
READY = f"{APT_ROOT}/ready"
INDEX_NAMES = ("Packages", "Packages.gz")
UPDATE_TIMEOUT_S = 300.0
INSTALL_TIMEOUT_S = 900.0
COPY_BATCH_BYTES = 16 * 1024 * 1024
# The index is read into the console's memory (a Debian mirror's main index is ~60 MiB).
INDEX_MAX_BYTES = 256 * 1024 * 1024

# Every apt run: only our sources.list, no sources.list.d, lists, caches and logs in scratch,
# no recommends or suggests, English output (parsed), no prompt, no retries (fail fast).
APT_OPTIONS = (
    f"Dir::Etc::SourceList={APT_ROOT}/sources.list",
    f"Dir::Etc::SourceParts={APT_ROOT}/sources.list.d",
    f"Dir::State::Lists={APT_ROOT}/lists",
    f"Dir::Cache={APT_ROOT}/cache",
    f"Dir::Log={APT_ROOT}/log",
    "APT::Install-Recommends=false",
    "APT::Install-Suggests=false",
    "APT::Sandbox::User=root",
    "Acquire::Languages=none",
    "Acquire::Retries=0",
    "Acquire::http::Timeout=20",
    "Acquire::https::Timeout=20",
    # No fsync per unpacked file: the build sandbox is thrown away if the build fails, and the
    # snapshot is taken from the finished file system.
    "Dpkg::Options::=--force-unsafe-io",
)
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", "LANG": "C"}

# `apt-get -s install` lines: "Inst name [old version] (new version origin [arch])".
_INST = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) ", re.MULTILINE)


@dataclass(frozen=True)
class IndexEntry:
    """One package of a repository folder's index."""

    name: str
    version: str
    filename: str  # relative to the folder, normalised


def source_label(sources: PackageSources) -> str:
    """The apt source as the job log and errors name it."""
    if sources.apt_folder is not None:
        return f"the apt repository folder {sources.apt_folder.name}/"
    suite = f" ({sources.apt_suite})" if sources.apt_suite else ""
    return f"the apt source {sources.apt_url_shown}{suite}"


def sources_line(sources: PackageSources) -> str:
    """The one sources.list line apt reads."""
    if sources.apt_folder is not None:
        return f"deb [trusted=yes] file:{REPO_DIR} ./"
    if any(ch.isspace() or ord(ch) < 32 for ch in sources.apt_url + sources.apt_suite.replace(" ", "")):
        # A row saved before the form refused them: apt would read another source's line.
        raise StepFailed("check", f"{source_label(sources)!r} holds a line break or a tab; set it again")
    options = "[trusted=yes] " if sources.apt_trusted else ""
    where = sources.apt_suite or "./"
    return f"deb {options}{sources.apt_url} {where}"


def apt_get(*args: str, tool: str = "apt-get") -> str:
    """An apt-get (or apt-cache) command line with every option of APT_OPTIONS."""
    options = [part for option in APT_OPTIONS for part in ("-o", option)]
    return shlex.join([tool, *options, *args])


def index_file(folder: Path) -> Path:
    """The folder's index; StepFailed when it has none."""
    for name in INDEX_NAMES:
        path = folder / name
        if path.is_file() and not path.is_symlink():
            if path.stat().st_size > INDEX_MAX_BYTES:  # it is read whole to be copied in
                raise StepFailed("check", _too_big(folder))
            return path
    raise StepFailed(
        "check",
        f"the apt repository folder {folder.name}/ has no Packages index "
        "(make one with dpkg-scanpackages, or scripts/apt_repo.py)",
    )


def _too_big(folder: Path) -> str:
    return (
        f"the apt repository folder {folder.name}/ has a Packages index over {INDEX_MAX_BYTES // 2**20} MiB "
        "unpacked; split the repository"
    )


def read_index(folder: Path) -> dict[tuple[str, str], IndexEntry]:
    """{(name, version): entry} of the folder's index; entries naming files outside it are left out."""
    path = index_file(folder)
    with gzip.open(path) if path.name.endswith(".gz") else path.open("rb") as stream:
        raw = stream.read(INDEX_MAX_BYTES + 1)
    if len(raw) > INDEX_MAX_BYTES:
        raise StepFailed("dependencies", _too_big(folder))
    text = raw.decode("utf-8", "replace")
    entries: dict[tuple[str, str], IndexEntry] = {}
    for stanza in re.split(r"\n\s*\n", text):
        fields = {
            key.strip().lower(): value.strip()
            for key, _, value in (line.partition(":") for line in stanza.splitlines() if line and line[0] not in " \t")
        }
        name, version, filename = fields.get("package"), fields.get("version"), fields.get("filename")
        if not (name and version and filename):
            continue
        normal = posixpath.normpath(filename)
        if normal.startswith(("/", "..")):
            continue
        entries[(name, version)] = IndexEntry(name, version, normal)
    return entries


def missing_from_image(backend: Backend, sandbox_id: str, names: Sequence[str], step: str) -> list[str]:
    """The packages of `names` that dpkg does not have installed in the sandbox."""
    quoted = " ".join(shlex.quote(name) for name in names)
    script = (
        f"for p in {quoted}; do"
        " dpkg-query -W -f='${Status}' \"$p\" 2>/dev/null | grep -q 'ok installed' || echo \"$p\"; done"
    )
    missing = set(run(backend, sandbox_id, step, script).stdout.decode().split())
    return [name for name in names if name in missing]


def no_source_message(names: Sequence[str]) -> str:
    return (
        f"Debian package{'s' if len(names) > 1 else ''} {', '.join(names)}: not in the image, and the platform "
        "backend has no apt source (set 'apt repository folder' or 'apt mirror or proxy URL' on it)"
    )


def prepare_apt(backend: Backend, sandbox_id: str, sources: PackageSources, log: Log, *, step: str) -> None:
    """Write apt's configuration, copy a folder's index in, and read the source (`apt-get
    update`). Done once per build: the check and the install share it."""
    if run(backend, sandbox_id, step, f"test -e {READY}", check=False).exit_code == 0:
        return
    if run(backend, sandbox_id, step, "command -v apt-get && command -v dpkg", check=False).exit_code != 0:
        raise StepFailed(step, "the template has no apt-get and dpkg, so Debian packages cannot be installed in it")
    label = source_label(sources)
    run(
        backend,
        sandbox_id,
        step,
        f"mkdir -p {SCRATCH} && chmod 0700 {SCRATCH} && rm -rf {APT_ROOT} && mkdir -p {REPO_DIR}"
        f" {APT_ROOT}/sources.list.d {APT_ROOT}/lists/partial {APT_ROOT}/cache/archives/partial {APT_ROOT}/log"
        f" && printf '%s\\n' {shlex.quote(sources_line(sources))} > {APT_ROOT}/sources.list",
    )
    if sources.apt_folder is not None:
        index = index_file(sources.apt_folder)
        upload_tree(backend, sandbox_id, step, tar_of([(index.name, 0o644, index.read_bytes())]), REPO_DIR)
    result = run(backend, sandbox_id, step, apt_get("update"), env=APT_ENV, timeout_s=UPDATE_TIMEOUT_S, check=False)
    output = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    # apt-get update exits 0 when a source fails to answer ("W: Failed to fetch"); both are failures here.
    if result.exit_code != 0 or re.search(r"^(E:|W: Failed to fetch|W: Some index files failed)", output, re.MULTILINE):
        raise StepFailed(step, f"{label} could not be read from the build sandbox: {output_tail(result)}")
    run(backend, sandbox_id, step, f"touch {READY}")
    log(f"apt reads {label} only: {sources_line(sources).replace(sources.apt_url, sources.apt_url_shown)}")


def candidates(backend: Backend, sandbox_id: str, names: Sequence[str], *, step: str) -> dict[str, str | None]:
    """{name: the version apt would install from the source, or None when it has none}.

    Only the stanza headed by the exact name counts: for a name no package has, holding '.'
    or '+', apt reads it as a regular expression and lists the packages it matches."""
    quoted = " ".join(shlex.quote(name) for name in names)
    policy = apt_get("policy", tool="apt-cache")
    stanza = "awk -v head=\"$p:\" '/^[^ ]/ {mine = ($0 == head)} mine && /^  Candidate: / {print $2; exit}'"
    script = f'for p in {quoted}; do v=$({policy} "$p" 2>/dev/null | {stanza}); echo "$p ${{v:-(none)}}"; done'
    result = run(backend, sandbox_id, step, script, env=APT_ENV)
    found: dict[str, str | None] = dict.fromkeys(names)
    for line in result.stdout.decode(errors="replace").splitlines():
        name, _, version = line.partition(" ")
        if name in found and version and version != "(none)":
            found[name] = version
    return found


def simulate(
    backend: Backend, sandbox_id: str, names: Sequence[str], sources: PackageSources, *, step: str
) -> list[tuple[str, str]]:
    """The (name, version) pairs apt would unpack to install `names`, dependencies included;
    StepFailed in apt's words when they cannot be installed from the source."""
    result = run(
        backend,
        sandbox_id,
        step,
        apt_get("-s", "install", "--no-install-recommends", *names),
        env=APT_ENV,
        check=False,
    )
    if result.exit_code != 0:
        raise StepFailed(
            step,
            f"Debian packages {', '.join(names)} cannot be installed from {source_label(sources)}: "
            f"{output_tail(result, 800)}",
        )
    return [
        (name.partition(":")[0], version) for name, version in _INST.findall(result.stdout.decode(errors="replace"))
    ]


def check_debian(
    backend: Backend,
    sandbox_id: str,
    names: Sequence[str],
    sources: PackageSources,
    log: Log,
    *,
    step: str,
) -> tuple[list[str], list[str]]:
    """The sources check for Debian packages: (problems, plan lines). Each package is in the
    image or in the source (with the version apt would install), and the missing ones can be
    installed together from it (every dependency found there too)."""
    missing = missing_from_image(backend, sandbox_id, names, step)
    planned = [f"Debian {name}: already in the image" for name in names if name not in missing]
    if not missing:
        return [], planned
    if not sources.has_apt:
        return [no_source_message(missing)], planned
    prepare_apt(backend, sandbox_id, sources, log, step=step)
    label = source_label(sources)
    found = candidates(backend, sandbox_id, missing, step=step)
    problems = [f"Debian package {name}: not in {label}" for name, version in found.items() if version is None]
    if problems:
        return problems, planned
    planned += [f"Debian {name}: {version} in {label}" for name, version in found.items()]
    try:
        simulate(backend, sandbox_id, missing, sources, step=step)
    except StepFailed as exc:
        return [exc.message], planned
    return [], planned


def apt_install(
    backend: Backend,
    sandbox_id: str,
    names: Sequence[str],
    sources: PackageSources,
    log: Log,
    *,
    step: str = "dependencies",
) -> list[str]:
    """Install the Debian packages the image lacks from the apt source, as root, without
    recommends. Returns "name=version" for each package unpacked (dependencies included)."""
    missing = missing_from_image(backend, sandbox_id, names, step)
    if not missing:
        log(f"Debian packages already in the image: {', '.join(names)}")
        return []
    if not sources.has_apt:
        raise StepFailed(step, no_source_message(missing))
    prepare_apt(backend, sandbox_id, sources, log, step=step)
    label = source_label(sources)
    plan = simulate(backend, sandbox_id, missing, sources, step=step)
    if sources.apt_folder is not None:
        copy_debs(backend, sandbox_id, sources.apt_folder, plan, log, step=step)
    log(f"apt-get install from {label}: {', '.join(missing)} ({len(plan)} package(s) with dependencies)")
    result = run(
        backend,
        sandbox_id,
        step,
        apt_get("install", "-y", "-q", "--no-install-recommends", *missing),
        env=APT_ENV,
        timeout_s=INSTALL_TIMEOUT_S,
        check=False,
    )
    if result.exit_code != 0:
        raise StepFailed(step, f"apt-get install of {', '.join(missing)} from {label} failed: {output_tail(result)}")
    installed = [f"{name}={version}" for name, version in plan]
    log(f"installed from {label}: {', '.join(installed)}")
    return installed


def copy_debs(
    backend: Backend, sandbox_id: str, folder: Path, plan: Sequence[tuple[str, str]], log: Log, *, step: str
) -> None:
    """Copy the .deb files of the plan from the repository folder into the sandbox's copy of
    it, in uploads of about COPY_BATCH_BYTES (a build never holds the whole set in memory)."""
    index = read_index(folder)
    root = folder.resolve()
    paths: list[tuple[str, Path]] = []
    for name, version in plan:
        entry = index.get((name, version))
        path = (root / entry.filename).resolve() if entry is not None else None
        if entry is None or path is None or root not in path.parents or not path.is_file():
            raise StepFailed(step, f"the apt repository folder {folder.name}/ lists no file for {name} {version}")
        paths.append((entry.filename, path))
    total = 0
    batch: list[tuple[str, int, bytes]] = []
    for index_name, path in paths:
        batch.append((index_name, 0o644, path.read_bytes()))
        if sum(len(data) for _, _, data in batch) >= COPY_BATCH_BYTES:
            total += _upload(backend, sandbox_id, batch, step=step)
            batch = []
    if batch:
        total += _upload(backend, sandbox_id, batch, step=step)
    log(f"copied {len(paths)} .deb file(s) ({total / 1e6:.1f} MB) from {folder.name}/ to the build sandbox")


def _upload(backend: Backend, sandbox_id: str, batch: list[tuple[str, int, bytes]], *, step: str) -> int:
    upload_tree(backend, sandbox_id, step, tar_of(batch), REPO_DIR)
    return sum(len(data) for _, _, data in batch)
