#!/usr/bin/env bash
# Sourced by scripts/test: a certificate authority made now, and a PostgreSQL, a Redis and a
# 3-master Redis Cluster that speak only TLS with a certificate it signed, for the TLS tests
# (idem-store-postgres/tests/{conformance_tls,tls}.rs, idem-store-redis/tests/{conformance_tls,tls}.rs).
#
# Exports:
# - IDEM_TEST_TLS_CA: the CA's certificate (PEM) that signed the servers' certificate
#   (subjectAltName DNS:localhost, IP:127.0.0.1).
# - IDEM_TEST_TLS_UNTRUSTED_CA: a second CA's certificate that signed nothing here: verifying
#   against it must fail.
# - IDEM_TEST_POSTGRES_TLS_URL: postgres://postgres@127.0.0.1:PORT/test?sslmode=verify-full&sslrootcert=CA
#   (pg_hba.conf accepts `hostssl` only: a connection without TLS is refused). It also listens on
#   127.0.0.2, an address its certificate does not name, for the sslmode=verify-full test.
# - IDEM_TEST_REDIS_TLS_URL: rediss://127.0.0.1:PORT (no plain-text port).
# - IDEM_TEST_REDIS_TLS_CLUSTER_URLS: rediss://127.0.0.1:PORT,… (the cluster bus runs TLS too).
#
# - All of them already set: used as they are (e.g. a managed server; the tests assume the
#   server refuses connections without TLS).
# - Otherwise everything is made here, in a temp dir, with openssl (keys never committed, never
#   reused between runs), on free loopback ports; PostgreSQL with initdb + pg_ctl (as the postgres
#   user when run as root), Redis with redis-server --tls-port (Debian's Redis 7 has TLS built in).
#   Debian's packages are installed with apt-get if the binaries are missing.
# - Everything started here is stopped, and its files removed, by commands appended to
#   cleanup_cmds. Nothing here touches a server it did not start.

idem_tls_log() { echo "tls.sh: $*" >&2; }

idem_tls_port_free() {
  # $1 port: whether nobody listens on it nor on its cluster bus port (+10000).
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null &&
    ! (exec 3<>"/dev/tcp/127.0.0.1/$(($1 + 10000))") 2>/dev/null
}

idem_tls_free_port() {
  # $1 first port to try.
  local port=$1
  while ! idem_tls_port_free "$port"; do port=$((port + 1)); done
  echo "$port"
}

idem_tls_certs() {
  # $1 dir: writes ca.pem, untrusted-ca.pem, server.pem (leaf + CA chain) and server.key.
  local dir=$1 name
  for name in ca untrusted-ca; do
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
      -keyout "$dir/$name.key" -out "$dir/$name.pem" -subj "/CN=idem test $name" \
      >/dev/null 2>&1 || return 1
  done
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$dir/server.key" -out "$dir/server.csr" -subj "/CN=localhost" >/dev/null 2>&1 ||
    return 1
  printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth,clientAuth" \
    >"$dir/server.ext"
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 2 -extfile "$dir/server.ext" -out "$dir/server.pem" >/dev/null 2>&1 ||
    return 1
  rm -f "$dir/ca.key" "$dir/untrusted-ca.key" "$dir/server.csr"
}

idem_tls_postgres() {
  # $1 dir (holding the certificates): starts a TLS-only server; sets idem_tls_pg_url.
  local dir=$1 bindir initdb pg_ctl port data run_as=()
  for bindir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$bindir/initdb" ] && [ -x "$bindir/pg_ctl" ] && break
    bindir=
  done
  if [ -z "${bindir:-}" ]; then
    if command -v initdb >/dev/null 2>&1; then
      bindir=$(dirname "$(command -v initdb)")
    else
      idem_tls_log "PostgreSQL binaries missing: installing Debian's postgresql package"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
      bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V -r | head -1)
    fi
  fi
  initdb=$bindir/initdb pg_ctl=$bindir/pg_ctl
  data=$dir/pg
  mkdir -p "$data"
  if [ "$(id -u)" = 0 ]; then
    # initdb refuses to run as root; the server wants its key owned by itself, mode 0600.
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown postgres "$data"
    run_as=(runuser -u postgres --)
  fi
  "${run_as[@]}" "$initdb" -D "$data/data" -U postgres --auth=trust -E UTF8 --no-locale \
    >"$data/initdb.log" 2>&1 || { cat "$data/initdb.log" >&2; return 1; }
  cp "$dir/server.pem" "$dir/server.key" "$data/data/"
  chmod 600 "$data/data/server.key"
  [ "$(id -u)" = 0 ] && chown postgres "$data/data/server.pem" "$data/data/server.key"
  # Local (Unix socket) connections for this script only; over TCP, TLS or nothing.
  printf '%s\n' "local all all trust" "hostssl all all 127.0.0.0/8 trust" \
    "hostssl all all ::1/128 trust" >"$data/data/pg_hba.conf"
  port=$(idem_tls_free_port "${IDEM_PG_TLS_START_PORT:-57432}")
  "${run_as[@]}" "$pg_ctl" -D "$data/data" -l "$data/server.log" -w -t 60 \
    -o "-p $port -k $data -c listen_addresses=127.0.0.1,127.0.0.2 -c max_connections=200 -c ssl=on \
        -c ssl_cert_file=server.pem -c ssl_key_file=server.key" start >&2 ||
    { cat "$data/server.log" >&2; return 1; }
  cleanup_cmds+=("${run_as[*]} '$pg_ctl' -D '$data/data' -m fast -w stop >/dev/null")
  "${run_as[@]}" "$bindir/createdb" -h "$data" -p "$port" -U postgres -E UTF8 -T template0 test ||
    return 1
  idem_tls_pg_url="postgres://postgres@127.0.0.1:$port/test?sslmode=verify-full&sslrootcert=$dir/ca.pem"
  idem_tls_log "started a TLS-only PostgreSQL on 127.0.0.1:$port (stopped on exit)"
}

