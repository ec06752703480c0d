#!/usr/bin/env bash
# Sourced by scripts/test: makes sure a standalone Redis and a 3-master Redis Cluster are
# reachable and exports IDEM_TEST_REDIS_URL and IDEM_TEST_REDIS_CLUSTER_URLS.
#
# - IDEM_TEST_REDIS_URL already set: used as it is. Otherwise the server on
#   $IDEM_REDIS_HOST:$IDEM_REDIS_PORT (default 127.0.0.1:6379) if it answers PING; otherwise a
#   throw-away server (no persistence) on a free loopback port.
# - IDEM_TEST_REDIS_CLUSTER_URLS already set: used as it is. Otherwise a throw-away 3-master
#   cluster (redis-server --cluster-enabled yes x3 + redis-cli --cluster create) on free loopback
#   ports, in a temp dir.
# - Debian's redis-server package is installed with apt-get if the binaries are missing.
# - Everything started here is shut down, and its files removed, by commands appended to
#   cleanup_cmds. Nothing here stops, flushes or reconfigures a server it did not start.

idem_redis_log() { echo "redis.sh: $*" >&2; }

idem_redis_free_port() {
  # $1: first port to try; prints the first port nobody listens on.
  local port=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    port=$((port + 1))
  done
  echo "$port"
}

idem_redis_ensure_bins() {
  if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    return 0
  fi
  idem_redis_log "Redis binaries missing: installing Debian's redis-server package"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >&2
}

idem_redis_wait_ping() {
  # $1 port: waits (up to 30 s) until the server answers PING.
  local i
  for i in $(seq 1 300); do
    if [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]; then
      return 0
    fi
    sleep 0.1
  done
  idem_redis_log "no PING answer on 127.0.0.1:$1"
  return 1
}

idem_redis_start_server() {
  # $1 dir, $2 port, then extra redis-server arguments. Registers its shutdown.
  local dir=$1 port=$2
  shift 2
  mkdir -p "$dir/$port"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$port" --daemonize yes \
    --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log" \
    --save "" --appendonly no "$@" >/dev/null || return 1
  cleanup_cmds+=("redis-cli -h 127.0.0.1 -p $port shutdown nosave >/dev/null 2>&1")
  idem_redis_wait_ping "$port"
}

idem_redis_standalone() {
  local host=${IDEM_REDIS_HOST:-127.0.0.1} port=${IDEM_REDIS_PORT:-6379} dir
  if [ -n "${IDEM_TEST_REDIS_URL:-}" ]; then
    idem_redis_log "using IDEM_TEST_REDIS_URL from the environment"
    return 0
  fi
  if command -v redis-cli >/dev/null 2>&1 &&
    [ "$(redis-cli -h "$host" -p "$port" ping 2>/dev/null)" = PONG ]; then
    idem_redis_log "using the server on $host:$port"
  else
    idem_redis_ensure_bins || return 1
    dir=$(mktemp -d /tmp/idem-redis.XXXXXX)
    cleanup_cmds+=("rm -rf '$dir'")
    host=127.0.0.1
    port=$(idem_redis_free_port 56379)
    idem_redis_start_server "$dir" "$port" || return 1
    idem_redis_log "started a private server on 127.0.0.1:$port (stopped on exit)"
  fi
  export IDEM_TEST_REDIS_URL="redis://$host:$port"
  idem_redis_log "IDEM_TEST_REDIS_URL=$IDEM_TEST_REDIS_URL"
}

idem_redis_cluster() {
  local dir port next=${IDEM_REDIS_CLUSTER_START_PORT:-47000} ports=() urls=() i
  if [ -n "${IDEM_TEST_REDIS_CLUSTER_URLS:-}" ]; then
    idem_redis_log "using IDEM_TEST_REDIS_CLUSTER_URLS from the environment"
    return 0
  fi
  idem_redis_ensure_bins || return 1
  dir=$(mktemp -d /tmp/idem-redis-cluster.XXXXXX)
  cleanup_cmds+=("rm -rf '$dir'")
  for i in 1 2 3; do
    port=$(idem_redis_free_port "$next")
    # The cluster bus listens on port + 10000 (so port <= 55535): that one must be free too.
    while (exec 3<>"/dev/tcp/127.0.0.1/$((port + 10000))") 2>/dev/null; do
      port=$(idem_redis_free_port $((port + 1)))
    done
    next=$((port + 1))
    idem_redis_start_server "$dir" "$port" --cluster-enabled yes \
      --cluster-config-file "$dir/$port/nodes.conf" --cluster-node-timeout 5000 || return 1
    ports+=("$port")
    urls+=("redis://127.0.0.1:$port")
  done
  redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes \
    >"$dir/create.log" 2>&1 || { cat "$dir/create.log" >&2; return 1; }
  for i in $(seq 1 300); do
    if redis-cli -h 127.0.0.1 -p "${ports[0]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok' &&
      redis-cli -h 127.0.0.1 -p "${ports[2]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then
      break
    fi
    sleep 0.1
  done
  redis-cli -h 127.0.0.1 -p "${ports[0]}" cluster info | grep -q 'cluster_state:ok' ||
    { idem_redis_log "the cluster did not reach cluster_state:ok"; return 1; }
  export IDEM_TEST_REDIS_CLUSTER_URLS
  IDEM_TEST_REDIS_CLUSTER_URLS=$(IFS=,; echo "${urls[*]}")
  idem_redis_log "started a 3-master cluster on 127.0.0.1:${ports[*]} (stopped on exit)"
  idem_redis_log "IDEM_TEST_REDIS_CLUSTER_URLS=$IDEM_TEST_REDIS_CLUSTER_URLS"
}

idem_redis_standalone && idem_redis_cluster
