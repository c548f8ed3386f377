"""Settings read from the environment.

Embedded defaults (no environment at all) give a working single-process console: SQLite,
the in-memory channel layer and an in-process job runner. Setting REDIS_URL switches
bindings, locks, the channel layer and jobs to Redis and Celery.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url

from console.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(os.environ.get("CONSOLE_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if not value:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
# The embedded default key is public: outside DEBUG the console refuses to start on it
# (console/crypto.py, check_secrets). `make start` generates a key and keeps it in var/.
SECRET_KEY = os.environ.get("SECRET_KEY", "insecure-local-console-key-set-SECRET_KEY-in-production")
# Fernet key (urlsafe base64, 32 bytes) for secrets at rest, required outside DEBUG. Keys
# being rotated out stay readable while listed in FIELD_ENCRYPTION_OLD_KEYS (comma-separated)
# until `manage.py rotate_field_encryption_key` has re-encrypted everything.
FIELD_ENCRYPTION_KEY = os.environ.get("FIELD_ENCRYPTION_KEY", "")
FIELD_ENCRYPTION_OLD_KEYS = env_list("FIELD_ENCRYPTION_OLD_KEYS", [])
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "channels",
    "axes",
    "console",
    "sandboxes",
    "skills",
]

MIDDLEWARE = [
    # /healthz, /readyz and /metrics, answered before ALLOWED_HOSTS and TLS redirects apply.
    "console.health.OpsEndpointsMiddleware",
    "console.middleware.RequestIdMiddleware",
    "console.middleware.RequestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # A nonce per request, and the strict Content-Security-Policy that names it.
    "console.security.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "console.middleware.HtmxMessagesMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The shared layout and includes, then each room of sandboxes/ beside its pages
        # (sandboxes/<room>/templates/sandboxes/...); the apps' own (skills/templates) by APP_DIRS.
        "DIRS": [BASE_DIR / "templates", *sorted((BASE_DIR / "sandboxes").glob("*/templates"))],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.navigation",
                "console.context_processors.csp",
            ],
        },
    }
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'console.sqlite3'}"),
        conn_max_age=int(os.environ.get("DATABASE_CONN_MAX_AGE", "0")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web requests, jobs, the scheduler and the session store (sandboxes.sessions.store_db) write from
    # several threads at once: wait for the write lock rather than fail ("database is
    # locked"), take it at BEGIN so a transaction never has to upgrade (which fails at once
    # under contention), and let readers run beside the writer (WAL).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": int(os.environ.get("SQLITE_BUSY_TIMEOUT_S", 30)),
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
        }
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "console:dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
MEDIA_URL = "/media/"
MEDIA_ROOT = VAR_DIR / "media"
# Collected artifacts and uploads are the tenants' files: readable by the console's user only
# (its folders 0700, its files 0600), whatever the process's umask.
FILE_UPLOAD_PERMISSIONS = 0o600
FILE_UPLOAD_DIRECTORY_PERMISSIONS = 0o700

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # HTMX reads the token from the page, not the cookie
X_FRAME_OPTIONS = "DENY"

# --- Behind TLS (docs/operations.md, "Security settings") ---------------------------------
# CONSOLE_TLS=true when users reach the console over https: cookies travel over https only
# and HSTS is sent. Behind a TLS-terminating proxy also set SECURE_PROXY_SSL_HEADER (the
# proxy must always set or strip that header), or Django cannot tell https requests apart.
CONSOLE_TLS = env_bool("CONSOLE_TLS", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", CONSOLE_TLS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", CONSOLE_TLS)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS") or (31_536_000 if CONSOLE_TLS else 0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# "X-Forwarded-Proto: https" -> ("HTTP_X_FORWARDED_PROTO", "https"), as Django wants it.
_proxy_header, _, _proxy_value = os.environ.get("SECURE_PROXY_SSL_HEADER", "").partition(":")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_header.strip().upper().replace("-", "_"), _proxy_value.strip() or "https")
    if _proxy_header.strip()
    else None
)
# How many proxies in front append to X-Forwarded-For (0: use the connection's address).
FORWARDED_FOR_PROXIES = int(os.environ.get("FORWARDED_FOR_PROXIES", 0))
# Websocket handshakes come from the console's own origin (scheme, host and port) or one of
# these full origins (console/security.py).
WEBSOCKET_ALLOWED_ORIGINS = env_list("WEBSOCKET_ALLOWED_ORIGINS", CSRF_TRUSTED_ORIGINS)

# --- Inbound traffic to sandbox ports (sandboxes/inbound/, docs/inbound.md) --------------
# Where the console's inbound URLs are issued: "" = the console's own origin (as the page or
# API request reached it), pages served under `Content-Security-Policy: sandbox` (an opaque
# origin); or a wildcard origin, https://*.sandboxes.example.net (locally
# http://*.localhost:8000), a host of its own per sandbox port, <label>-<port>.<domain>,
# with wildcard DNS and TLS in front (docs/inbound.md). Checked at startup (sandboxes.E001).
INBOUND_BASE_URL = os.environ.get("INBOUND_BASE_URL", "").rstrip("/")
INBOUND_MAX_REQUEST_BYTES = int(os.environ.get("INBOUND_MAX_REQUEST_BYTES", 100 * 1024 * 1024))
INBOUND_CONNECT_TIMEOUT_S = float(os.environ.get("INBOUND_CONNECT_TIMEOUT_S", 5))
INBOUND_READ_TIMEOUT_S = float(os.environ.get("INBOUND_READ_TIMEOUT_S", 60))
INBOUND_MAX_DURATION_S = float(os.environ.get("INBOUND_MAX_DURATION_S", 3600))
INBOUND_LINK_DEFAULT_TTL_S = int(os.environ.get("INBOUND_LINK_DEFAULT_TTL_S", 3600))
INBOUND_LINK_MAX_TTL_S = int(os.environ.get("INBOUND_LINK_MAX_TTL_S", 7 * 24 * 3600))

# --- Login throttling (django-axes) -------------------------------------------------------
# After LOGIN_FAILURE_LIMIT failed logins for one username from one address, that pair is
# locked out for LOGIN_LOCKOUT_MINUTES (the lock is per pair, so nobody can lock a user out
# from elsewhere). `manage.py axes_reset` lifts every lock.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("LOGIN_FAILURE_LIMIT", 5))
AXES_COOLOFF_TIME = timedelta(minutes=int(os.environ.get("LOGIN_LOCKOUT_MINUTES", 15)))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "console.security.client_ip"
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False

# --- Users: invitations and email (docs/security.md, "Users and invitations") -------------
# An invitation link works once, for INVITE_LINK_HOURS. It is shown to the admin who made it;
# with EMAIL_HOST set it is also emailed to the user through Django's email backend.
INVITE_LINK_HOURS = float(os.environ.get("INVITE_LINK_HOURS", 72))
EMAIL_HOST = os.environ.get("EMAIL_HOST", "")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", 25))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "sandbox-console@localhost")
INVITE_EMAIL = env_bool("INVITE_EMAIL", bool(EMAIL_HOST))

# --- Single sign-on with OpenID Connect (docs/security.md, "Single sign-on") ---------------
# Off unless OIDC_RP_CLIENT_ID is set. The provider's endpoints are given one by one (no
# discovery request at start). Users are matched by their stored subject, else by email;
# OIDC_CREATE_USERS=true creates users the console does not know yet.
OIDC_RP_CLIENT_ID = os.environ.get("OIDC_RP_CLIENT_ID", "")
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
OIDC_RP_CLIENT_SECRET = os.environ.get("OIDC_RP_CLIENT_SECRET", "")
OIDC_OP_ISSUER = os.environ.get("OIDC_OP_ISSUER", "")
OIDC_OP_AUTHORIZATION_ENDPOINT = os.environ.get("OIDC_OP_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = os.environ.get("OIDC_OP_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = os.environ.get("OIDC_OP_USER_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = os.environ.get("OIDC_OP_JWKS_ENDPOINT", "")
OIDC_RP_SIGN_ALGO = os.environ.get("OIDC_RP_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = os.environ.get("OIDC_RP_SCOPES", "openid email profile")
OIDC_PROVIDER_NAME = os.environ.get("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_CREATE_USER = env_bool("OIDC_CREATE_USERS", False)
OIDC_TIMEOUT = int(os.environ.get("OIDC_TIMEOUT_S", 10))
LOGIN_REDIRECT_URL_FAILURE = "/login/?sso=failed"
if OIDC_ENABLED:
    AUTHENTICATION_BACKENDS.append("console.oidc.ConsoleOIDCBackend")

REDIS_URL = os.environ.get("REDIS_URL", "")


def redis_channel_layer(url: str, **config: object) -> dict[str, object]:
    """channels-redis on `url`.

    Its receive blocks in BZPOPMIN for 5 s at a time, and redis-py's default socket timeout
    is 5 s too: every idle consumer's read timed out and its websocket died with 1011. The
    read timeout stays well above the blocking read; health checks and TCP keepalive find a
    dead connection instead. A pooled connection that Redis dropped (a restart) is retried on
    a new one, so the first event sent after it is not lost."""
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError, TimeoutError

    host = {
        "address": url,
        "socket_timeout": 30,
        "socket_connect_timeout": 5,
        "socket_keepalive": True,
        "health_check_interval": 15,
        "retry": Retry(ExponentialBackoff(cap=1, base=0.05), 2),
        "retry_on_error": [ConnectionError, TimeoutError],
    }
    return {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [host], "capacity": 1000, **config}}


if REDIS_URL:
    CHANNEL_LAYERS = {"default": redis_channel_layer(REDIS_URL)}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Jobs: Celery over Redis when REDIS_URL is set, otherwise a thread in this process.
JOB_RUNNER = os.environ.get("JOB_RUNNER", "celery" if REDIS_URL else "inprocess")
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# A stable id for this console installation, stamped on every sandbox it creates so it never
# touches sandboxes of another installation sharing the same backend account. `make start`
# generates one per var/ and keeps it in var/console-installation-id (scripts/keys.sh; the
# development settings read it from there); a deployment sets it.
CONSOLE_INSTALLATION_ID = os.environ.get("CONSOLE_INSTALLATION_ID", "local")

# --- Logs, health and metrics (console/logs.py, console/health.py, console/metrics.py;
# docs/operations.md, "Health, metrics and logs") -----------------------------------------
# LOG_FORMAT: "json" (one JSON object a line, for a log collector) or "text" (for a person).
LOG_FORMAT = os.environ.get("LOG_FORMAT", "json")
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
LOGGING = logging_config(log_format=LOG_FORMAT, level=LOG_LEVEL)
# Celery keeps this set-up instead of installing its own (console/celery.py).
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# /readyz: each check's time limit, how long one answer is reused, and whether an unreachable
# platform backend makes the console unready ("required") or is only reported ("reported").
READYZ_TIMEOUT_S = float(os.environ.get("READYZ_TIMEOUT_S", 2))
READYZ_CACHE_S = float(os.environ.get("READYZ_CACHE_S", 5))
READYZ_BACKENDS = os.environ.get("READYZ_BACKENDS", "required")
# /metrics is refused unless a scraper is allowed: by a bearer token, or by its address.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
METRICS_ALLOWED_NETWORKS = env_list("METRICS_ALLOWED_NETWORKS", [])
# Scrapes from loopback without either (the development settings turn this on).
METRICS_ALLOW_LOOPBACK = env_bool("METRICS_ALLOW_LOOPBACK", False)

# The embedded console serves /static/ itself through Daphne (see console/asgi.py).
SERVE_STATIC = env_bool("SERVE_STATIC", True)

# Session workspaces and artifacts.
WORKSPACE_UPLOAD_MAX_BYTES = int(os.environ.get("WORKSPACE_UPLOAD_MAX_BYTES", 50 * 1024 * 1024))
WORKSPACE_READ_MAX_BYTES = int(os.environ.get("WORKSPACE_READ_MAX_BYTES", 10 * 1024 * 1024))
ARTIFACT_MAX_FILES = int(os.environ.get("ARTIFACT_MAX_FILES", 200))
ARTIFACT_MAX_FILE_BYTES = int(os.environ.get("ARTIFACT_MAX_FILE_BYTES", 50 * 1024 * 1024))
ARTIFACT_MAX_TOTAL_BYTES = int(os.environ.get("ARTIFACT_MAX_TOTAL_BYTES", 200 * 1024 * 1024))

# --- Docker egress (sandboxes/backends/docker/egress/; docs/network.md) -------------------
# The resolver each Docker space network's dnsmasq forwards to ("address" or "address#port");
# empty: no name resolves in Docker sandboxes. The host folder of the resolvers' and the
# refusal log's files (empty: /var/lib/sandbox-console/egress).
EGRESS_DNS_UPSTREAM = os.environ.get("EGRESS_DNS_UPSTREAM", "")
EGRESS_STATE_DIR = os.environ.get("EGRESS_STATE_DIR", "")
# The egress logs (refusals, resolvers' query logs, squid's access log) rotate at this size.
EGRESS_LOG_MAX_BYTES = int(os.environ.get("EGRESS_LOG_MAX_BYTES", 64 * 1024 * 1024))

# --- Disk limits (sandboxes/backends/docker/disk.py; docs/operations.md) ------------------
# The host folder of the size-bounded file systems (loop-mounted ext4 images) that hold Docker
# sandboxes' /workspace and /tmp, and the bound of one template build from Debian packages.
WORKSPACE_DISK_DIR = os.environ.get("WORKSPACE_DISK_DIR", "/var/lib/sandbox-console/disks")
TEMPLATE_BUILD_DISK_MB = int(os.environ.get("TEMPLATE_BUILD_DISK_MB", 4096))

# --- Skills (skills/archives.py; docs/skills.md) ------------------------------------------
# Caps on one skill import. Official skills reach 83 files / 5.5 MB; defaults sit well above.
SKILL_ARCHIVE_MAX_BYTES = int(os.environ.get("SKILL_ARCHIVE_MAX_BYTES", 20 * 1024 * 1024))
SKILL_MAX_FILES = int(os.environ.get("SKILL_MAX_FILES", 1000))
SKILL_MAX_UNCOMPRESSED_BYTES = int(os.environ.get("SKILL_MAX_UNCOMPRESSED_BYTES", 100 * 1024 * 1024))
SKILL_MAX_COMPRESSION_RATIO = int(os.environ.get("SKILL_MAX_COMPRESSION_RATIO", 100))
# Uploads above 2.5 MiB stream to a temporary file, never held in memory whole; the skill
# import view stops reading an upload past SKILL_ARCHIVE_MAX_BYTES. Non-file form fields stay
# small (file data does not count towards DATA_UPLOAD_MAX_MEMORY_SIZE).
FILE_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440

# Periodic tasks, run by Celery beat (REDIS_URL set) or by a thread of the server.
RUN_SCHEDULER = env_bool("RUN_SCHEDULER", True)
# Console processes heartbeat (console/processes.py): one silent for this long, or gone from
# this host, is dead, and what it held (exec slots, background commands, jobs) is released.
PROCESS_HEARTBEAT_WINDOW_S = float(os.environ.get("PROCESS_HEARTBEAT_WINDOW_S", 90))
# SIGTERM to the server (console/serve.py): the scheduler stops, the port closes, requests in
# flight get this long to finish, then they are cut and the process exits.
SHUTDOWN_GRACE_S = float(os.environ.get("SHUTDOWN_GRACE_S", 20))
REAPER_GRACE_S = int(os.environ.get("REAPER_GRACE_S", 300))
# The reaper pass also deletes what the backends hold under this installation's labels whose
# space, config or session is gone (sandboxes/sessions/unmanaged.py), once older than the grace.
REAPER_UNMANAGED = env_bool("REAPER_UNMANAGED", True)
# Seconds one backend may take to list its labelled resources for the Unmanaged resources page.
UNMANAGED_LIST_TIMEOUT_S = float(os.environ.get("UNMANAGED_LIST_TIMEOUT_S", 10))
# Finished reaper and idle-sweep jobs (failed ones too) are deleted after this long.
HOUSEKEEPING_JOB_RETENTION_S = int(os.environ.get("HOUSEKEEPING_JOB_RETENTION_S", 86400))
# How often each periodic task runs (seconds); short ones let fault tests see a pass soon.
REAPER_INTERVAL_S = float(os.environ.get("REAPER_INTERVAL_S", 60))
IDLE_SWEEP_INTERVAL_S = float(os.environ.get("IDLE_SWEEP_INTERVAL_S", 60))
# --- Quotas and rate limits per space (sandboxes/sessions/limits.py; docs/operations.md) ---
# Platform defaults; platform admins override them per space on the space's Limits page.
SPACE_LIMIT_DEFAULTS: dict[str, int] = {
    "live_sessions": int(os.environ.get("SPACE_LIVE_SESSIONS", 200)),
    "concurrent_execs": int(os.environ.get("SPACE_CONCURRENT_EXECS", 32)),
    "background_commands": int(os.environ.get("SPACE_BACKGROUND_COMMANDS", 32)),
    "api_requests_per_minute": int(os.environ.get("SPACE_API_REQUESTS_PER_MINUTE", 1200)),
}
# API tokens in force (not revoked) a space may hold; the rate limit above counts the space's
# requests whichever token sent them.
API_TOKENS_PER_SPACE = int(os.environ.get("API_TOKENS_PER_SPACE", 20))

# --- Retention (sandboxes/sessions/retention.py; docs/operations.md, "Retention") ---------
# Days each kind of record is kept; 0 keeps it forever. Only finished things are deleted:
# closed terminals, finished jobs and background commands; artifacts by collection time.
RETENTION_DAYS: dict[str, int] = {
    "audit_events": int(os.environ.get("RETENTION_AUDIT_EVENTS_DAYS", 365)),
    "jobs": int(os.environ.get("RETENTION_JOBS_DAYS", 90)),
    "terminals": int(os.environ.get("RETENTION_TERMINALS_DAYS", 90)),
    "commands": int(os.environ.get("RETENTION_COMMANDS_DAYS", 30)),
    "artifacts": int(os.environ.get("RETENTION_ARTIFACTS_DAYS", 30)),
    # Refused outbound attempts (sandboxes.network; docs/network.md).
    "egress_events": int(os.environ.get("EGRESS_LOG_RETENTION_DAYS", 14)),
    "activity_samples": int(os.environ.get("RETENTION_ACTIVITY_SAMPLES_DAYS", 14)),
}
RETENTION_BATCH = int(os.environ.get("RETENTION_BATCH", 2000))
RETENTION_INTERVAL_S = float(os.environ.get("RETENTION_INTERVAL_S", 3600))
# A finished background command's output stays readable (Redis ring buffer) this long.
COMMAND_OUTPUT_RETENTION_S = int(os.environ.get("COMMAND_OUTPUT_RETENTION_S", 3600))

# Egress (sandboxes/network; docs/network.md): how often refusals are read back from
# the backends, how many are kept per session (their days: RETENTION_DAYS["egress_events"]),
# and how long a policy change may spend reaching running sandboxes in the request.
EGRESS_INGEST_INTERVAL_S = float(os.environ.get("EGRESS_INGEST_INTERVAL_S", 5))
EGRESS_LOG_MAX_PER_SESSION = int(os.environ.get("EGRESS_LOG_MAX_PER_SESSION", 1000))
EGRESS_APPLY_BUDGET_S = float(os.environ.get("EGRESS_APPLY_BUDGET_S", 4))
# The activity charts' samples of the /metrics series (console/activity.py): one a minute;
# a previous sample further back than the gap gives no increases.
ACTIVITY_SAMPLE_INTERVAL_S = float(os.environ.get("ACTIVITY_SAMPLE_INTERVAL_S", 60))
ACTIVITY_MAX_GAP_S = float(os.environ.get("ACTIVITY_MAX_GAP_S", 5 * ACTIVITY_SAMPLE_INTERVAL_S))

PERIODIC_TASKS: dict[str, dict[str, object]] = {
    "process-release": {
        "function": "console.processes.release_dead_processes",
        "celery_task": "console.release_dead_processes",
        "every_s": max(5.0, PROCESS_HEARTBEAT_WINDOW_S / 3),
    },
    "egress-ingest": {
        "function": "sandboxes.network.log.ingest_refusals",
        "celery_task": "sandboxes.egress_ingest",
        "every_s": EGRESS_INGEST_INTERVAL_S,
    },
    "reaper": {
        "function": "sandboxes.sessions.reaper.start_reaper_pass",
        "celery_task": "sandboxes.reaper_pass",
        "every_s": REAPER_INTERVAL_S,
    },
    "idle-sweep": {
        "function": "sandboxes.sessions.reaper.start_idle_sweep",
        "celery_task": "sandboxes.idle_sweep",
        "every_s": IDLE_SWEEP_INTERVAL_S,
    },
    "retention": {
        "function": "sandboxes.sessions.retention.start_retention_pass",
        "celery_task": "sandboxes.retention_pass",
        "every_s": RETENTION_INTERVAL_S,
    },
    # The egress component's upkeep (Docker: pruning, deny-name refresh, resolver restarts,
    # log rotation, released networks' leftovers); never a side effect of reading refusals.
    "egress-housekeeping": {
        "function": "sandboxes.network.log.egress_housekeeping",
        "celery_task": "sandboxes.egress_housekeeping",
        "every_s": 60,
    },
    "terminal-sweep": {
        "function": "sandboxes.terminal.sweep.close_abandoned",
        "celery_task": "sandboxes.terminal_sweep",
        "every_s": 60,
    },
    "activity-sample": {
        "function": "console.activity.start_activity_sample",
        "celery_task": "console.activity_sample",
        "every_s": ACTIVITY_SAMPLE_INTERVAL_S,
    },
}
CELERY_BEAT_SCHEDULE = {
    name: {"task": spec["celery_task"], "schedule": float(spec["every_s"])}  # type: ignore[arg-type]
    for name, spec in PERIODIC_TASKS.items()
}

# --- Web terminal (sandboxes/terminal/; docs/terminal-protocol.md) ---
# No input or output for this long closes a terminal (with a message). Cube uses 30 minutes.
TERMINAL_IDLE_TIMEOUT_S = int(os.environ.get("TERMINAL_IDLE_TIMEOUT_S", 8 * 3600))  # a workday
# After an abnormal disconnect the shell waits this long for the same terminal to reattach.
TERMINAL_REATTACH_S = int(os.environ.get("TERMINAL_REATTACH_S", 30))
# A websocket ticket is single-use and valid this long after it was issued.
TERMINAL_TICKET_MAX_AGE_S = int(os.environ.get("TERMINAL_TICKET_MAX_AGE_S", 30))
# Output kept per terminal for replay on reattach.
TERMINAL_REPLAY_BYTES = int(os.environ.get("TERMINAL_REPLAY_BYTES", 1024 * 1024))
# How often an open terminal marks its session active and re-checks access.
TERMINAL_KEEPALIVE_S = int(os.environ.get("TERMINAL_KEEPALIVE_S", 30))
# A console process holding a terminal's websocket renews its attachment lease (a third of
# this) so another process's grace window never closes a terminal in use elsewhere.
TERMINAL_LEASE_S = int(os.environ.get("TERMINAL_LEASE_S", 30))
# Keep each terminal's shell in a tmux session in the sandbox (where the template has tmux),
# so a reload or a reconnect through any console process gets it back. Off: a plain shell per
# connection, whose output reaches the browser byte for byte (tmux re-renders the screen).
TERMINAL_KEEP_SHELLS = os.environ.get("TERMINAL_KEEP_SHELLS", "1") != "0"

# Skill installs: folders of wheels (one per name) that configs may name as an offline pip
# source; only folders under this root can be copied into build sandboxes.
SKILL_PACKAGE_SOURCES_ROOT = Path(os.environ.get("SKILL_PACKAGE_SOURCES_ROOT", VAR_DIR / "package-sources"))

# --- Session engine calls (sandboxes/sessions/runtime.py; docs/operations.md) --------------
# The longest a pause or a state read waits for the backend (shorter than a web worker's
# patience), and how long a stale rebuild waits for the session's execs, commands and open
# terminals to end before it is deferred to the next turn.
SESSION_ENGINE_TIMEOUT_S = float(os.environ.get("SESSION_ENGINE_TIMEOUT_S", 20))
SESSION_REBUILD_WAIT_S = float(os.environ.get("SESSION_REBUILD_WAIT_S", 5))