idem_tls_redis_start() {
  # $1 dir, $2 port, then extra redis-server arguments: a TLS-only server (no plain-text port).
  local dir=$1 port=$2 i
  shift 2
  mkdir -p "$dir/redis-$port"
  redis-server --port 0 --tls-port "$port" --bind 127.0.0.1 --dir "$dir/redis-$port" \
    --daemonize yes --pidfile "$dir/redis-$port/redis.pid" --logfile "$dir/redis-$port/redis.log" \
    --save "" --appendonly no --tls-cert-file "$dir/server.pem" --tls-key-file "$dir/server.key" \
    --tls-ca-cert-file "$dir/ca.pem" --tls-auth-clients no "$@" >/dev/null || return 1
  cleanup_cmds+=("redis-cli --tls --cacert '$dir/ca.pem' -h 127.0.0.1 -p $port shutdown nosave >/dev/null 2>&1")
  for i in $(seq 1 300); do
    [ "$(redis-cli --tls --cacert "$dir/ca.pem" -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ] &&
      return 0
    sleep 0.1
  done
  idem_tls_log "no PING answer over TLS on 127.0.0.1:$port; the end of its log:"
  tail -n 5 "$dir/redis-$port/redis.log" >&2 || true
  return 1
}

idem_tls_redis() {
  # $1 dir: a standalone server and a 3-master cluster; sets idem_tls_redis_url/cluster_urls.
  local dir=$1 port ports=() urls=() i next=${IDEM_REDIS_TLS_START_PORT:-45000}
  if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    idem_tls_log "Redis binaries missing: installing Debian's redis-server package"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >&2
  fi
  port=$(idem_tls_free_port "$next")
  idem_tls_redis_start "$dir" "$port" || return 1
  idem_tls_redis_url="rediss://127.0.0.1:$port"
  next=$((port + 1))
  for i in 1 2 3; do
    port=$(idem_tls_free_port "$next")
    next=$((port + 1))
    idem_tls_redis_start "$dir" "$port" --tls-cluster yes --cluster-enabled yes \
      --cluster-config-file "$dir/redis-$port/nodes.conf" --cluster-node-timeout 5000 || return 1
    ports+=("$port")
    urls+=("rediss://127.0.0.1:$port")
  done
  timeout 120 redis-cli --tls --cacert "$dir/ca.pem" --cluster create "${ports[@]/#/127.0.0.1:}" \
    --cluster-replicas 0 --cluster-yes >"$dir/cluster-create.log" 2>&1 ||
    { cat "$dir/cluster-create.log" >&2; return 1; }
  for i in $(seq 1 300); do
    local ok=1
    for port in "${ports[@]}"; do
      redis-cli --tls --cacert "$dir/ca.pem" -h 127.0.0.1 -p "$port" cluster info 2>/dev/null |
        grep -q 'cluster_state:ok' || ok=0
    done
    [ "$ok" = 1 ] && break
    sleep 0.1
  done
  [ "$ok" = 1 ] || { idem_tls_log "the TLS cluster did not reach cluster_state:ok"; return 1; }
  idem_tls_redis_cluster_urls=$(IFS=,; echo "${urls[*]}")
  idem_tls_log "started a TLS-only Redis on ${idem_tls_redis_url#rediss://} and a 3-master TLS cluster on 127.0.0.1:${ports[*]} (stopped on exit)"
}

idem_tls_main() {
  local dir
  if [ -n "${IDEM_TEST_TLS_CA:-}" ] && [ -n "${IDEM_TEST_TLS_UNTRUSTED_CA:-}" ] &&
    [ -n "${IDEM_TEST_POSTGRES_TLS_URL:-}" ] && [ -n "${IDEM_TEST_REDIS_TLS_URL:-}" ] &&
    [ -n "${IDEM_TEST_REDIS_TLS_CLUSTER_URLS:-}" ]; then
    idem_tls_log "using IDEM_TEST_TLS_CA, IDEM_TEST_*_TLS_URL(S) from the environment"
    return 0
  fi
  command -v openssl >/dev/null 2>&1 || {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >&2
  }
  dir=$(mktemp -d /tmp/idem-tls.XXXXXX)
  chmod 755 "$dir"
  cleanup_cmds+=("rm -rf '$dir'")
  idem_tls_certs "$dir" || { idem_tls_log "openssl could not make the certificates"; return 1; }
  idem_tls_postgres "$dir" || return 1
  idem_tls_redis "$dir" || return 1
  export IDEM_TEST_TLS_CA=$dir/ca.pem
  export IDEM_TEST_TLS_UNTRUSTED_CA=$dir/untrusted-ca.pem
  export IDEM_TEST_POSTGRES_TLS_URL=$idem_tls_pg_url
  export IDEM_TEST_REDIS_TLS_URL=$idem_tls_redis_url
  export IDEM_TEST_REDIS_TLS_CLUSTER_URLS=$idem_tls_redis_cluster_urls
  idem_tls_log "IDEM_TEST_TLS_CA=$IDEM_TEST_TLS_CA"
  idem_tls_log "IDEM_TEST_POSTGRES_TLS_URL=$IDEM_TEST_POSTGRES_TLS_URL"
  idem_tls_log "IDEM_TEST_REDIS_TLS_URL=$IDEM_TEST_REDIS_TLS_URL"
  idem_tls_log "IDEM_TEST_REDIS_TLS_CLUSTER_URLS=$IDEM_TEST_REDIS_TLS_CLUSTER_URLS"
}

idem_tls_main
