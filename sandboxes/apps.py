from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "sandboxes"
    verbose_name = "Sandboxes"

    def ready(self) -> None:
        # Register job handlers, and the signals that close terminals on loss of access.
        from .catalog import jobs, verify  # noqa: F401
        from .pages import onboarding  # noqa: F401  (the dashboard's getting-started steps)
        from .sessions import reaper  # noqa: F401
        from .terminal import tickets  # noqa: F401
