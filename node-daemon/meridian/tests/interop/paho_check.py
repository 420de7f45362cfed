"""paho-mqtt (Python) against a running Meridian: subscribe, publish QoS 1 and 2, receive.

usage: paho_check.py tcp|websockets 3|5 HOST PORT
"""
import sys
import threading

import paho.mqtt.client as mqtt

transport, version, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
proto = mqtt.MQTTv5 if version == "5" else mqtt.MQTTv311
topic = f"interop/paho/{transport}/v{version}"
TIMEOUT = 10


def client(name):
    c = mqtt.Client(
        callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
        client_id=f"paho-{name}-{transport}-{version}",
        protocol=proto,
        transport=transport,
    )
    if transport == "websockets":
        c.ws_set_options(path="/mqtt")
    return c


got = []
done = threading.Event()
subscribed = threading.Event()


def on_message(_c, _u, msg):
    got.append((msg.topic, msg.payload, msg.qos))
    if len(got) == 2:
        done.set()


sub = client("sub")
sub.on_message = on_message
sub.on_subscribe = lambda *a: subscribed.set()
sub.connect(host, port)
sub.loop_start()
sub.subscribe(topic, qos=2)
if not subscribed.wait(TIMEOUT):
    sys.exit("no SUBACK")

pub = client("pub")
pub.connect(host, port)
pub.loop_start()
pub.publish(topic, b"qos1", qos=1).wait_for_publish(TIMEOUT)
pub.publish(topic, b"qos2", qos=2).wait_for_publish(TIMEOUT)

if not done.wait(TIMEOUT):
    sys.exit(f"messages missing: {got}")
assert sorted(got) == sorted([(topic, b"qos1", 1), (topic, b"qos2", 2)]), got
pub.disconnect()
sub.disconnect()
pub.loop_stop()
sub.loop_stop()
print(f"paho {transport} v{version}: ok")
