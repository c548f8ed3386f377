from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "sandboxes"
    verbose_name = "Sandboxes"

    def ready(self) -> None:
        # Register job handlers, and the signals that close terminals on loss of access; a
        # committed policy change reaches running sandboxes that take it live.
        from console.signals import network_policy_changed

        from .catalog import jobs, verify  # noqa: F401
        from .egress.live import on_policy_changed
        from .sessions import reaper, retention  # noqa: F401
        from .terminal import tickets  # noqa: F401

        network_policy_changed.connect(on_policy_changed, dispatch_uid="sandboxes.egress.live")
