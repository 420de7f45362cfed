#!/usr/bin/env python3
"""Medians of scripts/bench-baseline's results.jsonl as Markdown tables, with Meridian's ratios
against each peer, and Mosquitto's against the relay floor when it ran; Meridian with one worker
thread (meridian-1w) and with a commit window (meridian-window) get the same ratios as Meridian. Usage: bench-table.py results.jsonl"""

import json
import statistics
import sys
from collections import OrderedDict

PEERS = ["mosquitto", "rumqttd"]
NAMES = {
    "meridian": "Meridian",
    "mosquitto": "Mosquitto",
    "rumqttd": "rumqttd",
    "relay-floor": "relay floor",
    "meridian-1w": "Meridian, 1 worker",
    "meridian-before": "Meridian, before the change",
    "meridian-window": "Meridian, commit window",
    "meridian-nowindow": "Meridian, no commit window",
}
# Whose ratios against the peers are printed.
OURS = ["meridian", "meridian-1w", "meridian-before", "meridian-window", "meridian-nowindow"]


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, digits=0):
    if v is None:
        return "–"
    if digits == 0:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.2f}×"


def get(report, *path):
    x = report
    for p in path:
        if x is None:
            return None
        x = x.get(p)
    return x


def kernel_share(report):
    """The part of the broker's CPU time spent in the kernel (reports from before it was
    recorded have none)."""
    cpu, system = get(report, "broker", "cpu_secs"), get(report, "broker", "cpu_system_secs")
    if not cpu or system is None:
        return None
    return system / cpu


def kernel(m):
    return "" if m["kernel"] is None else f" ({m['kernel']:.0%} kernel)"


def main():
    runs = OrderedDict()
    for line in open(sys.argv[1]):
        r = json.loads(line)
        runs.setdefault(r["scenario"], {}).setdefault(r["broker"], []).append(r["report"])

    flow = [(s, b) for s, b in runs.items() if any(get(x, "messages") for v in b.values() for x in v)]
    conn = [(s, b) for s, b in runs.items() if (s, b) not in flow]

    if flow:
        print("| scenario | broker | delivered msg/s | broker CPU µs/msg | storage written B/msg | latency p50 / p99 µs | lost | dup | runs |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for s, by in flow:
            m = {}
            for b, reps in by.items():
                ok = [x for x in reps if x]
                m[b] = {
                    "rate": med([get(x, "messages", "received_per_sec") for x in ok]),
                    "cpu": med([get(x, "broker", "cpu_us_per_message") for x in ok]),
                    "kernel": med([kernel_share(x) for x in ok]),
                    "disk": med([get(x, "broker", "storage_bytes_per_message") for x in ok]),
                    "p50": med([get(x, "messages", "latency", "p50_us") for x in ok]),
                    "p99": med([get(x, "messages", "latency", "p99_us") for x in ok]),
                    "lost": sum(get(x, "messages", "lost") or 0 for x in ok),
                    "dup": sum(get(x, "messages", "duplicates") or 0 for x in ok),
                    "runs": f"{len(ok)}/{len(reps)}",
                }
                print(
                    f"| {s} | {NAMES.get(b, b)} | {fmt(m[b]['rate'])} | {fmt(m[b]['cpu'], 2)}{kernel(m[b])} | "
                    f"{fmt(m[b]['disk'])} | {fmt(m[b]['p50'])} / {fmt(m[b]['p99'])} | {m[b]['lost']} | {m[b]['dup']} | {m[b]['runs']} |"
                )
            pairs = [(o, p) for o in OURS for p in PEERS + ["relay-floor"]] + [("relay-floor", "mosquitto")]
            for x, y in pairs:
                if x in m and y in m:
                    a, o = m[x], m[y]
                    print(
                        f"| {s} | {NAMES[x]} ÷ {NAMES[y]} | {ratio(a['rate'], o['rate'])} | "
                        f"{ratio(a['cpu'], o['cpu'])} | {ratio(a['disk'], o['disk'])} | "
                        f"{ratio(a['p50'], o['p50'])} / {ratio(a['p99'], o['p99'])} | | | |"
                    )
        print()

    if conn:
        print("| scenario | broker | all up (s) | CONNACK p99 µs | SUBACK p50 / p99 µs | broker RSS / connection (bytes) | failed | runs |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for s, by in conn:
            m = {}
            for b, reps in by.items():
                ok = [x for x in reps if x]
                m[b] = {
                    "up": med([get(x, "connects", "all_up_secs") for x in ok]),
                    "cp99": med([get(x, "connects", "connack", "p99_us") for x in ok]),
                    "s50": med([get(x, "connects", "suback", "p50_us") for x in ok]),
                    "s99": med([get(x, "connects", "suback", "p99_us") for x in ok]),
                    "rss": med([get(x, "broker", "rss_per_connection_bytes") for x in ok]),
                    "failed": sum(get(x, "connects", "failed") or 0 for x in ok),
                    "runs": f"{len(ok)}/{len(reps)}",
                }
                print(
                    f"| {s} | {NAMES.get(b, b)} | {fmt(m[b]['up'], 3)} | {fmt(m[b]['cp99'])} | "
                    f"{fmt(m[b]['s50'])} / {fmt(m[b]['s99'])} | {fmt(m[b]['rss'])} | {m[b]['failed']} | {m[b]['runs']} |"
                )
            for ours in [o for o in OURS if o in m]:
                for p in PEERS:
                    if p in m:
                        a, o = m[ours], m[p]
                        print(
                            f"| {s} | {NAMES[ours]} ÷ {NAMES[p]} | {ratio(a['up'], o['up'])} | {ratio(a['cp99'], o['cp99'])} | "
                            f"{ratio(a['s50'], o['s50'])} / {ratio(a['s99'], o['s99'])} | {ratio(a['rss'], o['rss'])} | | |"
                        )


if __name__ == "__main__":
    main()
