"""Local git repositories for the git-import tests: a repository written in a tmp folder
(`GitRepo`), served by `git daemon` on 127.0.0.1 and a free port (`GitDaemon`), or read
through file://. Nothing leaves this machine."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.test",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.test",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


def skill_md(name: str, body: str = "Hi.") -> bytes:
    return (
        f"---\nname: {name}\ndescription: Made by a git test. Use when testing.\nlicense: MIT\n---\n\n{body}\n".encode()
    )


class GitRepo:
    """A repository in `root` on branch `main`; `commit(files)` writes, adds and commits."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.git("init", "--quiet", "--initial-branch=main")

    def git(self, *args: str | bytes) -> str:
        env = {**os.environ, **GIT_ENV}
        done = subprocess.run(["git", *args], cwd=self.root, env=env, check=True, capture_output=True)
        return done.stdout.decode(errors="replace").strip()

    def commit(self, files: dict[str | bytes, bytes], *, executable: tuple[str, ...] = (), message: str = "c") -> str:
        """Write `files` (paths relative to the root, str or raw bytes) and commit them."""
        for path, data in files.items():
            raw = path.encode() if isinstance(path, str) else path
            target = os.path.join(bytes(self.root), raw)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as handle:
                handle.write(data)
            os.chmod(target, 0o755 if isinstance(path, str) and path in executable else 0o644)
        self.git("add", "--all")
        self.git("commit", "--quiet", "--allow-empty", "-m", message)
        return self.head()

    def head(self, ref: str = "HEAD") -> str:
        return self.git("rev-parse", ref)

    @property
    def file_url(self) -> str:
        return f"file://{self.root}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class GitDaemon:
    """`git daemon` serving the repositories under `base` on 127.0.0.1 (read-only)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, name: str) -> str:
        return f"git://{self.host}/{name}"

    def __enter__(self) -> GitDaemon:
        argv = [
            "git",
            "daemon",
            "--reuseaddr",
            "--export-all",
            "--listen=127.0.0.1",
            f"--port={self.port}",
            f"--base-path={self.base}",
            str(self.base),
        ]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        self.__exit__(None, None, None)
        raise RuntimeError("git daemon did not start")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)


class SilentServer:
    """A loopback port that accepts and never answers: what a hung git server looks like."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(8)
        self.port = int(self.socket.getsockname()[1])

    def was_contacted(self) -> bool:
        """Whether anything connected (a pending connection is accepted, without waiting)."""
        self.socket.setblocking(False)
        try:
            connection, _ = self.socket.accept()
        except BlockingIOError:
            return False
        connection.close()
        return True

    def close(self) -> None:
        self.socket.close()


class RedirectServer:
    """An HTTP server on 127.0.0.1 answering every request with a redirect to `target`."""

    def __init__(self, target: str) -> None:
        location = target

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the http.server hook's name
                self.send_response(302)
                self.send_header("Location", location + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # the hook's signature
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RefFloodServer:
    """A git:// server on 127.0.0.1 that answers with branch after branch and never ends the
    list (up to `total` bytes, then it holds the connection): a server that sends forever."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(4)
        self.port = int(self.socket.getsockname()[1])
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def _line(text: str) -> bytes:
        data = text.encode()
        return b"%04x" % (len(data) + 4) + data

    def _serve(self) -> None:
        try:
            connection, _ = self.socket.accept()
        except OSError:
            return
        commit = "a" * 40
        chunk = b"".join(self._line(f"{commit} refs/heads/branch-{n:012d}\n") for n in range(10_000))
        with connection:
            try:
                connection.recv(4096)
                connection.sendall(self._line(f"{commit} HEAD\0multi_ack\n"))
                while self.sent < self.total and not self.stop.is_set():
                    connection.sendall(chunk)
                    self.sent += len(chunk)
                self.stop.wait(30)
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.socket.close()
        self.thread.join(timeout=10)
