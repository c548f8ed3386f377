from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        from django.conf import settings
        from django.core import checks
        from django.core.exceptions import ImproperlyConfigured

        from .crypto import check_secrets

        # Before anything serves: outside DEBUG, no public default key, no derived secrets key.
        # An operator's mistake, not a bug: the message alone, without a traceback to read past.
        from .oidc import check_sso_settings

        try:
            check_secrets()
            check_sso_settings()
        except ImproperlyConfigured as exc:
            raise SystemExit(f"error: {exc}") from None
        # An expected 403 logs one line, not a traceback (console/errors.py).
        from .errors import install_log_filter

        install_log_filter()
        # The tuning overrides (CONSOLE_TUNING): an unknown knob or a bad value stops here.
        from . import environment, tuning

        try:
            tuning.validate(settings.TUNING)
        except tuning.TuningError as exc:
            raise SystemExit(f"error: {exc}") from None
        # Variables that look like ours but are not read: one log line now, a check warning.
        environment.log_unknown_variables()
        checks.register(environment.check_unknown_variables)
        # Register job handlers.
        from . import (
            activity,  # noqa: F401
            diagnostics,  # noqa: F401
            metrics,
        )
        from .jobs import active_job_counts

        metrics.register_scrape_collector(
            metrics.DatabaseGauge(
                "console_jobs", "Admin jobs queued or running now, by kind.", ["kind", "status"], active_job_counts
            )
        )
