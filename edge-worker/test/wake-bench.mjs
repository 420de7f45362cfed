// What a wake-up from hibernation costs: the built worker in Miniflare (workerd), N clients
// connected over raw WebSockets (MQTT 3.1.1, keep-alive off, one subscription each), then the
// round trip of a PINGREQ while the object is in memory against one that finds it evicted
// (workerd evicts an object quiet for 10 s, which it is 2 s after it wrote its checkpoint; its
// sockets stay open) and must build it again from storage and resume every connection first.
//
//   node edge-worker/test/wake-bench.mjs [CLIENTS...]     (default: 10 100 1000)
//
// Prints one line per client count. Not a test: it idles on purpose, and asserts nothing
// about time. docs/benchmarks.md, "The edge broker", records its output.
import { Miniflare } from "miniflare";
import WebSocket from "ws";
import { once } from "node:events";
import { setTimeout as idle } from "node:timers/promises";
import { workerOptions } from "./worker.mjs";

const IDLE_MS = 15_000;
const WARM_PINGS = 20;
const WAKE_UPS = 4;
const counts = process.argv.slice(2).map(Number);

function packet(first, body) {
  const bytes = [];
  let n = body.length;
  do {
    let b = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) b |= 0x80;
    bytes.push(b);
  } while (n > 0);
  return Buffer.concat([Buffer.from([first, ...bytes]), body]);
}
const str = (s) => {
  const b = Buffer.from(s);
  return Buffer.concat([Buffer.from([b.length >> 8, b.length & 0xff]), b]);
};
const connect = (id) => packet(0x10, Buffer.concat([str("MQTT"), Buffer.from([4, 0x02, 0, 0]), str(id)]));
const subscribe = (filter) => packet(0x82, Buffer.concat([Buffer.from([0, 1]), str(filter), Buffer.from([1])]));
const PINGREQ = Buffer.from([0xc0, 0]);

/** A connected client: `next()` resolves with its next packet. */
async function client(url, id) {
  const ws = new WebSocket(url, "mqtt");
  const queue = [];
  const waiting = [];
  ws.on("message", (data) => {
    const w = waiting.shift();
    if (w) w(Buffer.from(data));
    else queue.push(Buffer.from(data));
  });
  await once(ws, "open");
  const next = () => (queue.length ? Promise.resolve(queue.shift()) : new Promise((r) => waiting.push(r)));
  ws.send(connect(id));
  await next(); // CONNACK
  ws.send(subscribe(`bench/${id}/#`));
  await next(); // SUBACK
  return { ws, next };
}

async function ping(c) {
  const started = performance.now();
  c.ws.send(PINGREQ);
  await c.next();
  return performance.now() - started;
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

for (const n of counts.length ? counts : [10, 100, 1000]) {
  let log = "";
  const mf = new Miniflare({
    ...workerOptions({ bindings: { ALLOW_ANONYMOUS: "true" } }),
    handleRuntimeStdio(stdout, stderr) {
      for (const s of [stdout, stderr]) s.setEncoding("utf8").on("data", (c) => (log += c));
    },
  });
  const url = new URL("/mqtt", await mf.ready).href.replace(/^http/, "ws");
  const clients = [];
  for (let i = 0; i < n; i += 50) {
    const batch = [];
    for (let j = i; j < Math.min(n, i + 50); j++) batch.push(client(url, `c${j}`));
    clients.push(...(await Promise.all(batch)));
  }
  const warm = [];
  for (let i = 0; i < WARM_PINGS; i++) warm.push(await ping(clients[0]));
  // Round trips that found the object evicted, and those that found it in memory (an alarm
  // may have woken it during the idle time).
  const wakes = [];
  const kept = [];
  const line = `${n} of ${n} open connections resumed`;
  for (let i = 0; i < WAKE_UPS; i++) {
    await idle(IDLE_MS);
    const before = log.split(line).length;
    const rtt = await ping(clients[i % clients.length]);
    // The rebuilt object's log line may follow its answer by a moment.
    for (let tries = 0; tries < 50 && log.split(line).length === before; tries++) await idle(20);
    (log.split(line).length > before ? wakes : kept).push(rtt);
  }
  const list = (xs) => (xs.length ? xs.map((x) => x.toFixed(1)).join(", ") + " ms" : "none");
  console.log(
    `${n} clients: ping round trip warm ${median(warm).toFixed(1)} ms (median of ${WARM_PINGS}); ` +
      `after ${IDLE_MS / 1000} s idle, object rebuilt and ${n} connections resumed: ${list(wakes)}; ` +
      `object still in memory: ${list(kept)}`,
  );
  for (const c of clients) c.ws.terminate();
  await mf.dispose();
}
