"""`manage.py` started many times, each start a process of its own, at a fraction of the cost.

A test of what a start does (a bad CONSOLE_TUNING stops it with one line, unread variables are
reported) needs a process that loads the settings from scratch under the environment it is
given. Starting Python and importing Django for each of them took seconds per start on the
CI machine. `WarmManage` starts one helper process that imports Django's own modules (never
the console's: nothing that reads the environment or the settings), then forks a child per
run. The child takes the run's environment and arguments, runs `manage.py` as `python
manage.py` would, and exits with its status; its stdout and stderr come back whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

# Run in the helper process: read one JSON request a line ({"args", "env"}), fork, answer one
# JSON line ({"returncode", "stdout", "stderr"}).
_HELPER = r"""
import json, os, runpy, sys, tempfile, traceback

# Django's and the libraries' modules, never the console's: none of these reads the settings
# or a variable a run sets when imported.
import django.contrib.admin.options, django.core.management, django.db.models, django.http, django.urls  # noqa
import celery, channels.generic.websocket, daphne.server, docker  # noqa
from django.conf import settings

# Started without DJANGO_SETTINGS_MODULE: an import that read the settings would have failed.
assert not settings.configured
assert not [name for name in sys.modules if name.split(".")[0] in ("console", "sandboxes", "skills", "netpolicy")]

answers = sys.stdout
for line in sys.stdin:
    request = json.loads(line)
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout = os.fdopen(1, "w")
        sys.stderr = os.fdopen(2, "w")
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["manage.py", *request["args"]]
        code = 0
        try:
            runpy.run_path("manage.py", run_name="__main__")
        except SystemExit as exc:  # as the interpreter turns it into a status
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode("utf-8", "replace"))
        f.close()
    answer = {"returncode": os.waitstatus_to_exitcode(status), "stdout": texts[0], "stderr": texts[1]}
    answers.write(json.dumps(answer) + "\n")
    answers.flush()
"""


class WarmManage:
    """`run(args, env)` is `subprocess.run([python, "manage.py", *args], env=env, cwd=REPO)`."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", _HELPER],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps({"args": args, "env": env}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the warm manage.py helper died (status {self.process.poll()})"
        answer: dict[str, Any] = json.loads(line)
        return subprocess.CompletedProcess(
            ["manage.py", *args], answer["returncode"], answer["stdout"], answer["stderr"]
        )

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
