"""Dependency declarations: pip, npm and Debian packages, validated."""

from __future__ import annotations

import json

import pytest

from skills.install.dependencies import find_dependencies

pytestmark = pytest.mark.django_db


def test_requirements_in_root_and_scripts() -> None:
    files = {
        "requirements.txt": b"# comment\npandas>=2,<3\nrequests[socks] == 2.32.3 ; python_version >= '3.8'\n\n",
        "scripts/requirements.txt": b"pillow>=10  # images\n",
        "assets/requirements.txt": b"ignored\n",
    }
    deps = find_dependencies(files, {})
    assert [d["name"] for d in deps.pip] == ["pandas", "requests", "pillow"]
    assert deps.pip[2] == {"requirement": "pillow>=10", "name": "pillow", "source": "scripts/requirements.txt"}
    assert deps.warnings == []


@pytest.mark.parametrize(
    "line",
    [
        "-e git+https://example.com/x.git#egg=x",
        "--index-url https://evil.example/simple",
        "https://example.com/pkg.whl",
        "./local/path",
        "-r other.txt",
        "pkg @ https://example.com/pkg.zip",
    ],
)
def test_requirement_lines_that_choose_a_source_are_left_out(line: str) -> None:
    deps = find_dependencies({"requirements.txt": f"ok-pkg\n{line}\n".encode()}, {})
    assert [d["name"] for d in deps.pip] == ["ok-pkg"]
    assert len(deps.warnings) == 1
    assert "line 2" in deps.warnings[0]


def test_package_json_dependencies() -> None:
    document = {
        "name": "x",
        "dependencies": {
            "left-pad": "^1.3.0",
            "@scope/pkg": ">=2 <3",
            "Bad Name": "1",
            "from-git": "git+https://example.com/x.git",
            "from-file": "file:../x",
        },
        "devDependencies": {"jest": "^29"},
    }
    deps = find_dependencies({"scripts/package.json": json.dumps(document).encode()}, {})
    assert deps.npm == [
        {"name": "left-pad", "version": "^1.3.0", "source": "scripts/package.json"},
        {"name": "@scope/pkg", "version": ">=2 <3", "source": "scripts/package.json"},
    ]
    assert len(deps.warnings) == 3


@pytest.mark.parametrize("spec", ["..", ".", "...", ".1.2", "evil.tgz", "x.TAR.GZ", "pkg.tar"])
def test_package_json_specs_npm_reads_as_a_folder_or_tarball_are_left_out(spec: str) -> None:
    # npm reads a spec starting with "." as a folder and one ending in .tgz/.tar(.gz) as a
    # tarball path: each would install from the build sandbox's disk, not the source.
    document = {"dependencies": {"left-pad": "^1.3.0", "local": spec}}
    deps = find_dependencies({"package.json": json.dumps(document).encode()}, {})
    assert deps.npm == [{"name": "left-pad", "version": "^1.3.0", "source": "package.json"}]
    assert len(deps.warnings) == 1
    assert "local" in deps.warnings[0]


def test_invalid_package_json_is_a_warning() -> None:
    deps = find_dependencies({"package.json": b"{not json"}, {})
    assert deps.npm == []
    assert "not valid JSON" in deps.warnings[0]
    assert find_dependencies({"assets/package.json": b"{not json"}, {}).warnings == []


def test_debian_packages_from_metadata() -> None:
    deps = find_dependencies({}, {"debian-packages": "jq, poppler-utils  libreoffice jq Bad_Name x"})
    assert deps.debian == ["jq", "poppler-utils", "libreoffice"]
    assert len(deps.warnings) == 2
    assert deps.as_dict()["debian"] == deps.debian


def test_no_declarations() -> None:
    deps = find_dependencies({"SKILL.md": b"x"}, {})
    assert deps.empty
    assert deps.as_dict() == {"pip": [], "npm": [], "debian": []}


def test_package_json_nested_past_the_recursion_limit_is_a_warning() -> None:
    """json.loads raises RecursionError, not ValueError, on 2,000 nested arrays (4 KB)."""
    deep = b'{"dependencies": {"left-pad": "^1.3.0"}, "x": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    deps = find_dependencies({"package.json": deep}, {})
    assert deps.npm == []
    assert deps.warnings == ["package.json is not valid JSON (nested too deeply); ignored."]
