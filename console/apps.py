from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        from .crypto import check_secrets

        # Before anything serves: outside DEBUG, no public default key, no derived secrets key.
        check_secrets()
        # Register job handlers.
        from . import diagnostics  # noqa: F401
