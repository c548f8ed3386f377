"""Cube protocol values recorded or pinned before the releases were told apart
(sandboxes/migrations/0022_old_cube_protocols.py).

Until then `cube-0.4` meant "Cube before v0.5" (the label of sandboxes 0012's choices,
modelled on CubeSandbox 1ef7499, before v0.2.2); now it names v0.4.0, which takes L7 rules
and lists snapshots. An old pin read with the new meaning would send L7 rules that v0.3.0
drops silently and offer snapshots v0.2.2 cannot list. The data migration gives old pins the
weakest release before v0.5 (the same switch meanings, nothing advertised that an older
release drops) and forgets old detections (probed again when needed)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader

from sandboxes.backends.cube.releases import release_for
from sandboxes.models import SandboxConfig

BEFORE = [("sandboxes", "0021_session_list_indexes")]
AFTER = MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes("sandboxes")
OLD_VERSION = "Cube before v0.5 (no snapshot, network-update or idle-pause API)"


@pytest.mark.django_db(transaction=True)
def test_old_cube_values_keep_their_old_meaning_after_the_migration() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    Space = old.get_model("console", "Space")
    Backend = old.get_model("sandboxes", "PlatformBackend")
    Config = old.get_model("sandboxes", "SandboxConfig")
    space = Space.objects.create(name="A", slug="a")
    cube = Backend.objects.create(name="cube", kind="cube", endpoint="http://127.0.0.1:9", domain="cube.test")
    e2b = Backend.objects.create(name="e2b", kind="e2b", endpoint="http://127.0.0.1:9", domain="e2b.test")

    def config(name: str, backend: object, **values: str) -> None:
        Config.objects.create(space=space, backend=backend, name=name, default_template="base", **values)

    config("old pin", cube, protocol_pin="cube-0.4", backend_version=OLD_VERSION)
    config("old pin never tested", cube, protocol_pin="cube-0.4")
    config("new pin", cube, protocol_pin="cube-0.4", backend_version="CubeSandbox v0.4.0: egress switch …")
    config("old record", cube, backend_protocol="cube-0.4", backend_version=OLD_VERSION)
    config("new record", cube, backend_protocol="cube-0.4", backend_version="CubeSandbox v0.4.0: egress switch …")
    config("later pin", cube, protocol_pin="cube-0.5", backend_version="Cube v0.5+ (snapshots, …)")
    config("e2b", e2b, protocol_pin="e2b-v1", backend_protocol="e2b-v1")
    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)

    rows = {c.name: (c.protocol_pin, c.backend_protocol) for c in SandboxConfig.objects.all()}
    assert rows == {
        "old pin": ("cube-0.2", ""),
        "old pin never tested": ("cube-0.2", ""),
        "new pin": ("cube-0.4", ""),
        "old record": ("", ""),
        "new record": ("", "cube-0.4"),
        "later pin": ("cube-0.5", ""),
        "e2b": ("e2b-v1", "e2b-v1"),
    }
    # What an old pin now means: before v0.5, and nothing a release before v0.4.0 drops.
    release = release_for(rows["old pin"][0])
    assert release is not None
    assert (release.public_traffic_is_egress, release.l7_rules, release.snapshots) == (True, False, False)
