import uuid

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sandboxes", "0012_backend_protocol"),
    ]

    operations = [
        migrations.CreateModel(
            name="TemplateRecord",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                (
                    "owner_space",
                    models.UUIDField(
                        blank=True, help_text="The space it was built for; null: the platform.", null=True
                    ),
                ),
                (
                    "fingerprint",
                    models.CharField(
                        help_text="The backend account (sandboxes.catalog.bridge.config_fingerprint).", max_length=64
                    ),
                ),
                ("template_id", models.CharField(max_length=255)),
                ("created", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("fingerprint", "template_id"), name="one_template_record_per_account"
                    )
                ],
            },
        ),
    ]
