from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "sandboxes"
    verbose_name = "Sandboxes"

    def ready(self) -> None:
        # Register job handlers, and the signals that close terminals on loss of access; a
        # committed policy change reaches running sandboxes that take it live.
        from django.core import checks

        from console import health, metrics, users
        from console.signals import network_policy_changed, process_released

        from .api.tokens import api_tokens_made_by, revoke_api_tokens_made_by
        from .catalog import (  # noqa: F401
            jobs,
            onboarding,
            verify,
        )
        from .catalog.health import backend_checks
        from .network.live import on_policy_changed
        from .sessions import gauges, reaper, retention, teardown, unmanaged  # noqa: F401
        from .sessions.commands import lose_commands_of
        from .sessions.inbound_hosts import check_setting
        from .sessions.limits import release_slots_of
        from .sessions.store_select import check_store
        from .terminal import tickets  # noqa: F401

        checks.register(check_setting)  # INBOUND_BASE_URL: empty, or a usable wildcard origin
        network_policy_changed.connect(on_policy_changed, dispatch_uid="sandboxes.network.live")
        # What a dead console process held: its exec slots and background commands.
        process_released.connect(release_slots_of, dispatch_uid="sandboxes.exec_slots")
        process_released.connect(lose_commands_of, dispatch_uid="sandboxes.commands")
        # Readiness (console/health.py) and scrape-time series (console/metrics.py).
        health.register_checks("session_store", lambda: [("session_store", check_store, True)])
        health.register_checks("backends", backend_checks)
        # A deactivated user's API tokens are listed on the deactivate page and revoked with it.
        users.register_credential_source(
            "api_tokens", users.CredentialSource(held_by=api_tokens_made_by, revoke=revoke_api_tokens_made_by)
        )
        metrics.register_scrape_collector(gauges.SESSIONS)
        metrics.register_scrape_collector(gauges.OPEN_TERMINALS)
