#!/usr/bin/env bash
# Three regions of one deployment on this machine: euc1, ape1 and afs1, meshed over libp2p on
# loopback. Ctrl-C stops them all.
#
#   examples/three-regions/run.sh                 # direct links
#   examples/three-regions/run.sh --latency 80    # 80 ms each way on every link (160 ms RTT)
#   examples/three-regions/run.sh --bandwidth 500000   # every link carries 500 kB/s each way
set -euo pipefail
latency=0
bandwidth=0
while [ $# -gt 0 ]; do
    case "$1" in
        --latency) latency="$2"; shift 2 ;;
        --bandwidth) bandwidth="$2"; shift 2 ;;
        -h | --help) sed -n '2,8p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
cargo build --release -p meridian-mqtt --bin meridian
cargo build --release -p meridian-mqtt-tools --example link-proxy
target_dir="$(cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
bin="$target_dir/release/meridian"
proxy="$target_dir/release/examples/link-proxy"

work="$(mktemp -d "${TMPDIR:-/tmp}/meridian-three-regions.XXXXXX")"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

"$bin" keygen --cluster-key "$work/cluster.key" >/dev/null
regions=(euc1 ape1 afs1)
mqtt=(1883 1884 1885)
ws=(8083 8084 8085)
admin=(9101 9102 9103)
p2p=(7101 7102 7103)

# Direct links: ape1 and afs1 list euc1 only, and meet each other by discovery. With
# --latency or --bandwidth, every link goes through a proxy (proxy port -> region port):
# ape1 dials euc1, afs1 dials euc1 and ape1, and discovery is off so that no node dials
# another's own address around its proxy.
discover=()
if [ "$latency" -gt 0 ] || [ "$bandwidth" -gt 0 ]; then
    for pair in 7201:7101 7202:7101 7203:7102; do
        "$proxy" "${pair%:*}" "${pair#*:}" "$latency" "$bandwidth" >/dev/null \
            2>"$work/proxy-${pair%:*}.log" &
        pids+=($!)
    done
    peers_ape1=(/ip4/127.0.0.1/tcp/7201)
    peers_afs1=(/ip4/127.0.0.1/tcp/7202 /ip4/127.0.0.1/tcp/7203)
    discover=(--no-discover)
else
    peers_ape1=(/ip4/127.0.0.1/tcp/7101)
    peers_afs1=(/ip4/127.0.0.1/tcp/7101)
fi

for i in 0 1 2; do
    r="${regions[$i]}"
    args=(run --node-name "$r" --region "$r" --cluster-key "$work/cluster.key"
        --p2p "/ip4/127.0.0.1/tcp/${p2p[$i]}" --mqtt "127.0.0.1:${mqtt[$i]}"
        --ws "127.0.0.1:${ws[$i]}" --admin "127.0.0.1:${admin[$i]}" --data-dir "$work/$r"
        ${discover[@]+"${discover[@]}"})
    case "$r" in
        ape1) for p in "${peers_ape1[@]}"; do args+=(--peer "$p"); done ;;
        afs1) for p in "${peers_afs1[@]}"; do args+=(--peer "$p"); done ;;
    esac
    RUST_LOG="${RUST_LOG:-warn,meridian_daemon=info}" "$bin" "${args[@]}" 2>"$work/$r.log" &
    pids+=($!)
done

# Wait (bounded) until every region sees the other two.
for i in 0 1 2; do
    for _ in $(seq 1 200); do
        n="$(curl -fsS "http://127.0.0.1:${admin[$i]}/api/peers" 2>/dev/null | grep -o '"connected":true' | wc -l || true)"
        [ "$n" -ge 2 ] && break
        sleep 0.1
    done
done

cat <<INFO

Three regions are up (links: ${latency} ms each way, bandwidth ${bandwidth:-0} B/s, 0 = unlimited).
Logs: $work/*.log

  region  MQTT            WebSocket                    admin
  euc1    127.0.0.1:1883  ws://127.0.0.1:8083/mqtt     http://127.0.0.1:9101/api/peers
  ape1    127.0.0.1:1884  ws://127.0.0.1:8084/mqtt     http://127.0.0.1:9102/api/peers
  afs1    127.0.0.1:1885  ws://127.0.0.1:8085/mqtt     http://127.0.0.1:9103/api/peers

Try: subscribe in one region, publish in another:
  mosquitto_sub -h 127.0.0.1 -p 1883 -t 'geo/#' -q 1 -v
  mosquitto_pub -h 127.0.0.1 -p 1885 -t geo/hello -q 1 -m 'from afs1'
and watch the forwards: curl -s http://127.0.0.1:9103/metrics | grep forward

Ctrl-C stops everything.
INFO
wait
