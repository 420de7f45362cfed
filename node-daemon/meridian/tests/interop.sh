#!/usr/bin/env bash
# Interop: third-party clients against the real `meridian` daemon, over loopback.
#   mosquitto_pub/mosquitto_sub (Debian mosquitto-clients): TCP, MQTT 3.1.1 and 5.0
#   paho-mqtt (Python):                                        TCP and WebSocket, 3.1.1 and 5.0
#   MQTT.js (npm mqtt@5):                                      TCP and WebSocket, 3.1.1 and 5.0
# and `meridian bench` against another broker, Mosquitto (Debian mosquitto).
# Installs what is missing (idempotent), builds the daemon, runs every check, prints
# "N passed, M failed" and exits non-zero on any failure.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CRATE="$(dirname "$HERE")"
cd "$CRATE"

log() { echo "interop: $*" >&2; }

# ----- tools -----
if ! command -v mosquitto_sub >/dev/null || ! command -v mosquitto_pub >/dev/null; then
  log "installing mosquitto-clients"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq mosquitto-clients >/dev/null || { log "cannot install mosquitto-clients"; exit 1; }
fi
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
if [ ! -x "$MOSQUITTO" ]; then
  log "installing mosquitto"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq mosquitto >/dev/null || { log "cannot install mosquitto"; exit 1; }
fi
if ! python3 -c "import paho.mqtt" 2>/dev/null; then
  log "installing paho-mqtt"
  python3 -m pip install -q paho-mqtt 2>/dev/null || python3 -m pip install -q --break-system-packages paho-mqtt || { log "cannot install paho-mqtt"; exit 1; }
fi
if [ ! -d "$HERE/interop/node_modules/mqtt" ]; then
  log "installing mqtt@5 (npm)"
  (cd "$HERE/interop" && npm install --no-audit --no-fund --silent) || { log "cannot install mqtt"; exit 1; }
fi

# ----- daemon -----
cargo build -q -p meridian-mqtt --bin meridian || exit 1
TARGET_DIR="${CARGO_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')}"
BIN="$TARGET_DIR/debug/meridian"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
TMP="$(mktemp -d)"
MQTT=$(free_port); WS=$(free_port); ADMIN=$(free_port)
"$BIN" run --mqtt 127.0.0.1:$MQTT --ws 127.0.0.1:$WS --admin 127.0.0.1:$ADMIN --data-dir "$TMP/data" 2>"$TMP/daemon.log" &
PID=$!
cleanup() { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

# Ready when every port accepts connections (deadline 30 s).
python3 - "$MQTT" "$WS" "$ADMIN" <<'PY' || { log "daemon not ready"; cat "$TMP/daemon.log" >&2; exit 1; }
import socket, sys, time
deadline = time.time() + 30
for port in map(int, sys.argv[1:]):
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.time() > deadline:
                sys.exit(1)
            time.sleep(0.05)
PY

PASSED=0; FAILED=0
check() {
  local name="$1"; shift
  local runner=(timeout 60)
  declare -F "$1" >/dev/null && runner=()   # shell functions bound their own waits
  if out=$("${runner[@]}" "$@" 2>&1); then
    PASSED=$((PASSED + 1)); log "ok   $name"
  else
    FAILED=$((FAILED + 1)); log "FAIL $name"; echo "$out" | sed 's/^/    /' >&2
  fi
}

# GET from the admin API (python: no curl needed); fails on non-2xx.
http_get() {
  python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
    "http://127.0.0.1:$ADMIN$1"
}

mosquitto_round_trip() {
  local v="$1" topic="interop/mosquitto/$1"
  mosquitto_sub -h 127.0.0.1 -p "$MQTT" -V "$v" -t "$topic" -q 1 -C 2 -W 10 -i "msub-$v" >"$TMP/msub-$v.out" &
  local sub=$!
  # Wait until the subscription exists (admin API), not a fixed sleep.
  for _ in $(seq 1 200); do
    http_get "/api/clients/msub-$v" 2>/dev/null | grep -q "$topic" && break
    python3 -c 'import time; time.sleep(0.05)'
  done
  mosquitto_pub -h 127.0.0.1 -p "$MQTT" -V "$v" -t "$topic" -q 1 -m one -i "mpub1-$v" || return 1
  mosquitto_pub -h 127.0.0.1 -p "$MQTT" -V "$v" -t "$topic" -q 2 -m two -i "mpub2-$v" || return 1
  wait "$sub" || return 1
  [ "$(cat "$TMP/msub-$v.out")" = "$(printf 'one\ntwo')" ]
}

mosquitto_retained() {
  mosquitto_pub -h 127.0.0.1 -p "$MQTT" -V mqttv5 -t interop/retained -r -q 1 -m kept || return 1
  [ "$(mosquitto_sub -h 127.0.0.1 -p "$MQTT" -V mqttv311 -t interop/retained -C 1 -W 10)" = "kept" ]
}

# System topics, read as Mosquitto's own are: at once on subscribing, with the retain flag.
mosquitto_sys() {
  local out
  out=$(mosquitto_sub -h 127.0.0.1 -p "$MQTT" -V mqttv5 -t '$SYS/broker/version' -t '$SYS/broker/clients/connected' -C 2 -W 10 -F '%r %t %p') || return 1
  echo "$out"
  [ "$(echo "$out" | sort)" = "$(printf '1 $SYS/broker/clients/connected 1\n1 $SYS/broker/version meridian version %s' "$(grep -m1 '^version' "$HERE/../../../Cargo.toml" | cut -d'"' -f2)")" ]
}

check "mosquitto \$SYS topics" mosquitto_sys
check "mosquitto 3.1.1 tcp" mosquitto_round_trip mqttv311
check "mosquitto 5.0 tcp" mosquitto_round_trip mqttv5
check "mosquitto retained 5.0 -> 3.1.1" mosquitto_retained
for transport in tcp websockets; do
  port=$MQTT; [ "$transport" = websockets ] && port=$WS
  for v in 3 5; do
    check "paho $transport v$v" python3 "$HERE/interop/paho_check.py" "$transport" "$v" 127.0.0.1 "$port"
  done
done
for url in "mqtt://127.0.0.1:$MQTT" "ws://127.0.0.1:$WS/mqtt"; do
  for v in 4 5; do
    check "mqtt.js $url v$v" node "$HERE/interop/mqttjs_check.js" "$url" "$v"
  done
done

# `meridian bench` works against any broker: every message once, and the broker's CPU measured
# through its pid.
bench_against_mosquitto() {
  local port; port=$(free_port)
  printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "$port" >"$TMP/mosquitto.conf"
  "$MOSQUITTO" -c "$TMP/mosquitto.conf" 2>"$TMP/mosquitto.log" &
  local pid=$! rc=0
  python3 - "$port" <<'PY' || rc=1
import socket, sys, time
deadline = time.time() + 20
while True:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.5).close()
        break
    except OSError:
        if time.time() > deadline:
            sys.exit("mosquitto did not start")
        time.sleep(0.05)
PY
  if [ $rc -eq 0 ]; then
    "$BIN" bench pairs -c 2 -n 300 -q 1 --port "$port" --broker-pid "$pid" --json --quiet --timeout 30 \
      >"$TMP/bench.json" || rc=1
  fi
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  [ $rc -eq 0 ] || return 1
  python3 - "$TMP/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["messages"]
assert (m["sent"], m["acked"], m["received"]) == (600, 600, 600), m
assert (m["lost"], m["duplicates"], m["foreign"]) == (0, 0, 0), m
# CPU time is counted in clock ticks: a short run may take none.
assert r["broker"]["cpu_secs"] >= 0 and r["broker"]["rss_after_bytes"] > 0, r["broker"]
PY
}
check "meridian bench against mosquitto" bench_against_mosquitto

