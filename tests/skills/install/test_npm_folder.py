"""A folder of npm tarballs as a package source, read on the console host (skills/install/npm.py):
which tarballs count, how needs resolve against them (dependencies, peers, optional ones), and
the index the build sandbox's registry serves, and the folder scripts/npm_folder.py prepares."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from skills.install.npm import folder_tarballs, plan_folder, registry_index
from tests.support.npm_source import write_npm_tarball
from tests.support.skill_install import prepared_source


def test_readable_release_tarballs_count_links_do_not(tmp_path: Path) -> None:
    folder = tmp_path / "npm"
    real = write_npm_tarball(folder, "kept", "1.0.0")
    write_npm_tarball(folder / "nested", "nested", "2.0.0")
    (folder / "broken.tgz").write_bytes(b"not a tarball")
    write_npm_tarball(folder, "prerelease", "1.0.0-beta.1")
    (folder / "link.tgz").symlink_to(real)
    found = folder_tarballs(folder)
    assert {name: sorted(versions) for name, versions in found.items()} == {"kept": ["1.0.0"], "nested": ["2.0.0"]}
    assert found["kept"]["1.0.0"].path == real


def test_needs_resolve_with_dependencies_peers_and_optional_ones(tmp_path: Path) -> None:
    folder = tmp_path / "npm"
    write_npm_tarball(
        folder,
        "app",
        "1.4.0",
        dependencies={"lib": "^2.0.0"},
        peerDependencies={"host": "1.x", "maybe": "^1"},
        peerDependenciesMeta={"maybe": {"optional": True}},
        optionalDependencies={"fsevents": "^2"},
    )
    write_npm_tarball(folder, "app", "2.0.0")
    write_npm_tarball(folder, "lib", "2.3.1", dependencies={"deep": "1.0.0 - 1.5.0"})
    write_npm_tarball(folder, "deep", "1.6.0")
    plan = plan_folder(folder, [("app", "^1.0.0")])
    assert plan.planned == ["npm app@^1.0.0: 1.4.0 in the npm tarball folder npm/"]
    assert plan.problems == [
        "npm host@1.x (a dependency of app@1.4.0): not in the npm tarball folder npm/",
        "npm deep@1.0.0 - 1.5.0 (a dependency of lib@2.3.1): the npm tarball folder npm/ has 1.6.0, "
        "none in the range 1.0.0 - 1.5.0",
    ]
    # Every version of a needed name goes in (npm may choose another than the check did).
    assert {name: sorted(versions) for name, versions in plan.tarballs.items()} == {
        "app": ["1.4.0", "2.0.0"],
        "lib": ["2.3.1"],
    }


def test_the_served_index_names_each_tarball_by_its_hash(tmp_path: Path) -> None:
    path = write_npm_tarball(tmp_path / "npm", "@scope/tool", "0.3.0", scripts={"postinstall": "node build.js"})
    index, files = registry_index(folder_tarballs(tmp_path / "npm"))
    data = path.read_bytes()
    sha1 = hashlib.sha1(data, usedforsecurity=False).hexdigest()
    assert files == [(f"files/{sha1}.tgz", 0o644, data)]
    entry = json.loads(index)["packages"]["@scope/tool"]["0.3.0"]
    assert entry["file"] == f"{sha1}.tgz"
    assert entry["integrity"] == "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    assert entry["manifest"]["hasInstallScript"] is True
    assert json.loads(index)["latest"] == {"@scope/tool": "0.3.0"}


def test_the_prepared_folder_resolves_every_dependency_of_its_packages(settings: Any) -> None:
    folder = prepared_source(settings, "npm", "marked-*.tgz", ".ci/docker-up (scripts/npm_folder.py)")
    packages = (folder / ".complete").read_text().splitlines()[0].split()
    assert packages, f"{folder}/.complete names no package"
    plan = plan_folder(folder, [(name, "*") for name in packages])
    assert plan.problems == []
    assert len(plan.planned) == len(packages)
    # Every tarball of the folder is a package of the closure: nothing fetched for nothing.
    assert set(plan.tarballs) == set(folder_tarballs(folder))
