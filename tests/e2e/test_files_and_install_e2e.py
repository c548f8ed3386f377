"""The one-step skill install and the session page's file manager in Chromium, against the
live console (Daphne) and the real Docker engine.

Install: from the skill's card, choose the space and press Install; the job's status card
appears in place and HTMX follows it to its end without leaving the page. Files: browse, make
a folder, upload into it, preview the text (escaped), rename, and delete after the
confirmation. Screenshots go to var/test-artifacts/screenshots/."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from console.models import AdminJob
from sandboxes.backends.base import ExecRequest
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from tests.factories import make_config
from tests.personas import World
from tests.sandboxes.conftest import docker_base_image, test_run_id  # noqa: F401 - fixtures
from tests.support.browser import log_in, shoot_all, wait_until
from tests.support.skill_install import clean_up
from tests.support.skills import make_version

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.docker]


@pytest.fixture
def running(
    world: World,
    docker_base_image: str,  # noqa: F811
    settings: Any,
    test_run_id: str,  # noqa: F811
) -> Iterator[tuple[SandboxConfig, Session]]:
    """Space A's Docker config and a running session on it (made before Daphne forks)."""
    settings.CONSOLE_INSTALLATION_ID = installation = f"test-{test_run_id}-files-e2e"
    config = make_config(world.space_a, name="e2e files", default_template=docker_base_image, is_default=True)
    session = Runtime().resolve(world.space_a, "e2e-files").session
    try:
        yield config, session
    finally:
        connection.close()
        clean_up(config, installation)


@pytest.mark.timeout(420)
def test_a_skill_installs_from_its_card_in_one_step(
    world: World, running: tuple[SandboxConfig, Session], daphne_url: str, page: Any
) -> None:
    config, _ = running
    version = make_version("e2e-skill")
    log_in(page, daphne_url, "alice")
    page.goto(f"{daphne_url}{version.skill.get_absolute_url()}")
    page.select_option("#quick-install-target", f"{world.space_a.id}:{config.id}")
    url = page.url
    page.click("#quick-install button[type=submit]")
    page.wait_for_selector("#quick-install-result #job-status", timeout=20_000)
    assert "Installing e2e-skill into Space A on e2e files." in page.inner_text("#quick-install-result")
    # HTMX follows the job in place to its end: the card stops polling once it is finished.
    wait_until(
        page,
        "(() => { const card = document.querySelector('#job-status');"
        " return card !== null && !card.hasAttribute('hx-get'); })()",
        timeout=360_000,
    )
    assert page.url == url
    job = AdminJob.objects.get(kind="skills.install")
    status = page.inner_text("#job-status .status").strip()
    assert status == job.get_status_display()
    assert job.is_finished
    shoot_all(page, "skill-one-step-install", reload=False)


@pytest.mark.timeout(300)
def test_the_file_manager_makes_uploads_previews_renames_and_deletes(
    world: World, running: tuple[SandboxConfig, Session], daphne_url: str, page: Any, tmp_path: Path
) -> None:
    _, session = running
    sandbox = session.sandbox_id
    backend = get_backend(session.config)

    def ls(folder: str) -> str:
        result = backend.exec(sandbox, ExecRequest(shell=f"ls -A /workspace/{folder}", user="user", timeout_s=30))
        return result.stdout.decode()

    log_in(page, daphne_url, "bob")
    page.goto(f"{daphne_url}{session.get_absolute_url()}?browse=1")
    page.wait_for_selector("#file-list tr[data-name='output']")
    page.fill("#id_new_folder", "notes")
    page.click("#file-mkdir button[type=submit]")
    page.wait_for_selector("#file-list tr[data-name='notes']")
    page.click("#file-list tr[data-name='notes'] a")
    page.wait_for_url(re.compile(r".*path=notes.*"))
    upload = tmp_path / "report.txt"
    upload.write_text("<script>alert('x')</script> total: 42\n")
    page.set_input_files("#id_upload_here", str(upload))
    page.click("#file-upload button[type=submit]")
    page.wait_for_selector("#file-list tr[data-name='report.txt']")
    assert ls("notes") == "report.txt\n"
    shoot_all(page, "file-manager", reload=False)
    # The preview shows the text as text (the script is not run, nor made an element).
    page.click("#file-list tr[data-name='report.txt'] td a")
    page.wait_for_selector("#preview-text")
    assert "<script>alert('x')</script> total: 42" in page.inner_text("#preview-text")
    assert page.locator("#preview-text script").count() == 0
    page.go_back()
    # Rename in place, then delete with its confirmation.
    page.click("#file-list tr[data-name='report.txt'] summary")
    page.fill("#file-list tr[data-name='report.txt'] input[name=name]", "final.txt")
    page.click("#file-list tr[data-name='report.txt'] form button[type=submit]")
    page.wait_for_selector("#file-list tr[data-name='final.txt']")
    assert ls("notes") == "final.txt\n"
    page.click("#file-list tr[data-name='final.txt'] a.danger")
    page.wait_for_selector("text=Delete /workspace/notes/final.txt?")
    assert ls("notes") == "final.txt\n"  # nothing before the confirmation
    page.click("form button.danger")
    page.wait_for_selector("text=Deleted /workspace/notes/final.txt.")
    assert ls("notes") == ""
