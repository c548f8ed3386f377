"""The environment variables the console reads, and the ones it no longer reads.

Deployment settings (secrets, stores, hosts and TLS, base URLs, single sign-on, folders, the
local engine, logs) come from the environment, each listed once in `VARIABLES` and in the
table of docs/configuration.md (tests/console/test_configuration.py keeps the code, this list
and the table equal). Tuning knobs are not variables: they are typed defaults in each room's
`tuning.py`, overridden through the one variable CONSOLE_TUNING (console/tuning.py). Log format
and level, the login button's name, creating users at sign-in and serving /static/ are knobs.

At start a variable that looks like ours (`OUR_PREFIXES`, or a name the console read before)
but is not read is reported: a system check warning (console.W001) and one log line, so a
deployer who still sets TERMINAL_IDLE_TIMEOUT_S learns it does nothing and what replaces it.
"""

from __future__ import annotations

import os
import select
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    from django.core.checks import CheckMessage

# Every variable the console's code reads (settings and the few modules that read their own).
VARIABLES = frozenset(
    {
        # Secrets and stores
        "SECRET_KEY",
        "FIELD_ENCRYPTION_KEY",
        "DATABASE_URL",
        "DATABASE_POOL_SIZE",
        "REDIS_URL",
        # Hosts, TLS and proxies
        "ALLOWED_HOSTS",
        "CSRF_TRUSTED_ORIGINS",
        "CONSOLE_TLS",
        "SECURE_PROXY_SSL_HEADER",
        "FORWARDED_FOR_PROXIES",
        "INBOUND_BASE_URL",
        # This installation, its folders and the local engine
        "CONSOLE_INSTALLATION_ID",
        "CONSOLE_VAR_DIR",
        "EGRESS_STATE_DIR",
        "EGRESS_DNS_UPSTREAM",
        "WORKSPACE_DISK_DIR",
        "DOCKER_HOST",
        # Email and single sign-on
        "EMAIL_URL",
        "OIDC_RP_CLIENT_ID",
        "OIDC_RP_CLIENT_SECRET",
        "OIDC_OP_ISSUER",
        # Metrics, debugging
        "METRICS_TOKEN",
        "METRICS_ALLOWED_NETWORKS",
        "PROMETHEUS_MULTIPROC_DIR",
        "DEBUG",
        # Tuning overrides, and the first platform admin (`manage.py bootstrap_console`)
        "CONSOLE_TUNING",
        "CONSOLE_ADMIN_USER",
        "CONSOLE_ADMIN_PASSWORD",
    }
)

# Prefixes of the console's own variables: one that is set but not read is reported.
# (Not TERMINAL_ or SESSION_: other programs set TERMINAL_EMULATOR and SESSION_MANAGER.
# Their old names are listed one by one below.)
OUR_PREFIXES = ("CONSOLE_", "EGRESS_", "INBOUND_", "OIDC_", "READYZ_", "REAPER_", "RETENTION_", "SKILL_")


def _tuning(key: str) -> str:
    return f"no longer read; use CONSOLE_TUNING {key}=..."


