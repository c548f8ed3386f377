#!/usr/bin/env bash
# The one-command start: set up, migrate, create the first admin and a demo space, and
# serve pages and websockets with Daphne on 127.0.0.1:8000. With REDIS_URL set, a Celery
# worker and beat run beside it. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-console.settings.dev}
mkdir -p var
source scripts/keys.sh

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  echo "==> Docker engine answers; making sure the base template image exists"
  .venv/bin/python manage.py build_base_image
  # Online sandboxes need the host packet filter (docs/security.md); only root can load it.
  if [ "$(id -u)" = 0 ]; then
    command -v nft >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq --no-install-recommends nftables; }
    # The egress components (docs/network.md): dnsmasq per space network, ulogd2 for refusals.
    if [ ! -x /usr/sbin/dnsmasq ] || [ ! -x /usr/sbin/ulogd ] || [ ! -e /usr/lib/x86_64-linux-gnu/ulogd/ulogd_output_JSON.so ]; then
      apt-get update -qq && apt-get install -y -qq --no-install-recommends dnsmasq-base ulogd2 ulogd2-json
    fi
    .venv/bin/python -m sandboxes.backends.docker.firewall || true
    .venv/bin/python -m sandboxes.backends.docker.egress || true
    [ -n "${EGRESS_DNS_UPSTREAM:-}" ] || echo "==> EGRESS_DNS_UPSTREAM is not set: names do not resolve in Docker sandboxes (docs/network.md)"
  else
    echo "==> not root: the host packet filter is not applied, so sessions with outbound on are refused (docs/security.md)"
  fi
else
  echo "==> no Docker engine answers: the Docker backend stays unavailable until one runs (see docs/operations.md)"
fi

echo "==> migrating the database"
.venv/bin/python manage.py migrate --noinput
if [ -n "$LEGACY_SECRET_KEY" ]; then
  # A console from before the key was required: move its stored secrets to the new key.
  .venv/bin/python manage.py rotate_field_encryption_key --legacy-secret-key "$LEGACY_SECRET_KEY" ||
    echo "==> some stored secrets could not be moved to the new key; enter them again on their configs"
fi
.venv/bin/python manage.py bootstrap_console
.venv/bin/python manage.py register_local_engine

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
if [ -n "${REDIS_URL:-}" ]; then
  echo "==> REDIS_URL is set: starting a Celery worker and beat"
  .venv/bin/celery -A console worker --loglevel=INFO --pool=threads --concurrency=4 &
  pids+=($!)
  .venv/bin/celery -A console beat --loglevel=INFO --schedule var/celerybeat-schedule &
  pids+=($!)
fi

HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
echo "==> Sandbox Console on http://$HOST:$PORT/"
.venv/bin/daphne -b "$HOST" -p "$PORT" console.asgi:application
