"""Prepare a small local apt repository for the tests and the demo (a skills' apt source).

    python scripts/apt_repo.py FOLDER [--image IMAGE] PACKAGE...

Downloads, on the host, the Debian packages a build sandbox from IMAGE (default the base
template image) lacks to install PACKAGE... without recommends: apt on the host works the
set out against the image's own dpkg status (`-o Dir::State::status=`), so dependencies the
image already has are left out. Then writes the `Packages` index (what dpkg-scanpackages
writes: each .deb's control fields, Filename, Size and SHA256) and a `.complete` stamp.

Cached: nothing is downloaded when the stamp names the same packages and image, and a .deb
already in the folder is kept. Needs root (apt-get download of the host's lists), Docker and
the host on the same Debian release as the image. Nothing else of the project is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

STAMP = ".complete"
APT_ENV = {**os.environ, "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}


def image_status(image: str) -> bytes:
    """The image's /var/lib/dpkg/status: what it has installed."""
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", image, "/var/lib/dpkg/status"],
        check=True,
        capture_output=True,
    ).stdout


def image_id(image: str) -> str:
    result = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], check=True, capture_output=True)
    return result.stdout.decode().strip()


def needed(status: Path, packages: list[str]) -> list[tuple[str, str]]:
    """(name, version) of every package apt would unpack in the image for `packages`."""
    argv = ["apt-get", "-s", "-o", f"Dir::State::status={status}", "install", "--no-install-recommends", *packages]
    result = subprocess.run(argv, capture_output=True, env=APT_ENV, check=False)
    if result.returncode != 0 and b"Unable to locate" in result.stderr + result.stdout:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=APT_ENV)
        result = subprocess.run(argv, capture_output=True, env=APT_ENV, check=False)
    if result.returncode != 0:
        sys.exit(f"apt cannot work out {' '.join(packages)}: {result.stderr.decode(errors='replace')[-800:]}")
    lines = re.findall(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) ", result.stdout.decode(), re.MULTILINE)
    return [(name.partition(":")[0], version) for name, version in lines]


def deb_name(name: str, version: str, folder: Path) -> Path | None:
    """The downloaded file of name=version in the folder (apt writes the epoch as %3a)."""
    quoted = version.replace(":", "%3a")
    found = sorted(folder.glob(f"{name}_{quoted}_*.deb"))
    return found[0] if found else None


def download(folder: Path, plan: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Download what the folder lacks of the plan; returns the plan."""
    missing = [f"{name}={version}" for name, version in plan if deb_name(name, version, folder) is None]
    if missing:
        subprocess.run(
            ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", *missing],
            cwd=folder,
            check=True,
            env=APT_ENV,
            stdout=subprocess.DEVNULL,
        )
    return plan


def write_index(folder: Path, debs: list[Path]) -> None:
    """The Packages index of the .deb files, as dpkg-scanpackages writes it."""
    stanzas = []
    for deb in sorted(debs):
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True).stdout.decode()
        data = deb.read_bytes()
        stanzas.append(
            control.rstrip("\n")
            + f"\nFilename: ./{deb.name}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    temporary = folder / "Packages.new"
    temporary.write_text("\n".join(stanzas))
    temporary.replace(folder / "Packages")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("packages", nargs="+")
    parser.add_argument("--image", default="sandbox-console/base:latest")
    args = parser.parse_args()
    folder: Path = args.folder
    wanted = f"{' '.join(sorted(args.packages))}\n{image_id(args.image)}\n"
    stamp = folder / STAMP
    if stamp.is_file() and stamp.read_text() == wanted:
        print(f"apt repository {folder}: up to date")
        return
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        status = Path(scratch) / "status"
        status.write_bytes(image_status(args.image))
        try:
            plan = download(folder, needed(status, args.packages))
        except subprocess.CalledProcessError:  # the host's lists name versions the mirror dropped
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=APT_ENV)
            plan = download(folder, needed(status, args.packages))
    debs = []
    for name, version in plan:
        deb = deb_name(name, version, folder)
        if deb is None:
            sys.exit(f"apt-get download left no file for {name} {version}")
        debs.append(deb)
    for stale in set(folder.glob("*.deb")) - set(debs):
        stale.unlink()
    write_index(folder, debs)
    stamp.write_text(wanted)
    size = sum(deb.stat().st_size for deb in debs)
    print(f"apt repository {folder}: {len(debs)} packages ({size / 1e6:.1f} MB) for {' '.join(args.packages)}")


if __name__ == "__main__":
    main()
