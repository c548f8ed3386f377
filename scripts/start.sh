#!/usr/bin/env bash
# The one-command start: set up, migrate, create the first admin and a demo space, and
# serve pages and websockets with Daphne on 127.0.0.1:8000. With REDIS_URL set, a Celery
# worker and beat run beside it. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# One console per var/: a second start on the same folder stops here (scripts/lock.sh).
source scripts/lock.sh
# This console's folder (CONSOLE_VAR_DIR, else var/): its logs, beat schedule and metrics live
# there, so a second console on its own folder shares none of them with the first.
VAR_DIR=${CONSOLE_VAR_DIR:-var}
mkdir -p "$VAR_DIR"
# Setup noise (pip, npm, image builds, migrations) goes to $VAR_DIR/setup.log; the terminal gets
# one line per step, and the log's tail when a step fails.
SETUP_LOG=$VAR_DIR/setup.log
: >"$SETUP_LOG"
quietly() {  # quietly "what it does" command...
  local what=$1
  shift
  echo "==> $what"
  if ! "$@" >>"$SETUP_LOG" 2>&1; then
    echo "!! $what failed; the end of $SETUP_LOG:" >&2
    tail -n 30 "$SETUP_LOG" >&2
    exit 1
  fi
}

# What this start changed on the host beyond this folder, for the closing note.
changed=()

quietly "setting up Python packages and front-end assets (details in $SETUP_LOG)" bash scripts/setup.sh
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-console.settings.dev}
source scripts/keys.sh

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  quietly "Docker engine answers; making sure the base template image exists (a first build takes minutes)" \
    .venv/bin/python manage.py build_base_image
  changed+=("Docker: the image sandbox-console/base:latest (built when missing); sandboxes and networks labelled sandbox-console")
  # The skills' local apt repository (poppler-utils, qpdf, nodejs, npm, tesseract-ocr; cached): root only.
  if [ "$(id -u)" = 0 ]; then
    quietly "preparing the local apt repository for skills ($VAR_DIR/package-sources/debian)" \
      .venv/bin/python scripts/apt_repo.py "$VAR_DIR/package-sources/debian" poppler-utils qpdf nodejs npm tesseract-ocr
  fi
  # The skills' npm tarball folder (docx, pptxgenjs, marked and their dependencies; cached).
  quietly "preparing the npm tarball folder for skills ($VAR_DIR/package-sources/npm)" \
    .venv/bin/python scripts/npm_folder.py "$VAR_DIR/package-sources/npm"
  # Online sandboxes need the host packet filter (docs/security.md); only root can load it.
  if [ "$(id -u)" = 0 ]; then
    if ! command -v nft >/dev/null 2>&1; then
      quietly "installing nftables" bash -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends nftables"
      changed+=("apt: installed nftables")
    fi
    # HTTP rules and TLS by SNI: the console runs its own squid (docs/network.md).
    if ! command -v squid >/dev/null 2>&1 || ! squid -v 2>/dev/null | grep -q -- --with-openssl; then
      echo "==> installing squid-openssl (HTTP rules)"
      if { apt-get update -qq && apt-get install -y -qq --no-install-recommends squid-openssl; } >>"$SETUP_LOG" 2>&1; then
        changed+=("apt: installed squid-openssl (the console runs its own squid per space network)")
      else
        echo "==> squid-openssl could not be installed (see $SETUP_LOG): policies with HTTP rules are refused on Docker"
      fi
    fi
    # Debian's own squid service (port 3128 on every address) is not ours: kept off.
    if [ -d /run/systemd/system ] && { systemctl is-enabled --quiet squid 2>/dev/null || systemctl is-active --quiet squid 2>/dev/null; }; then
      systemctl disable --now squid >/dev/null 2>&1 && changed+=("systemd: stopped and disabled Debian's squid service") || true
    fi
    # The egress components (docs/network.md): dnsmasq per space network, ulogd2 for refusals.
    if [ ! -x /usr/sbin/dnsmasq ] || [ ! -x /usr/sbin/ulogd ] || [ ! -e /usr/lib/x86_64-linux-gnu/ulogd/ulogd_output_JSON.so ]; then
      quietly "installing dnsmasq-base, ulogd2, ulogd2-json" bash -c \
        "apt-get update -qq && apt-get install -y -qq --no-install-recommends dnsmasq-base ulogd2 ulogd2-json"
      changed+=("apt: installed dnsmasq-base, ulogd2, ulogd2-json")
    fi
    if .venv/bin/python -m sandboxes.backends.docker.egress.firewall >>"$SETUP_LOG" 2>&1; then
      changed+=("nftables: loaded the table 'inet sandbox_console', the sandboxes' packet filter (see it: nft list table inet sandbox_console; remove it: nft delete table inet sandbox_console)")
    else
      echo "==> the host packet filter could not be applied (see $SETUP_LOG); sessions with outbound on are refused"
    fi
    if .venv/bin/python -m sandboxes.backends.docker.egress >>"$SETUP_LOG" 2>&1; then
      changed+=("started ulogd2, which logs refused connections of sandboxes")
    else
      echo "==> ulogd2 could not be started (see $SETUP_LOG); refused connections are not read back"
    fi
    [ -n "${EGRESS_DNS_UPSTREAM:-}" ] || echo "==> EGRESS_DNS_UPSTREAM is not set: names do not resolve in Docker sandboxes (docs/network.md)"
  else
    echo "==> not root: the host packet filter is not applied, so sessions with outbound on are refused (docs/security.md)"
  fi
