"""Cube protocol values stored before the releases were told apart keep their old meaning.

Until sandboxes.backends.cube.releases, `cube-0.4` meant "Cube before v0.5" (0012's choice
label; modelled on CubeSandbox 1ef7499, which predates v0.2.2). It now names v0.4.0, which
takes L7 rules and lists snapshots, so an old pin read anew would send L7 rules that v0.3.0
drops silently and offer snapshots that v0.2.2 cannot list. A pin whose last health check was
not by the new adapter (its version does not read "CubeSandbox v0.4.0") becomes `cube-0.2`:
the same egress and inbound meaning as before v0.5, and nothing advertised that an older
release drops (the admin may pin v0.3.0 or v0.4.0 once known). An old detection is forgotten:
the adapter probes the release again when it needs it.
"""

from django.db import migrations

OLD = "cube-0.4"
NEW_VERSION = "CubeSandbox v0.4.0"


def keep_old_meaning(apps, schema_editor):
    Config = apps.get_model("sandboxes", "SandboxConfig")
    cube = Config.objects.filter(backend__kind="cube").exclude(backend_version__startswith=NEW_VERSION)
    cube.filter(protocol_pin=OLD).update(protocol_pin="cube-0.2")
    cube.filter(backend_protocol=OLD).update(backend_protocol="")


class Migration(migrations.Migration):
    dependencies = [
        ("sandboxes", "0021_session_list_indexes"),
    ]

    operations = [
        migrations.RunPython(keep_old_meaning, migrations.RunPython.noop),
    ]
