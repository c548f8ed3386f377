"""Reading a skill from a git repository: the URL checked against the platform's rules, the
newest commit asked for (`remote_commit`), and one commit's folder fetched as a tar.gz that
the archive reader (`skills.archives.read_archive`) then checks like any upload.

git runs as a subprocess, never through a shell, with a hard timeout that kills its whole
process group, a memory limit its helpers inherit (`prlimit --data`), no prompt
(`GIT_TERMINAL_PROMPT=0`), no system or user configuration, no hooks, no redirects, and
only the transports the policy allows (`GIT_ALLOW_PROTOCOL`, so
`ext::` and `fd::` never run; `file` only when local paths are allowed). The repository is
fetched bare with `--depth 1` (nothing is checked out, so no filter, hook or link of the
repository ever acts on this host) into a temporary folder whose size is watched while git
writes. Pure: no ORM, no settings; the caller passes the policy and the limits.
"""

from __future__ import annotations

import contextlib
import functools
import os
import posixpath
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from ..archives import human_size
from ..names import control_in

REMOTE_SCHEMES = ("https", "http", "git")
URL_MAX = 1000
PATH_MAX = 1024
REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]{0,199}$")
COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
HOST_ENTRY = re.compile(r"^(?P<host>[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?|\[[0-9a-f:.]+\])(:(?P<port>[0-9]{1,5}))?$")
POLL_S = 0.1
SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"
OUT_OF_MEMORY = "Out of memory"  # git's `fatal: Out of memory, malloc failed`
OUTPUT_MAX = 64 * 1024


class GitError(ValueError):
    """A refused URL or a failed git operation; `message` is shown to the admin as is."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class GitPolicy:
    """The platform admin's rules: the hosts (`host` or `host:port`) and whether `file://` is allowed."""

    allowed_hosts: frozenset[str] = frozenset()
    allow_local_paths: bool = False


@dataclass(frozen=True)
class GitLimits:
    """How long git may run, how much it may write (the fetched objects) and how much memory
    it and its helpers may take (`prlimit --data`: a server that never ends its list of refs
    would otherwise grow git for the whole timeout)."""

    timeout_s: float = 60.0
    max_bytes: int = 100 * 1024 * 1024
    memory_bytes: int = 1024 * 1024 * 1024


def check_host_entry(entry: str) -> str:
    """One allowed-hosts entry, lower-cased: a host name, an IPv4 or a bracketed IPv6, with an
    optional port. Raises GitError naming it."""
    cleaned = entry.strip().lower()
    match = HOST_ENTRY.match(cleaned)
    if match is None or (match.group("port") and not 0 < int(match.group("port")) < 65536):
        raise GitError(f"{entry[:100]!r} is not a host name or a host:port.")
    return cleaned


def check_url(url: str, policy: GitPolicy) -> str:
    """The URL if the policy allows it; else GitError saying why (never contacting anything)."""
    url = url.strip()
    if not url:
        raise GitError("Give the repository's URL.")
    if "::" in url.split("/", 1)[0]:
        raise GitError(
            "Remote helpers such as ext:: and fd:: are not allowed; give an https://, http:// or git:// URL."
        )
    if len(url) > URL_MAX or any(ch.isspace() for ch in url) or control_in(url):
        raise GitError("The URL is too long or holds spaces or control characters.")
    try:
        split = urlsplit(url)
        port = split.port
    except ValueError:
        raise GitError("The URL's host or port cannot be read.") from None
    scheme = split.scheme.lower()
    if scheme == "file":
        return _check_local(split.netloc, split.path, policy)
    if scheme not in REMOTE_SCHEMES:
        if not scheme or "://" not in url:
            raise GitError(
                "Give a URL with a scheme (https://, http:// or git://); scp-like host:path is not accepted."
            )
        raise GitError(f"The scheme {scheme}:// is not allowed; use https://, http:// or git://.")
    if "@" in split.netloc:
        raise GitError("Credentials in the URL are not accepted: the console stores and shows the URL.")
    host = (split.hostname or "").lower()
    if not host:
        raise GitError("The URL has no host.")
    shown = f"[{host}]" if ":" in host else host
    allowed = policy.allowed_hosts
    if shown not in allowed and (port is None or f"{shown}:{port}" not in allowed):
        hosts = ", ".join(sorted(allowed)) or "none yet"
        raise GitError(f"The host {shown} is not in the allowed git hosts ({hosts}); a platform admin can add it.")
    if split.query or split.fragment:
        raise GitError("The URL must not have a query or a fragment.")
    return url


