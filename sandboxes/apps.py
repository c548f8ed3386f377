from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "sandboxes"
    verbose_name = "Sandboxes"

    def ready(self) -> None:
        # Register job handlers, and the signals that close terminals on loss of access.
        from console import health, metrics

        from .catalog import jobs, verify  # noqa: F401
        from .catalog.health import backend_checks
        from .sessions import gauges, reaper, retention  # noqa: F401
        from .sessions.store_select import check_store
        from .terminal import tickets  # noqa: F401

        # Readiness (console/health.py) and scrape-time series (console/metrics.py).
        health.register_checks("session_store", lambda: [("session_store", check_store, True)])
        health.register_checks("backends", backend_checks)
        metrics.register_scrape_collector(gauges.SESSIONS)
        metrics.register_scrape_collector(gauges.OPEN_TERMINALS)
