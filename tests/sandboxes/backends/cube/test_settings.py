"""The settings Cube declares (`sandboxes/backends/cube/settings.py`): E2B's, plus the
workspace host root (checked by the adapter's own rule) and disk limits, its own protocols,
and the typed options the adapter reads (from typed options or the old string bag)."""

from __future__ import annotations

import json

import pytest

from sandboxes.backends import describe
from sandboxes.backends.base import BackendConfig, ErrorKind, RemoteError
from sandboxes.backends.cube.backend import CubeBackend
from sandboxes.backends.cube.releases import RELEASES
from sandboxes.backends.cube.settings import SCHEMA, CubeOptions
from sandboxes.backends.e2b.settings import SCHEMA as E2B_SCHEMA
from sandboxes.backends.settings import Given, Scope, SettingType

GOOD = {"endpoint": "https://cube.example.test", "domain": "cube.example.test", "api_key": "cube_key"}


def test_cube_declares_e2bs_settings_and_its_host_root_and_disk_limits() -> None:
    assert describe("cube") is SCHEMA
    declared = {(s.scope, s.name): (s.type, s.secret) for s in SCHEMA.settings}
    e2b = {(s.scope, s.name): (s.type, s.secret) for s in E2B_SCHEMA.settings}
    assert declared == {
        **e2b,
        (Scope.BACKEND, "workspace_host_root"): (SettingType.TEXT, False),
        (Scope.BACKEND, "max_disk_mb"): (SettingType.INT, False),
        (Scope.CONFIG, "disk_mb"): (SettingType.INT, False),
    }
    offered = [value for value, _ in SCHEMA.setting("protocol_pin", Scope.CONFIG).choices]
    assert offered[0] == ""
    assert set(offered[1:]) == {r.protocol for r in RELEASES}  # the protocols the adapter speaks


@pytest.mark.parametrize(
    ("root", "problem"),
    [
        ("/", "an absolute path below /"),
        ("srv/workspaces", "an absolute path below /"),
        ("/srv/work spaces", "letters, digits"),
        ("/srv/../etc", "without '.', '..'"),
        ("/srv/workspaces/", "trailing '/'"),
    ],
)
def test_a_workspace_host_root_cube_cannot_mount_is_refused_in_words(root: str, problem: str) -> None:
    problems = SCHEMA.problems(Given({**GOOD, "workspace_host_root": root}))
    assert problems["workspace_host_root"].startswith("The workspace host root must be ")
    assert problem in problems["workspace_host_root"]
    assert SCHEMA.problems(Given({**GOOD, "workspace_host_root": "/srv/sandbox-workspaces"})) == {}
    assert SCHEMA.problems(Given({**GOOD, "domain": ""})) == {"domain": "Cube backends need their sandbox domain."}


def test_the_adapter_reads_its_typed_options_as_the_old_string_bag_gave_them() -> None:
    metadata = {"console.space": "s-1"}
    bag = {"workspace_host_root": "/srv/sandbox-workspaces", "workspace_template": "base", "list_limit": "50",
           "housekeeping_metadata": json.dumps(metadata), "protocol": "cube-0.5", "sandbox_timeout": "600"}  # fmt: skip
    typed = CubeOptions.parse(bag)
    assert typed == CubeOptions(workspace_host_root="/srv/sandbox-workspaces", workspace_template="base",
                                list_limit=50, housekeeping_metadata=metadata, protocol="cube-0.5",
                                sandbox_timeout=600)  # fmt: skip
    for options in (bag, typed):
        config = BackendConfig(kind="cube", endpoint="http://127.0.0.1:9", domain="cube.example.test", options=options)
        backend = CubeBackend(config)
        assert backend.options == typed
        assert (backend.host_root, backend.housekeeping_template, backend.list_limit) == (
            "/srv/sandbox-workspaces", "base", 50)  # fmt: skip
        assert backend.housekeeping_metadata == metadata
        assert backend.sandbox_ttl == 600
        backend.close()


@pytest.mark.parametrize(
    ("bag", "named"),
    [
        ({"workspace_host_root": "/"}, "workspace_host_root"),
        ({"housekeeping_metadata": "[]"}, "housekeeping_metadata"),
        ({"protocol": "e2b-v2"}, "protocol"),
        ({"list_limit": "many"}, "list_limit"),
    ],
)
def test_an_option_the_adapter_cannot_use_is_an_invalid_error(bag: dict[str, str], named: str) -> None:
    config = BackendConfig(kind="cube", endpoint="http://127.0.0.1:9", domain="cube.example.test", options=bag)
    with pytest.raises(RemoteError) as caught:
        CubeBackend(config)
    assert caught.value.kind == ErrorKind.INVALID
    assert named in caught.value.message
