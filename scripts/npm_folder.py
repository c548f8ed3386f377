"""Prepare a small local npm tarball folder for the tests and the demo (a skills' npm source).

    python scripts/npm_folder.py FOLDER [PACKAGE...]

PACKAGE... defaults to a few packages document skills use, with small dependency closures:
docx, pptxgenjs and marked (25 tarballs, about 8 MB).

Works out, on the host, the full dependency closure of PACKAGE... with npm (`npm install
--package-lock-only --ignore-scripts`: a lock, nothing unpacked, no script run), then fetches
each package of the lock with `npm pack` into FOLDER and writes a `.complete` stamp naming
the packages and their tarballs. Optional dependencies (platform binaries) and
dev ones are left out: npm skips an optional dependency its source lacks.

Cached: nothing is fetched when the stamp names the same packages and every tarball it lists
is in the folder; a tarball already in the folder is kept. Needs `npm` on the host and the host
able to reach its npm registry; offline it stops, saying so. Nothing else of the project is
imported.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

STAMP = ".complete"
DOCUMENT_PACKAGES = ("docx", "pptxgenjs", "marked")
NPM_NETWORK = ["--no-audit", "--no-fund", "--fetch-retries=1", "--fetch-timeout=30000"]


def tarball_name(name: str, version: str) -> str:
    """The file `npm pack` writes for name@version (`@scope/x` packs as `scope-x-1.0.0.tgz`)."""
    return f"{name.removeprefix('@').replace('/', '-')}-{version}.tgz"


def lock_closure(lock: dict[str, object]) -> list[tuple[str, str]]:
    """Sorted (name, version) of every package a package-lock.json (v2/v3) installs, nested
    copies included, optional and dev ones left out."""
    packages = lock.get("packages")
    found: set[tuple[str, str]] = set()
    for path, entry in (packages if isinstance(packages, dict) else {}).items():
        if not path or not isinstance(entry, dict) or entry.get("link"):
            continue
        if entry.get("optional") or entry.get("dev") or entry.get("devOptional"):
            continue
        name = entry.get("name") or path.rpartition("node_modules/")[2]
        version = entry.get("version")
        if isinstance(name, str) and isinstance(version, str):
            found.add((name, version))
    return sorted(found)


def npm(argv: list[str], cwd: Path, what: str) -> str:
    """Run npm; stop with its own words when it fails (offline, unknown package)."""
    try:
        result = subprocess.run(["npm", *argv], cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        sys.exit("npm is not installed on this host: install it (apt-get install npm) to prepare the npm folder")
    if result.returncode != 0:
        sys.exit(
            f"npm could not {what} (is the host offline, or is a package name wrong?):\n"
            + "\n".join((result.stderr or result.stdout).splitlines()[:6])
        )
    return result.stdout


def resolve(packages: list[str], scratch: Path) -> list[tuple[str, str]]:
    """The closure of the packages, as npm on the host resolves it now."""
    (scratch / "package.json").write_text('{"name": "npm-folder", "private": true}\n')
    npm(
        ["install", "--package-lock-only", "--ignore-scripts", *NPM_NETWORK, *packages],
        scratch,
        f"resolve {' '.join(packages)}",
    )
    return lock_closure(json.loads((scratch / "package-lock.json").read_text()))


def stamp_text(packages: list[str], files: list[str]) -> str:
    return "\n".join([" ".join(sorted(packages)), *sorted(files)]) + "\n"


def up_to_date(folder: Path, packages: list[str]) -> bool:
    stamp = folder / STAMP
    if not stamp.is_file():
        return False
    lines = stamp.read_text().splitlines()
    return bool(lines) and lines[0] == " ".join(sorted(packages)) and all((folder / f).is_file() for f in lines[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("packages", nargs="*", default=list(DOCUMENT_PACKAGES))
    args = parser.parse_args()
    folder: Path = args.folder
    if up_to_date(folder, args.packages):
        print(f"npm folder {folder}: up to date")
        return
    with tempfile.TemporaryDirectory() as scratch:
        plan = resolve(args.packages, Path(scratch))
        folder.mkdir(parents=True, exist_ok=True)
        missing = [
            f"{name}@{version}" for name, version in plan if not (folder / tarball_name(name, version)).is_file()
        ]
        if missing:
            npm(["pack", "--pack-destination", str(folder.resolve()), *NPM_NETWORK, *missing], Path(scratch), "fetch")
    files = [tarball_name(name, version) for name, version in plan]
    absent = [f for f in files if not (folder / f).is_file()]
    if absent:
        sys.exit(f"npm pack left no file {', '.join(absent)} in {folder}")
    for stale in set(folder.glob("*.tgz")) - {folder / f for f in files}:
        stale.unlink()
    (folder / STAMP).write_text(stamp_text(args.packages, files))
    size = sum((folder / f).stat().st_size for f in files)
    print(f"npm folder {folder}: {len(files)} tarballs ({size / 1e6:.1f} MB) for {' '.join(args.packages)}")


if __name__ == "__main__":
    main()
