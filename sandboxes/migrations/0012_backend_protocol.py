from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sandboxes", "0011_platform_backends"),
    ]

    operations = [
        migrations.AddField(
            model_name="sandboxconfig",
            name="backend_protocol",
            field=models.CharField(
                blank=True, help_text="Wire protocol detected by the last connection test (E2B/Cube).", max_length=16
            ),
        ),
        migrations.AddField(
            model_name="sandboxconfig",
            name="protocol_pin",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "Detect from the server"),
                    ("e2b-v2", "E2B: SDK /v2 create (E2B cloud)"),
                    ("e2b-v1", "E2B: published-spec operations only (self-hosted)"),
                    ("cube-0.5", "Cube v0.5 or later"),
                    ("cube-0.4", "Cube before v0.5"),
                ],
                help_text="E2B/Cube: the wire protocol to speak. Empty: detect it from the server's answers.",
                max_length=16,
                verbose_name="Protocol",
            ),
        ),
    ]
