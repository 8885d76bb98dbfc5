#!/usr/bin/env bash
# Start a throw-away PostgreSQL server for the test-suite on 127.0.0.1:5432.
#
# Run as root on Debian (bookworm). Idempotent: running it again while the server
# is up changes nothing. Everything is logged to stderr; the last line on stdout is
#
#   export AOT_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres
#
# so that CI can do:  eval "$(bash .ci/postgres.sh | tail -1)"
#
# Choice: rather than the Debian default cluster (which the package may or may not
# have created, and whose pg_hba.conf we would have to edit), we initdb a dedicated
# cluster with trust authentication in $AOT_PG_DATA (default /var/tmp/aot-postgres),
# owned by the `postgres` user, and run it with pg_ctl. Trust auth is for tests only:
# the server listens on loopback only.
set -euo pipefail

PORT="${AOT_PG_PORT:-5432}"
HOST=127.0.0.1
BASE="${AOT_PG_DATA:-/var/tmp/aot-postgres}"
DATA="$BASE/data"
SOCK="$BASE/run"
LOG="$BASE/server.log"
URL="postgresql+psycopg://postgres@$HOST:$PORT/postgres"

log() { echo "[postgres.sh] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and switches to the postgres user)"

find_bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
    if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/pg_isready" ]; then
        echo "$d"
    fi
}

BIN=$(find_bindir)
if [ -z "$BIN" ]; then
    log "PostgreSQL binaries not found; installing Debian's postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    BIN=$(find_bindir)
    [ -n "$BIN" ] || die "postgresql installed but no /usr/lib/postgresql/*/bin/initdb found"
fi
MAJOR=$(basename "$(dirname "$BIN")")
log "using PostgreSQL $MAJOR from $BIN"
id postgres >/dev/null 2>&1 || die "the postgres system user does not exist (the Debian package creates it)"

as_pg() { (cd / && runuser -u postgres -- "$@"); }

can_connect() {
    as_pg "$BIN/psql" -h "$HOST" -p "$PORT" -U postgres -d postgres -w -tAc 'select 1' >/dev/null 2>&1
}

if "$BIN/pg_isready" -q -h "$HOST" -p "$PORT" -t 2; then
    if can_connect; then
        log "a server already accepts password-less connections on $HOST:$PORT; reusing it"
        echo "export AOT_TEST_POSTGRES_URL=$URL"
        exit 0
    fi
    die "another server listens on $HOST:$PORT but refuses password-less login as postgres; stop it (pg_lsclusters / pg_ctlcluster $MAJOR main stop) or set AOT_PG_PORT"
fi

mkdir -p "$BASE" "$SOCK"
chown postgres:postgres "$BASE" "$SOCK"
chmod 700 "$BASE"

if [ ! -s "$DATA/PG_VERSION" ]; then
    log "creating a cluster in $DATA (trust auth, tests only)"
    rm -rf "$DATA"
    as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >&2 \
        || as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --locale=C >&2
elif [ "$(cat "$DATA/PG_VERSION")" != "$MAJOR" ]; then
    log "cluster in $DATA is version $(cat "$DATA/PG_VERSION"), binaries are $MAJOR: recreating it"
    rm -rf "$DATA"
    as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --locale=C >&2
fi

# Stale pid file from a killed server would make pg_ctl refuse to start.
if [ -f "$DATA/postmaster.pid" ] && ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    log "removing stale postmaster.pid"
    rm -f "$DATA/postmaster.pid"
fi

if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    log "starting the server on $HOST:$PORT (log: $LOG)"
    as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
        -o "-c listen_addresses=$HOST -p $PORT -c unix_socket_directories=$SOCK -c max_connections=200 -c fsync=off" \
        start >&2 || { tail -20 "$LOG" >&2 || true; die "pg_ctl start failed"; }
fi

for _ in $(seq 1 60); do
    if "$BIN/pg_isready" -q -h "$HOST" -p "$PORT" -t 1; then
        can_connect || die "server is up but refuses password-less login as postgres"
        log "ready: $URL"
        echo "export AOT_TEST_POSTGRES_URL=$URL"
        exit 0
    fi
    sleep 1
done
tail -20 "$LOG" >&2 || true
die "server did not become ready on $HOST:$PORT within 60 s"
