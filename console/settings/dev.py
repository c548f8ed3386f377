"""Settings for the one-command start (`make start`)."""

from .base import *  # noqa: F403
