"""The install pipeline's dependency step inside a build sandbox: where packages come from
(`PackageSources`, probed from inside the sandbox), Debian packages from the apt source
(`install.apt`), pip requirements installed from the offline wheel folder or the config's
index (npm: `install.npm`).

Pure orchestration over a `Backend`, like `skills.install` (whose command helpers it uses):
no ORM, no settings. May import `sandboxes.backends` and `skills.install`; nothing else of
the project.
"""

from __future__ import annotations

import functools
import importlib.metadata
import io
import re
import shlex
import zipfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from sandboxes.backends.base import Backend

from .apt import apt_install
from .steps import PACKAGES_DIR, SCRATCH, Log, SkillPayload, StepFailed, output_tail, run, tar_of, upload_tree

PIP_TIMEOUT_S = 600.0

# Environment for pip run as root in the build sandbox. Env vars rather than flags so an
# older pip in the image ignores what it does not know.
PIP_ENV = {
    "PIP_BREAK_SYSTEM_PACKAGES": "1",  # Debian marks its Python EXTERNALLY-MANAGED
    "PIP_ROOT_USER_ACTION": "ignore",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_NO_CACHE_DIR": "1",
    "PIP_NO_INPUT": "1",
    # No pip.conf of the image may add an index: packages come from the config's source only.
    "PIP_CONFIG_FILE": "/dev/null",
}

# The same for an image's environment: these would add a source next to the config's own
# (PIP_EXTRA_INDEX_URL = a fallback to PyPI) or override it. Unset for every pip run.
PIP_SOURCE_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_TRUSTED_HOST")

# Asks a package source for one page from inside the build sandbox: argv URL, timeout.
# Prints the HTTP status (exit 0 for 2xx, 2 for another status), or why no answer came (1).
# Credentials in the URL's userinfo go in an Authorization header, as pip sends them.
SOURCE_PROBE = """
import base64, sys, urllib.error, urllib.parse, urllib.request
split = urllib.parse.urlsplit(sys.argv[1])
netloc = split.hostname if ":" not in (split.hostname or "") else f"[{split.hostname}]"
netloc += f":{split.port}" if split.port else ""
request = urllib.request.Request(urllib.parse.urlunsplit(split._replace(netloc=netloc)))
request.add_header("Accept", "application/vnd.pypi.simple.v1+html, text/html;q=0.9, application/json;q=0.8")
if split.username is not None:
    pair = f"{urllib.parse.unquote(split.username)}:{urllib.parse.unquote(split.password or '')}"
    request.add_header("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
try:
    with urllib.request.urlopen(request, timeout=float(sys.argv[2])) as answer:
        print(answer.status)
except urllib.error.HTTPError as exc:
    print(exc.code)
    sys.exit(2)
except (OSError, ValueError) as exc:
    reason = getattr(exc, "reason", None) or exc
    print(getattr(reason, "strerror", None) or str(reason) or type(reason).__name__)
    sys.exit(1)
"""

SOURCE_PROBE_TIMEOUT_S = 10


