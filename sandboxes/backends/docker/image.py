"""Build Docker template images from Debian packages, without any registry pull.

`mmdebstrap` writes a minimal Debian bookworm root filesystem as a tarball on the host and
`docker import` turns it into an image whose entrypoint is tini (PID 1 reaps the orphans
that agent commands leave behind). The image carries the account `user` (uid/gid 1000) and
a `/workspace` tree with `input/` and `output/` owned by it.

Runs without Django: `python -m sandboxes.backends.docker.image [--force]`. The management
command `build_base_image` calls the same function.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path

import docker
import docker.errors

from ..base import SANDBOX_UID

log = logging.getLogger(__name__)

DEFAULT_BASE_IMAGE = "sandbox-console/base:latest"
BASE_TEMPLATE_NAME = "base"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"

# Label keys shared with the Docker backend: it finds templates and snapshots by them.
LABEL_MANAGED = "console.managed"
LABEL_KIND = "console.kind"
LABEL_TEMPLATE_NAME = "console.template.name"
LABEL_TEMPLATE_DESCRIPTION = "console.template.description"
KIND_TEMPLATE = "template"

# python3 for agent code; tini as PID 1; coreutils for GNU `timeout`, which every exec runs
# under (it leads the process group a timeout kills: common.py); util-linux for setsid and
# other basics; procps for ps/kill/top; ca-certificates for TLS when online; vim-tiny and
# less so a person at the web terminal can read and edit files.
BASE_PACKAGES: tuple[str, ...] = (
    "python3",
    "bash",
    "coreutils",
    "procps",
    "tini",
    "util-linux",
    "ca-certificates",
    "vim-tiny",
    "less",
)
# Added to the base after its recipe digest was fixed: tmux keeps web-terminal shells alive
# across websocket reconnects through any console process (sandboxes/terminal/keeper.py).
# An image is current when its recipe digest matches and its packages label names each of
# these, so adding one rebuilds older images without changing the digest that images built
# by the earlier recipe carry. jq is what the bundled text-stats skill declares; curl is what
# agents (and admins trying a network policy) reach for first.
EXTRA_PACKAGES: tuple[str, ...] = ("tmux", "jq", "curl")
# Marks which recipe built an image, so a changed recipe rebuilds the base image by itself.
LABEL_RECIPE = "console.base.recipe"
LABEL_PACKAGES = "console.base.packages"

MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr"
BUILD_TIMEOUT_S = 1800

# Runs on the host against the finished chroot ("$1"); no tool inside the chroot is needed,
# so the minbase variant (which lacks useradd) is enough.
_ACCOUNT_HOOK = f"""set -e
root="$1"
account='user:x:{SANDBOX_UID}:{SANDBOX_UID}:Sandbox user:/home/user:/bin/bash'
grep -q '^user:' "$root/etc/passwd" || echo "$account" >> "$root/etc/passwd"
grep -q '^user:' "$root/etc/group" || echo 'user:x:{SANDBOX_UID}:' >> "$root/etc/group"
grep -q '^user:' "$root/etc/shadow" || echo 'user:*:19000:0:99999:7:::' >> "$root/etc/shadow"
mkdir -p "$root/home/user" "$root/workspace/input" "$root/workspace/output"
cp -a "$root/etc/skel/." "$root/home/user/" 2>/dev/null || true
chown -R {SANDBOX_UID}:{SANDBOX_UID} "$root/home/user" "$root/workspace"
chmod 1777 "$root/tmp"
[ -x "$root/usr/bin/vim.tiny" ] && ln -sf /usr/bin/vim.tiny "$root/usr/local/bin/vim"
true
"""

# Keeps the image small: no package lists, caches, docs, man pages or translations.
_CLEANUP_HOOK = """set -e
root="$1"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
find "$root" -xdev -name __pycache__ -type d -prune -exec rm -rf {} +
"""

_DPKG_EXCLUDES: tuple[str, ...] = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)


class ImageBuildError(RuntimeError):
    """mmdebstrap or the import failed; the message carries the tool's own words."""


def template_labels(name: str, description: str = "", extra: Mapping[str, str] | None = None) -> dict[str, str]:
    labels = {LABEL_MANAGED: "1", LABEL_KIND: KIND_TEMPLATE, LABEL_TEMPLATE_NAME: name}
    if description:
        labels[LABEL_TEMPLATE_DESCRIPTION] = description
    labels.update(extra or {})
    return labels