def _check_local(netloc: str, path: str, policy: GitPolicy) -> str:
    if not policy.allow_local_paths:
        raise GitError("file:// URLs are not allowed: a platform admin has not allowed local paths.")
    if netloc not in ("", "localhost"):
        raise GitError("A file:// URL names a path on this server: file:///path/to/repository.")
    if not path.startswith("/") or "\x00" in path:
        raise GitError("A file:// URL needs an absolute path.")
    if not Path(path).is_dir():
        raise GitError(f"There is no folder {path[:300]} on this server.")
    return f"file://{path}"


def check_ref(ref: str) -> str:
    """A branch or tag name ('' for the remote's default branch)."""
    ref = ref.strip()
    if not ref:
        return ""
    if not REF.match(ref) or ".." in ref or "//" in ref or ref.endswith((".lock", "/", ".")) or "@{" in ref:
        raise GitError(f"{ref[:100]!r} is not a branch or tag name.")
    return ref


def check_path(path: str) -> str:
    """The skill's folder in the repository, as a clean relative path ('' for the root)."""
    cleaned = path.strip().strip("/")
    if not cleaned:
        return ""
    parts = cleaned.split("/")
    if (
        len(cleaned) > PATH_MAX
        or "\\" in cleaned
        or control_in(cleaned)  # the rule of every skill name: C0/C1, format characters, separators
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise GitError(f"{path[:100]!r} is not a folder path inside the repository (no '..', no backslash).")
    return posixpath.join(*parts)


def folder_name(url: str, path: str) -> str:
    """The skill's folder name: the last part of `path`, else the repository's name."""
    if path:
        return path.rsplit("/", 1)[-1]
    name = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    return name.removesuffix(".git") or "skill"


# --- Running git -------------------------------------------------------------------------


def _environment(home: str, policy: GitPolicy) -> dict[str, str]:
    protocols = ["https", "http", "git"] + (["file"] if policy.allow_local_paths else [])
    return {
        "PATH": SEARCH_PATH,
        "HOME": home,
        "LC_ALL": "C",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ALLOW_PROTOCOL": ":".join(protocols),
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_NO_REPLACE_OBJECTS": "1",
    }


CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "http.followRedirects=false",  # a redirect could leave the allowed hosts
    "http.lowSpeedLimit=1000",
    "http.lowSpeedTime=20",
    "fetch.recurseSubmodules=false",
    "transfer.fsckObjects=true",
    "tar.umask=0022",
)


def _argv(args: list[str]) -> list[str]:
    argv = ["git"]
    for item in CONFIG:
        argv += ["-c", item]
    return argv + args


def _bounded(argv: list[str], memory_bytes: int) -> list[str]:
    """argv under a data-segment limit that git's helpers inherit (util-linux `prlimit`).
    A missing git stays unwrapped, so that starting it fails as itself."""
    prlimit = shutil.which("prlimit", path=SEARCH_PATH)
    found = shutil.which(argv[0], path=SEARCH_PATH)
    return [prlimit, f"--data={memory_bytes}", "--", found, *argv[1:]] if prlimit and found else argv


@dataclass(frozen=True)
class _Result:
    code: int
    stdout: bytes
    stderr: str


def _run(
    args: list[str],
    *,
    home: str,
    policy: GitPolicy,
    limits: GitLimits,
    what: str,
    watch: Path | None = None,
    stdout_path: Path | None = None,
) -> _Result:
    """Run git; kill its process group at the timeout or when `watch` grows past the limit."""
    deadline = time.monotonic() + limits.timeout_s
    with contextlib.ExitStack() as stack:
        out: IO[bytes] = (
            stack.enter_context(stdout_path.open("wb"))
            if stdout_path is not None
            else stack.enter_context(tempfile.TemporaryFile())
        )
        err = stack.enter_context(tempfile.TemporaryFile())
        try:
            process = subprocess.Popen(  # argv built here, never a shell
                _bounded(_argv(args), limits.memory_bytes),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=home,
                env=_environment(home, policy),
                start_new_session=True,
            )
        except OSError as exc:
            raise GitError(f"git cannot run on the console server: {exc.strerror or exc}.") from None
        reason = ""
        while process.poll() is None:
            if time.monotonic() > deadline:
                reason = f"{what} took longer than {limits.timeout_s:g} s"
            elif watch is not None and _size(watch) > limits.max_bytes:
                reason = f"{what} stopped: the repository is over {human_size(limits.max_bytes)}"
            elif stdout_path is not None and stdout_path.stat().st_size > limits.max_bytes:
                reason = f"{what} stopped: the archive is over {human_size(limits.max_bytes)}"
            if reason:
                _kill(process)
                raise GitError(reason + ".")
            time.sleep(POLL_S)
        err.seek(0)
        stderr = err.read(OUTPUT_MAX).decode("utf-8", "replace")
        if process.returncode != 0 and OUT_OF_MEMORY in stderr:
            raise GitError(f"{what} stopped: it needed more than {human_size(limits.memory_bytes)} of memory.")
        stdout = b""
        if stdout_path is None:
            out.seek(0)
            stdout = out.read(OUTPUT_MAX * 16)
    return _Result(process.returncode, stdout, stderr)


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _size(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _reason(result: _Result) -> str:
    """git's own last `fatal:`/`error:` line, shortened: what the admin needs to act on."""
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    wanted = [line for line in lines if line.startswith(("fatal:", "error:"))] or lines
    return (wanted[-1] if wanted else f"git exited with {result.code}")[:300]


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="skill-git-") as folder:
        yield Path(folder)


# --- What the console asks -------------------------------------------------------------


def remote_commit(url: str, ref: str, policy: GitPolicy, limits: GitLimits) -> str:
    """The commit `ref` (or the default branch) names on the remote now (`git ls-remote`)."""
    url, ref = check_url(url, policy), check_ref(ref)
    with _scratch() as home:
        patterns = [ref, f"refs/heads/{ref}", f"refs/tags/{ref}"] if ref else ["HEAD"]
        result = _run(
            ["ls-remote", "--", url, *patterns], home=str(home), policy=policy, limits=limits, what="git ls-remote"
        )
    if result.code != 0:
        raise GitError(f"The repository did not answer: {_reason(result)}")
    found: dict[str, str] = {}
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        commit, _, name = line.partition("\t")
        if COMMIT.match(commit):
            found[name] = commit
    wanted = (
        [f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref] if ref else ["HEAD"]
    )  # a peeled tag names the commit
    for name in wanted:
        if name in found:
            return found[name]
    raise GitError(f"The repository has no branch or tag {ref!r}." if ref else "The repository has no default branch.")


@dataclass(frozen=True)
class FetchedSkill:
    """One commit's skill folder as a tar.gz on disk (deleted with the context)."""

    commit: str
    archive: Path
    filename: str


@contextlib.contextmanager
def fetch_skill(url: str, ref: str, path: str, policy: GitPolicy, limits: GitLimits) -> Iterator[FetchedSkill]:
    """Fetch `ref` at depth 1 and yield the folder `path` of that commit as a tar.gz named
    after the folder (so the archive reader finds SKILL.md in one top-level folder)."""
    url, ref, path = check_url(url, policy), check_ref(ref), check_path(path)
    with _scratch() as home:
        repo = home / "repo.git"
        git = functools.partial(_run, home=str(home), policy=policy, limits=limits)
        init = git(["init", "--quiet", "--bare", str(repo)], what="git init")
        if init.code != 0:
            raise GitError(f"git init failed: {_reason(init)}")
        shallow = ["--quiet", "--depth", "1", "--no-tags", "--no-recurse-submodules"]
        fetch = git(
            ["-C", str(repo), "fetch", *shallow, "--", url, ref or "HEAD"],
            what="git fetch",
            watch=repo,
        )
        if fetch.code != 0:
            raise GitError(f"Fetching {ref or 'the default branch'} failed: {_reason(fetch)}")
        if _size(repo) > limits.max_bytes:  # a fetch quicker than the watch's first look
            raise GitError(f"git fetch stopped: the repository is over {human_size(limits.max_bytes)}.")
        parsed = git(["-C", str(repo), "rev-parse", "--verify", "FETCH_HEAD^{commit}"], what="git rev-parse")
        commit = parsed.stdout.decode("ascii", "replace").strip()
        if parsed.code != 0 or not COMMIT.match(commit):
            raise GitError(f"The fetched ref is not a commit: {_reason(parsed)}")
        name = folder_name(url, path)
        archive = home / "skill.tar.gz"
        tree = f"{commit}:{path}" if path else commit
        made = git(
            ["-C", str(repo), "archive", "--format=tar.gz", f"--prefix={name}/", tree],
            what="git archive",
            stdout_path=archive,
        )
        if made.code != 0:
            where = f"no folder {path!r}" if path else "nothing at its root"
            raise GitError(f"Commit {commit[:12]} has {where} to import ({_reason(made)}).")
        yield FetchedSkill(commit=commit, archive=archive, filename=f"{name}.tar.gz")
