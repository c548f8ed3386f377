"""Disk limits of Docker sandboxes, against the real engine: what a sandbox may write into
/workspace and /tmp stops at its config's limit with "No space left on device", the host's
disk holds at most that much for it, and the bounded file systems go with their volume or
sandbox. Limits above the platform backend's maximum are refused with words.

The host side is read directly: the loop-mounted images under the test's own disk folder,
the mount table, and `df` (statvfs) of the host file system that holds them.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from console.services import Actor, ServiceError
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.base import META_INSTALLATION, ListQuery, NetworkSpec, Resources, SandboxSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.disk import LABEL_SCRATCH, SCRATCH_PREFIX, VOLUME_PREFIX
from sandboxes.backends.docker.image import ImageBuildError, build_rootfs_image
from sandboxes.backends.docker.loopfs import LoopFs, list_names
from sandboxes.backends.docker.settings import DockerOptions
from sandboxes.catalog.bridge import backend_config_for, get_backend
from sandboxes.catalog.services import do_create_config, do_update_config
from sandboxes.models import SandboxConfig, Session
from tests.factories import config_form, make_backend, make_config
from tests.personas import World
from tests.sandboxes.api.test_agent_api import Agent

pytestmark = [pytest.mark.django_db, pytest.mark.docker]

MIB = 1024 * 1024


def root_required() -> None:
    if os.geteuid() != 0:
        pytest.skip("bounded disks need root (mount, mkfs.ext4)")


@pytest.fixture
def disk_dir(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The test's own folder of bounded file systems (on the host disk, not a tmpfs); anything
    left mounted or on disk there afterwards fails the test after unmounting it."""
    root_required()
    folder = Path("/var/tmp") / f"console-disks-{uuid.uuid4().hex[:8]}"
    settings.WORKSPACE_DISK_DIR = str(folder)
    yield folder
    leftovers = list_names(folder)
    for name in leftovers:
        LoopFs(folder, name).destroy()
    subprocess.run(["rm", "-rf", str(folder)], check=False)
    assert not leftovers, f"bounded disks left behind: {leftovers}"


@pytest.fixture
def limited(world: World, docker_base_image: str, disk_dir: Path, settings: Any, test_run_id: str) -> Iterator[Any]:
    """Space A's default Docker config with a 1 GiB disk limit, under its own installation
    id; its sandboxes and workspace volumes are deleted afterwards through the backend."""
    settings.CONSOLE_INSTALLATION_ID = f"test-disk-{test_run_id}-{uuid.uuid4().hex[:6]}"
    config = make_config(
        world.space_a, name="disk", default_template=docker_base_image, is_default=True, disk_mb=1024, memory_mb=512
    )
    try:
        yield config
    finally:
        backend = get_backend(config)
        for info in backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})):
            backend.delete(info.sandbox_id)
        volumes = backend.volumes()
        assert volumes is not None
        for session in Session.objects.filter(config=config):
            volumes.delete(session.workspace_volume)


@pytest.fixture
def agent(world: World) -> Agent:
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    return Agent(world.space_a.id, token)