@dataclass(frozen=True)
class PackageSources:
    """Where a build gets packages from (the config's fields, resolved on the console host)."""

    pip_index_url: str = ""
    pip_folder: Path | None = None  # a local folder of wheels, copied into the sandbox
    npm_registry_url: str = ""
    npm_folder: Path | None = None  # a local folder of npm tarballs, served inside the sandbox
    pip_constraints: str = ""  # a constraints file in the sandbox: the lock a rebuild reuses (install.lock)
    # Debian packages (install.apt): a local apt repository folder (.deb files and a Packages
    # index), whose needed files are copied in; else an apt mirror or proxy URL with its suite
    # and components ("" for a flat repository), signed unless the admin trusts it unsigned.
    apt_folder: Path | None = None
    apt_url: str = ""
    apt_suite: str = ""
    apt_trusted: bool = False

    @property
    def has_apt(self) -> bool:
        return bool(self.apt_folder or self.apt_url)

    @property
    def apt_uses_url(self) -> bool:
        """The URL is used only without a folder, as for pip: the folder needs no network."""
        return self.apt_folder is None and bool(self.apt_url)

    @property
    def apt_url_shown(self) -> str:
        return redact_userinfo(self.apt_url)

    @property
    def has_pip(self) -> bool:
        return bool(self.pip_folder or self.pip_index_url)

    @property
    def pip_uses_index(self) -> bool:
        """The index URL is used only without a folder: the offline folder needs no network."""
        return self.pip_folder is None and bool(self.pip_index_url)

    @property
    def has_npm(self) -> bool:
        return bool(self.npm_folder or self.npm_registry_url)

    @property
    def npm_uses_registry(self) -> bool:
        """As for pip: the registry URL only without a folder (the folder needs no network)."""
        return self.npm_folder is None and bool(self.npm_registry_url)


def pep503_name(name: str) -> str:
    """A project's normalised name, as PEP 503 index pages are named."""
    return re.sub(r"[-_.]+", "-", name).lower()


def source_host_port(url: str) -> tuple[str, int]:
    """The host (a name or an IP literal, without brackets) and port a source URL connects to."""
    split = urlsplit(url)
    port = split.port  # raises ValueError for a port that is not a number in range
    if split.scheme not in ("http", "https") or not split.hostname:
        raise ValueError("not an http(s) URL with a host")
    return split.hostname, port or (443 if split.scheme == "https" else 80)


def probe_page_url(base_url: str, project: str | None, *, pep503: bool = True) -> str:
    """The page a probe asks for: a project's PEP 503 page (`<index>/<normalised name>/`), or
    for an npm registry the package document (`<registry>/<name>`); the source root without
    a project."""
    if project is None:
        return base_url
    base = base_url if base_url.endswith("/") else base_url + "/"
    return base + quote(project, safe="@") + ("/" if pep503 else "")


def probe_source(
    backend: Backend,
    sandbox_id: str,
    what: str,
    url: str,
    log: Log,
    *,
    page_url: str | None = None,
    step: str = "dependencies",
) -> None:
    """Fail at once, in plain words, when a package source does not serve what the build needs.

    pip and npm retry an unreachable source for a while and then report that nothing matches
    (pip: "from versions: none"), which hides the cause; a server that answers 404 to
    everything passes a mere port check. So the probe asks the source itself for the first
    dependency's page (PEP 503 for pip) and names the HTTP status. Needs python3 in the
    image; without it the source is not probed and the installer's own error has to do.
    """
    host, port = source_host_port(url)
    asked = page_url or url
    argv = ["python3", "-c", SOURCE_PROBE, asked, str(SOURCE_PROBE_TIMEOUT_S)]
    result = run(backend, sandbox_id, step, shlex.join(argv), timeout_s=SOURCE_PROBE_TIMEOUT_S + 20, check=False)
    answer = result.stdout.decode(errors="replace").strip()
    shown = redact_userinfo(asked)
    if result.exit_code == 127:
        log(f"{what} {redact_userinfo(url)} not probed (no python3 in the image)")
        return
    if result.exit_code == 2:
        hint = " (the index has no such project)" if answer == "404" and page_url else ""
        raise StepFailed(
            step,
            f"{what} {redact_userinfo(url)} answers HTTP {answer} for {shown}{hint}, from the build sandbox "
            f"({host} port {port}). Check the URL and that the index serves the skill's dependencies.",
        )
    if result.exit_code != 0:
        reason = answer or output_tail(result)
        raise StepFailed(
            step,
            f"{what} {redact_userinfo(url)} does not answer from the build sandbox ({host} port {port}: {reason}). "
            "Check that it runs and that this backend's sandboxes can reach that address.",
        )
    log(f"{what} answers from the build sandbox ({host} port {port}): HTTP {answer} for {shown}")


