#!/usr/bin/env bash
# Sourced by scripts/test: starts a throw-away Redis Cluster of 3 masters, each with 1 replica, on
# free loopback ports, for the failover test (idem-store-redis/tests/failover.rs), and exports
# IDEM_TEST_REDIS_FAILOVER_URLS (its nodes, comma-separated).
#
# - IDEM_TEST_REDIS_FAILOVER_URLS already set: used as it is.
# - The test kills masters (kill -9) and promotes their replicas (CLUSTER FAILOVER TAKEOVER): this
#   cluster is never shared with the other tests, and is only ever one started here.
# - Debian's redis-server package is installed with apt-get if the binaries are missing.
# - Everything started here is shut down, and its files removed, by commands appended to
#   cleanup_cmds. Nothing here stops, flushes or reconfigures a server it did not start.

idem_rf_log() { echo "redis-failover.sh: $*" >&2; }

idem_rf_port_free() {
  # $1 port: whether nobody listens on it nor on its cluster bus port (+10000).
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null &&
    ! (exec 3<>"/dev/tcp/127.0.0.1/$(($1 + 10000))") 2>/dev/null
}

idem_rf_main() {
  local dir port=${IDEM_REDIS_FAILOVER_START_PORT:-48000} ports=() urls=() i
  if [ -n "${IDEM_TEST_REDIS_FAILOVER_URLS:-}" ]; then
    idem_rf_log "using IDEM_TEST_REDIS_FAILOVER_URLS from the environment"
    return 0
  fi
  if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    idem_rf_log "Redis binaries missing: installing Debian's redis-server package"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >&2
  fi
  dir=$(mktemp -d /tmp/idem-redis-failover.XXXXXX)
  cleanup_cmds+=("rm -rf '$dir'")
  for i in 1 2 3 4 5 6; do
    while ! idem_rf_port_free "$port"; do port=$((port + 1)); done
    mkdir -p "$dir/$port"
    # A short node timeout bounds how long the cluster takes to notice a dead master.
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$port" --daemonize yes \
      --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log" \
      --save "" --appendonly no --cluster-enabled yes \
      --cluster-config-file "$dir/$port/nodes.conf" --cluster-node-timeout 2000 \
      --repl-diskless-sync-delay 0 >/dev/null ||
      return 1
    # The test kills some of these with kill -9: shutdown may find nobody, which is fine.
    cleanup_cmds+=("redis-cli -h 127.0.0.1 -p $port shutdown nosave >/dev/null 2>&1")
    ports+=("$port")
    urls+=("redis://127.0.0.1:$port")
    port=$((port + 1))
  done
  for port in "${ports[@]}"; do
    for i in $(seq 1 300); do
      [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ] && break
      sleep 0.1
    done
  done
  redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 1 --cluster-yes \
    >"$dir/create.log" 2>&1 || { cat "$dir/create.log" >&2; return 1; }
  # Ready when every node sees the cluster ok and each master has its replica online.
  for i in $(seq 1 300); do
    local ok=1
    for port in "${ports[@]}"; do
      redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
    done
    [ "$(for port in "${ports[@]}"; do redis-cli -h 127.0.0.1 -p "$port" info replication; done 2>/dev/null |
      grep -c 'state=online')" -ge 3 ] || ok=0
    [ "$ok" = 1 ] && break
    sleep 0.2
  done
  [ "$ok" = 1 ] || { idem_rf_log "the cluster did not become ready"; return 1; }
  export IDEM_TEST_REDIS_FAILOVER_URLS
  IDEM_TEST_REDIS_FAILOVER_URLS=$(IFS=,; echo "${urls[*]}")
  idem_rf_log "started a 3-master, 3-replica cluster on 127.0.0.1:${ports[*]} (stopped on exit)"
  idem_rf_log "IDEM_TEST_REDIS_FAILOVER_URLS=$IDEM_TEST_REDIS_FAILOVER_URLS"
}

idem_rf_main
