# Sourced by scripts/start.sh: the embedded console's SECRET_KEY, FIELD_ENCRYPTION_KEY and
# CONSOLE_INSTALLATION_ID. Outside DEBUG the console refuses to start on the public default
# key or without a FIELD_ENCRYPTION_KEY, so the one-command start generates both once and
# keeps them in var/ (mode 600), and every later start uses the same ones. The installation
# id is kept the same way, so two consoles on one Docker engine never take each other's
# sandboxes for their own (a console from before keeps "local", which its sandboxes carry).
# Values set in the environment win.
# Sets LEGACY_SECRET_KEY when FIELD_ENCRYPTION_KEY was just generated for an existing
# console, whose stored secrets were encrypted with a key derived from that SECRET_KEY.
var_dir=${CONSOLE_VAR_DIR:-var}
mkdir -p "$var_dir"
python_bin=${PYTHON_BIN:-.venv/bin/python}
LEGACY_SECRET_KEY=""

keep_reason() {
  if [ "$1" = CONSOLE_INSTALLATION_ID ]; then echo "every sandbox of this console carries it"; else echo "stored secrets need it"; fi
}

keep_key() {  # keep_key NAME FILE PYTHON-EXPRESSION
  local name=$1 file=$var_dir/$2 expr=$3
  if [ -n "${!name:-}" ]; then return; fi
  if [ ! -s "$file" ]; then
    (umask 077 && "$python_bin" -c "import base64, os, secrets; print($expr)" >"$file.tmp" && mv "$file.tmp" "$file")
    echo "==> generated $name in $file (keep it: $(keep_reason "$name"))"
    [ "$name" = FIELD_ENCRYPTION_KEY ] && LEGACY_SECRET_KEY=${SECRET_KEY_BEFORE:-insecure-local-console-key-set-SECRET_KEY-in-production}
  fi
  export "$name=$(cat "$file")"
}

SECRET_KEY_BEFORE=${SECRET_KEY:-}
if [ -z "${CONSOLE_INSTALLATION_ID:-}" ] && [ ! -s "$var_dir/console-installation-id" ] &&
  { [ -s "$var_dir/secret-key" ] || [ -s "$var_dir/console.sqlite3" ]; }; then
  (umask 077 && echo local >"$var_dir/console-installation-id")
  echo "==> kept installation id \"local\" of this console in $var_dir/console-installation-id (its sandboxes carry it)"
fi
keep_key CONSOLE_INSTALLATION_ID console-installation-id "'console-' + secrets.token_hex(6)"
keep_key SECRET_KEY secret-key "secrets.token_urlsafe(50)"
keep_key FIELD_ENCRYPTION_KEY field-encryption-key "base64.urlsafe_b64encode(os.urandom(32)).decode()"