def redact_userinfo(url: str) -> str:
    """The URL as logged: a password in its userinfo replaced by ***, and a userinfo without
    one (a token alone, as pip reads it) replaced whole. A URL that cannot be parsed loses
    everything before its last '@' in the host part."""
    try:
        split = urlsplit(url)
    except ValueError:
        scheme, sep, rest = url.rpartition("://")
        netloc, slash, path = rest.partition("/")
        return f"{scheme}{sep}***@{netloc.rpartition('@')[2]}{slash}{path}" if "@" in netloc else url
    if "@" not in split.netloc:
        return url
    shown = "***" if split.password is None else f"{split.username}:***"
    netloc = f"{shown}@" + split.netloc.rpartition("@")[2]
    return split._replace(netloc=netloc).geturl()


def install_dependencies(
    backend: Backend,
    sandbox_id: str,
    skills: Sequence[SkillPayload],
    sources: PackageSources,
    log: Log,
    *,
    also_debian: Collection[str] = (),
) -> dict[str, list[str]]:
    """Install the skills' declared Debian packages (and `also_debian`) and pip requirements
    as root; npm packages come after, from `install.npm`. Returns {skill name: installed lines}."""
    installed: dict[str, list[str]] = {skill.name: [] for skill in skills}
    debian = sorted({name for skill in skills for name in skill.debian_packages} | set(also_debian))
    if debian:
        lines = apt_install(backend, sandbox_id, debian, sources, log)
        for skill in skills:
            installed[skill.name] += [line for line in lines if line.partition("=")[0] in skill.debian_packages]
    pip_skills = [skill for skill in skills if skill.pip_requirements]
    if pip_skills:
        first = next((name for skill in pip_skills for name in skill.pip_names), None)
        pip = prepare_pip(backend, sandbox_id, sources, log, project=pep503_name(first) if first else None)
        for skill in pip_skills:
            installed[skill.name] = pip_install(backend, sandbox_id, pip, skill, sources, log)
    if not (debian or pip_skills or any(skill.npm_packages for skill in skills)):
        log("no dependencies declared")
    return installed


def prepare_pip(
    backend: Backend, sandbox_id: str, sources: PackageSources, log: Log, *, project: str | None = None
) -> list[str]:
    """Copy the wheel folder in (or check the index answers) and find a pip to run.

    Returns the argv prefix for pip.

    pip, in this order: the image's own (`python3 -m pip`); a `pip-*.whl` in the package
    source, run straight from the wheel (`python3 pip-X.whl/pip ...`, which pip supports);
    else the console's own pip, packed into a wheel-shaped zip and run the same way. pip is
    never installed into the image by this: it runs from scratch, which is removed.
    """
    if not sources.has_pip:
        raise StepFailed(
            "dependencies",
            "the skill declares pip dependencies but the config has no pip package source "
            "(set 'pip find-links folder' or 'pip index URL' on the config)",
        )
    if sources.pip_folder is not None:
        wheels = package_folder_entries(sources.pip_folder)
        upload_tree(backend, sandbox_id, "dependencies", tar_of(wheels), PACKAGES_DIR)
        log(f"copied package source {sources.pip_folder.name}/ ({len(wheels)} file(s)) to {PACKAGES_DIR}")
        if sources.pip_index_url:
            log(f"the pip index URL is not used: the find-links folder {sources.pip_folder.name}/ wins (offline)")
    if sources.pip_uses_index:
        probe_source(
            backend,
            sandbox_id,
            "the pip index",
            sources.pip_index_url,
            log,
            page_url=probe_page_url(sources.pip_index_url, project),
        )
    own = run(backend, sandbox_id, "dependencies", "python3 -m pip --version", check=False)
    if own.exit_code == 0:
        log(f"using the image's pip: {own.stdout.decode(errors='replace').strip()[:120]}")
        return ["python3", "-m", "pip"]
    if sources.pip_folder is not None:
        bundled = sorted(
            p.name for p in sources.pip_folder.iterdir() if re.match(r"pip-[0-9][^-]*-py3-none-any\.whl$", p.name)
        )
        if bundled:
            log(f"the image has no pip; running {bundled[-1]} from the package source")
            return ["python3", f"{PACKAGES_DIR}/{bundled[-1]}/pip"]
    name, data = console_pip_wheel()
    upload_tree(backend, sandbox_id, "dependencies", tar_of([(name, 0o644, data)]), SCRATCH)
    log(f"the image has no pip; running the console's own {name} from scratch")
    return ["python3", f"{SCRATCH}/{name}/pip"]


