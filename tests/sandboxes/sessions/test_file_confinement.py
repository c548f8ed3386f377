"""File operations of the API and the UI never leave /workspace, whatever the sandbox's own user
(uid 1000) planted there: links to /etc and /root, a relative ../.. chain, a link swapped in
while the console reads, and input/ replaced by a link or a folder of the user's.

Real Docker engine, sandboxes offline (network none). Each refusal is a clear 400, never a
500, and a root check afterwards shows nothing appeared or changed outside /workspace.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from console.services import SYSTEM, Actor, ServiceError
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.base import META_INSTALLATION, ExecRequest, ListQuery
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import MemorySessionStore
from sandboxes.sessions.workspace import list_files, read_file, stage_input, write_file
from tests.factories import make_config
from tests.personas import World
from tests.support.tuning import Tuned

pytestmark = [pytest.mark.django_db, pytest.mark.docker]

KEY = "confined"
LINKS = (
    "ln -s /etc etclink && ln -s /root rootlink && ln -s /etc/shadow shadowlink"
    " && mkdir -p a/b && ln -s ../../../etc a/b/up && ln -s ../.. output/top"
)


class Agent:
    sandbox_id = ""
    config: SandboxConfig

    def __init__(self, space_id: Any, token: str) -> None:
        self.client = Client()
        self.base = f"/api/v1/spaces/{space_id}/sessions/{KEY}"
        self.headers = {"Authorization": f"Bearer {token}"}

    def post(self, suffix: str, body: Any = None) -> Any:
        data = json.dumps(body) if body is not None else ""
        return self.client.post(f"{self.base}/{suffix}", data, content_type="application/json", headers=self.headers)

    def get(self, suffix: str, **params: Any) -> Any:
        return self.client.get(f"{self.base}/{suffix}", params, headers=self.headers)

    def put(self, suffix: str, data: bytes) -> Any:
        return self.client.put(
            f"{self.base}/{suffix}", data, content_type="application/octet-stream", headers=self.headers
        )

    def shell(self, line: str) -> str:
        ran = self.post("exec", {"shell": line, "timeout_s": 60})
        assert ran.status_code == 200, ran.content
        assert ran.json()["exit_code"] == 0, ran.json()
        return str(ran.json()["stdout"])


@pytest.fixture
def agent(world: World, session_config: SandboxConfig) -> Agent:
    _, token = do_create_api_token(world.space_a, name="confinement", actor=Actor(user=world.alice))
    made = Agent(world.space_a.id, token)
    resolved = made.post("resolve")
    assert resolved.status_code == 200, resolved.content
    made.sandbox_id = resolved.json()["sandbox_id"]
    made.config = session_config
    return made


def as_root(agent: Agent, line: str) -> str:
    backend = get_backend(agent.config)
    result = backend.exec(agent.sandbox_id, ExecRequest(shell=line, user="root", timeout_s=60))
    assert result.exit_code == 0, result
    return result.stdout.decode()


def etc_fingerprint(agent: Agent) -> str:
    """Names, sizes and times of everything in /etc and /root, as root sees them."""
    listing = as_root(agent, "find /etc /root -xdev -printf '%p %s %T@\\n' | sort")
    return hashlib.sha256(listing.encode()).hexdigest()


def assert_refused(response: Any) -> None:
    assert response.status_code == 400, (response.status_code, response.content)
    assert response.json()["error"]["message"]


def test_planted_links_are_never_followed(agent: Agent) -> None:
    agent.shell(LINKS)
    before = etc_fingerprint(agent)
    for path in ("etclink/shadow", "etclink/passwd", "shadowlink", "rootlink/.bashrc", "a/b/up/passwd", "output/top"):
        read = agent.get("files/content", path=path)
        assert_refused(read)
        assert b"root:" not in read.content
    for path in ("etclink", "rootlink", "a/b/up", "a/b/up/apt", "output/top/etc"):
        assert_refused(agent.get("files", path=path))
    for path in ("etclink/x", "shadowlink", "a/b/up/x", "rootlink/x", "output/top/etc/x"):
        assert_refused(agent.put(f"files/content?path={path}", b"planted"))
    assert etc_fingerprint(agent) == before
    # The links themselves are listed as links (inside /workspace, not followed).
    listing = agent.get("files", path="")
    assert listing.status_code == 200
    entries = {entry["name"]: entry for entry in listing.json()["entries"]}
    assert entries["etclink"]["is_symlink"]
    assert not entries["etclink"]["is_dir"]
    # Ordinary files still work, as the session user.
    wrote = agent.put("files/content?path=a/b/real.txt", b"mine")
    assert wrote.status_code == 201
    assert agent.get("files/content", path="a/b/real.txt").content == b"mine"
    assert agent.shell("stat -c %u /workspace/a/b/real.txt") == "1000\n"


def test_reads_run_as_the_session_user(agent: Agent) -> None:
    as_root(agent, "echo secret > /workspace/root-only.txt && chmod 600 /workspace/root-only.txt")
    assert_refused(agent.get("files/content", path="root-only.txt"))


def test_a_link_swapped_in_while_reading_is_never_followed(agent: Agent) -> None:
    agent.shell("mkdir realdir && echo inside > realdir/passwd && ln -s /etc linkdir")
    loop = (
        "end=$(( $(date +%s) + 30 )); while [ $(date +%s) -lt $end ]; do "
        "mv -T realdir swap; mv -T swap realdir; mv -T linkdir swap; mv -T swap linkdir; done"
    )
    agent.shell(f"setsid nohup sh -c '{loop}' > /dev/null 2>&1 & echo $! > /tmp/swapper.pid")
    seen: dict[int, int] = {}
    try:
        for _ in range(40):
            read = agent.get("files/content", path="swap/passwd")
            assert read.status_code != 500
            seen[read.status_code] = seen.get(read.status_code, 0) + 1
            if read.status_code == 200:
                assert read.content == b"inside\n"
            assert b"root:" not in read.content
            listed = agent.get("files", path="swap")
            assert listed.status_code != 500
            if listed.status_code == 200:
                assert {e["name"] for e in listed.json()["entries"]} == {"passwd"}
    finally:
        agent.shell("kill $(cat /tmp/swapper.pid) 2>/dev/null; true")
    assert len(seen) >= 2, seen  # the swap really happened under the reads


def test_input_replaced_by_a_link_or_a_folder_of_the_users_is_refused(agent: Agent) -> None:
    before = etc_fingerprint(agent)
    agent.shell("mv input input.away && ln -s /etc input")
    assert_refused(agent.put("input/evil.txt", b"x"))
    assert_refused(agent.put("input/sub/evil.txt", b"x"))
    agent.shell("rm input && mkdir input && chmod 777 input")
    refused = agent.put("input/evil.txt", b"x")
    assert_refused(refused)
    assert "staging folder" in refused.json()["error"]["message"]
    assert etc_fingerprint(agent) == before
    # Gone altogether: root makes a fresh staging folder and the upload lands there.
    agent.shell("rm -r input")
    staged = agent.put("input/data/fresh.txt", b"ok\n")
    assert staged.status_code == 201, staged.content
    assert as_root(agent, "stat -c '%u %a' /workspace/input /workspace/input/data/fresh.txt") == "0 755\n0 444\n"


def test_input_swapped_for_a_link_during_uploads_is_never_written_through(agent: Agent) -> None:
    before = etc_fingerprint(agent)
    # renameat2(RENAME_EXCHANGE) swaps input/ and a link to /etc atomically, over and over:
    # input/ is never missing, half the time it is the link.
    swapper = (
        "import ctypes, os, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "os.symlink('/etc', '/workspace/etc-link')\n"
        "end = time.time() + 30\n"
        "while time.time() < end:\n"
        "    libc.renameat2(-100, b'/workspace/input', -100, b'/workspace/etc-link', 2)\n"
    )
    agent.post(
        "exec",
        {"argv": ["sh", "-c", 'setsid nohup python3 -c "$0" > /dev/null 2>&1 & echo $! > /tmp/swapper.pid', swapper]},
    )
    codes: dict[int, int] = {}
    try:
        for n in range(30):
            staged = agent.put(f"input/race-{n}.txt", b"staged\n")
            assert staged.status_code in (201, 400, 404), staged.content  # 404: input/ missing mid-swap
            codes[staged.status_code] = codes.get(staged.status_code, 0) + 1
    finally:
        agent.shell("kill $(cat /tmp/swapper.pid) 2>/dev/null; sleep 0.2; true")
    assert len(codes) >= 2, codes
    assert as_root(agent, "ls /etc | grep race- || true") == ""
    assert etc_fingerprint(agent) == before


def test_artifact_collection_skips_links_and_never_leaves_output(agent: Agent) -> None:
    agent.shell("echo result > output/result.txt && ln -s /etc output/etcdir && ln -s /etc/passwd output/pw")
    collected = agent.post("artifacts/collect")
    assert collected.status_code == 200, collected.content
    body = collected.json()
    assert [a["path"] for a in body["artifacts"]] == ["result.txt"]
    assert any("etcdir" in r and "symlink" in r for r in body["refused"])
    assert any(r.startswith("pw:") and "symlink" in r for r in body["refused"])


def test_the_session_page_browser_refuses_links_without_a_500(world: World, agent: Agent, client: Client) -> None:
    agent.shell("ln -s /root rootlink")
    session = Session.objects.get(space=world.space_a, key=KEY)
    client.force_login(world.alice)
    page = client.get(f"/sessions/{session.id}/", {"browse": "1", "path": "rootlink"})
    assert page.status_code == 200
    assert b".bashrc" not in page.content
    assert b"symbolic link" in page.content


def test_a_link_swapped_into_output_while_collecting_is_never_followed(agent: Agent) -> None:
    agent.shell("mkdir -p output/d && echo inside > output/d/passwd && ln -s /etc output/link")
    swapper = (
        "import ctypes, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "end = time.time() + 30\n"
        "while time.time() < end:\n"
        "    libc.renameat2(-100, b'/workspace/output/d', -100, b'/workspace/output/link', 2)\n"
    )
    agent.post(
        "exec",
        {"argv": ["sh", "-c", 'setsid nohup python3 -c "$0" > /dev/null 2>&1 & echo $! > /tmp/swapper.pid', swapper]},
    )
    collected_files = 0
    try:
        for _ in range(12):
            collected = agent.post("artifacts/collect")
            assert collected.status_code == 200, collected.content
            for artifact in collected.json()["artifacts"]:
                download = agent.client.get(
                    artifact["download_url"].replace("http://testserver", ""), headers=agent.headers
                )
                data = download.getvalue()
                assert b"root:" not in data
                collected_files += 1
    finally:
        agent.shell("kill $(cat /tmp/swapper.pid) 2>/dev/null; true")
    if not collected_files:
        # Under load the swapper may win every race above (each collection then refuses the
        # link, as it must); once it stops, the real file is collected under whichever name
        # the last exchange left it.
        collected = agent.post("artifacts/collect")
        assert collected.status_code == 200, collected.content
        for artifact in collected.json()["artifacts"]:
            download = agent.client.get(
                artifact["download_url"].replace("http://testserver", ""), headers=agent.headers
            )
            data = download.getvalue()
            assert b"root:" not in data
            collected_files += data == b"inside\n"
    assert collected_files  # the real file was collected at least once


# The same layer on the remote backends (the fake E2B/Cube servers run real containers).


@pytest.fixture(params=["e2b", pytest.param("cube", marks=pytest.mark.cube)])
def remote_session(
    request: pytest.FixtureRequest, world: World, settings: Any, test_run_id: str
) -> Iterator[tuple[Runtime, Session]]:
    fake = request.getfixturevalue(f"fake_{request.param}")
    settings.CONSOLE_INSTALLATION_ID = f"test-conf-{test_run_id}-{uuid.uuid4().hex[:6]}"
    config = make_config(
        world.space_a, **fake.platform_fields(sandbox_url=fake.sandbox_url), default_template="base", is_default=True
    )
    runtime = Runtime(MemorySessionStore())
    try:
        yield runtime, runtime.resolve(world.space_a, "confined-remote").session
    finally:
        backend = get_backend(config)
        for info in backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})):
            backend.delete(info.sandbox_id)


@pytest.mark.e2b
def test_remote_backends_go_through_the_same_confinement(remote_session: tuple[Runtime, Session]) -> None:
    runtime, session = remote_session
    sandbox_id = runtime.resolve_session(session).sandbox.sandbox_id
    backend = get_backend(session.config)

    def sh(line: str, user: str = "user") -> None:
        result = backend.exec(sandbox_id, ExecRequest(shell=f"cd /workspace && {line}", user=user, timeout_s=30))
        assert result.exit_code == 0, result

    sh("ln -s /etc etclink && mkdir -p a/b && ln -s ../../../etc a/b/up")
    for call in (
        lambda: read_file(runtime, session, "etclink/passwd"),
        lambda: read_file(runtime, session, "a/b/up/passwd"),
        lambda: list_files(runtime, session, "etclink"),
        lambda: write_file(runtime, session, "etclink/x", b"x", actor=SYSTEM),
    ):
        with pytest.raises(ServiceError):
            call()
    sh("mv input input.away && ln -s /etc input")
    with pytest.raises(ServiceError):
        stage_input(runtime, session, "evil.txt", b"x", actor=SYSTEM)
    check = backend.exec(sandbox_id, ExecRequest(shell="ls /etc/evil.txt /etc/x", user="root"))
    assert check.exit_code != 0
    # Moved back, it may be a copy of the user's (a rename on overlayfs copies): refused too.
    # Gone, root makes a fresh one.
    sh("rm input")
    assert stage_input(runtime, session, "fine.txt", b"ok", actor=SYSTEM).path == "/workspace/input/fine.txt"
    assert read_file(runtime, session, "input/fine.txt") == b"ok"


def test_links_left_in_a_persistent_workspace_never_redirect_the_layout(agent: Agent) -> None:
    """A rebuild lays out the same volume again as root: input/ -> /etc and output/ -> /etc
    are moved aside, not followed (a plain chown would hand /etc to uid 1000)."""
    from sandboxes.models import Session

    agent.shell("mv input input.mine && ln -s /etc input && rm -r output && ln -s /etc output")
    session = Session.objects.get(key=KEY)
    assert session.has_persistent_workspace
    rebuilt = Runtime().rebuild(session, actor=SYSTEM)
    agent.sandbox_id = rebuilt.sandbox.sandbox_id
    layout = as_root(agent, "stat -c '%n %U %a %F' /etc /workspace/input /workspace/output; ls /workspace")
    lines = layout.splitlines()
    assert lines[:3] == [
        "/etc root 755 directory",
        "/workspace/input root 755 directory",
        "/workspace/output user 755 directory",
    ], layout
    assert any(line.startswith("input.replaced-") for line in lines[3:]), layout
    assert agent.put("input/after.txt", b"ok").status_code == 201


def test_names_that_are_not_utf8_are_listed_and_skipped_without_a_500(agent: Agent) -> None:
    agent.shell("touch \"$(printf 'bad-\\377.txt')\" && touch \"output/$(printf 'bad-\\377.txt')\"")
    listing = agent.get("files", path="")
    assert listing.status_code == 200, listing.content
    assert "bad-\ufffd.txt" in {entry["name"] for entry in listing.json()["entries"]}
    collected = agent.post("artifacts/collect")
    assert collected.status_code == 200, collected.content
    assert any("not UTF-8" in refusal for refusal in collected.json()["refused"])


# Links every pid-file path it sees in a command line to /etc/console-victim, as uid 1000.
PID_FILE_RACER = (
    "import os, time\n"
    "seen = set()\n"
    "end = time.time() + 40\n"
    "while time.time() < end:\n"
    "    for pid in os.listdir('/proc'):\n"
    "        if not pid.isdigit() or pid in seen:\n"
    "            continue\n"
    "        seen.add(pid)\n"
    "        try:\n"
    "            argv = open('/proc/%s/cmdline' % pid, 'rb').read().split(b'\\0')\n"
    "        except OSError:\n"
    "            continue\n"
    "        for arg in argv:\n"
    "            if b'.console-exec-' in arg and arg.endswith(b'.pid'):\n"
    "                try:\n"
    "                    os.symlink('/etc/console-victim', arg)\n"
    "                except OSError:\n"
    "                    pass\n"
)


@pytest.mark.e2b
def test_remote_root_commands_never_write_through_a_link_at_their_pid_file(
    remote_session: tuple[Runtime, Session],
) -> None:
    """An E2B or Cube exec records its process group in a pid file; a root one (staging into
    input/) must not write it where uid 1000 can plant a link. A racer as uid 1000 watches the
    process table for a new pid-file path in a command line and puts a link to a root-owned
    file there before the wrapper writes it (fs.protected_symlinks does not stop this on a
    host where it is 0, and the console cannot rely on the host's setting). A Docker exec
    writes no file at all: tests/sandboxes/backends/docker/test_backend.py watches for one."""
    runtime, session = remote_session
    sandbox_id = runtime.resolve_session(session).sandbox.sandbox_id
    backend = get_backend(session.config)
    seeded = backend.exec(
        sandbox_id,
        ExecRequest(shell="echo original > /etc/console-victim && chmod 644 /etc/console-victim", user="root"),
    )
    assert seeded.exit_code == 0, seeded
    started = backend.exec(
        sandbox_id,
        ExecRequest(argv=("sh", "-c", 'setsid nohup python3 -c "$0" > /dev/null 2>&1 &', PID_FILE_RACER), timeout_s=30),
    )
    assert started.exit_code == 0, started
    for n in range(15):
        stage_input(runtime, session, f"race-{n}.txt", b"staged\n", actor=SYSTEM)
    victim = backend.exec(sandbox_id, ExecRequest(shell="cat /etc/console-victim", user="root"))
    assert victim.stdout == b"original\n"


def test_paths_longer_than_the_kernel_takes_are_a_clear_400(agent: Agent) -> None:
    """A path past PATH_MAX (and past the 128 KiB one argument may have) is bad input, not a
    502 'internal' from an exec the engine could not start."""
    for path in ("a" * 200_000, "a/" * 70_000, "a/" * 2100):
        for response in (
            agent.get("files/content", path=path),
            agent.get("files", path=path),
            agent.put(f"files/content?path={path}", b"x"),
            agent.put(f"input/{path}", b"x"),
        ):
            assert_refused(response)
            assert "too long" in response.json()["error"]["message"]


def test_uploads_past_djangos_memory_limit_reach_the_workspace_cap(tuned: Tuned, agent: Agent, settings: Any) -> None:
    """A raw-body PUT above DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB) was an HTML 400 from Django,
    so sessions.workspace_upload_max_bytes (50 MiB) could not be reached; past the cap it is a JSON 400."""
    data = b"q" * (5 * 1024 * 1024)
    wrote = agent.put("files/content?path=five.bin", data)
    assert wrote.status_code == 201, wrote.content[:300]
    assert wrote.json()["size"] == len(data)
    staged = agent.put("input/five.bin", data)
    assert staged.status_code == 201, staged.content[:300]
    tuned({"sessions.workspace_upload_max_bytes": 4 * 1024 * 1024})
    for response in (agent.put("files/content?path=over.bin", data), agent.put("input/over.bin", data)):
        assert_refused(response)
        assert "larger than" in response.json()["error"]["message"]


def test_folders_planted_at_the_moved_aside_names_do_not_stop_a_rebuild(agent: Agent) -> None:
    """The layout moves a link named input aside as input.replaced-<time>; a user who made
    folders of those names for the coming minutes made every rebuild fail (rename of the
    link onto a non-empty folder: EISDIR), locking the session out of its own workspace."""
    agent.shell(
        'now=$(date +%s); for t in $(seq $((now - 5)) $((now + 300))); do mkdir -p "input.replaced-$t/x"; done'
        " && mv input input.mine && ln -s /etc input"
    )
    session = Session.objects.get(key=KEY)
    rebuilt = Runtime().rebuild(session, actor=SYSTEM)
    agent.sandbox_id = rebuilt.sandbox.sandbox_id
    assert as_root(agent, "stat -c '%U %a %F' /workspace/input /etc") == "root 755 directory\nroot 755 directory\n"
    assert agent.put("input/after.txt", b"ok").status_code == 201