else
  echo "==> no Docker engine answers: the Docker backend stays unavailable until one runs (see docs/operations.md)"
fi

quietly "migrating the database" .venv/bin/python manage.py migrate --noinput
if [ -n "$LEGACY_SECRET_KEY" ]; then
  # A console from before the key was required: move its stored secrets to the new key.
  .venv/bin/python manage.py rotate_field_encryption_key --legacy-secret-key "$LEGACY_SECRET_KEY" >>"$SETUP_LOG" 2>&1 ||
    echo "==> some stored secrets could not be moved to the new key; enter them again on their configs"
fi
# Their lines go into the closing note below, not lost above it.
bootstrap_note=$(.venv/bin/python manage.py bootstrap_console)
engine_note=$(.venv/bin/python manage.py register_local_engine)

pids=()
# Ctrl-C or SIGTERM: every process gets SIGTERM (Daphne stops its scheduler and gives the
# requests in flight processes.shutdown_grace_s (tuning) to finish), and whatever still runs past
# the grace is killed, so a stop always ends; what a killed process held is released by the
# next start (docs/operations.md, "Stopping and crashes").
stop_all() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  local deadline=$((SECONDS + ${shutdown_grace_s%.*} + 5))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}
shutdown_grace_s=$(.venv/bin/python manage.py tuning processes.shutdown_grace_s)
trap stop_all EXIT INT TERM
if [ -n "${REDIS_URL:-}" ]; then
  echo "==> REDIS_URL is set: starting a Celery worker and beat (logs: $VAR_DIR/celery-worker.log, $VAR_DIR/celery-beat.log)"
  # Daphne and the worker add their metrics up in one folder (docs/operations.md, "Metrics").
  metrics_dir=$VAR_DIR/metrics
  [[ $metrics_dir = /* ]] || metrics_dir=$PWD/$metrics_dir
  export PROMETHEUS_MULTIPROC_DIR=${PROMETHEUS_MULTIPROC_DIR:-$metrics_dir}
  .venv/bin/celery -A console worker --loglevel=INFO --pool=threads --concurrency=4 >>"$VAR_DIR/celery-worker.log" 2>&1 &
  pids+=($!)
  .venv/bin/celery -A console beat --loglevel=INFO --schedule "$VAR_DIR/celerybeat-schedule" >>"$VAR_DIR/celery-beat.log" 2>&1 &
  pids+=($!)
fi

HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
admin_user=${CONSOLE_ADMIN_USER:-admin}
# The closing note: what a newcomer needs, once setup is done and before the request lines.
{
  echo
  echo "================================================================================"
  echo " Sandbox Console is starting on http://$HOST:$PORT/   (Ctrl-C stops it)"
  echo
  echo " Log in as:  $admin_user"
  if printf '%s\n' "$bootstrap_note" | grep -q "password:"; then
    echo " Password:   $(printf '%s\n' "$bootstrap_note" | sed -n 's/^ *password: //p')"
    echo "             shown this once and not stored; note it now."
  elif [ -n "${CONSOLE_ADMIN_PASSWORD:-}" ]; then
    echo " Password:   the one in CONSOLE_ADMIN_PASSWORD (first run only)."
  else
    echo " Password:   set on the first run (printed then, never stored)."
  fi
  echo " Forgot it?  .venv/bin/python manage.py changepassword $admin_user   (in this folder)"
  if [ -n "$engine_note" ]; then printf '%s\n' "$engine_note" | sed '1s/^/ Backends:   /; 2,$s/^/             /'; fi
  echo
  if [ ${#changed[@]} -gt 0 ]; then
    echo " Changed on this host (beyond this folder):"
    for line in "${changed[@]}"; do echo "   - $line"; done
  else
    echo " Changed on this host: nothing beyond this folder."
  fi
  echo
  echo " Logs: setup in $SETUP_LOG; the periodic passes (reaper, idle sweep, samples) in"
  echo "       $VAR_DIR/housekeeping.log (tail -f it to watch them); requests and warnings below."
  echo " Other address or port: HOST=0.0.0.0 PORT=9000 make start"
  echo "================================================================================"
  echo
}
# Daphne at -v 0: the console logs one access line per request itself. Twisted's
# "HTTP/2 support not enabled" says nothing an embedded console needs (TLS and
# HTTP/2 are the reverse proxy's job in a deployment: docs/operations.md, "Production").
# console.serve is Daphne with a bounded shutdown (console/serve.py); in the background, so
# a signal to this script reaches stop_all at once.
.venv/bin/python -m console.serve -v 0 -b "$HOST" -p "$PORT" console.asgi:application \
  2> >(grep --line-buffered -v "HTTP/2 support not enabled" >&2) &
web=$!
pids+=("$web")
wait "$web"
