"""paho-mqtt (Python) roaming between two regions of one deployment: a persistent session
(MQTT 3.1.1, clean session 0) left in one region is resumed in the other with what was
published for it meanwhile.

usage: paho_roaming.py HOST PORT_REGION_A PORT_REGION_B
"""
import sys
import threading
import time

import paho.mqtt.client as mqtt

host, port_a, port_b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
TIMEOUT = 20


def client(name, clean_session=True):
    return mqtt.Client(
        callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
        client_id=name,
        protocol=mqtt.MQTTv311,
        clean_session=clean_session,
    )


got = []
probe = threading.Event()
subscribed = threading.Event()


def on_message(_c, _u, msg):
    if msg.topic == "interop/roam/probe":
        probe.set()
    else:
        got.append(msg.payload.decode())


roamer = client("paho-roamer", clean_session=False)
roamer.on_message = on_message
roamer.on_subscribe = lambda *a: subscribed.set()
roamer.connect(host, port_a)
roamer.loop_start()
roamer.subscribe("interop/roam/#", qos=1)
if not subscribed.wait(TIMEOUT):
    sys.exit("no SUBACK in region a")

publisher = client("paho-roam-pub")
publisher.connect(host, port_b)
publisher.loop_start()
# Region b routes to region a once it learned the subscription: probe until one arrives.
deadline = time.time() + TIMEOUT
while not probe.is_set():
    if time.time() > deadline:
        sys.exit("region b never routed to region a")
    publisher.publish("interop/roam/probe", b"?", qos=0)
    probe.wait(0.1)

roamer.disconnect()
roamer.loop_stop()
for i in range(5):
    info = publisher.publish("interop/roam/cmd", f"cmd {i}".encode(), qos=1)
    info.wait_for_publish(TIMEOUT)

# The same client id, in region b: its session, with the five commands.
present = []
connected = threading.Event()
done = threading.Event()


def on_connect(_c, _u, flags, reason, _p):
    present.append(flags.session_present)
    connected.set()


def on_message_b(_c, _u, msg):
    if msg.topic == "interop/roam/cmd":
        got.append(msg.payload.decode())
        if len(got) >= 5:
            done.set()


back = client("paho-roamer", clean_session=False)
back.on_connect = on_connect
back.on_message = on_message_b
back.connect(host, port_b)
back.loop_start()
if not connected.wait(TIMEOUT):
    sys.exit("no CONNACK in region b")
if present != [True]:
    sys.exit(f"session present: {present}")
if not done.wait(TIMEOUT):
    sys.exit(f"received {got}")
back.disconnect()
publisher.disconnect()
if got != [f"cmd {i}" for i in range(5)]:
    sys.exit(f"received {got}")
print("paho roaming ok")
