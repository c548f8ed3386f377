"""Settings for the one-command start (`make start`).

`make start` generates SECRET_KEY, FIELD_ENCRYPTION_KEY and the installation id once and
keeps them in var/ (scripts/keys.sh); they are read from there when the environment does not
set them, so `manage.py` run by hand uses the same ones as the running console.
"""

import os

from console.logs import logging_config

from .base import *  # noqa: F403
from .base import VAR_DIR


def _kept_key(name: str, default: str) -> str:
    path = VAR_DIR / name.lower().replace("_", "-")
    if os.environ.get(name) or not path.is_file():
        return default
    return path.read_text().strip()


SECRET_KEY = _kept_key("SECRET_KEY", SECRET_KEY)  # noqa: F405
FIELD_ENCRYPTION_KEY = _kept_key("FIELD_ENCRYPTION_KEY", FIELD_ENCRYPTION_KEY)  # noqa: F405
CONSOLE_INSTALLATION_ID = _kept_key("CONSOLE_INSTALLATION_ID", CONSOLE_INSTALLATION_ID)  # noqa: F405

# Readable log lines at a terminal unless the tuning logs.format says otherwise.
LOG_FORMAT = LOG_FORMAT if "logs.format" in TUNING else "text"  # noqa: F405
# The periodic passes' routine lines (reaper, idle sweep, samples…) go to var/housekeeping.log,
# so the terminal keeps the start's closing note and the requests; warnings stay on both.
LOGGING = logging_config(
    log_format=LOG_FORMAT,
    level=LOG_LEVEL,  # noqa: F405
    housekeeping_log=str(VAR_DIR / "housekeeping.log"),
)
# /metrics from this host without a token (docs/operations.md, "Metrics").
METRICS_ALLOW_LOOPBACK = True
