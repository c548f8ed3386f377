# Sourced by scripts/start.sh first of all: one console per var/. The script holds an flock
# on var/console.lock on file descriptor 9 for as long as it runs; the console's processes
# inherit the descriptor, so the lock stays held while any of them still lives (a Daphne
# finishing its requests after Ctrl-C included), and a second `make start` on the same var/
# stops here with the reason instead of running a second console on one SQLite file.
var_dir=${CONSOLE_VAR_DIR:-var}
mkdir -p "$var_dir"
lock_file=$var_dir/console.lock
exec 9>>"$lock_file"
if ! flock --nonblock 9; then
  holder=$(cat "$lock_file" 2>/dev/null || true)
  echo "!! another console is running on $var_dir (${holder:-its process}); stop it first (Ctrl-C in its terminal)," >&2
  echo "!! or give this one a folder of its own: CONSOLE_VAR_DIR=/another/folder make start" >&2
  exit 1
fi
echo "pid $$ since $(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$lock_file"
