// End-to-end tests of the edge worker: the worker built by `worker-build --release` runs in
// Miniflare (workerd, the Workers runtime), with its Durable Object on SQLite storage, and
// MQTT.js clients (MQTT 3.1.1 and 5.0) and raw WebSockets talk to it on loopback.
// Every wait has a deadline; nothing sleeps.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import { appendFileSync, copyFileSync, cpSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Miniflare } from "miniflare";
import { workerOptions } from "./worker.mjs";
import mqtt from "mqtt";
import WebSocket from "ws";

const DEADLINE_MS = 10000;

const running = new Set();
const clients = new Set();

after(async () => {
  await Promise.allSettled([...clients].map((c) => within(c.endAsync(true), "a client to end")));
  await Promise.allSettled([...running].map((edge) => edge.stop()));
});

/** Resolves with `promise`, or rejects once `ms` have passed. */
function within(promise, what, ms = DEADLINE_MS) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/**
 * Waits until `cond()` holds (a condition that throws does not hold yet), asking it again
 * every 25 ms, for at most `ms`; a timeout's error ends with `detail()`.
 */
async function until(what, cond, ms = DEADLINE_MS, detail = () => "") {
  const deadline = Date.now() + ms;
  while (!(await cond().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}\n${detail()}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** Waits until the hub object (`eu`) lists `leaf` as a leaf linked to it (`/status`). */
async function leafLinked(edge, leaf, ms = 30000) {
  await until(
    `${leaf} linked as a leaf of the hub`,
    async () => (await edge.status("eu")).body.peers.some((p) => p.node === leaf && p.leaf && p.connected),
    ms,
  );
}

/**
 * The worker in Miniflare on a free loopback port. `persist`: a directory that keeps the
 * Durable Object's storage across instances, as a restart or redeploy keeps it. `users`: the
 * MQTT_USERS secret; without it, `anonymous` sets ALLOW_ANONYMOUS = "true" (as local
 * development does), and `false` leaves it unset. `acl`: the MQTT_ACL secret.
 */
async function startEdge({ persist = false, users, anonymous = true, acl, upstream, linkToken, vars = {} } = {}) {
  // Secrets reach a worker as string bindings, as `wrangler secret put MQTT_USERS` gives them.
  const bindings = { ...vars };
  if (upstream !== undefined) bindings.MERIDIAN_UPSTREAM = upstream;
  if (linkToken !== undefined) bindings.MERIDIAN_LINK_TOKEN = linkToken;
  if (users !== undefined) bindings.MQTT_USERS = users;
  else if (anonymous) bindings.ALLOW_ANONYMOUS = "true";
  if (acl !== undefined) bindings.MQTT_ACL = acl;
  let output = "";
  const watchers = [];
  const mf = new Miniflare({
    ...workerOptions({ bindings, persist }),
    handleRuntimeStdio(stdout, stderr) {
      for (const stream of [stdout, stderr]) {
        stream.setEncoding("utf8");
        stream.on("data", (chunk) => {
          output += chunk;
          for (const w of [...watchers]) w();
        });
      }
    },
  });
  const url = await within(mf.ready, "Miniflare to start", 30000);
  // Its workerd process: the youngest child of this process of that name.
  const workerd = Number(spawnSync("pgrep", ["-n", "-P", String(process.pid), "workerd"], { encoding: "utf8" }).stdout);
  const edge = {
    http: url.href,
    ws: new URL("/mqtt", url).href.replace(/^http/, "ws"),
    /** The same worker, its clients pinned to a location (`/mqtt?location=NAME`). */
    at(location) {
      return { ...edge, ws: `${edge.ws}?location=${location}` };
    },
    /** An object's state (`GET /status?location=NAME`). */
    async status(location) {
      const r = await fetch(new URL(`/status?location=${location}`, url));
      return { code: r.status, body: r.status === 200 ? await r.json() : await r.text() };
    },
    get output() {
      return output;
    },
    /** Waits until the worker's log holds `text`. */
    waitForLog(text, ms = DEADLINE_MS) {
      return within(
        new Promise((resolve) => {
          const check = () => {
            if (!output.includes(text)) return;
            watchers.splice(watchers.indexOf(check), 1);
            resolve();
          };
          watchers.push(check);
          check();
        }),
        `the log line "${text}"`,
        ms,
      );
    },
    async stop() {
      if (!running.delete(edge)) return;
      await mf.dispose();
    },
    /** Its runtime killed outright (kill -9): nothing flushed, no object told. */
    async kill9() {
      assert.ok(workerd > 0, "workerd's pid");
      process.kill(workerd, "SIGKILL");
      running.delete(edge);
      await mf.dispose().catch(() => {});
    },
  };
  running.add(edge);
  return edge;
}

/** An MQTT.js client, connected; ended after the tests. */
async function connect(edge, clientId, protocolVersion, options = {}) {
  const client = await within(
    mqtt.connectAsync(edge.ws, {
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

/**
 * A client connecting with the CONNACK in hand (session present, properties), its messages
 * collected from the start: a resumed session's queue arrives right after CONNACK.
 */
async function connectWithConnack(edge, clientId, protocolVersion, options = {}) {
  const client = mqtt.connect(edge.ws, {
    clientId,
    protocolVersion,
    reconnectPeriod: 0,
    connectTimeout: DEADLINE_MS,
    ...options,
  });
  clients.add(client);
  const box = inbox(client);
  const [connack] = await within(once(client, "connect"), `${clientId} to connect`);
  return { client, box, connack };
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
    /** Every message received and not yet taken. */
    drain() {
      return queue.splice(0);
    },
    /** The next message, within `ms`; a wait that times out takes nothing later. */
    next(what = "a message", ms = DEADLINE_MS) {
      if (queue.length) return Promise.resolve(queue.shift());
      let resolver;
      const arrival = new Promise((resolve) => {
        resolver = resolve;
        waiting.push(resolve);
      });
      return within(arrival, what, ms).catch((e) => {
        const at = waiting.indexOf(resolver);
        if (at >= 0) waiting.splice(at, 1);
        throw e;
      });
    },
  };
}

/**
 * A raw WebSocket speaking the `mqtt` subprotocol. `closed` resolves with the close code;
 * `next()` waits for the next binary message (one MQTT packet from this broker).
 */
async function rawConnection(edge) {
  const ws = new WebSocket(edge.ws, "mqtt");
  const closed = new Promise((resolve) => ws.once("close", (code) => resolve(code)));
  const queue = [];
  const waiting = [];
  ws.on("message", (data) => {
    const packet = Buffer.from(data);
    const w = waiting.shift();
    if (w) w(packet);
    else queue.push(packet);
  });
  await within(once(ws, "open"), "the raw WebSocket to open");
  assert.equal(ws.protocol, "mqtt");
  const next = (what) =>
    queue.length
      ? Promise.resolve(queue.shift())
      : within(new Promise((resolve) => waiting.push(resolve)), what);
  return { ws, closed, next };
}

const CONNACK_ACCEPTED = Buffer.from([0x20, 2, 0, 0]);
const PINGREQ = Buffer.from([0xc0, 0]);
const PINGRESP = Buffer.from([0xd0, 0]);

/** An MQTT 3.1.1 CONNECT: clean session, this client id and keep-alive. */
function connectPacket(clientId, keepAliveSecs) {
  const id = Buffer.from(clientId);
  const body = Buffer.concat([
    Buffer.from([0, 4, ...Buffer.from("MQTT"), 4, 0x02, keepAliveSecs >> 8, keepAliveSecs & 0xff]),
    Buffer.from([id.length >> 8, id.length & 0xff]),
    id,
  ]);
  return Buffer.concat([Buffer.from([0x10, body.length]), body]);
}

test("plain HTTP gets a description, /mqtt without an upgrade 426, other paths 404", async () => {
  const edge = await startEdge();
  const root = await fetch(edge.http);
  assert.equal(root.status, 200);
  assert.match(await root.text(), /MQTT over WebSocket at \/mqtt/);
  assert.equal((await fetch(new URL("/mqtt", edge.http))).status, 426);
  assert.equal((await fetch(new URL("/nothing", edge.http))).status, 404);
  await edge.stop();
});

test("MQTT 5.0 and 3.1.1 clients exchange QoS 0, 1 and 2 messages", async () => {
  const edge = await startEdge();
  for (const [subVersion, pubVersion] of [
    [5, 4],
    [4, 5],
  ]) {
    const sub = await connect(edge, `sub-v${subVersion}`, subVersion);
    const box = inbox(sub);
    const granted = await sub.subscribeAsync(`qos/v${subVersion}/#`, { qos: 2 });
    assert.equal(granted[0].qos, 2);
    const pub = await connect(edge, `pub-v${pubVersion}`, pubVersion);
    for (const qos of [0, 1, 2]) {
      const topic = `qos/v${subVersion}/${qos}`;
      await within(pub.publishAsync(topic, `m${qos}`, { qos }), `the QoS ${qos} acknowledgement`);
      const m = await box.next(`the QoS ${qos} message`);
      assert.equal(m.topic, topic);
      assert.equal(m.payload, `m${qos}`);
      assert.equal(m.packet.qos, qos);
    }
  }
  await edge.stop();
});

test("the broker announces the edge's limits: 64 KiB packets", async () => {
  const edge = await startEdge();
  const { connack } = await connectWithConnack(edge, "limits", 5);
  assert.equal(connack.properties.maximumPacketSize, 64 * 1024);
  await edge.stop();
});

test("retained messages and a persistent session's queue outlive a restart", async () => {
  const dir = mkdtempSync(path.join(tmpdir(), "meridian-edge-"));
  try {
    let edge = await startEdge({ persist: dir });
    const sessionOptions = { clean: false, properties: { sessionExpiryInterval: 3600 } };
    const away = await connect(edge, "away", 5, sessionOptions);
    await away.subscribeAsync("queued/#", { qos: 1 });
    await away.endAsync();
    const pub = await connect(edge, "publisher", 4);
    await pub.publishAsync("retained/state", "on", { qos: 1, retain: true });
    await pub.publishAsync("queued/1", "while you were away", { qos: 1 });
    await pub.endAsync();
    await edge.stop();

    // A new runtime on the same storage: the Durable Object starts from what it stored.
    edge = await startEdge({ persist: dir });
    const { box, connack } = await connectWithConnack(edge, "away", 5, sessionOptions);
    assert.equal(connack.sessionPresent, true);
    const queued = await box.next("the queued message");
    assert.equal(queued.topic, "queued/1");
    assert.equal(queued.payload, "while you were away");

    const late = await connect(edge, "late", 4);
    const lateBox = inbox(late);
    await late.subscribeAsync("retained/#", { qos: 1 });
    const retained = await lateBox.next("the retained message");
    assert.equal(retained.topic, "retained/state");
    assert.equal(retained.payload, "on");
    assert.equal(retained.packet.retain, true);
    await edge.stop();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the will is published when a connection drops without DISCONNECT", async () => {
  const edge = await startEdge();
  const watcher = await connect(edge, "watcher", 5);
  const box = inbox(watcher);
  await watcher.subscribeAsync("wills/#", { qos: 1 });
  const will = { topic: "wills/dying", payload: Buffer.from("gone"), qos: 1, retain: false };
  const dying = await connect(edge, "dying", 4, { will });
  dying.stream.destroy(); // the connection drops; no DISCONNECT is sent
  const m = await box.next("the will");
  assert.equal(m.topic, "wills/dying");
  assert.equal(m.payload, "gone");
  await edge.stop();
});

test("a delayed will goes out on the alarm when no client is connected", async () => {
  const dir = mkdtempSync(path.join(tmpdir(), "meridian-edge-"));
  try {
    const edge = await startEdge({ persist: dir });
    const sessionOptions = { clean: false, properties: { sessionExpiryInterval: 3600 } };
    const watcher = await connect(edge, "watcher", 5, sessionOptions);
    await watcher.subscribeAsync("wills/#", { qos: 1 });
    await watcher.endAsync();
    const will = {
      topic: "wills/late",
      payload: Buffer.from("gone a second ago"),
      qos: 1,
      retain: false,
      properties: { willDelayInterval: 1 },
    };
    const dying = await connect(edge, "dying", 5, {
      will,
      properties: { sessionExpiryInterval: 1 },
    });
    dying.stream.destroy();
    // Nobody is connected, and the object runs no timer: only its alarm wakes the broker,
    // which then sends the will and ends the session a second later.
    await edge.waitForLog('SessionEnded { client_id: "dying" }');
    const { box, connack } = await connectWithConnack(edge, "watcher", 5, sessionOptions);
    assert.equal(connack.sessionPresent, true);
    const m = await box.next("the delayed will, queued for the watcher");
    assert.equal(m.topic, "wills/late");
    assert.equal(m.payload, "gone a second ago");
    await edge.stop();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a client that goes silent is closed when its keep-alive runs out", async () => {
  const edge = await startEdge();
  const { ws, closed, next } = await rawConnection(edge);
  ws.send(connectPacket("silent", 1));
  assert.deepEqual(await next("CONNACK"), CONNACK_ACCEPTED);
  // Alive while it speaks: a ping is answered.
  ws.send(PINGREQ);
  assert.deepEqual(await next("PINGRESP"), PINGRESP);
  // Then silence; the broker closes it (1.5 x 1 s after the ping).
  await within(closed, "the silent client to be closed");
  await edge.stop();
});

test("bad input closes only the connection that sent it", async () => {
  const edge = await startEdge();
  const sub = await connect(edge, "bystander", 5);
  const box = inbox(sub);
  await sub.subscribeAsync("still/#", { qos: 1 });

  // Connected first (keep-alive 60 s), so that only the garbage can end the connection.
  const garbage = await rawConnection(edge);
  garbage.ws.send(connectPacket("garbage", 60));
  assert.deepEqual(await garbage.next("CONNACK"), CONNACK_ACCEPTED);
  garbage.ws.send(Buffer.from([0xf0, 0xff, 0xff, 0xff, 0xff, 0x7f]));
  await within(garbage.closed, "the garbage sender to be closed");

  const text = await rawConnection(edge);
  text.ws.send("CONNECT, but as text");
  assert.equal(await within(text.closed, "the text sender to be closed"), 1003);

  const pub = await connect(edge, "publisher", 4);
  await pub.publishAsync("still/here", "yes", { qos: 1 });
  const m = await box.next("a message after the bad input");
  assert.equal(m.payload, "yes");
  await edge.stop();
});

test("with MQTT_USERS set, only the listed users get in, with their passwords", async () => {
  const edge = await startEdge({ users: "# devices\nalice:s3cret:token\nbob:builder\n" });
  const refused = (clientId, protocolVersion, options) =>
    within(
      mqtt
        .connectAsync(edge.ws, { clientId, protocolVersion, reconnectPeriod: 0, ...options })
        .then(
          () => assert.fail(`${clientId} got in`),
          (error) => error.code,
        ),
      `${clientId} to be refused`,
    );
  // MQTT 5.0: 0x86 bad user name or password, 0x87 not authorized; 3.1.1: 4 and 5.
  assert.equal(await refused("wrong-v5", 5, { username: "alice", password: "s3cret" }), 0x86);
  assert.equal(await refused("wrong-v4", 4, { username: "bob", password: "s3cret:token" }), 4);
  assert.equal(await refused("stranger", 5, { username: "carol", password: "builder" }), 0x86);
  assert.equal(await refused("anonymous-v5", 5, {}), 0x87);
  assert.equal(await refused("anonymous-v4", 4, {}), 5);

  const alice = await connect(edge, "alice-1", 5, { username: "alice", password: "s3cret:token" });
  const box = inbox(alice);
  await alice.subscribeAsync("for/alice", { qos: 1 });
  const bob = await connect(edge, "bob-1", 4, { username: "bob", password: "builder" });
  await bob.publishAsync("for/alice", "hi", { qos: 1 });
  assert.equal((await box.next("bob's message")).payload, "hi");
  await edge.stop();
});

for (const [users, logged] of [
  ["alice:s3cret\nbob\n", "MQTT_USERS line 2: expected `user:password`"],
  ["# nobody yet\n", "MQTT_USERS is set but lists no user"],
]) {
  test(`MQTT_USERS "${users.trim()}" keeps the broker closed and the log says why`, async () => {
    const edge = await startEdge({ users });
    const ws = new WebSocket(edge.ws, "mqtt");
    const [, response] = await within(once(ws, "unexpected-response"), "the refusal");
    assert.equal(response.statusCode, 503);
    await edge.waitForLog(logged);
    await edge.stop();
  });
}

test("without MQTT_USERS or ALLOW_ANONYMOUS every client is refused, and the log says how to open it", async () => {
  const edge = await startEdge({ anonymous: false });
  const refused = (protocolVersion) =>
    within(
      mqtt.connectAsync(edge.ws, { clientId: `c${protocolVersion}`, protocolVersion, reconnectPeriod: 0 }).then(
        () => assert.fail("an anonymous client got in"),
        (error) => error.code,
      ),
      "the refusal",
    );
  assert.equal(await refused(5), 0x87);
  assert.equal(await refused(4), 5);
  await edge.waitForLog("MQTT_USERS is not set: every client is refused");
  await edge.stop();
});

const ACL = `
[acl]
default = "allow"

[[acl.rules]]
permission = "deny"
action = "subscribe"
topic = "secret/#"

[[acl.rules]]
permission = "deny"
action = "publish"
topic = "readonly/#"
`;

test("MQTT_ACL rules, in the daemon's [acl] format, apply at the edge", async () => {
  const edge = await startEdge({ acl: ACL });
  const watcher = await connect(edge, "watcher", 5);
  // MQTT.js rejects a SUBACK whose only reason code is a failure.
  const suback = await watcher.subscribeAsync("secret/#", { qos: 1 }).then(
    () => assert.fail("secret/# was granted"),
    (error) => error.packet,
  );
  assert.deepEqual(suback.granted, [0x87], "a filter wholly in denied topics is refused");
  const box = inbox(watcher);
  await watcher.subscribeAsync("#", { qos: 1 });
  const pub = await connect(edge, "pub", 4);
  await pub.publishAsync("secret/plans", "no", { qos: 1 });
  await pub.publishAsync("readonly/state", "no", { qos: 1 });
  await pub.publishAsync("open/news", "yes", { qos: 1 });
  const m = await box.next("the allowed message");
  assert.deepEqual([m.topic, m.payload], ["open/news", "yes"], "denied topics never arrive");
  await edge.stop();
});

test("a bad MQTT_ACL keeps the broker closed and the log names the line", async () => {
  const edge = await startEdge({ acl: ACL.replace('topic = "secret/#"', 'topic = "secret/#/x"') });
  const ws = new WebSocket(edge.ws, "mqtt");
  const [, response] = await within(once(ws, "unexpected-response"), "the refusal");
  assert.equal(response.statusCode, 503);
  await edge.waitForLog("MQTT_ACL: TOML parse error at line 5");
  await edge.stop();
});

test("a client's WebSocket Close is answered at once", async () => {
  const edge = await startEdge();
  const conn = await rawConnection(edge);
  conn.ws.send(connectPacket("closer", 60));
  assert.deepEqual(await conn.next("CONNACK"), CONNACK_ACCEPTED);
  conn.ws.send(Buffer.from([0xe0, 0])); // DISCONNECT
  conn.ws.close(1000, "bye");
  // Without an answer the ws library waits 30 s and reports 1006.
  assert.equal(await within(conn.closed, "the broker's Close", 5000), 1000);
  await edge.stop();
});

/** An MQTT 3.1.1 packet: the fixed header's first byte, then the body (under 128 bytes). */
function packet(first, ...parts) {
  const body = Buffer.concat(parts.map((p) => Buffer.from(p)));
  assert.ok(body.length < 128);
  return Buffer.concat([Buffer.from([first, body.length]), body]);
}
const u16 = (n) => [n >> 8, n & 0xff];
const mqttString = (text) => [...u16(Buffer.byteLength(text)), ...Buffer.from(text)];
const ack = (first, id) => packet(first, u16(id));
const PUBACK = 0x40, PUBREC = 0x50, PUBREL = 0x62, PUBCOMP = 0x70;

test("clients stay connected while the object hibernates; exchanges that span it complete once", async (t) => {
  const edge = await startEdge();
  // A 3.1.1 subscriber and publisher speaking raw MQTT, to hold acknowledgements across the
  // hibernation; no keep-alive, so that nothing they do wakes the object.
  const sub = await rawConnection(edge);
  sub.ws.send(connectPacket("hib-sub", 0));
  assert.deepEqual(await sub.next("CONNACK"), CONNACK_ACCEPTED);
  sub.ws.send(packet(0x82, u16(1), mqttString("hib/#"), [2]));
  assert.deepEqual(await sub.next("SUBACK"), packet(0x90, u16(1), [2]));
  const pub = await rawConnection(edge);
  pub.ws.send(connectPacket("hib-pub", 0));
  assert.deepEqual(await pub.next("CONNACK"), CONNACK_ACCEPTED);
  // A silent client with a 24 s keep-alive: the broker's deadline for it (36 s) rings the
  // object's alarm after the object has been quiet long enough to be evicted (10 s in workerd,
  // after the checkpoint it writes 2 s into the quiet), and so builds it again.
  const waker = await rawConnection(edge);
  waker.ws.send(connectPacket("hib-waker", 24));
  assert.deepEqual(await waker.next("CONNACK"), CONNACK_ACCEPTED);
  // An MQTT.js client too, which must never see its connection drop.
  const watcher = await connect(edge, "hib-watcher", 5, { keepalive: 0 });
  const box = inbox(watcher);
  let reconnects = 0;
  watcher.on("connect", () => reconnects++);
  await watcher.subscribeAsync("hib/#", { qos: 1 });

  // QoS 2 from the publisher: PUBREC, and no PUBREL yet. QoS 1 delivered, not acknowledged.
  pub.ws.send(packet(0x34, mqttString("hib/two"), u16(7), Buffer.from("exactly once")));
  assert.deepEqual(await pub.next("PUBREC"), ack(PUBREC, 7));
  pub.ws.send(packet(0x32, mqttString("hib/one"), u16(8), Buffer.from("at least once")));
  assert.deepEqual(await pub.next("PUBACK"), ack(PUBACK, 8));
  const delivered = [await sub.next("the QoS 2 message"), await sub.next("the QoS 1 message")];
  assert.equal(delivered[0][0], 0x34);
  assert.equal(delivered[1][0], 0x32);
  const idOf = (p) => p.readUInt16BE(4 + p.readUInt16BE(2));
  const [twoId, oneId] = delivered.map(idOf);
  assert.equal((await box.next("the watcher's copy")).topic, "hib/two");
  assert.equal((await box.next("the watcher's copy")).topic, "hib/one");

  // Quiet: the object is evicted from memory, its sockets kept; the alarm builds it again,
  // which resumes every connection from storage.
  await edge.waitForLog("of 4 open connections resumed", 90000);
  assert.match(edge.output, /4 of 4 open connections resumed/);
  assert.equal(waker.ws.readyState, WebSocket.OPEN, "its keep-alive counts from the wake-up");

  // The exchanges complete on the same connections, each message once.
  const started = performance.now();
  pub.ws.send(ack(PUBREL, 7));
  assert.deepEqual(await pub.next("PUBCOMP after the wake-up"), ack(PUBCOMP, 7));
  t.diagnostic(`first answer after the wake-up: ${(performance.now() - started).toFixed(1)} ms`);
  sub.ws.send(ack(PUBREC, twoId));
  assert.deepEqual(await sub.next("PUBREL"), ack(PUBREL, twoId));
  sub.ws.send(ack(PUBCOMP, twoId));
  sub.ws.send(ack(PUBACK, oneId));
  await watcher.publishAsync("hib/after", "still here", { qos: 1 });
  const after = await sub.next("a message published after the wake-up");
  assert.equal(after[0], 0x32, "the next packet is the new message, not a copy of an old one");
  assert.match(after.toString("latin1"), /hib\/after/);
  assert.equal((await box.next("the watcher's own message")).topic, "hib/after");
  assert.equal(reconnects, 0, "MQTT.js kept its connection");
  await edge.stop();
});

test("client ids the broker assigns differ from one start to the next", async () => {
  const assigned = [];
  for (let start = 0; start < 2; start++) {
    const edge = await startEdge();
    const { client, connack } = await connectWithConnack(edge, "", 5);
    assigned.push(connack.properties.assignedClientIdentifier);
    await client.endAsync();
    await edge.stop();
  }
  assert.ok(assigned.every((id) => typeof id === "string" && id.length > 0), String(assigned));
  assert.notEqual(assigned[0], assigned[1]);
});

/** A loopback port nobody listens on now. */
async function freePort() {
  const server = createServer();
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address();
  server.close();
  await once(server, "close");
  return port;
}

test("clients are placed by location: pinned with ?location, unknown ones refused", async () => {
  // Without a region to link to, the worker runs one object unless told otherwise.
  const single = await startEdge();
  const refused = await single.status("eu");
  assert.equal(refused.code, 404);
  assert.match(refused.body, /one broker/);
  await single.stop();

  const edge = await startEdge({ vars: { PLACEMENT: "continent", EDGE_LOCATIONS: "DE=eu-central" } });
  const unknown = await edge.status("mars");
  assert.equal(unknown.code, 404);
  assert.match(unknown.body, /unknown location "mars"; known: .*eu-central/);
  const ws = new WebSocket(`${edge.at("mars").ws}`, "mqtt");
  const [, response] = await within(once(ws, "unexpected-response"), "the refusal of an unknown location");
  assert.equal(response.statusCode, 404);
  // Each location is an object of its own (with nothing to link them, each a broker alone).
  const eu = await connect(edge.at("eu-central"), "in-frankfurt", 5);
  const as = await connect(edge.at("as"), "in-tokyo", 4);
  assert.equal((await edge.status("eu-central")).body.connections, 1);
  assert.equal((await edge.status("as")).body.connections, 1);
  assert.equal((await edge.status("eu-central")).body.linked, false);
  await Promise.all([eu.endAsync(), as.endAsync()]);
  await edge.stop();
});

/**
 * A `meridian` daemon (test.sh builds it and names it in MERIDIAN_BIN): one region of a mesh,
 * with an edge-link listener that takes `token`. Stopped after the tests.
 */
async function startRegion(token) {
  const bin = process.env.MERIDIAN_BIN;
  assert.ok(bin, "MERIDIAN_BIN names the meridian binary (edge-worker/test.sh sets it)");
  const dir = mkdtempSync(path.join(tmpdir(), "meridian-region-"));
  const key = path.join(dir, "cluster.key");
  const keygen = spawnSync(bin, ["keygen", "--cluster-key", key]);
  assert.equal(keygen.status, 0, String(keygen.stderr));
  const tokens = path.join(dir, "edge-tokens");
  writeFileSync(tokens, `# edge objects\n${token}\n`);
  const [mqttPort, admin, p2p, edgeLink] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const args = [
    "run",
    "--mqtt", `127.0.0.1:${mqttPort}`,
    "--admin", `127.0.0.1:${admin}`,
    "--data-dir", path.join(dir, "data"),
    "--region", "euc1",
    "--p2p", `/ip4/127.0.0.1/tcp/${p2p}`,
    "--cluster-key", key,
    "--edge-link", `127.0.0.1:${edgeLink}`,
    "--edge-token-file", tokens,
  ];
  let log = "";
  let daemon;
  const launch = () => {
    daemon = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
    for (const s of [daemon.stdout, daemon.stderr]) s.setEncoding("utf8").on("data", (c) => (log += c));
  };
  launch();
  const region = {
    mqtt: `mqtt://127.0.0.1:${mqttPort}`,
    upstream: `ws://127.0.0.1:${edgeLink}/link`,
    get log() {
      return log;
    },
    async api(pathname) {
      const r = await fetch(`http://127.0.0.1:${admin}${pathname}`);
      assert.equal(r.status, 200, pathname);
      return r.json();
    },
    async metrics() {
      return (await fetch(`http://127.0.0.1:${admin}/metrics`)).text();
    },
    /** Waits until `cond()` holds; a timeout reports the daemon's log. */
    until(what, cond) {
      return until(what, cond, 30000, () => log);
    },
    /** Killed outright (kill -9): nothing flushed, nothing said to anyone. */
    async kill9() {
      const exited = once(daemon, "exit");
      daemon.kill("SIGKILL");
      await within(exited, "the daemon to die");
    },
    /** Started again on the same data directory and ports. */
    async restart() {
      launch();
      await region.ready();
    },
    /** Ready once its MQTT listener (bound last) accepts. */
    async ready() {
      await region.until("the daemon to listen", async () => {
        const c = await mqtt.connectAsync(region.mqtt, { reconnectPeriod: 0, connectTimeout: 1000 });
        await c.endAsync();
        return true;
      });
    },
    async stop() {
      if (daemon.exitCode === null) {
        daemon.kill("SIGTERM");
        await within(once(daemon, "exit"), "the daemon to stop").catch(() => daemon.kill("SIGKILL"));
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
  await region.ready();
  return region;
}

test("an edge object linked to its region exchanges messages with it, towards interest only", async () => {
  const token = "edge-link-token-0123456789";
  const region = await startRegion(token);
  try {
    // Linked, the worker places clients by location: one object each, both leaves of the region.
    const edge = await startEdge({ upstream: region.upstream, linkToken: token });
    // An edge subscriber in Europe: its object starts, links to the region, and the region
    // wants what it wants.
    const edgeSub = await connect(edge.at("eu"), "edge-sub", 5);
    const edgeBox = inbox(edgeSub);
    await edgeSub.subscribeAsync("edge/#", { qos: 2 });
    await until("the edge object linked to the region", async () => (await edge.status("eu")).body.linked === true, 30000);
    await region.until("the edge subscriber's filter in the region's route set", async () =>
      (await region.api("/api/routes")).includes("edge/#"),
    );
    const peers = await region.api("/api/peers");
    assert.ok(peers.some((p) => p.leaf === true && p.peer_id === "edge-eu"), JSON.stringify(peers));
    const status = await edge.status("eu");
    assert.equal(status.code, 200);
    assert.equal(status.body.node, "edge-eu");
    assert.equal(status.body.linked, true);
    assert.equal(status.body.connections, 1);
    assert.ok(status.body.hub.length > 10, JSON.stringify(status.body));

    // From a client of the region to the edge.
    const regionPub = await within(mqtt.connectAsync(region.mqtt, { clientId: "region-pub", reconnectPeriod: 0 }), "a region client");
    clients.add(regionPub);
    await regionPub.publishAsync("edge/1", "from the region", { qos: 1 });
    const m = await edgeBox.next("the region's message at the edge");
    assert.deepEqual([m.topic, m.payload, m.packet.qos], ["edge/1", "from the region", 1]);

    // From the edge to a subscriber of the region, once the edge knows the region wants it.
    const regionSub = await within(mqtt.connectAsync(region.mqtt, { clientId: "region-sub", reconnectPeriod: 0 }), "a region client");
    clients.add(regionSub);
    const regionBox = inbox(regionSub);
    await regionSub.subscribeAsync("up/#", { qos: 2 });
    // A publisher in Asia, at another object: through the region to the region's subscriber,
    // and to the European edge subscriber.
    const edgePub = await connect(edge.at("as"), "edge-pub", 4);
    let got;
    for (let attempt = 0; !got; attempt++) {
      await edgePub.publishAsync("up/1", `from the edge ${attempt}`, { qos: 1 });
      got = await regionBox.next("the edge's message in the region", 1000).catch(() => undefined);
      assert.ok(got || attempt < 20, "the edge's messages never reached the region");
    }
    assert.equal(got.topic, "up/1");
    // QoS 0, 1 and 2, each way, each once and in order.
    for (const qos of [0, 1, 2]) {
      await edgePub.publishAsync("up/q", `edge qos ${qos}`, { qos });
      await regionPub.publishAsync("edge/q", `region qos ${qos}`, { qos });
    }
    const fromEdge = [];
    while (fromEdge.length < 3) {
      const m = await regionBox.next("the edge's QoS 0, 1 and 2 in the region");
      if (m.topic === "up/q") fromEdge.push([m.payload, m.packet.qos]);
    }
    assert.deepEqual(fromEdge, [["edge qos 0", 0], ["edge qos 1", 1], ["edge qos 2", 2]]);
    const toEdge = [];
    while (toEdge.length < 3) {
      const m = await edgeBox.next("the region's QoS 0, 1 and 2 at the edge");
      toEdge.push([m.topic, m.payload, m.packet.qos]);
    }
    assert.deepEqual(toEdge, [["edge/q", "region qos 0", 0], ["edge/q", "region qos 1", 1], ["edge/q", "region qos 2", 2]]);
    await edgePub.publishAsync("edge/from-asia", "via the region", { qos: 1 });
    const m2 = await edgeBox.next("the Asian edge's message in Europe");
    assert.deepEqual([m2.topic, m2.payload], ["edge/from-asia", "via the region"]);

    // What nobody in the region wants stays at the edge.
    // Counted at both ends: what the region took from the Asian object, what that object sent.
    const fromAsia = async () => [
      (await region.api("/api/peers")).find((p) => p.peer_id === "edge-as").forwarded_from,
      (await edge.status("as")).body.peers[0].forwarded_to,
    ];
    const leafBefore = await fromAsia();
    for (let i = 0; i < 5; i++) await edgePub.publishAsync("nobody/wants/this", "stay", { qos: 1 });
    await regionPub.publishAsync("edge/2", "after", { qos: 1 });
    assert.equal((await edgeBox.next("a later message")).topic, "edge/2");
    assert.deepEqual(await fromAsia(), leafBefore, "nothing unwanted crossed");
    await Promise.all([edgeSub.endAsync(), edgePub.endAsync(), regionPub.endAsync(), regionSub.endAsync()]);
    await edge.stop();

    // A wrong token is refused by the region, and the edge says so.
    const refused = await startEdge({ upstream: region.upstream, linkToken: "not-the-token-0123456789" });
    const lone = await connect(refused, "lone", 5);
    await until("the refusal at the edge", async () => /401/.test((await refused.status("eu")).body.link_error ?? ""), 30000);
    assert.equal((await refused.status("eu")).body.linked, false);
    await region.until("the refusal counted", async () =>
      /meridian_edge_links_refused_total\{reason="token"\} [1-9]/.test(await region.metrics()),
    );
    await lone.endAsync();
    await refused.stop();
  } finally {
    await region.stop();
  }
});

test("a region killed and restarted, and an edge object restarted, with backlogs both ways: each message once, in order", async () => {
  const token = "edge-link-token-0123456789";
  const region = await startRegion(token);
  const dir = mkdtempSync(path.join(tmpdir(), "meridian-edge-"));
  const persistent = { clean: false, properties: { sessionExpiryInterval: 3600 } };
  try {
    let edge = await startEdge({ persist: dir, upstream: region.upstream, linkToken: token });
    // A persistent subscriber in the region, one at the edge; each side learns the other's
    // interest.
    let regionSub = await within(
      mqtt.connectAsync(region.mqtt, { clientId: "region-sub", protocolVersion: 5, reconnectPeriod: 0, ...persistent }),
      "the region's subscriber",
    );
    await regionSub.subscribeAsync("up/#", { qos: 1 });
    await regionSub.endAsync();
    const edgeSub = await connect(edge.at("eu"), "edge-sub", 5, persistent);
    const edgeBox = inbox(edgeSub);
    await edgeSub.subscribeAsync("down/#", { qos: 1 });
    await region.until("the edge's interest in the region", async () =>
      (await region.api("/api/routes")).includes("down/#"),
    );
    let edgePub = await connect(edge.at("eu"), "edge-pub", 5);
    // The edge knows the region wants up/# once a first message gets there.
    await region.until("the edge to learn the region's interest", async () => {
      await edgePub.publishAsync("up/prime", "x", { qos: 1 });
      return ((await region.api("/api/peers")).find((p) => p.leaf)?.forwarded_from ?? 0) > 0;
    });

    // A region client publishes QoS 1 and 2 for the edge, and the region dies the moment the
    // last is acknowledged, with what it has not forwarded yet in its outbox.
    const regionPub = await within(mqtt.connectAsync(region.mqtt, { clientId: "region-pub", reconnectPeriod: 0 }), "a region client");
    clients.add(regionPub);
    for (let i = 1; i <= 8; i++) await regionPub.publishAsync("down/x", `region ${i}`, { qos: 1 + (i % 2) });
    await region.kill9();
    // The edge's messages, QoS 1 and 2, wait in its outbox, kept in its storage.
    for (let i = 1; i <= 6; i++) await edgePub.publishAsync("up/x", `edge ${i}`, { qos: 1 + (i % 2) });
    await edgePub.endAsync();
    await edgeSub.endAsync();
    // The edge object restarts too, with that backlog in its storage.
    await edge.stop();
    edge = await startEdge({ persist: dir, upstream: region.upstream, linkToken: token });
    const { client: again, box: againBox } = await connectWithConnack(edge.at("eu"), "edge-sub", 5, persistent);
    await region.restart();
    await until("the edge object linked to the region again", async () => (await edge.status("eu")).body.linked === true, 60000);
    // The region's subscriber gets the edge's messages, once each, in order.
    // Its queue arrives right after CONNACK: collected from the start.
    regionSub = mqtt.connect(region.mqtt, { clientId: "region-sub", protocolVersion: 5, reconnectPeriod: 0, ...persistent });
    clients.add(regionSub);
    const regionBox = inbox(regionSub);
    await within(once(regionSub, "connect"), "the region's subscriber again");
    const got = [];
    for (;;) {
      const m = await regionBox.next("the edge's backlog in the region", 30000).catch(async (e) => {
        // What both ends saw, for the failure's report.
        const status = JSON.stringify((await edge.status("eu")).body);
        const peers = JSON.stringify(await region.api("/api/peers"));
        e.message += `\nreceived ${JSON.stringify(got)}\nedge ${status}\nregion peers ${peers}\n` +
          `edge log:\n${edge.output.slice(-3000)}\nregion log:\n${region.log.slice(-5000)}`;
        throw e;
      });
      if (m.topic === "up/prime") continue;
      got.push(m.payload);
      if (got.length === 6) break;
    }
    assert.deepEqual(got, ["edge 1", "edge 2", "edge 3", "edge 4", "edge 5", "edge 6"]);
    // The edge's subscriber gets the region's, once each, in order: those that crossed before
    // the region died, then the rest from its outbox.
    const down = edgeBox.drain().map((m) => m.payload);
    while (down.length < 8) down.push((await againBox.next("the region's backlog at the edge", 30000)).payload);
    assert.deepEqual(down, Array.from({ length: 8 }, (_, i) => `region ${i + 1}`));
    // And the restarted region reaches the edge again.
    await region.until("the edge's interest in the restarted region", async () =>
      (await region.api("/api/routes")).includes("down/#"),
    );
    const regionPub2 = await within(mqtt.connectAsync(region.mqtt, { clientId: "region-pub", reconnectPeriod: 0 }), "a region client");
    clients.add(regionPub2);
    await regionPub2.publishAsync("down/x", "after", { qos: 1 });
    assert.equal((await againBox.next("the region's message after its restart")).payload, "after");
    for (const box of [regionBox, againBox]) {
      const extra = await box.next("nothing more", 1000).catch(() => null);
      assert.equal(extra, null, "nothing twice");
    }
    await Promise.all([regionSub.endAsync(), regionPub2.endAsync(), again.endAsync()]);
    await edge.stop();
  } finally {
    await region.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});


/** The messages `box` gets until it has `count` that are not primers, in order. */
async function collect(box, count, what, ms = DEADLINE_MS) {
  const got = [];
  while (got.length < count) {
    const m = await box.next(what, ms);
    if (!m.topic.endsWith("/prime")) got.push(m);
  }
  return got;
}

/**
 * Publishes on `topic`/prime from `publisher` until `box` gets one: the publisher's object has
 * learnt, through its hub, that someone there wants the topic.
 */
async function prime(publisher, topic, box, what) {
  for (let attempt = 0; ; attempt++) {
    await publisher.publishAsync(`${topic}/prime`, "prime", { qos: 1 });
    const m = await box.next(what, 500).catch(() => undefined);
    if (m) return;
    assert.ok(attempt < 40, `${what}: never arrived`);
  }
}

test("edge-only: objects linked through a hub object exchange QoS 0, 1 and 2 once, towards interest only", async () => {
  // No daemon: the object of `eu` is the hub, every other location's object its leaf.
  const edge = await startEdge({ vars: { EDGE_HUB: "eu" } });
  const naSub = await connect(edge.at("na"), "na-sub", 5);
  const naBox = inbox(naSub);
  await naSub.subscribeAsync("chat/#", { qos: 2 });
  const euSub = await connect(edge.at("eu"), "eu-sub", 4);
  const euBox = inbox(euSub);
  await euSub.subscribeAsync("chat/#", { qos: 2 });
  await leafLinked(edge, "edge-na");
  const asPub = await connect(edge.at("as"), "as-pub", 5);
  await leafLinked(edge, "edge-as");
  await prime(asPub, "chat", naBox, "a first message from Asia in North America");

  // From a leaf to the other leaf (through the hub) and to the hub's own subscriber.
  for (let i = 1; i <= 30; i++) await asPub.publishAsync("chat/m", `as ${i}`, { qos: i % 3 });
  const expected = Array.from({ length: 30 }, (_, i) => `as ${i + 1}`);
  // Each once at its QoS, in order within each QoS (MQTT orders a topic per QoS: a QoS 0
  // message may pass a QoS 1/2 one waiting for the subscriber's Receive Maximum).
  const perQos = (got) =>
    [0, 1, 2].map((q) => got.filter((m) => m.packet.qos === q).map((m) => m.payload));
  const wanted = [0, 1, 2].map((q) => expected.filter((_, i) => (i + 1) % 3 === q));
  const atNa = await collect(naBox, 30, "Asia's messages in North America");
  assert.deepEqual(perQos(atNa), wanted);
  assert.deepEqual(perQos(await collect(euBox, 30, "Asia's messages at the hub")), wanted);

  // From the hub's client to a leaf's.
  const asBox = inbox(asPub);
  await asPub.subscribeAsync("back/#", { qos: 2 });
  const euPub = await connect(edge.at("eu"), "eu-pub", 5);
  await prime(euPub, "back", asBox, "a first message from the hub in Asia");
  for (let i = 1; i <= 5; i++) await euPub.publishAsync("back/m", `eu ${i}`, { qos: 2 });
  assert.deepEqual(
    (await collect(asBox, 5, "the hub's messages in Asia")).map((m) => m.payload),
    ["eu 1", "eu 2", "eu 3", "eu 4", "eu 5"],
  );

  // Each object's /status: the hub lists its leaves, each leaf its hub.
  const hub = (await edge.status("eu")).body;
  assert.equal(hub.role, "hub");
  assert.deepEqual(hub.peers.map((p) => [p.node, p.leaf, p.connected]).sort(), [
    ["edge-as", true, true],
    ["edge-na", true, true],
  ]);
  const na = (await edge.status("na")).body;
  assert.deepEqual([na.role, na.node, na.linked, na.hub], ["leaf", "edge-na", true, "edge-eu"]);

  // What nobody beyond Asia wants stays there: neither end counts a forward for it.
  const counts = async () => [
    (await edge.status("as")).body.peers[0].forwarded_to,
    (await edge.status("eu")).body.peers.find((p) => p.node === "edge-as").forwarded_from,
  ];
  const before = await counts();
  for (let i = 0; i < 5; i++) await asPub.publishAsync("nobody/wants/this", "stay", { qos: 1 });
  await asPub.publishAsync("chat/after", "after", { qos: 1 });
  assert.equal((await naBox.next("a later message")).topic, "chat/after");
  const after = await counts();
  assert.deepEqual(after, before.map((n) => n + 1), "only the wanted message crossed");

  // A leaf's subscribers want at most 2,500 distinct filters (what its hub takes from a leaf):
  // past it a new filter is refused (0x97), not carried to a hub that would cut the link.
  const many = [];
  for (let c = 0; c < 3; c++) many.push(await connect(edge.at("na"), `na-many-${c}`, 5));
  const filters = Array.from({ length: 2500 }, (_, i) => `many/${i}`);
  const granted = [];
  for (let c = 0; c < 3; c++) {
    const part = filters.slice(c * 1000, (c + 1) * 1000);
    // MQTT.js rejects a SUBACK that refuses any filter, with the SUBACK.
    const codes = await many[c].subscribeAsync(part, { qos: 0 }).then(
      (gs) => gs.map((g) => g.qos),
      (e) => e.packet.granted,
    );
    granted.push(...codes);
  }
  // chat/# and 2,499 of these.
  assert.deepEqual(granted.slice(0, 2499), Array(2499).fill(0));
  assert.equal(granted[2499], 0x97);
  await until("the hub to hold North America's 2,500 filters", async () =>
    (await edge.status("eu")).body.peers.find((p) => p.node === "edge-na").routes === 2500,
    30000,
  );
  assert.equal((await edge.status("na")).body.linked, true, "the link stays");
  await Promise.all([...many, naSub, euSub, asPub, euPub].map((c) => c.endAsync()));
  await edge.stop();
});

test("edge-only: objects restarted with messages on their way through the hub deliver each once, in order", async () => {
  const dir = mkdtempSync(path.join(tmpdir(), "meridian-edge-only-"));
  const vars = { EDGE_HUB: "eu" };
  const persistent = { clean: false, properties: { sessionExpiryInterval: 3600 } };
  try {
    let edge = await startEdge({ persist: dir, vars });
    // A persistent subscriber in North America, away while Asia publishes.
    const sub = await connect(edge.at("na"), "na-sub", 5, persistent);
    await sub.subscribeAsync("chat/#", { qos: 1 });
    await sub.endAsync();
    const pub = await connect(edge.at("as"), "as-pub", 5);
    await leafLinked(edge, "edge-as");
    // Asia's object knows North America wants chat/# once its view of the hub holds it.
    await until("Asia's object to learn what the others want", async () =>
      (await edge.status("as")).body.peers[0]?.routes === 1,
      30000,
    );
    for (let i = 1; i <= 40; i++) await pub.publishAsync("chat/m", `as ${i}`, { qos: 1 });
    // The runtime is killed the moment the last is acknowledged, with messages wherever they
    // stand: Asia's outbox, the hub's, North America's queue.
    await edge.kill9();
    edge = await startEdge({ persist: dir, vars });
    // Asia's object starts again (and dials the hub) when asked for its state.
    assert.equal((await edge.status("as")).code, 200);
    const { box, connack } = await connectWithConnack(edge.at("na"), "na-sub", 5, persistent);
    assert.equal(connack.sessionPresent, true);
    const got = await collect(box, 40, "Asia's messages in North America", 30000);
    assert.deepEqual(got.map((m) => m.payload), Array.from({ length: 40 }, (_, i) => `as ${i + 1}`));
    const extra = await box.next("nothing more", 1000).catch(() => null);
    assert.equal(extra, null, "nothing twice");
    await edge.stop();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a copy of the template, under `npx wrangler dev`, serves the broker on loopback, with no account", async (t) => {
  const port = await freePort();
  // The template copied as a user copies it, with its npm packages installed as they install
  // them. Only the Meridian crates differ: they come from this checkout, not from crates.io,
  // with this checkout's lockfile.
  const template = fileURLToPath(new URL("../template", import.meta.url));
  const root = fileURLToPath(new URL("../..", import.meta.url));
  const copy = mkdtempSync(path.join(tmpdir(), "meridian-edge-template-"));
  t.after(() => rmSync(copy, { recursive: true, force: true }));
  const skip = new Set(["build", "node_modules", ".wrangler"]);
  cpSync(template, copy, { recursive: true, filter: (src) => !skip.has(path.basename(src)) });
  appendFileSync(
    path.join(copy, ".cargo", "config.toml"),
    `\n[patch.crates-io]\n` +
      `meridian-mqtt-core = { path = ${JSON.stringify(path.join(root, "core"))} }\n` +
      `meridian-mqtt-edge = { path = ${JSON.stringify(path.join(root, "edge-worker"))} }\n`,
  );
  copyFileSync(path.join(root, "Cargo.lock"), path.join(copy, "Cargo.lock"));
  const install = spawnSync("npm", ["ci", "--prefer-offline", "--no-audit", "--no-fund"], {
    cwd: copy,
    encoding: "utf8",
    timeout: 300000,
  });
  assert.equal(install.status, 0, `npm ci in the copy failed:\n${install.stdout}${install.stderr}`);
  // The same command a user types; test.sh has put the build's tools in the environment.
  const dev = spawn("npx", ["wrangler", "dev", "--ip", "127.0.0.1", "--port", String(port)], {
    cwd: copy,
    env: { ...process.env, WRANGLER_SEND_METRICS: "false", CI: "true" },
    stdio: ["ignore", "pipe", "pipe"],
    detached: true,
  });
  let output = "";
  const ready = new Promise((resolve, reject) => {
    const look = (chunk) => {
      output += chunk;
      if (output.includes("Ready on")) resolve();
    };
    dev.stdout.setEncoding("utf8").on("data", look);
    dev.stderr.setEncoding("utf8").on("data", look);
    dev.once("exit", (code) => reject(new Error(`wrangler dev exited with ${code}:\n${output}`)));
  });
  try {
    // Its custom build (worker-build --release) runs first: minutes on a cold cache.
    await within(ready, "wrangler dev to be ready", 300000);
    const url = `ws://127.0.0.1:${port}/mqtt`;
    const sub = await within(
      mqtt.connectAsync(url, { clientId: "dev-sub", protocolVersion: 4, reconnectPeriod: 0 }),
      "a client of wrangler dev to connect",
    );
    clients.add(sub);
    const box = inbox(sub);
    await sub.subscribeAsync("dev/#", { qos: 1 });
    const pub = await within(
      mqtt.connectAsync(url, { clientId: "dev-pub", protocolVersion: 5, reconnectPeriod: 0 }),
      "a publisher to connect",
    );
    clients.add(pub);
    await pub.publishAsync("dev/hello", "from wrangler dev", { qos: 1 });
    const m = await box.next("the message through wrangler dev");
    assert.deepEqual([m.topic, m.payload], ["dev/hello", "from wrangler dev"]);
    await Promise.all([sub.endAsync(), pub.endAsync()]);
  } finally {
    // The whole process group: npx, wrangler and its workerd.
    try {
      process.kill(-dev.pid, "SIGTERM");
    } catch {}
    if (dev.exitCode === null) await within(once(dev, "exit"), "wrangler dev to stop").catch(() => {});
    // Whatever of the group outlived the request to stop (workerd has been seen to).
    try {
      process.kill(-dev.pid, "SIGKILL");
    } catch {}
  }
});