def image_changes(labels: Mapping[str, str]) -> list[str]:
    """Dockerfile instructions applied at import (an imported tarball has no config)."""
    changes = [
        'ENTRYPOINT ["/usr/bin/tini", "--"]',
        'CMD ["sleep", "infinity"]',
        "WORKDIR /workspace",
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
    ]
    changes += [f"LABEL {_quote(key)}={_quote(value)}" for key, value in sorted(labels.items())]
    return changes


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def mmdebstrap_argv(packages: Iterable[str], target: Path) -> list[str]:
    argv = [
        shutil.which("mmdebstrap") or "/usr/bin/mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        "--format=tar",
        "--include=" + ",".join(sorted(set(packages))),
        '--aptopt=APT::Install-Recommends "false"',
        '--aptopt=APT::Install-Suggests "false"',
    ]
    argv += [f"--dpkgopt={option}" for option in _DPKG_EXCLUDES]
    if Path(MERGED_USR_HOOKS).is_dir():
        # Sets up merged /usr directly; otherwise bookworm pulls in usrmerge and ~45 MB of perl.
        argv.append(f"--hook-directory={MERGED_USR_HOOKS}")
    argv += [f"--customize-hook={_ACCOUNT_HOOK}", f"--customize-hook={_CLEANUP_HOOK}"]
    argv += [DEBIAN_SUITE, str(target), f"deb {DEBIAN_MIRROR} {DEBIAN_SUITE} main"]
    return argv


def build_rootfs_image(
    client: docker.DockerClient,
    tag: str,
    *,
    packages: Iterable[str] = (),
    labels: Mapping[str, str],
    space: AbstractContextManager[str] | None = None,
) -> str:
    """mmdebstrap the base packages plus `packages` and import the result as `tag`.

    Returns the image id. Needs root (mmdebstrap --mode=root) and the Debian mirror. `space`
    gives the folder the chroot and the tarball are written in (a size-bounded one: see
    disk.py); by default a temporary folder.
    """
    with space or tempfile.TemporaryDirectory(prefix="console-rootfs-") as workdir:
        tarball = Path(workdir) / "rootfs.tar"
        argv = mmdebstrap_argv([*BASE_PACKAGES, *packages], tarball)
        log.info("building %s with mmdebstrap", tag)
        # mmdebstrap makes its chroot under TMPDIR: inside the same folder, so one bound holds both.
        env = {**os.environ, "TMPDIR": workdir}
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False, env=env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ImageBuildError(f"mmdebstrap could not run: {exc}") from exc
        if done.returncode != 0:
            raise ImageBuildError(f"mmdebstrap failed ({done.returncode}): {done.stderr[-4000:]}")
        repository, _, version = tag.rpartition(":")
        client.api.import_image_from_file(
            str(tarball), repository=repository, tag=version, changes=image_changes(labels)
        )
    image = client.images.get(tag)
    return str(image.id)


def base_recipe() -> str:
    """A short digest of everything that shapes the base image."""
    material = "\n".join([DEBIAN_SUITE, *sorted(BASE_PACKAGES), _ACCOUNT_HOOK, _CLEANUP_HOOK, *_DPKG_EXCLUDES])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def image_is_current(labels: Mapping[str, str]) -> bool:
    """Built by this recipe, with every one of EXTRA_PACKAGES."""
    packages = set(filter(None, labels.get(LABEL_PACKAGES, "").split(",")))
    return labels.get(LABEL_RECIPE) == base_recipe() and set(EXTRA_PACKAGES) <= packages


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_base_image(
    *, force: bool = False, tag: str = DEFAULT_BASE_IMAGE, client: docker.DockerClient | None = None
) -> str:
    """Build the base template image unless `tag` already exists (or `force`). Returns its id."""
    own_client = client is None
    engine = client or docker.from_env(timeout=120)
    try:
        if not force and image_exists(engine, tag):
            image = engine.images.get(tag)
            if image_is_current(image.labels or {}):
                return str(image.id)
            log.info("%s was built by another recipe; rebuilding", tag)
        labels = template_labels(
            BASE_TEMPLATE_NAME,
            "Debian bookworm with python3, bash, tmux, curl, jq and tini",
            {LABEL_RECIPE: base_recipe(), LABEL_PACKAGES: ",".join(sorted(EXTRA_PACKAGES))},
        )
        return build_rootfs_image(engine, tag, packages=EXTRA_PACKAGES, labels=labels)
    finally:
        if own_client:
            engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the sandbox console's base template image.")
    parser.add_argument("--force", action="store_true", help="rebuild even if the tag exists")
    parser.add_argument("--tag", default=DEFAULT_BASE_IMAGE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        image_id = build_base_image(force=args.force, tag=args.tag)
    except (ImageBuildError, docker.errors.DockerException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.tag} {image_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
