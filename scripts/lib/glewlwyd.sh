# Starts Glewlwyd 2.7 (Debian's `glewlwyd`, an OpenID Certified provider in C) on loopback as a
# reference OpenID Provider: a fresh database from Debian's own schema, its OIDC plugin
# signing with an RS256 2048-bit key (the broker's algorithm and size), one user with a
# password and one confidential client. Sourced by scripts/oidc-rps.sh and scripts/bench-oidc.sh.
# GLEWLWYD_DB=postgres (the default) gives it its own throwaway PostgreSQL cluster in
# $WORK/glewlwyd/pg, set up like the broker's embedded one (initdb defaults, durable, unix socket
# only), so that a benchmark compares two providers on the same database; GLEWLWYD_DB=sqlite
# gives it a sqlite file, which serialises its writes ("database busy" under concurrency).
# The caller sets WORK and calls start_glewlwyd REDIRECT_URI...; it then exports
# GLEWLWYD_PID, GLEWLWYD_POSTMASTER_PID (empty on sqlite), GLEWLWYD_ISSUER (= the plugin's base
# URL), GLEWLWYD_CLIENT_ID/_SECRET, GLEWLWYD_USER/_PASSWORD. stop_glewlwyd ends both.
: "${GLEWLWYD_DB:=postgres}"
GLEWLWYD_PID= GLEWLWYD_POSTMASTER_PID= GLEWLWYD_PG_DATA=
GLEWLWYD_PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
glewlwyd_missing() {  # prints what is not installed (nothing when all is there)
  command -v glewlwyd >/dev/null || echo "glewlwyd (apt: glewlwyd)"
  case $GLEWLWYD_DB in
    sqlite) [ -f /usr/share/doc/glewlwyd/database/init.sqlite3.sql.gz ] || echo "Glewlwyd's sqlite schema (apt: glewlwyd)" ;;
    postgres)
      [ -f /usr/share/doc/glewlwyd/database/init.postgre.sql.gz ] || echo "Glewlwyd's PostgreSQL schema (apt: glewlwyd)"
      [ -x "$GLEWLWYD_PG_BIN/initdb" ] || echo "PostgreSQL server binaries (apt: postgresql)"
      ls /usr/share/postgresql/*/extension/pgcrypto.control > /dev/null 2>&1 ||
        echo "pgcrypto, which Glewlwyd's schema uses (apt: postgresql-contrib)" ;;
    *) echo "GLEWLWYD_DB=$GLEWLWYD_DB: postgres or sqlite" ;;
  esac
}

glewlwyd_pg() {  # glewlwyd_pg COMMAND ARGS... : a PostgreSQL binary, as 'postgres' when we are root
  local command=$GLEWLWYD_PG_BIN/$1; shift
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$command" "$@"; else "$command" "$@"; fi
}

stop_glewlwyd() {
  [ -n "$GLEWLWYD_PID" ] && kill -TERM "$GLEWLWYD_PID" 2>/dev/null && wait "$GLEWLWYD_PID" 2>/dev/null || true
  GLEWLWYD_PID=
  if [ -n "$GLEWLWYD_PG_DATA" ] && [ -f "$GLEWLWYD_PG_DATA/postmaster.pid" ]; then
    glewlwyd_pg pg_ctl -D "$GLEWLWYD_PG_DATA" -m fast -w -t 60 stop > /dev/null || true
  fi
  GLEWLWYD_POSTMASTER_PID= GLEWLWYD_PG_DATA=
}

# start_glewlwyd_postgres DIR : a fresh cluster in DIR/pg with Debian's Glewlwyd schema in
# database glewlwyd; sets GLEWLWYD_CONNINFO. The same initdb options and server settings as the
# broker's embedded cluster (Sources/EmbeddedPostgres): durable, defaults otherwise.
start_glewlwyd_postgres() {
  local dir=$1 data=$1/pg
  mkdir -m 700 "$data"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$data"; fi
  glewlwyd_pg initdb -D "$data" -U glewlwyd --auth=trust --encoding=UTF8 --locale=C.UTF-8 --no-instructions > "$dir/initdb.log"
  glewlwyd_pg pg_ctl -D "$data" -l "$data/server.log" -w -t 60 \
    -o "-c listen_addresses='' -c port=5432 -k $data -c unix_socket_permissions=0700" start > /dev/null
  GLEWLWYD_PG_DATA=$data GLEWLWYD_POSTMASTER_PID=$(head -1 "$data/postmaster.pid")
  glewlwyd_pg createdb -h "$data" -U glewlwyd glewlwyd
  # The schema stores passwords with crypt()/gen_salt() and does not create pgcrypto itself.
  { echo "SET client_min_messages = warning; CREATE EXTENSION pgcrypto;"
    zcat /usr/share/doc/glewlwyd/database/init.postgre.sql.gz; } |
    glewlwyd_pg psql -q -v ON_ERROR_STOP=1 -h "$data" -U glewlwyd -d glewlwyd > /dev/null
  GLEWLWYD_CONNINFO="host=$data dbname=glewlwyd user=glewlwyd"
}

start_glewlwyd() {  # start_glewlwyd PYTHON REDIRECT_URI... (PYTHON: an interpreter with requests)
  local python=$1; shift
  local dir=$WORK/glewlwyd port
  port=$(free_port)
  stop_glewlwyd
  # A cluster left running by a killed run holds the directory: stop it first.
  [ -f "$dir/pg/postmaster.pid" ] && glewlwyd_pg pg_ctl -D "$dir/pg" -m immediate -w stop > /dev/null 2>&1 || true
  rm -rf "$dir"; mkdir -p "$dir"
  local database
  if [ "$GLEWLWYD_DB" = sqlite ]; then
    zcat /usr/share/doc/glewlwyd/database/init.sqlite3.sql.gz | python3 -c '
import sqlite3, sys
db = sqlite3.connect(sys.argv[1]); db.executescript(sys.stdin.read()); db.commit()' "$dir/glewlwyd.db"
    database="type = \"sqlite3\"; path = \"$dir/glewlwyd.db\";"
  else
    start_glewlwyd_postgres "$dir"
    database="type = \"postgre\"; conninfo = \"$GLEWLWYD_CONNINFO\";"
  fi
  openssl genrsa -traditional -out "$dir/key.pem" 2048 2>/dev/null
  openssl rsa -in "$dir/key.pem" -pubout -out "$dir/pub.pem" 2>/dev/null
  # Debian's configuration with our port, database and log; everything else as shipped.
  sed -e "s|^port=.*|port=$port|" -e "s|^external_url=.*|external_url=\"http://127.0.0.1:$port\"|" \
    -e "s|^log_file=.*|log_file=\"$dir/glewlwyd.log\"|" -e 's|^log_level=.*|log_level="WARNING"|' \
    -e "s|^@include .*|database = { $database };|" \
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
  export GLEWLWYD_PID GLEWLWYD_POSTMASTER_PID
}
