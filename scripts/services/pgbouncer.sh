#!/usr/bin/env bash
# Sourced by scripts/test: makes sure a PgBouncer in transaction pooling mode stands in front of
# the test database and exports IDEM_TEST_PGBOUNCER_URL (the same user and database as
# IDEM_TEST_POSTGRES_URL, through the pooler).
#
# - IDEM_TEST_PGBOUNCER_URL already set: used as it is.
# - Otherwise: starts a private PgBouncer (Debian's pgbouncer package, installed with apt-get if
#   the binary is missing) on a free loopback port (from $IDEM_PGBOUNCER_START_PORT, default
#   56432), in a temp dir, with `pool_mode = transaction`, `auth_type = trust` and otherwise
#   PgBouncer's defaults (server-side prepared statements are not tracked), every database
#   forwarded to the server of IDEM_TEST_POSTGRES_URL. Its shutdown and the removal of its files
#   are appended to cleanup_cmds.
#
# It needs IDEM_TEST_POSTGRES_URL: when this file is sourced first, it sources postgres.sh (which
# keeps a URL already set).

idem_pgb_log() { echo "pgbouncer.sh: $*" >&2; }

idem_pgb_free_port() {
  local port=${IDEM_PGBOUNCER_START_PORT:-56432}
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    port=$((port + 1))
  done
  echo "$port"
}

idem_pgb_main() {
  local url rest userinfo user password hostport host port db dir bin pgb_port run_as=() i
  if [ -n "${IDEM_TEST_PGBOUNCER_URL:-}" ]; then
    idem_pgb_log "using IDEM_TEST_PGBOUNCER_URL from the environment"
    return 0
  fi
  if [ -z "${IDEM_TEST_POSTGRES_URL:-}" ]; then
    # shellcheck source=/dev/null
    source "$(dirname "${BASH_SOURCE[0]}")/postgres.sh" || return 1
  fi
  url=${IDEM_TEST_POSTGRES_URL:?}
  # postgres://[user[:password]@]host[:port]/db[?params]
  rest=${url#*://}
  rest=${rest%%\?*}
  userinfo=
  case $rest in *@*) userinfo=${rest%@*} rest=${rest##*@} ;; esac
  user=${userinfo%%:*}
  user=${user:-postgres}
  password=
  case $userinfo in *:*) password=${userinfo#*:} ;; esac
  hostport=${rest%%/*}
  db=${rest#*/}
  [ "$db" != "$rest" ] && [ -n "$db" ] || db=$user
  host=${hostport%:*}
  port=${hostport##*:}
  [ "$port" != "$hostport" ] || port=5432
  if ! bin=$(command -v pgbouncer || ls /usr/sbin/pgbouncer 2>/dev/null); then
    idem_pgb_log "pgbouncer missing: installing Debian's pgbouncer package"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >&2
    bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
  fi
  # The package enables its own service on 6432 where an init system runs; this one is private.
  dir=$(mktemp -d /tmp/idem-pgbouncer.XXXXXX)
  pgb_port=$(idem_pgb_free_port)
  # trust still looks the user up in auth_file, and logs in to the server with its password.
  printf '"%s" "%s"\n' "$user" "$password" >"$dir/userlist.txt"
  chmod 600 "$dir/userlist.txt"
  cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=$host port=$port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $pgb_port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
; Many test pools connect at once (up to 4 connections each); the server side keeps the default
; of 20 connections per database and user.
max_client_conn = 2000
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
  if [ "$(id -u)" = 0 ]; then
    # PgBouncer refuses to run as root.
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$dir" postgres
    chown -R postgres "$dir"
    run_as=(runuser -u postgres --)
  fi
  "${run_as[@]}" "$bin" -d "$dir/pgbouncer.ini" >&2 || { cat "$dir/pgbouncer.log" >&2; return 1; }
  cleanup_cmds+=("kill \$(cat '$dir/pgbouncer.pid' 2>/dev/null) 2>/dev/null; rm -rf '$dir'")
  for i in $(seq 1 100); do
    if psql "postgres://$user@127.0.0.1:$pgb_port/$db" -Atqc 'select 1' >/dev/null 2>&1 </dev/null; then
      break
    fi
    [ "$i" = 100 ] && { idem_pgb_log "no answer on 127.0.0.1:$pgb_port"; cat "$dir/pgbouncer.log" >&2; return 1; }
    sleep 0.1
  done
  export IDEM_TEST_PGBOUNCER_URL="postgres://$user@127.0.0.1:$pgb_port/$db"
  idem_pgb_log "started PgBouncer ($("$bin" --version | head -1)) in transaction mode on 127.0.0.1:$pgb_port (stopped on exit)"
  idem_pgb_log "IDEM_TEST_PGBOUNCER_URL=$IDEM_TEST_PGBOUNCER_URL"
}

idem_pgb_main
