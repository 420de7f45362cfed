// End-to-end: starts server.mjs on a free loopback port and drives it with MQTT.js clients
// (MQTT 3.1.1 and 5.0) and raw WebSocket connections. Every wait has a deadline; nothing sleeps.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import mqtt from "mqtt";
import WebSocket from "ws";
import { PacketDecoder, encodePacket } from "meridian-mqtt-wasm";

const SERVER = fileURLToPath(new URL("../server.mjs", import.meta.url));
// The runtime that runs the server: this Node by default; e.g. a path to `bun`, or
// "deno run -A", to check the example there (MQTT.js and the test stay on Node).
const RUNTIME = (process.env.MERIDIAN_SERVER_RUNTIME ?? process.execPath).split(" ");
const DEADLINE_MS = 5000;

let server;
let url;
let serverOutput = "";
const clients = new Set();

/** Resolves with `promise`, or rejects once `ms` have passed. */
function within(promise, what, ms = DEADLINE_MS) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

before(async () => {
  server = spawn(RUNTIME[0], [...RUNTIME.slice(1), SERVER, "--port", "0", "--quiet"], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  server.stdout.setEncoding("utf8");
  server.stderr.setEncoding("utf8");
  server.stderr.on("data", (d) => (serverOutput += d));
  url = await within(
    new Promise((resolve, reject) => {
      server.stdout.on("data", (d) => {
        serverOutput += d;
        const m = /on (ws:\/\/\S+)/.exec(serverOutput);
        if (m) resolve(m[1]);
      });
      server.once("exit", (code) => reject(new Error(`server exited (${code}): ${serverOutput}`)));
    }),
    "the server to listen",
    15000,
  );
});

after(async () => {
  await Promise.allSettled([...clients].map((c) => within(c.endAsync(true), "a client to end")));
  const exited = once(server, "exit");
  server.kill("SIGTERM");
  const [code] = await within(exited, "the server to exit");
  assert.equal(code, 0, `server exit code; output:\n${serverOutput}`);
});

/** An MQTT.js client, connected; ended after the tests. */
async function connect(clientId, protocolVersion, options = {}) {
  const client = await within(
    mqtt.connectAsync(url, {
      clientId,
      protocolVersion,
      reconnectPeriod: 0,
      connectTimeout: DEADLINE_MS,
      ...options,
    }),
    `${clientId} to connect`,
  );
  clients.add(client);
  return client;
}

/** Collects a client's messages; `next()` waits for the next one. */
function inbox(client) {
  const queue = [];
  const waiting = [];
  client.on("message", (topic, payload, packet) => {
    const m = { topic, payload: payload.toString(), packet };
    const w = waiting.shift();
    if (w) w(m);
    else queue.push(m);
  });
  return {
    next(what = "a message") {
      if (queue.length) return Promise.resolve(queue.shift());
      return within(new Promise((resolve) => waiting.push(resolve)), what);
    },
    get pending() {
      return queue.length;
    },
  };
}

/** A raw WebSocket speaking the `mqtt` subprotocol, with decoded replies. */
async function rawConnection() {
  const ws = new WebSocket(url, "mqtt");
  await within(once(ws, "open"), "the raw WebSocket to open");
  const decoder = new PacketDecoder(5);
  const packets = [];
  ws.on("message", (data) => packets.push(...decoder.push(data)));
  const closed = new Promise((resolve) => ws.once("close", resolve));
  return { ws, packets, closed };
}

/** A ping round trip through a client's connection: proof that it still works. */
async function roundTrip(client, box, topic) {
  await client.subscribeAsync(topic, { qos: 1 });
  await client.publishAsync(topic, "still here", { qos: 1 });
  const m = await box.next(`the round trip on ${topic}`);
  assert.equal(m.topic, topic);
  assert.equal(m.payload, "still here");
}

for (const version of [4, 5]) {
  describe(`MQTT ${version === 4 ? "3.1.1" : "5.0"}`, () => {
    test("QoS 0, 1 and 2 are delivered at the QoS published", async () => {
      const sub = await connect(`sub-v${version}`, version);
      const box = inbox(sub);
      const granted = await sub.subscribeAsync(`qos/v${version}/#`, { qos: 2 });
      assert.equal(granted[0].qos, 2);
      // The publisher speaks the other version: the broker translates.
      const pub = await connect(`pub-v${version}`, version === 4 ? 5 : 4);
      for (const qos of [0, 1, 2]) {
        await within(pub.publishAsync(`qos/v${version}/${qos}`, `m${qos}`, { qos }), `QoS ${qos} ack`);
        const m = await box.next(`the QoS ${qos} message`);
        assert.equal(m.topic, `qos/v${version}/${qos}`);
        assert.equal(m.payload, `m${qos}`);
        assert.equal(m.packet.qos, qos);
      }
    });

    test("a retained message reaches later subscribers until it is cleared", async () => {
      const topic = `retained/v${version}`;
      const pub = await connect(`retainer-v${version}`, version);
      await pub.publishAsync(topic, "last known", { qos: 1, retain: true });
      const late = await connect(`late-v${version}`, version);
      const box = inbox(late);
      await late.subscribeAsync(topic, { qos: 1 });
      const m = await box.next("the retained message");
      assert.equal(m.payload, "last known");
      assert.equal(m.packet.retain, true);

      await pub.publishAsync(topic, "", { qos: 1, retain: true }); // clears it
      // Live delivery of the clearing message (retain flag off for a live subscriber).
      const cleared = await box.next("the clearing message");
      assert.equal(cleared.payload, "");
      const later = await connect(`later-v${version}`, version);
      const laterBox = inbox(later);
      await later.subscribeAsync([topic, `retained-probe/v${version}`], { qos: 1 });
      await later.publishAsync(`retained-probe/v${version}`, "probe", { qos: 1 });
      const first = await laterBox.next("the probe");
      assert.equal(first.topic, `retained-probe/v${version}`, "no retained message before it");
    });

    test("the will is published when a client vanishes without DISCONNECT", async () => {
      const watcher = await connect(`watcher-v${version}`, version);
      const box = inbox(watcher);
      await watcher.subscribeAsync(`wills/v${version}/#`, { qos: 1 });
      const will = {
        topic: `wills/v${version}/dying`,
        payload: Buffer.from("gone"),
        qos: 1,
        retain: false,
        ...(version === 5 ? { properties: { userProperties: { why: "test" } } } : {}),
      };
      const dying = await connect(`dying-v${version}`, version, { will });
      dying.stream.destroy(); // the connection drops; no DISCONNECT is sent
      const m = await box.next("the will");
      assert.equal(m.topic, will.topic);
      assert.equal(m.payload, "gone");
      if (version === 5) assert.deepEqual({ ...m.packet.properties?.userProperties }, { why: "test" });
    });

    test("a clean DISCONNECT does not publish the will", async () => {
      const watcher = await connect(`quiet-watcher-v${version}`, version);
      const box = inbox(watcher);
      await watcher.subscribeAsync([`quiet-wills/v${version}`, `quiet-probe/v${version}`], { qos: 1 });
      const polite = await connect(`polite-v${version}`, version, {
        will: { topic: `quiet-wills/v${version}`, payload: Buffer.from("no"), qos: 1, retain: false },
      });
      await within(polite.endAsync(), "a clean disconnect");
      await watcher.publishAsync(`quiet-probe/v${version}`, "probe", { qos: 1 });
      const m = await box.next("the probe");
      assert.equal(m.topic, `quiet-probe/v${version}`, "the probe comes first: no will");
    });

    test("a persistent session gets what was published while it was away", async () => {
      const options =
        version === 5 ? { clean: false, properties: { sessionExpiryInterval: 300 } } : { clean: false };
      const id = `persistent-v${version}`;
      const first = await connect(id, version, options);
      await first.subscribeAsync(`offline/v${version}`, { qos: 1 });
      await within(first.endAsync(), "the first session to disconnect");
      clients.delete(first);
      const pub = await connect(`offline-pub-v${version}`, version);
      await pub.publishAsync(`offline/v${version}`, "while you were out", { qos: 1 });
      // Listen before CONNACK: the queued message follows it immediately.
      const again = mqtt.connect(url, { clientId: id, protocolVersion: version, reconnectPeriod: 0, ...options });
      clients.add(again);
      const box = inbox(again);
      const [connack] = await within(once(again, "connect"), "the second session to connect");
      assert.equal(connack.sessionPresent, true);
      const m = await box.next("the queued message");
      assert.equal(m.payload, "while you were out");
    });
  });
}

describe("MQTT 5.0 only", () => {
  test("properties pass through to subscribers", async () => {
    const sub = await connect("props-sub", 5);
    const box = inbox(sub);
    await sub.subscribeAsync("props/#", { qos: 1 });
    const pub = await connect("props-pub", 5);
    await pub.publishAsync("props/x", "{}", {
      qos: 1,
      properties: {
        contentType: "application/json",
        responseTopic: "props/reply",
        correlationData: Buffer.from([1, 2, 3]),
        userProperties: { a: "1", b: ["2", "3"] },
      },
    });
    const m = await box.next("the message with properties");
    const p = m.packet.properties;
    assert.equal(p.contentType, "application/json");
    assert.equal(p.responseTopic, "props/reply");
    assert.deepEqual([...p.correlationData], [1, 2, 3]);
    assert.deepEqual({ ...p.userProperties }, { a: "1", b: ["2", "3"] });
  });

  test("a shared subscription delivers each message to one member", async () => {
    const members = await Promise.all(["w1", "w2"].map((id) => connect(id, 5)));
    const counts = [0, 0];
    let total = 0;
    let done;
    const all = new Promise((resolve) => (done = resolve));
    members.forEach((c, i) =>
      c.on("message", () => {
        counts[i] += 1;
        if (++total === 10) done();
      }),
    );
    await Promise.all(members.map((c) => c.subscribeAsync("$share/workers/jobs", { qos: 1 })));
    const pub = await connect("jobs-pub", 5);
    for (let i = 0; i < 10; i++) await pub.publishAsync("jobs", `job ${i}`, { qos: 1 });
    await within(all, "10 deliveries");
    assert.equal(counts[0] + counts[1], 10);
  });
});

describe("bad input", () => {
  test("a malformed frame closes only its own connection", async () => {
    const good = await connect("bystander", 5);
    const goodBox = inbox(good);

    const raw = await rawConnection();
    raw.ws.send(encodePacket({ type: "connect", clientId: "raw" }, 5));
    await within(
      new Promise((resolve) => raw.ws.on("message", () => raw.packets.length && resolve())),
      "the raw CONNACK",
    );
    assert.equal(raw.packets[0].type, "connack");
    assert.equal(raw.packets[0].reasonCode, 0);
    // A PUBLISH whose topic length runs past the end of the packet.
    raw.ws.send(new Uint8Array([0x30, 3, 0, 9, 0x61]));
    const code = await within(raw.closed, "the malformed connection to close");
    assert.ok(code === 1000 || code === 1005 || code === 1006, `close code ${code}`);
    const disconnect = raw.packets.find((p) => p.type === "disconnect");
    assert.equal(disconnect?.reasonCode, 0x81, "DISCONNECT: malformed packet");

    // Garbage before any CONNECT is refused too.
    const garbage = await rawConnection();
    garbage.ws.send(new Uint8Array([0xff, 0xff, 0xff, 0xff, 0xff]));
    await within(garbage.closed, "the garbage connection to close");

    assert.equal(good.connected, true);
    await roundTrip(good, goodBox, "bystander/alive");
  });

  test("a text frame is refused", async () => {
    const raw = await rawConnection();
    raw.ws.send("CONNECT please");
    const code = await within(raw.closed, "the text-frame connection to close");
    assert.equal(code, 1003);
  });
});
