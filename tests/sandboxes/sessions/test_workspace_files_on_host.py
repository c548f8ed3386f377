"""A session's files as the API and the host see them: a missing file is a 404 in words (it
was a 502 "backend failure"), and collected artifacts are the console user's alone on the
host (files 0600, folders 0700; they were 0644 in 0755 folders, readable by every local user).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.models import Artifact, SandboxConfig
from tests.personas import World
from tests.sandboxes.api.test_agent_api import Agent

pytestmark = [pytest.mark.django_db, pytest.mark.docker]


@pytest.fixture
def agent(world: World, session_config: SandboxConfig) -> Agent:
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    return Agent(world.space_a.id, token)


def test_a_missing_file_is_404_not_a_backend_failure(agent: Agent) -> None:
    assert agent.post("files-1", "resolve").status_code == 200
    for path in ("no-such-file.txt", "output/none/deeper.txt"):
        missing = agent.get("files-1", "files/content", path=path)
        assert missing.status_code == 404, missing.content
        body = missing.json()["error"]
        assert body["code"] == "not_found"
        assert body["field"] == "path"
        assert "no such file" in body["message"]
        assert "backend" not in body
    listing = agent.get("files-1", "files", path="no-such-folder")
    assert listing.status_code == 404, listing.content
    # A file that is there still reads.
    assert agent.put("files-1", "files/content?path=here.txt", b"here").status_code == 201
    assert agent.get("files-1", "files/content", path="here.txt").content == b"here"


def test_collected_artifacts_are_readable_by_the_console_user_only(agent: Agent, settings: Any, tmp_path: Path) -> None:
    media = tmp_path / "media"
    media.mkdir(mode=0o755)  # as an older console left it
    media.chmod(0o755)
    settings.MEDIA_ROOT = str(media)  # the storage reads it afresh (setting_changed)
    try:
        old = os.umask(0o022)  # the usual umask, which made 0644 files
        assert agent.post("art-1", "resolve").status_code == 200
        made = agent.post(
            "art-1",
            "exec",
            {"shell": "mkdir -p output/deep/er && echo a > output/a.txt && echo b > output/deep/er/b.txt"},
        )
        assert made.json()["exit_code"] == 0, made.content
        collected = agent.post("art-1", "artifacts/collect")
        assert collected.status_code == 200, collected.content
        assert len(collected.json()["artifacts"]) == 2
        files = [Path(a.file.path) for a in Artifact.objects.all()]
        assert len(files) == 2
        for file in files:
            info = file.stat()
            assert stat.S_IMODE(info.st_mode) == 0o600, (file, oct(info.st_mode))
            assert info.st_uid == os.getuid()
            folder = file.parent
            while folder != media.parent:
                assert stat.S_IMODE(folder.stat().st_mode) == 0o700, (folder, oct(folder.stat().st_mode))
                folder = folder.parent
        downloaded = agent.client.get(collected.json()["artifacts"][0]["download_url"], headers=agent.headers)
        assert downloaded.status_code == 200
    finally:
        os.umask(old)
