"""Settings: deployment settings read from the environment, and the tuning overrides.

Embedded defaults (no environment at all) give a working single-process console: SQLite,
the in-memory channel layer and an in-process job runner. Setting REDIS_URL switches
bindings, locks, the channel layer and jobs to Redis and Celery.

Every variable read here is listed in console/environment.py and in the one table of
docs/configuration.md. Tuning knobs (timeouts, sizes, intervals, retention) are typed
defaults in each room's `tuning.py`; CONSOLE_TUNING overrides them (TUNING below).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from console import tuning
from console.environment import (
    DEFAULT_POOL_SIZE,
    database_settings,
    email_settings,
    env_bool,
    env_int,
    env_list,
    env_str,
)
from console.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(env_str("CONSOLE_VAR_DIR") or BASE_DIR / "var")

# The one override mapping of the rooms' tuning knobs ("terminal.idle_timeout_s" -> value),
# checked against the rooms at start (console/tuning.py; `manage.py tuning` lists them).
# The knobs the settings read themselves (security.*, login.*, sso.*, logs.*, serving.*)
# are resolved here: a bad
# override stops the start with one line, as the other rooms' do (ConsoleConfig.ready).
try:
    TUNING: dict[str, object] = tuning.parse(env_str("CONSOLE_TUNING"))
    _security = tuning.resolve("security", tuning.SecurityTuning, TUNING)
    _login = tuning.resolve("login", tuning.LoginTuning, TUNING)
    _sso = tuning.resolve("sso", tuning.SsoTuning, TUNING)
    _logs = tuning.resolve("logs", tuning.LogsTuning, TUNING)
    _serving = tuning.resolve("serving", tuning.ServingTuning, TUNING)
except tuning.TuningError as exc:
    raise SystemExit(f"error: {exc}") from None

DEBUG = env_bool("DEBUG", False)
# The embedded default key is public: outside DEBUG the console refuses to start on it
# (console/crypto.py, check_secrets). `make start` generates a key and keeps it in var/.
SECRET_KEY = env_str("SECRET_KEY", "insecure-local-console-key-set-SECRET_KEY-in-production")
# Fernet key (urlsafe base64, 32 bytes) for secrets at rest, required outside DEBUG. While a key
# is rotated out, FIELD_ENCRYPTION_KEY lists the new key first and then the old ones
# (comma-separated): the old stay readable until `manage.py rotate_field_encryption_key` has
# re-encrypted everything.
FIELD_ENCRYPTION_KEY, *FIELD_ENCRYPTION_OLD_KEYS = env_list("FIELD_ENCRYPTION_KEY", []) or [""]
# The old keys' own variable is gone; left set, the old secrets would stop decrypting on
# upgrade, so the start stops and says where the keys go (a warning is too easy to miss).
if "FIELD_ENCRYPTION_OLD_KEYS" in os.environ:
    raise SystemExit(
        "error: FIELD_ENCRYPTION_OLD_KEYS is no longer read; list the old keys after the new one in "
        "FIELD_ENCRYPTION_KEY (new,old1,old2) and unset FIELD_ENCRYPTION_OLD_KEYS"
    )
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
            # `|when` (times) and the other shared helpers, in every template without a load.
            "builtins": ["console.templatetags.console_tags"],
        },
    }
]

# PostgreSQL: a pool of DATABASE_POOL_SIZE connections per process (docs/configuration.md).
DATABASES = {
    "default": database_settings(
        env_str("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'console.sqlite3'}",
        env_int("DATABASE_POOL_SIZE", DEFAULT_POOL_SIZE),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web requests, jobs, the scheduler and the session store (sandboxes.sessions.store_db) write from
    # several threads at once: wait for the write lock rather than fail ("database is
    # locked"), take it at BEGIN so a transaction never has to upgrade (which fails at once
    # under contention), and let readers run beside the writer (WAL).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 30,
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
# and HSTS is sent (tuning security.*, read at start). Behind a TLS-terminating proxy also set
# SECURE_PROXY_SSL_HEADER (the proxy must always set or strip that header), or Django cannot
# tell https requests apart.
CONSOLE_TLS = env_bool("CONSOLE_TLS", False)
SESSION_COOKIE_SECURE = CONSOLE_TLS
CSRF_COOKIE_SECURE = CONSOLE_TLS
SECURE_SSL_REDIRECT = _security.ssl_redirect
SECURE_HSTS_SECONDS = _security.hsts_seconds if CONSOLE_TLS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = _security.hsts_include_subdomains
SECURE_HSTS_PRELOAD = _security.hsts_preload
# "X-Forwarded-Proto: https" -> ("HTTP_X_FORWARDED_PROTO", "https"), as Django wants it.
_proxy_header, _, _proxy_value = env_str("SECURE_PROXY_SSL_HEADER").partition(":")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_header.strip().upper().replace("-", "_"), _proxy_value.strip() or "https")
    if _proxy_header.strip()
    else None
)
# How many proxies in front append to X-Forwarded-For (0: use the connection's address).
FORWARDED_FOR_PROXIES = env_int("FORWARDED_FOR_PROXIES", 0)
# Websocket handshakes come from the console's own origin (scheme, host and port) or one of
# the trusted origins (console/security.py).
WEBSOCKET_ALLOWED_ORIGINS = CSRF_TRUSTED_ORIGINS

# --- Inbound traffic to sandbox ports (sandboxes/inbound/, docs/inbound.md) --------------
# Where the console's inbound URLs are issued: "" = the console's own origin (as the page or
# API request reached it), pages served under `Content-Security-Policy: sandbox` (an opaque
# origin); or a wildcard origin, https://*.sandboxes.example.net (locally
# http://*.localhost:8000), a host of its own per sandbox port, <label>-<port>.<domain>,
# with wildcard DNS and TLS in front (docs/inbound.md). Checked at startup (sandboxes.E001).
INBOUND_BASE_URL = env_str("INBOUND_BASE_URL").rstrip("/")

# --- Login throttling (django-axes) -------------------------------------------------------
# After login.failure_limit failed logins for one username from one address, that pair is
# locked out for login.lockout_minutes (tuning, read at start; the lock is per pair, so nobody
# can lock a user out from elsewhere). `manage.py axes_reset` lifts every lock.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = _login.failure_limit
AXES_COOLOFF_TIME = timedelta(minutes=_login.lockout_minutes)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "console.security.client_ip"
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False

# --- Users: invitations and email (docs/security.md, "Users and invitations") -------------
# An invitation link works once, for users.invite_link_hours (tuning). It is shown to the admin
# who made it; with EMAIL_URL set it is also emailed to the user through Django's email backend.
try:
    _email = email_settings(env_str("EMAIL_URL"))
except ValueError as exc:
    raise SystemExit(f"error: {exc}") from None
EMAIL_HOST = str(_email["EMAIL_HOST"])
EMAIL_PORT = int(str(_email.get("EMAIL_PORT", 25)))
EMAIL_HOST_USER = str(_email.get("EMAIL_HOST_USER", ""))
EMAIL_HOST_PASSWORD = str(_email.get("EMAIL_HOST_PASSWORD", ""))
EMAIL_USE_TLS = bool(_email.get("EMAIL_USE_TLS", False))
DEFAULT_FROM_EMAIL = str(_email.get("DEFAULT_FROM_EMAIL", "sandbox-console@localhost"))
INVITE_EMAIL = bool(EMAIL_HOST)

# --- Single sign-on with OpenID Connect (docs/security.md, "Single sign-on") ---------------
# Off unless OIDC_RP_CLIENT_ID is set. The provider's endpoints and signing algorithm are read
# from OIDC_OP_ISSUER's discovery document at each sign-in (console/oidc.py), never typed in.
# Users are matched by their stored subject, else by email; the tuning sso.create_users=true
# creates users the console does not know yet; sso.provider_name names the login button.
OIDC_RP_CLIENT_ID = env_str("OIDC_RP_CLIENT_ID")
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
OIDC_RP_CLIENT_SECRET = env_str("OIDC_RP_CLIENT_SECRET")
OIDC_OP_ISSUER = env_str("OIDC_OP_ISSUER")
OIDC_RP_SCOPES = "openid email profile"
OIDC_PROVIDER_NAME = _sso.provider_name
OIDC_CREATE_USER = _sso.create_users
OIDC_TIMEOUT = 10
OIDC_AUTHENTICATE_CLASS = "console.oidc.ConsoleOIDCRequestView"
LOGIN_REDIRECT_URL_FAILURE = "/login/?sso=failed"
if OIDC_ENABLED:
    AUTHENTICATION_BACKENDS.append("console.oidc.ConsoleOIDCBackend")

REDIS_URL = env_str("REDIS_URL")


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
JOB_RUNNER = "celery" if REDIS_URL else "inprocess"
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
CONSOLE_INSTALLATION_ID = env_str("CONSOLE_INSTALLATION_ID", "local")

# --- Logs, health and metrics (console/logs.py, console/health.py, console/metrics.py;
# docs/operations.md, "Health, metrics and logs") -----------------------------------------
# Tuning logs.format: "json" (one JSON object a line, for a log collector) or "text" (for a
# person); logs.level: the root level.
LOG_FORMAT = _logs.format
LOG_LEVEL = _logs.level.upper()
LOGGING = logging_config(log_format=LOG_FORMAT, level=LOG_LEVEL)
# Celery keeps this set-up instead of installing its own (console/celery.py).
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# /metrics is refused unless a scraper is allowed: by a bearer token, or by its address.
METRICS_TOKEN = env_str("METRICS_TOKEN")
METRICS_ALLOWED_NETWORKS = env_list("METRICS_ALLOWED_NETWORKS", [])
# Scrapes from loopback without either (the development settings turn this on).
METRICS_ALLOW_LOOPBACK = False

# The embedded console serves /static/ itself through Daphne (see console/asgi.py); the tuning
# serving.static=false leaves it to a web server in front.
SERVE_STATIC = _serving.static

# --- Docker egress (sandboxes/backends/docker/egress/; docs/network.md) -------------------
# The resolver each Docker space network's dnsmasq forwards to ("address" or "address#port");
# empty: no name resolves in Docker sandboxes. The host folder of the resolvers' and the
# refusal log's files (empty: /var/lib/sandbox-console/egress).
EGRESS_DNS_UPSTREAM = env_str("EGRESS_DNS_UPSTREAM")
EGRESS_STATE_DIR = env_str("EGRESS_STATE_DIR")

# --- Disk limits (sandboxes/backends/docker/disk.py; docs/operations.md) ------------------
# The host folder of the size-bounded file systems (loop-mounted ext4 images) that hold Docker
# sandboxes' /workspace and /tmp (the bound of one template build: catalog.template_build_disk_mb).
WORKSPACE_DISK_DIR = env_str("WORKSPACE_DISK_DIR", "/var/lib/sandbox-console/disks")

# Uploads above 2.5 MiB stream to a temporary file, never held in memory whole; the skill
# import view stops reading an upload past skills.archive_max_bytes. Non-file form fields stay
# small (file data does not count towards DATA_UPLOAD_MAX_MEMORY_SIZE).
FILE_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440

# Periodic tasks (console/periodic.py: each registered beside its function) run on Celery beat
# (REDIS_URL set) or on a thread of the server; the test settings turn the thread off.
RUN_SCHEDULER = True

# Skill installs: folders of wheels (one per name) that configs may name as an offline pip
# source; only folders under this root can be copied into build sandboxes.
SKILL_PACKAGE_SOURCES_ROOT = VAR_DIR / "package-sources"
