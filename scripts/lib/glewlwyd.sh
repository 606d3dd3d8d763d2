# Starts Glewlwyd 2.7 (Debian's `glewlwyd`, an OpenID Certified provider in C) on loopback as a
# reference OpenID Provider: a fresh sqlite database from Debian's own schema, its OIDC plugin
# signing with an RS256 2048-bit key (the broker's algorithm and size), one user with a
# password and one confidential client. Sourced by scripts/oidc-rps.sh and scripts/bench-oidc.sh.
# The caller sets WORK and calls start_glewlwyd REDIRECT_URI...; it then exports
# GLEWLWYD_PID, GLEWLWYD_ISSUER (= the plugin's base URL), GLEWLWYD_CLIENT_ID/_SECRET,
# GLEWLWYD_USER/_PASSWORD. stop_glewlwyd ends it.
GLEWLWYD_PID=
glewlwyd_missing() {  # prints what is not installed (nothing when all is there)
  command -v glewlwyd >/dev/null || echo "glewlwyd (apt: glewlwyd)"
  [ -f /usr/share/doc/glewlwyd/database/init.sqlite3.sql.gz ] || echo "Glewlwyd's sqlite schema (apt: glewlwyd)"
}

stop_glewlwyd() {
  [ -n "$GLEWLWYD_PID" ] && kill -TERM "$GLEWLWYD_PID" 2>/dev/null && wait "$GLEWLWYD_PID" 2>/dev/null || true
  GLEWLWYD_PID=
}

start_glewlwyd() {  # start_glewlwyd PYTHON REDIRECT_URI... (PYTHON: an interpreter with requests)
  local python=$1; shift
  local dir=$WORK/glewlwyd port
  port=$(free_port)
  rm -rf "$dir"; mkdir -p "$dir"
  zcat /usr/share/doc/glewlwyd/database/init.sqlite3.sql.gz | python3 -c '
import sqlite3, sys
db = sqlite3.connect(sys.argv[1]); db.executescript(sys.stdin.read()); db.commit()' "$dir/glewlwyd.db"
  openssl genrsa -traditional -out "$dir/key.pem" 2048 2>/dev/null
  openssl rsa -in "$dir/key.pem" -pubout -out "$dir/pub.pem" 2>/dev/null
  # Debian's configuration with our port, database and log; everything else as shipped.
  sed -e "s|^port=.*|port=$port|" -e "s|^external_url=.*|external_url=\"http://127.0.0.1:$port\"|" \
    -e "s|^log_file=.*|log_file=\"$dir/glewlwyd.log\"|" -e 's|^log_level=.*|log_level="WARNING"|' \
    -e "s|^@include .*|database = { type = \"sqlite3\"; path = \"$dir/glewlwyd.db\"; };|" \
    /etc/glewlwyd/glewlwyd.conf > "$dir/glewlwyd.conf"
  echo 'bind_address="127.0.0.1"' >> "$dir/glewlwyd.conf"
  glewlwyd --config-file="$dir/glewlwyd.conf" > "$dir/stdout.log" 2>&1 &
  GLEWLWYD_PID=$!
  wait_http "http://127.0.0.1:$port/api/" 2>/dev/null || wait_http "http://127.0.0.1:$port/config/" || {
    echo "glewlwyd did not start: $(tail -5 "$dir/glewlwyd.log" "$dir/stdout.log")" >&2; return 1; }
  export GLEWLWYD_USER=alice GLEWLWYD_PASSWORD=$(openssl rand -hex 12)
  export GLEWLWYD_CLIENT_ID=rp-glewlwyd GLEWLWYD_CLIENT_SECRET=$(openssl rand -hex 16)
  export GLEWLWYD_ISSUER=http://127.0.0.1:$port/api/oidc GLEWLWYD_BASE=http://127.0.0.1:$port
  "$python" "$ROOT/scripts/oidc/glewlwyd_setup.py" "$GLEWLWYD_BASE" "$dir/key.pem" "$dir/pub.pem" "$@"
  export GLEWLWYD_PID
}
