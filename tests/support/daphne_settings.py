"""Settings of a `daphne` subprocess started by a test (tests/sandboxes/terminal/test_daphne.py).

The test settings, plus what the parent test chose: its installation id (so the sandboxes the
child creates are swept with the parent's) and the channel layer (channels-redis exactly as
production configures it, under a prefix of the test's own).
"""

import os

from console.settings.base import redis_channel_layer
from console.settings.test import *  # noqa: F403
from console.settings.test import REDIS_URL

CONSOLE_INSTALLATION_ID = os.environ["TEST_CONSOLE_INSTALLATION_ID"]
if os.environ.get("TEST_CHANNEL_LAYER") == "redis":
    CHANNEL_LAYERS = {"default": redis_channel_layer(REDIS_URL, prefix=os.environ["TEST_CHANNEL_LAYER_PREFIX"])}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "INFO"},
}