def package_folder_entries(folder: Path) -> list[tuple[str, int, bytes]]:
    """Regular files directly in (or below) the folder; links are skipped, never followed."""
    entries = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        entries.append((path.relative_to(folder).as_posix(), 0o644, path.read_bytes()))
    return entries


# Measured (bench/module_caches.py): zipping pip 211 ms a build; the cached wheel 5 us.
@functools.cache
def console_pip_wheel() -> tuple[str, bytes]:
    """The console's installed pip as a wheel-shaped zip (pure Python, runnable from the zip)."""
    dist = importlib.metadata.distribution("pip")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for entry in dist.files or []:
            if "__pycache__" in entry.parts or entry.suffix == ".pyc" or (entry.parts and entry.parts[0] == ".."):
                continue
            source = Path(str(dist.locate_file(entry)))
            if source.is_file():
                archive.write(source, entry.as_posix())
    return f"pip-{dist.version}-py3-none-any.whl", buffer.getvalue()


def pip_install(
    backend: Backend, sandbox_id: str, pip: list[str], skill: SkillPayload, sources: PackageSources, log: Log
) -> list[str]:
    requirements = f"{SCRATCH}/requirements-{skill.name}.txt"
    files = backend.files()
    assert files is not None  # checked by upload_tree before
    files.write(sandbox_id, requirements, ("\n".join(skill.pip_requirements) + "\n").encode(), mode=0o600, user="root")
    argv = [*pip, "install", "--only-binary=:all:", "--no-warn-script-location", *pip_source_args(sources)]
    argv += ["--constraint", sources.pip_constraints] if sources.pip_constraints else []
    log(f"pip install for {skill.name}: {', '.join(skill.pip_requirements)}")
    result = run(
        backend,
        sandbox_id,
        "dependencies",
        shlex.join(["env", *(f"--unset={name}" for name in PIP_SOURCE_VARIABLES), *argv, "-r", requirements]),
        env=PIP_ENV,
        timeout_s=PIP_TIMEOUT_S,
        check=False,
    )
    if result.exit_code != 0:
        where = f" from the pip index {sources.pip_index_url}" if sources.pip_uses_index else ""
        raise StepFailed("dependencies", f"pip install for {skill.name} failed{where}: {output_tail(result)}")
    installed = parse_pip_installed(result.stdout.decode(errors="replace"))
    log(f"installed: {', '.join(installed) or 'already satisfied'}")
    return installed


def pip_source_args(sources: PackageSources) -> list[str]:
    """Where pip looks: the copied folder only, or the config's index only (never PyPI too).

    `--index-url` replaces PyPI and no `--extra-index-url` is ever given, so a package the
    source lacks fails instead of coming from elsewhere. Plain http needs `--trusted-host`
    (pip ignores an untrusted http index), for that host and port only.
    """
    if sources.pip_folder is not None:
        return ["--no-index", "--find-links", PACKAGES_DIR]
    args = ["--index-url", sources.pip_index_url]
    split = urlsplit(sources.pip_index_url)
    if split.scheme == "http":
        args += ["--trusted-host", split.netloc.rpartition("@")[2]]
    return args


def parse_pip_installed(output: str) -> list[str]:
    for line in output.splitlines():
        if line.startswith("Successfully installed "):
            return line.removeprefix("Successfully installed ").split()
    return []
