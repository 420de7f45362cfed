"""The clients of the chaos test (node-daemon/meridian/tests/chaos.rs): paho-mqtt (Python),
MQTT 5.0, against three regions of one deployment.

One QoS 2 publisher per region (a persistent session that stays on its node) publishes numbered
messages at a steady rate; three persistent subscribers on `chaos/#` at QoS 2 move between the
regions on the schedule the test drew from its seed, each move ending the old connection one of
three ways: DISCONNECT (normal, the session kept: expiry 3600 s), the socket closed without
DISCONNECT, or the connection left open (a device that changed networks: the old node learns of
it by the takeover). A subscriber is one paho `Client` for the whole run, connected anew at each
move with Clean Start 0, so that its QoS 2 receiver state (packet ids received, PUBREL not yet
seen) follows it as the spec's session state on the client side: paho hands a QoS 2 message to
the application once, at its PUBREL, and answers a PUBREL it does not know with PUBCOMP.

A client whose node is down (killed by the test) or refuses it tries again every 200 ms; a
subscriber goes on trying the node it moved to until its next move.

usage: paho_chaos.py PLAN.json RESULT.json

The plan (written by the test): {"host", "ports": [3], "publish_ms", "interval_ms",
"settle_ms", "moves": [[{"at", "to", "how"}...] per subscriber]}. The script connects every
client, prints `ready` on stdout, waits for a line on stdin (the test's go: time 0 of the
schedule), runs the schedule, then waits (until `settle_ms` past the end of publishing, polling)
for every subscriber to hold every message a publisher got PUBREC or PUBCOMP for, and writes
what happened to RESULT.json: per publisher what it published (and when) and what was
acknowledged; per subscriber every message the application received, in order, its moves and
every CONNACK's Session Present.
"""
import json
import os
import re
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

plan = json.load(open(sys.argv[1]))
result_path = sys.argv[2]
HOST = plan["host"]
PORTS = plan["ports"]
TOPIC_FILTER = "chaos/#"
CONNACK_WAIT = 10.0
RETRY = 0.2

# Every client's thread and the main thread share these, under LOCK.
LOCK = threading.Lock()
STOP = threading.Event()
T0 = None


def now_ms():
    return int((time.monotonic() - T0) * 1000) if T0 is not None else 0


def log(*args):
    print(f"[{now_ms():>7}]", *args, file=sys.stderr, flush=True)


def owe_pubrel(client):
    """Put back, before a connection attempt, the QoS 2 messages paho owes a PUBREL for.

    paho-mqtt (2.2.0) resets its outgoing messages on every connection attempt
    (`_messages_reconnect_reset_out`): a message waiting for PUBCOMP is marked to resend its
    PUBREL, but one already so marked (an earlier attempt was refused, as while its node is
    down) is marked to resend its PUBLISH, with DUP 0. The broker had that packet id released
    (it got the PUBREL), so it takes the PUBLISH for a new message, as MQTT requires, and the
    message is delivered twice. Marked back as waiting for PUBCOMP, the reset gives it its
    PUBREL again.
    """
    with client._out_message_mutex:
        for m in client._out_messages.values():
            if m.state == mqtt.mqtt_ms_resend_pubrel:
                m.state = mqtt.mqtt_ms_wait_for_pubcomp


def connect_props():
    p = Properties(PacketTypes.CONNECT)
    p.SessionExpiryInterval = 3600
    return p


