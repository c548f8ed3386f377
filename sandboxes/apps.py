from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "sandboxes"
    verbose_name = "Sandboxes"

    def ready(self) -> None:
        # Register job handlers, and the signals that close terminals on loss of access; a
        # committed policy change reaches running sandboxes that take it live.
        from django.core import checks

        from console import health, metrics
        from console.signals import network_policy_changed

        from .catalog import jobs, verify  # noqa: F401
        from .catalog.health import backend_checks
        from .egress.live import on_policy_changed
        from .pages import onboarding  # noqa: F401  (the dashboard's getting-started steps)
        from .sessions import gauges, reaper, retention, teardown, unmanaged  # noqa: F401
        from .sessions.inbound_hosts import check_setting
        from .sessions.store_select import check_store
        from .terminal import tickets  # noqa: F401

        checks.register(check_setting)  # INBOUND_BASE_URL: empty, or a usable wildcard origin
        network_policy_changed.connect(on_policy_changed, dispatch_uid="sandboxes.egress.live")
        # Readiness (console/health.py) and scrape-time series (console/metrics.py).
        health.register_checks("session_store", lambda: [("session_store", check_store, True)])
        health.register_checks("backends", backend_checks)
        metrics.register_scrape_collector(gauges.SESSIONS)
        metrics.register_scrape_collector(gauges.OPEN_TERMINALS)
