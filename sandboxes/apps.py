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

        # What the space page and the session page show of the rooms (console.panels,
        # sessions.panels): neither page imports them.
        from console.panels import register_space_action, register_space_panel
        from console.signals import network_policy_changed, process_released

        from .api import pages as token_pages
        from .api.tokens import api_tokens_made_by, revoke_api_tokens_made_by
        from .catalog import (  # noqa: F401
            config_pages,
            jobs,
            onboarding,
            verify,
        )
        from .catalog.health import backend_checks
        from .inbound import pages as inbound_pages
        from .inbound.hosts import check_setting
        from .network import pages as network_pages
        from .network.live import on_policy_changed
        from .pools import gauges as pool_gauges
        from .pools import pages as pool_pages
        from .pools.claim import take
        from .pools.signals import connect_image_signals, on_space_policy_changed
        from .sessions import bulk, gauges, palette, reaper, retention, teardown, unmanaged  # noqa: F401
        from .sessions import pages as session_pages
        from .sessions.commands import lose_commands_of
        from .sessions.limits import release_slots_of
        from .sessions.panels import register_session_panel
        from .sessions.provisioning import register_warm_source
        from .sessions.store_select import check_store
        from .terminal import access  # noqa: F401  (the signals that close or re-check terminals)

        register_space_action(session_pages.SPACE_ACTION)
        register_space_action(token_pages.SPACE_ACTION)
        register_space_action(pool_pages.SPACE_ACTION)
        register_space_panel(network_pages.SPACE_PANEL)
        register_space_panel(config_pages.SPACE_PANEL)
        register_session_panel(inbound_pages.SESSION_PANEL)
        register_session_panel(network_pages.SESSION_PANEL)

        checks.register(check_setting)  # INBOUND_BASE_URL: empty, or a usable wildcard origin
        network_policy_changed.connect(on_policy_changed, dispatch_uid="sandboxes.network.live")
        # Warm pools: a new session's first resolve takes a ready sandbox; a changed policy or
        # skill image drains what their pools hold.
        register_warm_source(take)
        network_policy_changed.connect(on_space_policy_changed, dispatch_uid="sandboxes.pools")
        connect_image_signals()
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
        for gauge in pool_gauges.GAUGES:
            metrics.register_scrape_collector(gauge)
