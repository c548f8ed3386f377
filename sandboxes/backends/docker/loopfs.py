"""Size-bounded file systems on the engine's host: an ext4 image file, loop-mounted.

Each one is a sparse image `<root>/<name>.img` mounted at `<root>/<name>/`. Writes into it
stop with ENOSPC at its size, and the host's disk holds at most that size for it (a sparse
file only takes the blocks written). Used by `disk.py` for workspaces, scratch and template
builds, because Docker on overlay2 over ext4 cannot bound a container's writable layer
(`--storage-opt size` needs xfs with project quotas, btrfs or zfs).

Needs root (mount, mkfs.ext4) on the host that runs the engine, in the engine's mount
namespace. Every function is idempotent and leaves nothing behind when it fails: a file
system that could not be mounted is removed again.

Imports nothing of the project: the standard library only.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")
TOOL_TIMEOUT_S = 120
# Smallest useful ext4 image: below this, the journal and metadata leave almost nothing.
MIN_SIZE_MB = 16


class LoopFsError(RuntimeError):
    """A tool failed; the message carries its own words."""


@dataclass(frozen=True)
class LoopFs:
    """One bounded file system: its image file and its mount point, under `root`."""

    root: Path
    name: str

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise LoopFsError(f"not a file system name: {self.name!r}")

    @property
    def image(self) -> Path:
        return self.root / f"{self.name}.img"

    @property
    def mountpoint(self) -> Path:
        return self.root / self.name

    def exists(self) -> bool:
        return self.image.exists()

    def is_mounted(self) -> bool:
        return os.path.ismount(self.mountpoint)

    def size_mb(self) -> int:
        """The image's size (its bound), 0 when there is none."""
        try:
            return self.image.stat().st_size // (1024 * 1024)
        except FileNotFoundError:
            return 0

    def create(self, size_mb: int) -> None:
        """Make and mount a file system of `size_mb` MiB (once; an existing one is mounted)."""
        if self.exists():
            self.mount()
            return
        if size_mb < MIN_SIZE_MB:
            raise LoopFsError(f"a bounded file system needs at least {MIN_SIZE_MB} MiB, not {size_mb}")
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            # O_EXCL: two processes making the same one race here, and one of them wins.
            fd = os.open(self.image, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            self.mount()
            return
        try:
            os.ftruncate(fd, size_mb * 1024 * 1024)  # sparse: no block is taken yet
            os.close(fd)
            # -m 0: no blocks reserved for root (the whole size is the sandbox's); nodiscard:
            # the sparse image has nothing to discard; lazy init: metadata blocks are written
            # when used, so a new image takes ~2 MiB of the host; root_owner: callers hand out subfolders.
            _run(
                "mkfs.ext4",
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "nodiscard,lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
                "-L",
                "console",
                str(self.image),
            )
            self.mount()
        except BaseException:
            self.destroy()
            raise

    def mount(self) -> None:
        """Mount the image if it is not (after a host reboot, or a crash between the steps)."""
        if self.is_mounted():
            return
        if not self.exists():
            raise LoopFsError(f"no file system {self.name} under {self.root}")
        self.mountpoint.mkdir(mode=0o700, exist_ok=True)
        # nosuid, nodev: nothing a sandbox writes there acts as a device or a setuid program
        # on the host side; the loop device is freed by the unmount (mount sets autoclear).
        _run("mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", str(self.image), str(self.mountpoint))

    def grow(self, size_mb: int) -> None:
        """Enlarge a mounted file system to `size_mb` (ext4 grows online); never shrinks."""
        if size_mb <= self.size_mb() or not self.is_mounted():
            return
        device = _run("findmnt", "-n", "-o", "SOURCE", "--target", str(self.mountpoint)).strip()
        os.truncate(self.image, size_mb * 1024 * 1024)
        _run("losetup", "-c", device)
        _run("resize2fs", device)

    def destroy(self) -> None:
        """Unmount and delete the image (idempotent). A busy mount is detached lazily: the
        kernel frees it when its last user goes, and the image's blocks with it."""
        if self.is_mounted():
            try:
                _run("umount", str(self.mountpoint))
            except LoopFsError:
                _run("umount", "-l", str(self.mountpoint))
        if self.mountpoint.is_dir() and not self.is_mounted():
            shutil.rmtree(self.mountpoint, ignore_errors=True)
        self.image.unlink(missing_ok=True)


def list_names(root: Path, prefix: str = "") -> list[str]:
    """The names of the file systems under `root` (by their image files)."""
    try:
        return sorted(p.name.removesuffix(".img") for p in root.glob(f"{prefix}*.img") if NAME.match(p.stem))
    except FileNotFoundError:
        return []


def available(root: Path) -> str | None:
    """Why bounded file systems cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "the console does not run as root (mounting needs it)"
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount", "losetup") if shutil.which(tool) is None]
    if missing:
        return f"missing on the host: {', '.join(missing)}"
    if not Path("/dev/loop-control").exists():
        return "no loop devices on the host (/dev/loop-control)"
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot use {root}: {exc.strerror}"
    return None


def _run(*argv: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LoopFsError(f"{argv[0]} could not run: {exc}") from exc
    if done.returncode != 0:
        raise LoopFsError(f"{argv[0]} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout
