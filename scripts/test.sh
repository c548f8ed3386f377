#!/usr/bin/env bash
# The one-command test: set up with dev tools, then format check, lint, types and tests.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh --dev
export DJANGO_SETTINGS_MODULE=console.settings.test

echo "==> ruff format --check"
.venv/bin/ruff format --check .
echo "==> ruff check"
.venv/bin/ruff check .
echo "==> mypy"
.venv/bin/mypy .
echo "==> pytest"
.venv/bin/pytest "$@"
