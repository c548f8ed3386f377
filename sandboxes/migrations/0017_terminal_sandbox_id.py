"""Terminal.sandbox_id: the sandbox a terminal's shell runs in, on the row itself.

The idle sweep read it from the terminal's `terminal.open` audit row, which the audit
retention may delete while the terminal is still open. Open terminals opened before this
migration get it from that row when it is still there.
"""

from django.db import migrations, models


def copy_from_open_audits(apps, schema_editor):
    Terminal = apps.get_model("sandboxes", "Terminal")
    AuditEvent = apps.get_model("console", "AuditEvent")
    pending = Terminal.objects.filter(opened__isnull=False, closed__isnull=True, sandbox_id="")
    for terminal in pending.iterator():
        opened = AuditEvent.objects.filter(action="terminal.open", target_id=str(terminal.pk)).first()
        sandbox_id = str(((opened.details or {}).get("sandbox_id") or "") if opened is not None else "")
        if sandbox_id:
            Terminal.objects.filter(pk=terminal.pk).update(sandbox_id=sandbox_id[:128])


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0005_users_invitations_oidc"),
        ("sandboxes", "0016_exec_slots"),
    ]

    operations = [
        migrations.AddField(
            model_name="terminal",
            name="sandbox_id",
            field=models.CharField(blank=True, max_length=128),
        ),
        migrations.RunPython(copy_from_open_audits, migrations.RunPython.noop),
    ]
