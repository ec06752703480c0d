#!/usr/bin/env bash
# Sourced by scripts/test: makes sure a PostgreSQL is reachable and exports IDEM_TEST_POSTGRES_URL.
#
# - IDEM_TEST_POSTGRES_URL already set: used as it is.
# - A server answers on $IDEM_PG_HOST:$IDEM_PG_PORT (default 127.0.0.1:5432): used, with the first
#   of the users postgres / root / $USER that can log in without a password, and database
#   $IDEM_PG_DB (default test, created if missing).
# - Otherwise: starts a throw-away server (initdb + pg_ctl in a temp dir, trust auth, UTF8) on a
#   free port (or $IDEM_PG_START_PORT), installing Debian's postgresql package if the binaries
#   are missing, and appends the command that stops it and removes its files to cleanup_cmds.
#
# Nothing here stops or restarts a server it did not start.

idem_pg_log() { echo "postgres.sh: $*" >&2; }

idem_pg_find_bin() {
  # $1: a PostgreSQL server program; prints its path (newest version first).
  local d
  if command -v "$1" >/dev/null 2>&1; then
    command -v "$1"
    return 0
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/$1" ]; then
      echo "$d/$1"
      return 0
    fi
  done
  return 1
}

idem_pg_login() {
  # $1 host, $2 port: prints a user that can log in (to any database) without a password.
  local user
  for user in postgres root "${USER:-}"; do
    [ -n "$user" ] || continue
    if PGCONNECT_TIMEOUT=3 psql -h "$1" -p "$2" -U "$user" -d postgres -Atqc 'select 1' \
      >/dev/null 2>&1 </dev/null; then
      echo "$user"
      return 0
    fi
  done
  return 1
}

idem_pg_ensure_db() {
  # $1 host, $2 port, $3 user, $4 database
  if ! psql -h "$1" -p "$2" -U "$3" -d postgres -Atqc \
    "select 1 from pg_database where datname = '$4'" </dev/null | grep -q 1; then
    createdb -h "$1" -p "$2" -U "$3" -E UTF8 -T template0 "$4"
  fi
}

idem_pg_free_port() {
  local port=${IDEM_PG_START_PORT:-55432}
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    port=$((port + 1))
  done
  echo "$port"
}

idem_pg_start() {
  # Starts a private server; sets idem_pg_host/port/user.
  local initdb pg_ctl dir port run_as=()
  if ! initdb=$(idem_pg_find_bin initdb) || ! command -v psql >/dev/null 2>&1; then
    idem_pg_log "PostgreSQL binaries missing: installing Debian's postgresql package"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    initdb=$(idem_pg_find_bin initdb)
  fi
  pg_ctl="$(dirname "$initdb")/pg_ctl"
  [ -x "$pg_ctl" ] || pg_ctl=$(idem_pg_find_bin pg_ctl)
  dir=$(mktemp -d /tmp/idem-pg.XXXXXX)
  port=$(idem_pg_free_port)
  if [ "$(id -u)" = 0 ]; then
    # initdb refuses to run as root.
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$dir" postgres
    chown postgres "$dir"
    run_as=(runuser -u postgres --)
  fi
  "${run_as[@]}" "$initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; return 1; }
  "${run_as[@]}" "$pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" start >&2 ||
    { cat "$dir/server.log" >&2; return 1; }
  cleanup_cmds+=("${run_as[*]} '$pg_ctl' -D '$dir/data' -m fast -w stop >/dev/null; rm -rf '$dir'")
  idem_pg_host=127.0.0.1
  idem_pg_port=$port
  idem_pg_user=postgres
  idem_pg_log "started a private server on 127.0.0.1:$port (data in $dir; stopped on exit)"
}

idem_pg_main() {
  local host=${IDEM_PG_HOST:-127.0.0.1} port=${IDEM_PG_PORT:-5432} db=${IDEM_PG_DB:-test} user
  if [ -n "${IDEM_TEST_POSTGRES_URL:-}" ]; then
    idem_pg_log "using IDEM_TEST_POSTGRES_URL from the environment"
    return 0
  fi
  if command -v pg_isready >/dev/null 2>&1 && pg_isready -q -h "$host" -p "$port" -t 3 &&
    user=$(idem_pg_login "$host" "$port"); then
    idem_pg_log "using the server on $host:$port as $user"
  else
    idem_pg_start || return 1
    host=$idem_pg_host port=$idem_pg_port user=$idem_pg_user
  fi
  idem_pg_ensure_db "$host" "$port" "$user" "$db" || return 1
  export IDEM_TEST_POSTGRES_URL="postgres://$user@$host:$port/$db"
  idem_pg_log "IDEM_TEST_POSTGRES_URL=$IDEM_TEST_POSTGRES_URL"
}

idem_pg_main