# Variables read before settings were split into deployment and tuning: what replaces each.
RETIRED: dict[str, str] = {
    **{
        old: _tuning(key)
        for old, key in {
            "TERMINAL_IDLE_TIMEOUT_S": "terminal.idle_timeout_s",
            "TERMINAL_REATTACH_S": "terminal.reattach_s",
            "TERMINAL_TICKET_MAX_AGE_S": "terminal.ticket_max_age_s",
            "TERMINAL_REPLAY_BYTES": "terminal.replay_bytes",
            "TERMINAL_KEEPALIVE_S": "terminal.keepalive_s",
            "TERMINAL_LEASE_S": "terminal.lease_s",
            "TERMINAL_KEEP_SHELLS": "terminal.keep_shells",
            "RETENTION_AUDIT_EVENTS_DAYS": "retention.audit_events_days",
            "RETENTION_JOBS_DAYS": "retention.jobs_days",
            "RETENTION_TERMINALS_DAYS": "retention.terminals_days",
            "RETENTION_COMMANDS_DAYS": "retention.commands_days",
            "RETENTION_ARTIFACTS_DAYS": "retention.artifacts_days",
            "RETENTION_ACTIVITY_SAMPLES_DAYS": "retention.activity_samples_days",
            "EGRESS_LOG_RETENTION_DAYS": "retention.egress_events_days",
            "RETENTION_BATCH": "retention.batch",
            "RETENTION_INTERVAL_S": "retention.interval_s",
            "INBOUND_MAX_REQUEST_BYTES": "inbound.max_request_bytes",
            "INBOUND_CONNECT_TIMEOUT_S": "inbound.connect_timeout_s",
            "INBOUND_READ_TIMEOUT_S": "inbound.read_timeout_s",
            "INBOUND_MAX_DURATION_S": "inbound.max_duration_s",
            "INBOUND_LINK_DEFAULT_TTL_S": "sessions.inbound_link_default_ttl_s",
            "INBOUND_LINK_MAX_TTL_S": "sessions.inbound_link_max_ttl_s",
            "READYZ_TIMEOUT_S": "readyz.timeout_s",
            "READYZ_CACHE_S": "readyz.cache_s",
            "READYZ_BACKENDS": "readyz.backends",
            "EGRESS_INGEST_INTERVAL_S": "network.ingest_interval_s",
            "EGRESS_LOG_MAX_PER_SESSION": "network.log_max_per_session",
            "EGRESS_APPLY_BUDGET_S": "network.apply_budget_s",
            "EGRESS_LOG_MAX_BYTES": "catalog.egress_log_max_bytes",
            "TEMPLATE_BUILD_DISK_MB": "catalog.template_build_disk_mb",
            "REAPER_GRACE_S": "sessions.reaper_grace_s",
            "REAPER_UNMANAGED": "sessions.reaper_unmanaged",
            "REAPER_INTERVAL_S": "sessions.reaper_interval_s",
            "IDLE_SWEEP_INTERVAL_S": "sessions.idle_sweep_interval_s",
            "UNMANAGED_LIST_TIMEOUT_S": "sessions.unmanaged_list_timeout_s",
            "SESSION_ENGINE_TIMEOUT_S": "sessions.engine_timeout_s",
            "SESSION_REBUILD_WAIT_S": "sessions.rebuild_wait_s",
            "COMMAND_OUTPUT_RETENTION_S": "sessions.command_output_retention_s",
            "WORKSPACE_UPLOAD_MAX_BYTES": "sessions.workspace_upload_max_bytes",
            "WORKSPACE_READ_MAX_BYTES": "sessions.workspace_read_max_bytes",
            "ARTIFACT_MAX_FILES": "sessions.artifact_max_files",
            "ARTIFACT_MAX_FILE_BYTES": "sessions.artifact_max_file_bytes",
            "ARTIFACT_MAX_TOTAL_BYTES": "sessions.artifact_max_total_bytes",
            "SKILL_ARCHIVE_MAX_BYTES": "skills.archive_max_bytes",
            "SKILL_MAX_FILES": "skills.max_files",
            "SKILL_MAX_UNCOMPRESSED_BYTES": "skills.max_uncompressed_bytes",
            "SKILL_MAX_COMPRESSION_RATIO": "skills.max_compression_ratio",
            "ACTIVITY_SAMPLE_INTERVAL_S": "activity.sample_interval_s",
            "ACTIVITY_MAX_GAP_S": "activity.max_gap_s",
            "PROCESS_HEARTBEAT_WINDOW_S": "processes.heartbeat_window_s",
            "SHUTDOWN_GRACE_S": "processes.shutdown_grace_s",
            "HOUSEKEEPING_JOB_RETENTION_S": "jobs.housekeeping_retention_s",
            "SPACE_LIVE_SESSIONS": "limits.live_sessions",
            "SPACE_CONCURRENT_EXECS": "limits.concurrent_execs",
            "SPACE_BACKGROUND_COMMANDS": "limits.background_commands",
            "SPACE_API_REQUESTS_PER_MINUTE": "limits.api_requests_per_minute",
            "API_TOKENS_PER_SPACE": "limits.api_tokens_per_space",
            "LOGIN_FAILURE_LIMIT": "login.failure_limit",
            "LOGIN_LOCKOUT_MINUTES": "login.lockout_minutes",
            "INVITE_LINK_HOURS": "users.invite_link_hours",
            "SECURE_HSTS_SECONDS": "security.hsts_seconds",
            "SECURE_HSTS_INCLUDE_SUBDOMAINS": "security.hsts_include_subdomains",
            "SECURE_HSTS_PRELOAD": "security.hsts_preload",
            "SECURE_SSL_REDIRECT": "security.ssl_redirect",
            "OIDC_PROVIDER_NAME": "sso.provider_name",
            "OIDC_CREATE_USERS": "sso.create_users",
            "LOG_FORMAT": "logs.format",
            "LOG_LEVEL": "logs.level",
            "SERVE_STATIC": "serving.static",
        }.items()
    },
    "SESSION_COOKIE_SECURE": "no longer read; CONSOLE_TLS=true makes the cookies secure",
    "CSRF_COOKIE_SECURE": "no longer read; CONSOLE_TLS=true makes the cookies secure",
    "WEBSOCKET_ALLOWED_ORIGINS": "no longer read; CSRF_TRUSTED_ORIGINS also names the websocket origins",
    "EMAIL_HOST": "no longer read; use EMAIL_URL=smtp://user:password@host:port",
    "EMAIL_PORT": "no longer read; use EMAIL_URL=smtp://user:password@host:port",
    "EMAIL_HOST_USER": "no longer read; use EMAIL_URL=smtp://user:password@host:port",
    "EMAIL_HOST_PASSWORD": "no longer read; use EMAIL_URL=smtp://user:password@host:port",
    "EMAIL_USE_TLS": "no longer read; use EMAIL_URL=smtp+tls://...",
    "DEFAULT_FROM_EMAIL": "no longer read; use EMAIL_URL=smtp://host?from=address",
    "FIELD_ENCRYPTION_OLD_KEYS": "no longer read; list old keys after the new one in FIELD_ENCRYPTION_KEY (a,b)",
    "INVITE_EMAIL": "no longer read; invitations are emailed when EMAIL_URL is set",
    "OIDC_RP_SCOPES": "no longer read; the console asks for 'openid email profile'",
    "OIDC_TIMEOUT_S": "no longer read; calls to the provider wait 10 s",
    **dict.fromkeys(
        ("OIDC_OP_AUTHORIZATION_ENDPOINT", "OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_USER_ENDPOINT", "OIDC_OP_JWKS_ENDPOINT"),
        "no longer read; the provider's discovery document at OIDC_OP_ISSUER gives it",
    ),
    "OIDC_RP_SIGN_ALGO": "no longer read; the discovery document's algorithms are used (RS256 preferred)",
    "METRICS_ALLOW_LOOPBACK": "no longer read; list 127.0.0.1/32 in METRICS_ALLOWED_NETWORKS",
    "SKILL_PACKAGE_SOURCES_ROOT": "no longer read; the package sources are CONSOLE_VAR_DIR/package-sources",
    "DATABASE_CONN_MAX_AGE": "no longer read; PostgreSQL connections are pooled (DATABASE_POOL_SIZE per process)",
    "SQLITE_BUSY_TIMEOUT_S": "no longer read; SQLite waits 30 s for its write lock",
    "JOB_RUNNER": "no longer read; jobs run on Celery when REDIS_URL is set, else in the process",
    "RUN_SCHEDULER": "no longer read; the in-process scheduler runs when REDIS_URL is not set",
}


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(name, what to do) for each variable set that looks like ours but is not read."""
    environ = os.environ if environ is None else environ
    found = []
    for name in sorted(environ):
        if name in VARIABLES:
            continue
        if name in RETIRED:
            found.append((name, RETIRED[name]))
        elif name.startswith(OUR_PREFIXES):
            found.append((name, "not a setting of the console (docs/configuration.md)"))
    return found


def check_unknown_variables(app_configs: object = None, **kwargs: object) -> list[CheckMessage]:
    """System check console.W001: each variable set that looks like ours and is not read."""
    from django.core import checks

    return [
        checks.Warning(f"{name} is set: {what}", hint="docs/configuration.md", id="console.W001")
        for name, what in unknown_variables()
    ]


def log_unknown_variables() -> None:
    """One log line (at start) naming the variables set that look like ours and are not read."""
    import logging

    found = unknown_variables()
    if found:
        logging.getLogger("console.environment").warning(
            "environment variables not read by the console: %s", "; ".join(f"{name} ({what})" for name, what in found)
        )


# --- Reading --------------------------------------------------------------------------------


def env_str(name: str, default: str = "") -> str:
    assert name in VARIABLES, name
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = env_str(name)
    if value.strip() == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = env_str(name).strip()
    return int(value) if value else default


def env_list(name: str, default: list[str]) -> list[str]:
    value = env_str(name)
    if not value:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def email_settings(url: str) -> dict[str, object]:
    """Django's EMAIL_* settings and the sender from EMAIL_URL:
    `smtp://user:password@host:port?from=console@example.test`, or `smtp+tls://...` for
    STARTTLS (user and password percent-encoded). Empty: no email."""
    if not url:
        return {"EMAIL_HOST": ""}
    parts = urlsplit(url)
    shown = f"{parts.scheme}://{parts.hostname or ''}"  # never the password
    if parts.scheme not in {"smtp", "smtp+tls"} or not parts.hostname:
        raise ValueError(f"EMAIL_URL must be smtp://[user:password@]host[:port] or smtp+tls://..., not {shown}...")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"EMAIL_URL {shown}: the port is not a number from 0 to 65535") from None
    # A plus in an address (console+ops@...) is kept: parse_qs would read it as a space.
    query = parse_qs(parts.query.replace("+", "%2B"))
    tls = parts.scheme == "smtp+tls" or query.get("tls", [""])[0].lower() in {"1", "true"}
    sender = {"DEFAULT_FROM_EMAIL": query["from"][0]} if query.get("from", [""])[0] else {}
    return {
        **sender,
        "EMAIL_HOST": parts.hostname,
        "EMAIL_PORT": port or (587 if tls else 25),
        "EMAIL_HOST_USER": unquote(parts.username or ""),
        "EMAIL_HOST_PASSWORD": unquote(parts.password or ""),
        "EMAIL_USE_TLS": tls,
    }


# A PostgreSQL connection pool per process: at most this many connections, whatever the
# number of threads (Daphne runs each request on a thread of its own). 0: no pool, a
# connection per request. Bounded, so that a typo cannot make one process take the server.
DEFAULT_POOL_SIZE = 10
MAX_POOL_SIZE = 50
# A request that finds every pooled connection taken waits this long, then fails (503).
POOL_TIMEOUT_S = 10


# A pooled connection verified by a round trip this recently, whose socket has nothing to read,
# is taken as it is (`pooled_connection_check`).
POOL_CHECK_INTERVAL_S = 5.0
_verified: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def pooled_connection_check(conn: Any) -> None:
    """Raise if a connection leaving the pool is dead (the pool then replaces it).

    psycopg's own check is a round trip on every request (0.3-1 ms of the request, and the
    server's time). A connection the server closed — a restart, a crash, a terminated backend
    — has its goodbye or end of file waiting on its socket while it sits idle in the pool:
    that is seen with a poll, no round trip. The round trip runs for such a connection, and
    for one not verified in the last POOL_CHECK_INTERVAL_S (a peer that vanished silently)."""
    from psycopg_pool import ConnectionPool

    now = time.monotonic()
    if not conn.closed and now - _verified.get(conn, -POOL_CHECK_INTERVAL_S) < POOL_CHECK_INTERVAL_S:
        # poll(), not select(): a busy process's descriptors run past select()'s 1024.
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN | select.POLLERR | select.POLLHUP)
        if not poller.poll(0):
            return
    ConnectionPool.check_connection(conn)
    _verified[conn] = now


def database_settings(url: str, pool_size: int = DEFAULT_POOL_SIZE) -> dict[str, Any]:
    """Django's `DATABASES["default"]` for DATABASE_URL: PostgreSQL through psycopg's pool of
    at most `pool_size` connections (Django's own `OPTIONS["pool"]`); SQLite as it was."""
    import dj_database_url
    from django.core.exceptions import ImproperlyConfigured

    if not 0 <= pool_size <= MAX_POOL_SIZE:
        raise ImproperlyConfigured(f"DATABASE_POOL_SIZE must be 0 to {MAX_POOL_SIZE} (connections per process)")
    database: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=0))
    if database["ENGINE"] == "django.db.backends.postgresql" and pool_size:
        options = dict(database.get("OPTIONS") or {})
        # Each connection is checked as it leaves the pool (`pooled_connection_check`, through
        # the engine console.postgresql): after a PostgreSQL restart the pooled ones are dead,
        # and without the check requests kept failing on them (503) after the server was back.
        database["ENGINE"] = "console.postgresql"
        database["CONN_HEALTH_CHECKS"] = True
        options["pool"] = {
            "min_size": 1,
            "max_size": pool_size,
            "timeout": POOL_TIMEOUT_S,
            "max_idle": 300,  # idle connections above min_size are closed after 5 min
            "max_lifetime": 1800,
        }
        database["OPTIONS"] = options
    return database
