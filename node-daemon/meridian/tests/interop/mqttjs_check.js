// MQTT.js against a running Meridian: subscribe, publish QoS 1 and 2, receive.
// usage: node mqttjs_check.js URL 4|5     (URL: mqtt://127.0.0.1:1883 or ws://127.0.0.1:8083/mqtt)
const mqtt = require('mqtt');

const [url, version] = process.argv.slice(2);
const protocolVersion = Number(version);
const topic = `interop/mqttjs/${url.split(':')[0]}/v${version}`;
const timer = setTimeout(() => { console.error('timeout'); process.exit(1); }, 15000);

(async () => {
  const opts = (id) => ({ protocolVersion, clientId: `mqttjs-${id}-${Date.now()}`, reconnectPeriod: 0 });
  const sub = await mqtt.connectAsync(url, opts('sub'));
  const got = [];
  const done = new Promise((resolve) => sub.on('message', (t, payload, packet) => {
    got.push([t, payload.toString(), packet.qos]);
    if (got.length === 2) resolve();
  }));
  await sub.subscribeAsync(topic, { qos: 2 });
  const pub = await mqtt.connectAsync(url, opts('pub'));
  await pub.publishAsync(topic, 'qos1', { qos: 1 });
  await pub.publishAsync(topic, 'qos2', { qos: 2 });
  await done;
  got.sort();
  const want = [[topic, 'qos1', 1], [topic, 'qos2', 2]];
  if (JSON.stringify(got) !== JSON.stringify(want)) {
    console.error('unexpected', got);
    process.exit(1);
  }
  await pub.endAsync();
  await sub.endAsync();
  clearTimeout(timer);
  console.log(`mqtt.js ${url} v${version}: ok`);
})().catch((e) => { console.error(e); process.exit(1); });
