from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "sandboxes"
    verbose_name = "Sandboxes"

    def ready(self) -> None:
        # Register job handlers.
        from . import jobs, reaper, verify  # noqa: F401
