from django.apps import AppConfig


class SkillsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "skills"

    def ready(self) -> None:
        # Register job handlers.
        from . import (
            onboarding,  # noqa: F401  (the dashboard's getting-started step)
            palette,  # noqa: F401  (what the command palette finds)
            snapshot_refs,
        )
        from .install import jobs  # noqa: F401

        snapshot_refs.connect()
        # A generation an interrupted job was building fails, so the previous one stays in force.
        from console.signals import process_released

        from .install.start import fail_interrupted_builds

        process_released.connect(fail_interrupted_builds, dispatch_uid="skills.interrupted_builds")
        # The space page's button to the space's skill image (console.panels).
        from console.panels import register_space_action, register_space_panel

        from .image_views import SPACE_ACTION, SPACE_PANEL

        register_space_action(SPACE_ACTION)
        register_space_panel(SPACE_PANEL)