class Peer:
    """One paho client driven by its own thread (paho's loop() called here only)."""

    def __init__(self, name, node):
        self.name = name
        self.node = node
        self.client = mqtt.Client(
            callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
            client_id=name,
            protocol=mqtt.MQTTv5,
        )
        self.client.on_connect = self.on_connect
        self.client.on_disconnect = self.on_disconnect
        self.connected = False
        self.connecting_since = None
        self.first = True
        self.last_try = -1e9
        self.connacks = []  # [t_ms, node, session_present, reason]
        self.events = []  # [t_ms, what]

    def event(self, what):
        with LOCK:
            self.events.append([now_ms(), what])

    def on_connect(self, _c, _u, flags, reason, _p):
        present = bool(flags.session_present)
        with LOCK:
            self.connacks.append([now_ms(), self.node, present, int(reason.value)])
        if reason.is_failure:
            log(self.name, "refused at node", self.node, reason)
            return
        self.connected = True
        self.connecting_since = None

    def on_disconnect(self, _c, _u, _flags, reason, _p):
        if self.connected:
            self.event(f"disconnected from node {self.node}: {reason}")
        self.connected = False

    def try_connect(self):
        """Connect to self.node unless connected or connecting; at most every RETRY s."""
        t = time.monotonic()
        if self.connected:
            return
        if self.connecting_since is not None:
            if t - self.connecting_since < CONNACK_WAIT:
                return
            self.event(f"no CONNACK from node {self.node} in {CONNACK_WAIT} s")
            self.connecting_since = None
        if t - self.last_try < RETRY:
            return
        self.last_try = t
        owe_pubrel(self.client)
        try:
            self.client.connect(
                HOST,
                PORTS[self.node],
                keepalive=30,
                clean_start=self.first,
                properties=connect_props(),
            )
            self.first = False
            self.connecting_since = t
        except OSError as e:
            self.event(f"connect to node {self.node} failed: {e}")

    def pump(self, timeout):
        if self.connected or self.connecting_since is not None:
            rc = self.client.loop(timeout=timeout)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                if self.connected or self.connecting_since is not None:
                    self.event(f"connection to node {self.node} lost: {mqtt.error_string(rc)}")
                self.connected = False
                self.connecting_since = None
        else:
            time.sleep(min(timeout, RETRY))  # pacing between connection attempts


class Publisher(Peer):
    def __init__(self, index):
        super().__init__(f"chaos-pub-{index}", index)
        self.index = index
        self.topic = f"chaos/{index}"
        self.next_n = 0
        self.sent = {}  # n -> t_ms published
        self.by_mid = {}  # paho mid -> n
        self.pubrec = set()
        self.pubcomp = set()
        self.failed = []  # [n, reason] for PUBCOMP with a failure reason
        self.unfinished = set()  # published, no PUBCOMP yet
        self.client.on_publish = self.on_publish
        self.client.on_log = self.on_log
        self.client.max_inflight_messages_set(20)

    def on_log(self, _c, _u, _level, buf):
        # paho has no callback for PUBREC: it logs it (client.py, _handle_pubrec).
        if buf.startswith("Received PUBREC"):
            m = re.search(r"Mid: (\d+)", buf)
            n = self.by_mid.get(int(m.group(1))) if m else None
            if n is not None:
                with LOCK:
                    self.pubrec.add(n)

    def on_publish(self, _c, _u, mid, reason, _p):
        n = self.by_mid.get(mid)
        if n is None:
            return
        with LOCK:
            self.unfinished.discard(n)
            if reason.is_failure:
                self.failed.append([n, str(reason)])
            else:
                self.pubcomp.add(n)

    def run(self):
        start = time.monotonic()
        first_at = self.index * 0.007
        end = plan["publish_ms"] / 1000.0
        interval = plan["interval_ms"] / 1000.0
        tick = 0
        while not STOP.is_set():
            t = time.monotonic() - start
            due = first_at + tick * interval
            if due < end and t >= due:
                tick += 1
                # Published only while connected: the numbers have no gaps.
                if self.connected:
                    n = self.next_n
                    self.next_n += 1
                    info = self.client.publish(self.topic, f"{self.index} {n}".encode(), qos=2)
                    with LOCK:
                        self.by_mid[info.mid] = n
                        self.sent[n] = now_ms()
                        self.unfinished.add(n)
                continue
            self.try_connect()
            wait = max(0.0, due - t) if due < end else 0.05
            self.pump(min(wait, 0.01) if due < end else 0.05)


