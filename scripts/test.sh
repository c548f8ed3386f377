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
# The browser tests run in a pytest process of their own: Playwright's sync API keeps an
# event loop running in the main thread, which Django's database code then refuses to run
# under. They go first, so the closing summary is the whole suite's.
echo "==> pytest (browser tests, real Chromium)"
status=0
.venv/bin/pytest -m e2e "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "(no browser test selected)"
  status=0
fi

# The rest runs in TEST_WORKERS processes (pytest-xdist; 2 = the CI machine's cores), a test
# file at a time on one of them, so a module's shared engine or sandbox is made once. Each
# worker has its own test database and Redis database (console/settings/test.py).
echo "==> pytest (everything but the browser tests, ${TEST_WORKERS:-2} workers)"
.venv/bin/pytest -m "not e2e" -n "${TEST_WORKERS:-2}" --dist loadfile "$@" || status=$?
exit "$status"
