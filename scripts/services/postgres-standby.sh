#!/usr/bin/env bash
# Sourced by scripts/test: makes sure PostgreSQL's server programs (initdb, pg_ctl,
# pg_basebackup) are present and exports IDEM_TEST_PG_BINDIR, their directory, for the failover
# test (idem-store-postgres/tests/failover.rs). That test starts its own primaries and streaming
# standbys on free loopback ports in temp dirs (as the postgres user when run as root: initdb
# refuses root), kills and promotes them, and removes them; it never touches another server.
#
# - IDEM_TEST_PG_BINDIR already set: used as it is.
# - Otherwise the newest /usr/lib/postgresql/*/bin with pg_basebackup, or the directory of
#   pg_basebackup on PATH; Debian's postgresql package is installed with apt-get if none.

idem_pgsb_log() { echo "postgres-standby.sh: $*" >&2; }

idem_pgsb_bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/pg_basebackup" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
      echo "$d"
      return 0
    fi
  done
  if command -v pg_basebackup >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
    dirname "$(command -v pg_basebackup)"
    return 0
  fi
  return 1
}

idem_pgsb_main() {
  local dir
  if [ -n "${IDEM_TEST_PG_BINDIR:-}" ]; then
    idem_pgsb_log "using IDEM_TEST_PG_BINDIR from the environment"
    return 0
  fi
  if ! dir=$(idem_pgsb_bindir); then
    idem_pgsb_log "PostgreSQL server programs missing: installing Debian's postgresql package"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    dir=$(idem_pgsb_bindir) || return 1
  fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --no-create-home postgres
  fi
  export IDEM_TEST_PG_BINDIR=$dir
  idem_pgsb_log "IDEM_TEST_PG_BINDIR=$IDEM_TEST_PG_BINDIR"
}

idem_pgsb_main
