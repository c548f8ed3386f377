from django.apps import AppConfig


class SkillsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "skills"

    def ready(self) -> None:
        # Register job handlers.
        from . import (
            jobs,  # noqa: F401
            onboarding,  # noqa: F401  (the dashboard's getting-started step)
            snapshot_refs,
        )

        snapshot_refs.connect()