class Subscriber(Peer):
    def __init__(self, index, moves):
        super().__init__(f"chaos-sub-{index}", index)
        self.index = index
        self.moves = moves
        self.received = []  # [publisher, n, dup, t_ms, node]
        self.moved = []  # [t_ms, from, to, how]
        self.left_open = []  # fds of connections left open (how = "vanish")
        self.client.on_message = self.on_message

    def on_message(self, _c, _u, msg):
        try:
            p, n = msg.payload.decode().split()
            rec = [int(p), int(n), bool(msg.dup), now_ms(), self.node]
        except ValueError:
            rec = [-1, -1, bool(msg.dup), now_ms(), self.node]
        with LOCK:
            self.received.append(rec)

    def subscribe(self):
        done = threading.Event()
        self.client.on_subscribe = lambda *_a: done.set()
        self.client.subscribe(TOPIC_FILTER, qos=2)
        deadline = time.monotonic() + CONNACK_WAIT
        while not done.is_set():
            if time.monotonic() > deadline:
                sys.exit(f"{self.name}: no SUBACK")
            self.pump(0.02)

    def move(self, m):
        how = m["how"]
        # The connections left open at the last move go now.
        for fd in self.left_open:
            os.close(fd)
        self.left_open = []
        if self.connected:
            if how == "disconnect":
                self.client.disconnect()
                deadline = time.monotonic() + 2.0
                while self.connected and time.monotonic() < deadline:
                    self.client.loop(timeout=0.02)
            elif how == "vanish":
                sock = self.client.socket()
                if sock is not None:
                    # paho closes its socket at the next connect; this copy keeps the TCP
                    # connection open, unread, as a device that went out of range does.
                    self.left_open.append(os.dup(sock.fileno()))
            # "close": the next connect closes the socket without DISCONNECT.
        with LOCK:
            self.moved.append([now_ms(), self.node, m["to"], how])
        self.connected = False
        self.connecting_since = None
        self.last_try = -1e9
        self.node = m["to"]

    def run(self):
        start = time.monotonic()
        moves = list(self.moves)
        while not STOP.is_set():
            t = (time.monotonic() - start) * 1000
            if moves and t >= moves[0]["at"]:
                self.move(moves.pop(0))
                continue
            self.try_connect()
            wait = (moves[0]["at"] - t) / 1000 if moves else 0.05
            self.pump(max(0.0, min(wait, 0.02)))
        for fd in self.left_open:
            os.close(fd)


def main():
    global T0
    publishers = [Publisher(i) for i in range(len(PORTS))]
    subscribers = [Subscriber(i, plan["moves"][i]) for i in range(len(PORTS))]
    # Connected and subscribed before time 0.
    for c in subscribers + publishers:
        deadline = time.monotonic() + CONNACK_WAIT
        while not c.connected:
            if time.monotonic() > deadline:
                sys.exit(f"{c.name}: no CONNACK from node {c.node}")
            c.try_connect()
            c.pump(0.02)
    for s in subscribers:
        s.subscribe()
    print("ready", flush=True)
    if not sys.stdin.readline():
        sys.exit("the test went away before go")
    T0 = time.monotonic()
    log("go")
    threads = [threading.Thread(target=c.run, daemon=True) for c in publishers + subscribers]
    for th in threads:
        th.start()

    def missing():
        """(subscriber, publisher, n) for what a subscriber lacks; publishers still waiting."""
        with LOCK:
            pending = sum(len(p.unfinished) for p in publishers)
            acked = [p.pubrec | p.pubcomp for p in publishers]
            out = 0
            for s in subscribers:
                got = [set() for _ in publishers]
                for p, n, *_ in s.received:
                    if 0 <= p < len(got):
                        got[p].add(n)
                out += sum(len(a - g) for a, g in zip(acked, got))
        return out, pending

    end = plan["publish_ms"] / 1000.0
    deadline = end + plan["settle_ms"] / 1000.0
    last_report = 0.0
    while True:
        t = time.monotonic() - T0
        lacking, pending = (None, None)
        if t >= end:
            lacking, pending = missing()
            if lacking == 0 and pending == 0:
                log("every subscriber holds every acknowledged message")
                break
            if t > deadline:
                log(f"deadline: {lacking} deliveries missing, {pending} messages unacknowledged")
                break
            if t - last_report > 5:
                last_report = t
                log(f"waiting: {lacking} deliveries missing, {pending} messages unacknowledged")
        time.sleep(0.05)  # polling the condition above, with the deadline

    STOP.set()
    for th in threads:
        th.join(timeout=10)
    with LOCK:
        result = {
            "elapsed_ms": now_ms(),
            "publishers": [
                {
                    "name": p.name,
                    "published": p.next_n,
                    "sent_ms": [p.sent.get(n) for n in range(p.next_n)],
                    "pubrec": sorted(p.pubrec),
                    "pubcomp": sorted(p.pubcomp),
                    "failed": p.failed,
                    "unfinished": sorted(p.unfinished),
                    "connacks": p.connacks,
                    "events": p.events,
                }
                for p in publishers
            ],
            "subscribers": [
                {
                    "name": s.name,
                    "received": s.received,
                    "moves": s.moved,
                    "connacks": s.connacks,
                    "events": s.events,
                }
                for s in subscribers
            ],
        }
    with open(result_path, "w") as f:
        json.dump(result, f)
    for c in subscribers + publishers:
        try:
            c.client.disconnect()
        except Exception:
            pass
    log("done")


main()
