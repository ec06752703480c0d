#!/usr/bin/env bash
# Sourced by scripts/test: makes sure a DynamoDB-compatible server is reachable and exports
# IDEM_TEST_DYNAMODB_URL (dynamodb://TABLE?endpoint=http://127.0.0.1:PORT&region=us-east-1) for
# idem-store-dynamodb's tests and `idem … --store dynamodb://…`.
#
# - IDEM_TEST_DYNAMODB_URL already set: used as it is (credentials come from the SDK's own chain).
# - Otherwise: moto 5 (open source, Apache-2.0) in server mode on a free loopback port, installed
#   from PyPI into a virtualenv under $IDEM_CACHE_DIR (default ~/.cache/idem) the first time, and
#   fake credentials exported for the AWS SDK (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; IMDS off,
#   so the SDK never probes for an instance role).
# - moto's server answers each request on its own thread and checks a write's condition, then
#   writes, with no lock between the two: two conditional writes of one item could both pass.
#   DynamoDB itself applies a conditional write to an item atomically, so the server is started
#   through a small launcher that serves one request at a time (the WSGI app behind one lock).
# - The server started here is stopped, and its files removed, by commands appended to
#   cleanup_cmds. Nothing here touches a server it did not start.

idem_ddb_log() { echo "dynamodb.sh: $*" >&2; }

idem_ddb_free_port() {
  # $1: first port to try; prints the first port nobody listens on.
  local port=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    port=$((port + 1))
  done
  echo "$port"
}

idem_ddb_venv() {
  # Prints the virtualenv's python, creating it and installing moto 5 if needed.
  local dir=${IDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/idem}/moto5-venv
  if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c 'import moto.server' 2>/dev/null; then
    echo "$dir/bin/python"
    return 0
  fi
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    idem_ddb_log "python3's venv module missing: installing Debian's python3-venv package"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >&2
  fi
  idem_ddb_log "installing moto 5 (server mode) into $dir"
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  python3 -m venv "$dir" >&2 || return 1
  "$dir/bin/python" -m pip install -q --disable-pip-version-check 'moto[server]>=5,<6' >&2 || return 1
  echo "$dir/bin/python"
}

# The launcher: moto's own WSGI app (as moto_server builds it), one request at a time.
idem_ddb_launcher='
import sys, threading
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()

def serialized(environ, start_response):
    with lock:
        # The body is read in full under the lock, so no write interleaves with another.
        body = app(environ, start_response)
        try:
            return list(body)
        finally:
            if hasattr(body, "close"):
                body.close()

run_simple("127.0.0.1", int(sys.argv[1]), serialized, threaded=True)
'

idem_ddb_start() {
  local python port dir pid i
  if [ -n "${IDEM_TEST_DYNAMODB_URL:-}" ]; then
    idem_ddb_log "using IDEM_TEST_DYNAMODB_URL from the environment"
    return 0
  fi
  python=$(idem_ddb_venv) || { idem_ddb_log "could not install moto"; return 1; }
  dir=$(mktemp -d /tmp/idem-moto.XXXXXX)
  cleanup_cmds+=("rm -rf '$dir'")
  port=$(idem_ddb_free_port "${IDEM_DYNAMODB_START_PORT:-48000}")
  "$python" -c "$idem_ddb_launcher" "$port" >"$dir/moto.log" 2>&1 &
  pid=$!
  cleanup_cmds+=("kill $pid 2>/dev/null; wait $pid 2>/dev/null")
  for i in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      cat "$dir/moto.log" >&2
      idem_ddb_log "moto exited before it listened"
      return 1
    fi
    sleep 0.1
  done
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null ||
    { idem_ddb_log "moto did not listen on 127.0.0.1:$port"; return 1; }
  export AWS_ACCESS_KEY_ID=idem-test AWS_SECRET_ACCESS_KEY=idem-test AWS_EC2_METADATA_DISABLED=true
  export IDEM_TEST_DYNAMODB_URL="dynamodb://idem-test?endpoint=http://127.0.0.1:$port&region=us-east-1"
  idem_ddb_log "started moto on 127.0.0.1:$port (stopped on exit)"
  idem_ddb_log "IDEM_TEST_DYNAMODB_URL=$IDEM_TEST_DYNAMODB_URL"
}

idem_ddb_start
