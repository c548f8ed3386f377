"""Disk limits of Docker sandboxes (Resources.disk_mb) and of template builds.

What holds where (docs/operations.md, "Disk limits"):

- `/workspace` and `/tmp` of a sandbox share one size-bounded file system of the config's
  limit (`loopfs`: a sparse ext4 image, loop-mounted on the engine's host). A persistent
  workspace is a named volume bound to its `workspace/` folder (local driver, `o=bind`), so
  it outlives sandboxes as before and is deleted with the volume; its `tmp/` folder is
  emptied for each new sandbox. Without a persistent workspace, a scratch file system per
  sandbox holds both and is deleted with the sandbox.
- The writable layer (everything else: /home, /usr, /var …) is bounded with
  `--storage-opt size=` where the engine's storage driver supports it (overlay2 on xfs with
  project quotas, btrfs, zfs); overlay2 on ext4 cannot, and `capabilities()` says so.
- Template builds from Debian packages run mmdebstrap inside a bounded file system too,
  locked (flock) by the building process: the sweep deletes one no living process holds.

Bounded file systems need the engine on this host (a unix socket) and a console running as
root; otherwise nothing here is made and `capabilities()` says what is not enforced.

Imports nothing of the project but `base` and its siblings.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base import SANDBOX_UID, WORKSPACE, DiskCapabilities, ErrorKind, RemoteError, SandboxSpec
from .common import KIND_WORKSPACE, _engine_call, metadata_labels
from .image import LABEL_KIND, LABEL_MANAGED
from .loopfs import LoopFs, LoopFsError, available, list_names

if TYPE_CHECKING:
    from .backend import DockerBackend

logger = logging.getLogger(__name__)

DEFAULT_DISK_DIR = "/var/lib/sandbox-console/disks"
DEFAULT_TEMPLATE_BUILD_DISK_MB = 4096
# On a sandbox: the scratch file system it owns. On a workspace volume: its bound in MiB.
LABEL_SCRATCH = "console.disk.scratch"
LABEL_DISK_MB = "console.disk.mb"
SCRATCH_PREFIX = "scratch-"
VOLUME_PREFIX = "ws-"
BUILD_PREFIX = "build-"
TMP = "/tmp"  # noqa: S108 - the path inside the sandbox
# A file system nothing owns is deleted after this long (one being made has no owner yet).
ORPHAN_GRACE_S = 600
SWEEP_MARK = ".swept"
# Storage drivers whose writable layer takes --storage-opt size (overlay2: only on xfs with
# the pquota mount option, which the engine does not report: tried, and remembered if refused).
LAYER_DRIVERS = frozenset({"btrfs", "zfs", "devicemapper", "windowsfilter"})


@dataclass
class DiskPlan:
    """What a new sandbox's container gets: host folders bound in, the layer's size option,
    labels, and the scratch file system to delete if the container is not made."""

    binds: dict[str, dict[str, str]] = field(default_factory=dict)
    storage_opt: dict[str, str] | None = None
    labels: dict[str, str] = field(default_factory=dict)
    scratch: LoopFs | None = None

    def discard(self) -> None:
        if self.scratch is not None:
            with contextlib.suppress(LoopFsError):
                self.scratch.destroy()


class DockerDisk:
    """The Docker adapter's disk component (held by the backend as `backend.disk`)."""

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend
        options = backend.options
        self.root = Path(options.disk_dir or DEFAULT_DISK_DIR)
        self.build_disk_mb = options.template_build_disk_mb or DEFAULT_TEMPLATE_BUILD_DISK_MB
        self._host_problem: str | None = None
        self._host_checked = False
        self._layer: bool | None = None
        self._info: dict[str, Any] | None = None

    # What this engine can bound -------------------------------------------------------

    def host_problem(self) -> str | None:
        """Why bounded file systems cannot be made for this engine, or None."""
        if not self._host_checked:
            if not self.backend.engine_is_local():
                self._host_problem = "the engine is not on the console's host"
            else:
                self._host_problem = available(self.root)
            self._host_checked = True
        return self._host_problem

    def _storage(self) -> tuple[str, str]:
        """The engine's storage driver and its backing file system ("" when not reported)."""
        if self._info is None:
            with _engine_call("reading the engine's storage driver"):
                self._info = dict(self.backend.api.info())
        status = {str(k): str(v) for k, v in self._info.get("DriverStatus") or []}
        return str(self._info.get("Driver") or "?"), status.get("Backing Filesystem", "")

    def layer_supported(self) -> bool:
        """The engine bounds a container's writable layer (--storage-opt size)."""
        if self._layer is None:
            driver, backing = self._storage()
            self._layer = driver in LAYER_DRIVERS or (driver == "overlay2" and backing == "xfs")
        return self._layer

    def layer_refused(self) -> None:
        """The engine refused --storage-opt (overlay2 on xfs without pquota): not again."""
        self._layer = False

    def storage_driver(self) -> str:
        """In words, e.g. "overlay2 on extfs"."""
        driver, backing = self._storage()
        return f"{driver} on {backing}" if backing else driver

    def capabilities(self) -> DiskCapabilities:
        problem = self.host_problem()
        layer = self.layer_supported()
        driver = self.storage_driver()
        bounded = problem is None
        parts = []
        if bounded:
            parts.append(
                "/workspace and /tmp share one file system of the disk limit per sandbox; "
                "writes past it fail with \u201cNo space left on device\u201d."
            )
        else:
            parts.append(f"/workspace and /tmp are not bounded: {problem}.")
        if layer:
            parts.append(f"The rest of the sandbox's files (its writable layer) is bounded too ({driver}).")
        else:
            parts.append(
                f"The rest of its files (/home, /usr, /var: the writable layer) is not bounded: this engine's "
                f"storage ({driver}) cannot (--storage-opt size needs overlay2 on xfs with pquota, btrfs or zfs)."
            )
        if bounded:
            parts.append(f"Template builds from Debian packages run in {self.build_disk_mb} MiB.")
        return DiskCapabilities(
            workspace=bounded, tmp=bounded, writable_layer=layer, template_builds=bounded, summary=" ".join(parts)
        )

    # Sandboxes ------------------------------------------------------------------------

    def plan(self, spec: SandboxSpec) -> DiskPlan:
        """Make what a new sandbox's disk limit needs (its scratch, its volume's tmp) and say
        how the container gets it. Nothing is made without a limit."""
        disk_mb = spec.resources.disk_mb
        if not disk_mb:
            return DiskPlan()
        plan = DiskPlan(storage_opt={"size": f"{disk_mb}M"} if self.layer_supported() else None)
        if self.host_problem() is not None:
            return plan
        self.sweep()
        volume_fs = self._volume_fs(spec.workspace_volume) if spec.workspace_volume else None
        if volume_fs is not None:
            _fresh_folder(volume_fs.mountpoint / "tmp", 0o1777)
            plan.binds[str(volume_fs.mountpoint / "tmp")] = {"bind": TMP, "mode": "rw"}
            return plan
        scratch = LoopFs(self.root, f"{SCRATCH_PREFIX}{uuid.uuid4().hex}")
        try:
            scratch.create(disk_mb)
            _fresh_folder(scratch.mountpoint / "tmp", 0o1777)
            plan.binds[str(scratch.mountpoint / "tmp")] = {"bind": TMP, "mode": "rw"}
            if not spec.workspace_volume:
                _workspace_folder(scratch.mountpoint / "workspace")
                plan.binds[str(scratch.mountpoint / "workspace")] = {"bind": WORKSPACE, "mode": "rw"}
        except (LoopFsError, OSError) as exc:
            with contextlib.suppress(LoopFsError):
                scratch.destroy()
            raise RemoteError(ErrorKind.INTERNAL, f"could not make the sandbox's bounded disk: {exc}") from exc
        plan.scratch = scratch
        plan.labels[LABEL_SCRATCH] = scratch.name
        return plan

    def scratch_of(self, labels: Mapping[str, str]) -> LoopFs | None:
        """The scratch file system a sandbox owns, named by its labels (read before it goes)."""
        name = labels.get(LABEL_SCRATCH)
        return LoopFs(self.root, name) if name else None

    def release(self, fs: LoopFs | None) -> None:
        if fs is not None:
            try:
                fs.destroy()
            except LoopFsError as exc:
                logger.warning("could not delete bounded disk %s: %s", fs.name, exc)

    def remount(self, container_id: str) -> None:
        """Before a stopped sandbox starts again (after a host reboot the mounts are gone):
        mount its file systems, so it never writes into the bare folders on the host disk."""
        if self.host_problem() is not None:
            return
        try:
            with _engine_call(f"sandbox {container_id}"):
                attrs = self.backend.api.inspect_container(container_id)
        except RemoteError:
            return
        for mount in attrs.get("Mounts") or []:
            source = Path(str(mount.get("Source") or ""))
            if mount.get("Type") == "bind" and source.parent.parent == self.root:
                with contextlib.suppress(LoopFsError):
                    LoopFs(self.root, source.parent.name).mount()
            elif mount.get("Type") == "volume" and mount.get("Name"):
                self._volume_fs(str(mount["Name"]))

    # Workspace volumes ------------------------------------------------------------------

    def ensure_volume(self, name: str, metadata: Mapping[str, str], disk_mb: int | None) -> None:
        """The session's workspace volume: bounded to `disk_mb` where this host can, else the
        engine's plain named volume. An existing volume is kept (a bounded one mounted and
        grown to a raised limit; one made before limits stays unbounded)."""
        if not disk_mb or self.host_problem() is not None:
            self.backend.ensure_volume(name, metadata)
            return
        existing = self._inspect_volume(name)
        if existing is not None:
            fs = self._volume_fs(name, existing)
            if fs is not None:
                with contextlib.suppress(LoopFsError):
                    fs.grow(disk_mb)
            return
        fs = LoopFs(self.root, f"{VOLUME_PREFIX}{name}")
        try:
            fs.create(disk_mb)
            _workspace_folder(fs.mountpoint / "workspace")
            labels = {
                **metadata_labels(metadata),
                LABEL_MANAGED: "1",
                LABEL_KIND: KIND_WORKSPACE,
                LABEL_DISK_MB: str(disk_mb),
            }
            with _engine_call(f"volume {name}"):
                self.backend.api.create_volume(
                    name,
                    driver="local",
                    driver_opts={"type": "none", "o": "bind", "device": str(fs.mountpoint / "workspace")},
                    labels=labels,
                )
        except (LoopFsError, OSError) as exc:
            self.release(fs)
            raise RemoteError(ErrorKind.INTERNAL, f"could not make the bounded workspace {name}: {exc}") from exc
        except RemoteError:
            if self._inspect_volume(name) is None:  # another process's volume is kept
                self.release(fs)
            raise

    def release_volume(self, name: str) -> None:
        """After the volume itself is gone: its file system (idempotent)."""
        self.release(LoopFs(self.root, f"{VOLUME_PREFIX}{name}") if _fs_name_ok(name) else None)

    def _inspect_volume(self, name: str) -> dict[str, Any] | None:
        try:
            with _engine_call(f"volume {name}"):
                found: dict[str, Any] = self.backend.api.inspect_volume(name)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return None
            raise
        return found

    def _volume_fs(self, name: str, attrs: Mapping[str, Any] | None = None) -> LoopFs | None:
        """A bounded volume's file system, mounted; None for a plain volume."""
        attrs = attrs if attrs is not None else self._inspect_volume(name)
        if attrs is None or not (attrs.get("Labels") or {}).get(LABEL_DISK_MB) or not _fs_name_ok(name):
            return None
        fs = LoopFs(self.root, f"{VOLUME_PREFIX}{name}")
        try:
            fs.mount()
        except LoopFsError as exc:
            raise RemoteError(ErrorKind.INTERNAL, f"the bounded workspace {name} cannot be mounted: {exc}") from exc
        return fs

    # Leftovers ---------------------------------------------------------------------------

    def sweep(self, *, force: bool = False) -> list[str]:
        """Delete file systems nothing owns any more (a scratch whose sandbox is gone, a
        volume's whose volume is gone), older than the grace; at most every grace period
        unless `force`. Returns the names deleted."""
        mark = self.root / SWEEP_MARK
        now = time.time()
        with contextlib.suppress(FileNotFoundError):
            if not force and now - mark.stat().st_mtime < ORPHAN_GRACE_S:
                return []
        with contextlib.suppress(OSError):
            mark.touch()
        with _engine_call("listing sandboxes with bounded disks"):
            containers = self.backend.api.containers(all=True, filters={"label": LABEL_SCRATCH})
            volumes = self.backend.api.volumes(filters={"label": LABEL_DISK_MB}).get("Volumes") or []
        owned = {(c.get("Labels") or {}).get(LABEL_SCRATCH) for c in containers}
        owned |= {f"{VOLUME_PREFIX}{v['Name']}" for v in volumes}
        deleted = []
        for name in [*list_names(self.root, SCRATCH_PREFIX), *list_names(self.root, VOLUME_PREFIX)]:
            fs = LoopFs(self.root, name)
            try:
                age = now - fs.image.stat().st_mtime
            except FileNotFoundError:
                continue
            if name not in owned and age > ORPHAN_GRACE_S:
                self.release(fs)
                deleted.append(name)
        for name in list_names(self.root, BUILD_PREFIX):
            if _build_abandoned(LoopFs(self.root, name), now):
                deleted.append(name)
        if deleted:
            logger.info("deleted %d bounded disk(s) nothing owned: %s", len(deleted), ", ".join(deleted))
        return deleted

    # Template builds --------------------------------------------------------------------

    def build_storage_opt(self) -> dict[str, str] | None:
        """A script build container's writable layer size, where the engine bounds one."""
        return {"size": f"{self.build_disk_mb}M"} if self.layer_supported() else None

    @contextlib.contextmanager
    def build_space(self) -> Iterator[str]:
        """A folder of `build_disk_mb` for a template build, deleted afterwards; a plain
        temporary folder where this host cannot bound one."""
        if self.host_problem() is not None:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="console-rootfs-") as folder:
                yield folder
            return
        fs = LoopFs(self.root, f"{BUILD_PREFIX}{uuid.uuid4().hex}")
        held: int | None = None
        try:
            try:
                fs.create(self.build_disk_mb)
                # Held while the build runs; the kernel drops it when this process dies, which
                # is how the sweep tells a killed console's build space from a running build.
                held = os.open(fs.image, os.O_RDONLY)
                fcntl.flock(held, fcntl.LOCK_SH)
            except (LoopFsError, OSError) as exc:
                raise RemoteError(ErrorKind.INTERNAL, f"could not make the build's bounded disk: {exc}") from exc
            yield str(fs.mountpoint)
        finally:
            self.release(fs)
            if held is not None:
                os.close(held)


