#!/usr/bin/env python3
"""What a broker keeps per message queued for an absent subscriber, read from its RSS.

A persistent session (mosquitto_sub -c, QoS 1) subscribes to `wanted` and goes away. Then a
publisher writes N times, in one write each, a 16 KiB QoS 0 message nobody wants and a 10-byte
QoS 1 message for the absent session, and waits for its PUBACK. A broker that keeps each queued
message as a part of the read it arrived in keeps the whole read.

Usage: scripts/queued-memory.py PORT BROKER_PID [N]   (N defaults to 5000)
Needs mosquitto_sub (Debian's mosquitto-clients). Works against any MQTT 3.1.1 broker.
"""

import socket
import struct
import subprocess
import sys


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"no VmRSS for pid {pid}")


def remaining_length(n):
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (128 if n else 0))
        if not n:
            return bytes(out)


def string(b):
    return struct.pack(">H", len(b)) + b


def packet(first_byte, body):
    return bytes([first_byte]) + remaining_length(len(body)) + body


def read_exactly(sock, n):
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise SystemExit("the broker closed the connection")
        got += chunk
    return got


def main():
    port, pid = int(sys.argv[1]), int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 5000
    # A persistent session, subscribed at QoS 1, then gone (-E: exit once subscribed).
    subprocess.run(
        ["mosquitto_sub", "-p", str(port), "-i", "queued-memory-absent", "-c", "-q", "1",
         "-t", "wanted", "-E"],
        check=True,
    )
    sock = socket.create_connection(("127.0.0.1", port))
    connect = string(b"MQTT") + bytes([4, 2]) + struct.pack(">H", 60) + string(b"queued-memory-pub")
    sock.sendall(packet(0x10, connect))
    if read_exactly(sock, 4)[0] != 0x20:
        raise SystemExit("no CONNACK")
    before = rss_bytes(pid)
    unwanted = packet(0x30, string(b"unwanted") + b"x" * 16384)
    for i in range(n):
        wanted = packet(0x32, string(b"wanted") + struct.pack(">H", i % 65535 + 1) + b"0123456789")
        sock.sendall(unwanted + wanted)
        # The PUBACK: the message is queued (and stored) by then.
        if read_exactly(sock, 4)[0] != 0x40:
            raise SystemExit("no PUBACK")
    after = rss_bytes(pid)
    print(f"RSS growth per queued message: {(after - before) / n:.0f} bytes ({n} messages)")


if __name__ == "__main__":
    main()
