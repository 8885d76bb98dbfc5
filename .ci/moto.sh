#!/usr/bin/env bash
# Start a throw-away S3-compatible server (moto in server mode) for the test-suite on
# loopback, as s3fs's own tests do.
#
# Needs moto[server] in the Python given by $MOTO_PYTHON (default: python3); .ci/run
# passes the fresh venv's, where the test extras installed it. Nothing else is
# installed. Idempotent: when a moto server already answers on the port it is reused.
# Everything is logged to stderr; the last line on stdout is
#
#   export AOT_TEST_S3_ENDPOINT=http://127.0.0.1:PORT
#
# so that CI can do:  eval "$(bash .ci/moto.sh | tail -1)"
#
# The server keeps its buckets in memory only; it runs detached (its own session, its
# output in $AOT_MOTO_DIR/server.log) and its pid is in $AOT_MOTO_DIR/server.pid.
# Stop it with:  kill "$(cat /var/tmp/aot-moto/server.pid)"
set -euo pipefail

PORT="${AOT_MOTO_PORT:-5391}"
HOST=127.0.0.1
PYTHON="${MOTO_PYTHON:-python3}"
BASE="${AOT_MOTO_DIR:-/var/tmp/aot-moto}"
LOG="$BASE/server.log"
PIDFILE="$BASE/server.pid"
ENDPOINT="http://$HOST:$PORT"

log() { echo "[moto.sh] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# 0 if a moto server answers on the port (its management API is moto's own).
is_moto() {
    "$PYTHON" - "$ENDPOINT" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
# The dashboard, not /moto-api/data.json: that one answers 500 once a test deleted a
# bucket the server's state still lists, although the server works.
with urllib.request.urlopen(sys.argv[1] + "/moto-api/", timeout=15) as r:
    sys.exit(0 if r.status == 200 and b"moto" in r.read().lower() else 1)
EOF
}

port_busy() {
    "$PYTHON" - "$HOST" "$PORT" <<'EOF' >/dev/null 2>&1
import socket, sys
s = socket.socket()
s.settimeout(1)
sys.exit(0 if s.connect_ex((sys.argv[1], int(sys.argv[2]))) == 0 else 1)
EOF
}

"$PYTHON" -c 'import moto.server, flask' 2>/dev/null \
    || die "moto[server] is not installed in $PYTHON; pip install 'jax-aot[test]' (or 'moto[server]')"

if is_moto; then
    log "a moto server already answers on $ENDPOINT; reusing it"
    echo "export AOT_TEST_S3_ENDPOINT=$ENDPOINT"
    exit 0
fi
port_busy && die "something else listens on $HOST:$PORT; set AOT_MOTO_PORT to a free port"

mkdir -p "$BASE"
log "starting moto on $ENDPOINT (log: $LOG)"
# setsid + every stream redirected: the server must not hold the caller's stdout
# (CI reads this script's output through a pipe, which would never close).
setsid "$PYTHON" -m moto.server -H "$HOST" -p "$PORT" </dev/null >"$LOG" 2>&1 &
echo $! >"$PIDFILE"

for _ in $(seq 1 60); do
    if is_moto; then
        log "ready: $ENDPOINT (pid $(cat "$PIDFILE"))"
        echo "export AOT_TEST_S3_ENDPOINT=$ENDPOINT"
        exit 0
    fi
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { tail -20 "$LOG" >&2 || true; die "moto exited at start-up"; }
    sleep 0.5
done
tail -20 "$LOG" >&2 || true
die "moto did not answer on $ENDPOINT within 30 s"
