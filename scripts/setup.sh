#!/usr/bin/env bash
# Sets up a checkout: virtualenv, Python packages (pinned by constraints.txt), front-end
# assets from npm. Idempotent. `--dev` also installs the test and lint tools.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_BIN=${PYTHON_BIN:-python3}
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"

if [ ! -x .venv/bin/python ]; then
  echo "==> creating the virtualenv in .venv"
  "$PYTHON_BIN" -m venv .venv
fi
echo "==> installing Python packages${extras:+ (with dev tools)}"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet --constraint constraints.txt --editable ".${extras}"

echo "==> building front-end assets from npm"
if [ package-lock.json -nt node_modules/.package-lock.json ] || [ ! -d node_modules ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
npm run --silent build >/dev/null

# The bundled example skills' pip dependencies as a wheel folder (an offline package source
# the one-command start gives the local engine; skills/examples/package-source.txt).
examples_source="${CONSOLE_VAR_DIR:-var}/package-sources/examples"
if [ ! -f "$examples_source/.complete" ] || [ skills/examples/package-source.txt -nt "$examples_source/.complete" ]; then
  echo "==> downloading the example skills' wheels into $examples_source"
  mkdir -p "$examples_source"
  .venv/bin/python -m pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
    --dest "$examples_source" --requirement skills/examples/package-source.txt
  touch "$examples_source/.complete"
fi