def host_used_bytes(path: Path) -> int:
    """`df`'s used figure of the host file system holding `path`."""
    stat = os.statvfs(path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def allocated_bytes(path: Path) -> int:
    """What a (sparse) file takes on the host disk."""
    return os.stat(path).st_blocks * 512


def mounted_under(folder: Path) -> list[str]:
    with open("/proc/self/mounts") as mounts:
        return [line.split()[1] for line in mounts if line.split()[1].startswith(str(folder))]


def exec_in(agent: Agent, key: str, shell: str, timeout_s: int = 120) -> dict[str, Any]:
    response = agent.post(key, "exec", {"shell": shell, "timeout_s": timeout_s})
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


# --- A member at the limit ---------------------------------------------------------------


def test_writing_5_gib_into_workspace_under_a_1_gib_limit_ends_in_enospc_and_the_host_holds_at_most_1_gib(
    agent: Agent, limited: SandboxConfig, disk_dir: Path
) -> None:
    assert agent.post("big", "resolve").status_code == 200
    session = Session.objects.get(key="big")
    image = LoopFs(disk_dir, f"{VOLUME_PREFIX}{session.workspace_volume}").image
    before = host_used_bytes(disk_dir)

    wrote = exec_in(
        agent, "big", "dd if=/dev/zero of=/workspace/big bs=1M count=5120 conv=fsync; rc=$?; sync; exit $rc"
    )

    after = host_used_bytes(disk_dir)
    print(
        f"\ndisk figures: exit {wrote['exit_code']}; image holds {allocated_bytes(image) / MIB:.0f} MiB of the host; "
        f"df moved by {(after - before) / MIB:.0f} MiB (limit 1024 MiB)"
    )
    assert wrote["exit_code"] != 0
    assert "No space left on device" in wrote["stderr"]
    assert allocated_bytes(image) <= 1024 * MIB
    # df is the whole host's: other processes write too, so only a bound well below the 5 GiB
    # that an unbounded workspace lands on the host.
    assert after - before <= 1024 * MIB + 256 * MIB
    # The workspace still works after it filled up: freeing space lets the member write again.
    assert exec_in(agent, "big", "rm big && echo again > output/after.txt && cat output/after.txt")["stdout"] == (
        "again\n"
    )


def test_tmp_is_bounded_and_shares_the_limit_with_workspace(agent: Agent, limited: SandboxConfig) -> None:
    assert agent.post("tmp", "resolve").status_code == 200
    filled = exec_in(agent, "tmp", "dd if=/dev/zero of=/tmp/fill bs=1M count=3072 2>&1 | head -1; df -m /tmp")
    assert "No space left on device" in filled["stdout"]
    # /workspace is the same file system: what /tmp took is gone from it.
    full = exec_in(agent, "tmp", "dd if=/dev/zero of=/workspace/more bs=1M count=64")
    assert full["exit_code"] != 0
    assert "No space left on device" in full["stderr"]


def test_a_new_sandbox_starts_with_an_empty_tmp_and_keeps_the_workspace(agent: Agent, limited: SandboxConfig) -> None:
    assert agent.post("again", "resolve").status_code == 200
    exec_in(agent, "again", "echo keep > /workspace/output/kept.txt; echo drop > /tmp/dropped.txt")
    session = Session.objects.get(key="again")
    get_backend(limited).delete(session.sandbox_id)
    assert agent.post("again", "resolve").status_code == 200
    seen = exec_in(agent, "again", "cat /workspace/output/kept.txt; ls -A /tmp | grep -c dropped || true")
    assert seen["stdout"] == "keep\n0\n"


# --- Nothing outlives its owner ----------------------------------------------------------


def test_deleting_the_session_deletes_its_bounded_workspace(
    agent: Agent, limited: SandboxConfig, disk_dir: Path
) -> None:
    assert agent.post("gone", "resolve").status_code == 200
    volume = Session.objects.get(key="gone").workspace_volume
    fs = LoopFs(disk_dir, f"{VOLUME_PREFIX}{volume}")
    assert fs.exists()
    assert fs.is_mounted()

    assert agent.delete("gone").status_code in (200, 202, 204)

    assert not fs.exists()
    assert mounted_under(disk_dir) == []


def test_a_sandbox_without_persistent_workspace_gets_a_scratch_deleted_with_it(
    world: World, limited: SandboxConfig, disk_dir: Path
) -> None:
    backend = get_backend(limited)
    spec = SandboxSpec(
        template_id=limited.default_template,
        network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
        resources=Resources(memory_mb=256, pids=64, disk_mb=128),
    )
    info = backend.create(spec)
    try:
        scratch = list_names(disk_dir, SCRATCH_PREFIX)
        assert len(scratch) == 1
        result = backend.exec(info.sandbox_id, _shell("dd if=/dev/zero of=/workspace/x bs=1M count=512"))
        assert b"No space left on device" in result.stderr
        assert allocated_bytes(LoopFs(disk_dir, scratch[0]).image) <= 128 * MIB
    finally:
        backend.delete(info.sandbox_id)
    assert list_names(disk_dir) == []
    assert mounted_under(disk_dir) == []


def test_a_failed_create_leaves_no_scratch_behind(limited: SandboxConfig, disk_dir: Path) -> None:
    backend = get_backend(limited)
    spec = SandboxSpec(
        template_id=limited.default_template,
        network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
        resources=Resources(memory_mb=256, pids=64, disk_mb=128),
        env={"BAD NAME\x00": "x"},  # the engine refuses the container
    )
    with pytest.raises(Exception):  # noqa: B017,PT011 - whatever the engine says, nothing is left
        backend.create(spec)
    assert list_names(disk_dir) == []
    assert mounted_under(disk_dir) == []


def test_a_scratch_whose_sandbox_vanished_is_swept(limited: SandboxConfig, disk_dir: Path, engine: Any) -> None:
    backend = get_backend(limited)
    assert isinstance(backend, DockerBackend)
    spec = SandboxSpec(
        template_id=limited.default_template,
        network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
        resources=Resources(memory_mb=256, pids=64, disk_mb=64),
    )
    info = backend.create(spec)
    name = engine.inspect_container(info.sandbox_id)["Config"]["Labels"][LABEL_SCRATCH]
    engine.remove_container(info.sandbox_id, force=True)  # behind the console's back
    image = LoopFs(disk_dir, name).image
    os.utime(image, (0, 0))  # older than the grace
    assert backend.disk.sweep(force=True) == [name]
    assert list_names(disk_dir) == []
    assert mounted_under(disk_dir) == []


def test_a_stopped_sandbox_whose_disk_was_unmounted_gets_it_back_on_resume(
    limited: SandboxConfig, disk_dir: Path, engine: Any
) -> None:
    """After a host reboot the loop mounts are gone; the sandbox must not start on the bare
    folders (unbounded, on the host disk) nor lose its files."""
    backend = get_backend(limited)
    spec = SandboxSpec(
        template_id=limited.default_template,
        network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
        resources=Resources(memory_mb=256, pids=64, disk_mb=64),
    )
    info = backend.create(spec)
    try:
        backend.exec(info.sandbox_id, _shell("echo kept > /workspace/kept.txt"))
        engine.stop(info.sandbox_id, timeout=1)
        (name,) = list_names(disk_dir, SCRATCH_PREFIX)
        subprocess.run(["umount", str(LoopFs(disk_dir, name).mountpoint)], check=True)
        backend.connect(info.sandbox_id)
        assert backend.exec(info.sandbox_id, _shell("cat /workspace/kept.txt")).stdout == b"kept\n"
        assert LoopFs(disk_dir, name).is_mounted()
    finally:
        backend.delete(info.sandbox_id)


# --- What the engine can bound, said on the page -------------------------------------------


def test_the_engine_says_where_the_limit_holds_and_the_config_page_shows_it(
    world: World, limited: SandboxConfig
) -> None:
    backend = get_backend(limited)
    assert isinstance(backend, DockerBackend)
    disk = backend.disk_capabilities()
    driver = backend.disk.storage_driver()
    assert disk.workspace
    assert disk.tmp
    if driver == "overlay2 on extfs":
        assert not disk.writable_layer
        assert "overlay2 on extfs" in disk.summary
        assert "not bounded" in disk.summary
    page = world.client_for("carol").get(limited.get_absolute_url()).content.decode()
    assert 'id="config-disk"' in page
    assert "1024&nbsp;MiB per sandbox" in page
    assert "/workspace and /tmp share one file system of the disk limit" in page


# --- Limits within the platform's maximum ----------------------------------------------------


def test_a_disk_limit_above_the_backends_maximum_is_refused_by_the_form(world: World) -> None:
    backend = make_backend(world.space_a, name="local engine", max_disk_mb=2048)
    response = world.client_for("alice").post(
        reverse("sandboxes:config_create", args=[world.space_a.id]), config_form(backend, disk_mb="4096")
    )
    assert response.status_code == 400
    assert response.context["form"].errors["disk_mb"] == ["at most 2048 MiB of disk on local engine"]
    assert not SandboxConfig.objects.exists()


def test_a_disk_limit_above_the_backends_maximum_is_refused_by_the_services(world: World) -> None:
    backend = make_backend(world.space_a, name="local engine", max_disk_mb=2048)
    data = {"name": "x", "backend": backend, "default_template": "sandbox-console/base:latest", "disk_mb": 4096}
    with pytest.raises(ServiceError) as refused:
        do_create_config(world.space_a, data=data, api_key="", actor=Actor(user=world.alice))
    assert refused.value.field_errors == {"disk_mb": ["at most 2048 MiB of disk on local engine"]}
    config = make_config(world.space_a, backend=backend, disk_mb=1024)
    with pytest.raises(ServiceError):
        do_update_config(config, data={"disk_mb": 2049}, api_key=None, actor=Actor(user=world.alice))
    config.refresh_from_db()
    assert config.disk_mb == 1024


def test_lowering_the_maximum_below_a_configs_limit_is_refused(world: World) -> None:
    from sandboxes.catalog.platform import do_update_platform_backend

    backend = make_backend(world.space_a, name="local engine", max_disk_mb=8192)
    make_config(world.space_a, backend=backend, disk_mb=4096)
    world.alice.is_superuser = True
    world.alice.save(update_fields=["is_superuser"])
    with pytest.raises(ServiceError, match="above the new limits"):
        do_update_platform_backend(
            backend, data={"max_disk_mb": 2048}, secrets={}, spaces=[world.space_a], actor=Actor(user=world.alice)
        )


# --- Template builds ---------------------------------------------------------------------------


def test_a_template_build_writes_its_root_filesystem_into_bounded_space(
    limited: SandboxConfig, disk_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mmdebstrap builds its chroot under TMPDIR and writes the tarball beside it: a build
    that grows past catalog.template_build_disk_mb fails with ENOSPC, and its space is deleted. (A
    stand-in mmdebstrap that writes 200 MiB: the real one needs the Debian mirror.)"""
    stand_in = tmp_path / "mmdebstrap"
    stand_in.write_text('#!/bin/sh\ndd if=/dev/zero of="$TMPDIR/chroot.img" bs=1M count=200 || exit 1\n')
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    config = backend_config_for(limited)
    backend = DockerBackend(
        dataclasses.replace(
            config, options=dataclasses.replace(DockerOptions.parse(config.options), template_build_disk_mb=64)
        )
    )
    with pytest.raises(ImageBuildError, match="No space left on device"):
        build_rootfs_image(backend.client, "sandbox-console/never:latest", labels={}, space=backend.disk.build_space())
    assert list_names(disk_dir) == []
    assert mounted_under(disk_dir) == []


def _shell(line: str) -> Any:
    from sandboxes.backends.base import ExecRequest

    return ExecRequest(shell=line, timeout_s=120)


def test_a_build_space_left_by_a_killed_console_is_swept_a_running_one_kept(
    limited: SandboxConfig, disk_dir: Path
) -> None:
    """`kill -9` of the console mid template build leaves its bounded build space mounted
    (a loop device and up to catalog.template_build_disk_mb of the host's disk); the sweep deletes it
    once past the grace, but never the space of a build still running in another process."""
    import signal

    config = backend_config_for(limited)
    backend = DockerBackend(
        dataclasses.replace(
            config, options=dataclasses.replace(DockerOptions.parse(config.options), template_build_disk_mb=32)
        )
    )
    assert backend.disk.host_problem() is None
    backend.disk.layer_supported()  # read now: the forked child makes no engine call
    pid = os.fork()
    if pid == 0:  # the killed console: inside its build, then SIGKILL
        try:
            with backend.disk.build_space():
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    [killed] = list_names(disk_dir, "build-")
    with backend.disk.build_space() as running_folder:
        running = Path(running_folder).name
        for name in (killed, running):
            os.utime(LoopFs(disk_dir, name).image, (0, 0))  # both older than the grace
        assert backend.disk.sweep(force=True) == [killed]
        assert list_names(disk_dir, "build-") == [running]
        assert os.path.ismount(running_folder)
    assert list_names(disk_dir) == []
    assert mounted_under(disk_dir) == []