def _build_abandoned(fs: LoopFs, now: float) -> bool:
    """Delete a template build's space whose build process is gone (killed mid-build: no
    process holds its lock), once older than the grace; True when it went."""
    try:
        if now - fs.image.stat().st_mtime <= ORPHAN_GRACE_S:
            return False
        fd = os.open(fs.image, os.O_RDONLY)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a build is running in it
        try:
            fs.destroy()
        except LoopFsError as exc:
            logger.warning("could not delete the abandoned build space %s: %s", fs.name, exc)
            return False
        return True
    finally:
        os.close(fd)


def _fs_name_ok(volume: str) -> bool:
    try:
        LoopFs(Path("/"), f"{VOLUME_PREFIX}{volume}")
    except LoopFsError:
        return False
    return True


def _fresh_folder(path: Path, mode: int) -> None:
    """An empty folder (a sandbox's /tmp starts empty); what was there is removed without
    following links a sandbox planted."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.mkdir()
    os.chmod(path, mode)


def _workspace_folder(path: Path) -> None:
    """/workspace's layout, as the base image has it: input/ and output/, the user's."""
    for folder in (path, path / "input", path / "output"):
        folder.mkdir(exist_ok=True)
        os.chown(folder, SANDBOX_UID, SANDBOX_UID)
