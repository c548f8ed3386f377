"""A config's warm pool as its space admin sees it, in Chromium against the live console
(Daphne) and the real Docker engine: set a pool of 2 on the Pools page and watch it fill, a
new session through the agent API served from it, then a skill install that drains the pool
and refills it with the new image, which a session taken from it runs."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from console.models import JobStatus
from console.services import SYSTEM
from sandboxes.api.tokens import do_create_api_token
from sandboxes.models import SandboxConfig, SessionImage
from tests.personas import World
from tests.sandboxes.conftest import docker_base_image, test_run_id  # noqa: F401 - fixtures
from tests.support.browser import log_in, shoot_all, wait_until
from tests.support.skill_install import (  # noqa: F401 - installation: a fixture
    import_skill,
    installation,
    job_error,
    plain_skill,
    run_install,
    skills_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.docker]

SKILL = "pool-walk"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost only


@pytest.fixture
def pooled(
    world: World,
    docker_base_image: str,  # noqa: F811
    installation: str,  # noqa: F811 - this module's own id, which the clean-up deletes by
) -> Iterator[tuple[SandboxConfig, str]]:
    """Space A's Docker config (no pool yet) and a raw API token of the space."""
    _, raw = do_create_api_token(world.space_a, name="pool-walk", actor=SYSTEM)
    with skills_config(world.space_a, docker_base_image, installation, name="pooled") as config:
        yield config, raw
        connection.close()  # the one Playwright's loop used is not this thread's to close


def api(base: str, world: World, token: str, key: str, tail: str, body: dict[str, Any]) -> dict[str, Any]:
    url = f"{base}/api/v1/spaces/{world.space_a.id}/sessions/{key}/{tail}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")  # noqa: S310 - localhost
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    with _DIRECT.open(request, timeout=120) as answer:
        answered: dict[str, Any] = json.loads(answer.read())
    return answered


def cell(page: Any, config: SandboxConfig, name: str) -> str:
    return str(page.inner_text(f"#pool-{config.id} .pool-{name}")).strip()


def images_settle(page: Any, config: SandboxConfig, image: str, count: int) -> None:
    """Until the page (following itself, never reloaded) shows `count` ready on `image` alone."""
    wait_until(
        page,
        f"(() => {{ const c = document.querySelector('#pool-{config.id} .pool-image');"
        f" return c !== null && c.innerText.trim() === '{count}: {image}'; }})()",
        timeout=45_000,
    )


@pytest.mark.timeout(180)
def test_a_pool_fills_serves_a_session_and_refills_with_a_new_skill_image(
    world: World,
    pooled: tuple[SandboxConfig, str],
    daphne_url: str,
    page: Any,
    docker_base_image: str,  # noqa: F811
) -> None:
    config, token = pooled
    log_in(page, daphne_url, "alice")
    page.goto(f"{daphne_url}/spaces/{world.space_a.id}/pools/")
    page.fill(f"#pool-{config.id} input[name=pool_size]", "2")
    page.click(f"#pool-{config.id} button[type=submit]")
    page.wait_for_selector("text=The pool of pooled keeps 2 sandbox(es) ready.")
    assert cell(page, config, "size") == "2"
    images_settle(page, config, docker_base_image, 2)
    assert cell(page, config, "ready") == "2"
    assert "2 ready, unclaimed" in page.inner_text("#pool-quota")

    served = api(daphne_url, world, token, "pooled-one", "resolve", {})
    assert served["action"] == "pooled"
    assert served["state"] == "running"
    wait_until(page, f"document.querySelector('#pool-{config.id} .pool-hit-rate').innerText.startsWith('100%')")

    # A skill install changes the space's image on this config: the pool drains and refills.
    job = run_install(world.space_a, config, import_skill(plain_skill(SKILL)))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    snapshot = SessionImage.objects.get(space=world.space_a, config=config).snapshot_id
    images_settle(page, config, snapshot, 2)
    assert cell(page, config, "ready") == "2"
    shoot_all(page, "warm-pool-refilled", reload=False)

    fresh = api(daphne_url, world, token, "pooled-two", "resolve", {})
    assert (fresh["action"], fresh["template_id"]) == ("pooled", snapshot)
    ran = api(daphne_url, world, token, "pooled-two", "exec", {"shell": f"/opt/skills/{SKILL}/scripts/hello.sh"})
    assert ran["exit_code"] == 0, ran
    assert ran["stdout"] == f"hello from {SKILL}\n"