# Two regions of one deployment: a paho client's persistent session follows it from one to the
# other.
paho_roaming() {
  "$BIN" keygen --cluster-key "$TMP/cluster.key" >/dev/null || return 1
  local pa pb qa qb wa wb aa ab rc=0
  pa=$(free_port); pb=$(free_port); qa=$(free_port); qb=$(free_port); wa=$(free_port); wb=$(free_port)
  aa=$(free_port); ab=$(free_port)
  "$BIN" run --mqtt 127.0.0.1:$qa --ws 127.0.0.1:$wa --admin 127.0.0.1:$aa --data-dir "$TMP/region-a" \
    --region euc1 --p2p /ip4/127.0.0.1/tcp/$pa --cluster-key "$TMP/cluster.key" 2>"$TMP/region-a.log" &
  local a=$!
  "$BIN" run --mqtt 127.0.0.1:$qb --ws 127.0.0.1:$wb --admin 127.0.0.1:$ab --data-dir "$TMP/region-b" \
    --region ape1 --p2p /ip4/127.0.0.1/tcp/$pb --cluster-key "$TMP/cluster.key" \
    --peer /ip4/127.0.0.1/tcp/$pa 2>"$TMP/region-b.log" &
  local b=$!
  # Linked when region a's admin API lists a connected peer (deadline 30 s).
  python3 - "$aa" <<'PY' || rc=1
import json, sys, time, urllib.request
deadline = time.time() + 30
while True:
    try:
        peers = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api/peers", timeout=2))
        if any(p.get("connected") for p in peers):
            break
    except OSError:
        pass
    if time.time() > deadline:
        sys.exit("the regions did not link")
    time.sleep(0.05)
PY
  [ $rc -eq 0 ] && { python3 "$HERE/interop/paho_roaming.py" 127.0.0.1 "$qa" "$qb" || rc=1; }
  kill "$a" "$b" 2>/dev/null; wait "$a" "$b" 2>/dev/null
  [ $rc -eq 0 ] || { tail -5 "$TMP/region-a.log" "$TMP/region-b.log" >&2; return 1; }
}
check "paho roaming between two regions" paho_roaming

# The daemon is still healthy after all of it.
check "daemon healthy" http_get /health

echo "interop: $PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
