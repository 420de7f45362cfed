// The nodejs build (bindings/pkg) from plain JavaScript: the drive loop, and the promise that
// bad input of any kind surfaces as a JS exception, never as a wasm trap (WebAssembly.RuntimeError),
// checked with seeded random input. Run `wasm-pack build bindings --target nodejs` first.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const m = require("../pkg/meridian_wasm.js");
const { Broker, PacketDecoder, TopicMatcher, decodePacket, encodePacket } = m;

const T0 = 1_700_000_000_000;

/** mulberry32: a small seeded PRNG, so that a failure can be replayed from its seed. */
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const SEED = Number(process.env.MERIDIAN_FUZZ_SEED ?? 20261121);

/** Calls f; a thrown value must be an ordinary JS Error, never a wasm trap. */
function noTrap(f, context) {
  try {
    return f();
  } catch (e) {
    assert.ok(!(e instanceof WebAssembly.RuntimeError), `wasm trap (${context}): ${e?.stack}`);
    assert.ok(e instanceof Error, `non-Error thrown (${context}): ${e}`);
    assert.ok(e.message.length > 0, `empty message (${context})`);
    return undefined;
  }
}

function connectBytes(clientId, version) {
  return encodePacket({ type: "connect", clientId, protocolVersion: version }, version);
}

test("the drive loop from JavaScript: two clients, one message", () => {
  const b = new Broker({}, T0);
  const out = new Map(); // conn -> decoded packets
  const decoders = new Map();
  const pump = () => {
    for (let o = b.pollOutput(); o !== undefined; o = b.pollOutput()) {
      if (o.type !== "send") continue;
      out.set(o.conn, [...(out.get(o.conn) ?? []), ...decoders.get(o.conn).push(o.data)]);
    }
  };
  const open = (id, v) => {
    const c = b.accept(T0, { remoteAddr: `test:${id}` });
    decoders.set(c, new PacketDecoder(v));
    b.handleBytes(c, connectBytes(id, v), T0);
    pump();
    assert.equal(out.get(c)[0].type, "connack");
    return c;
  };
  const sub = open("sub", 5);
  const pub = open("pub", 4);
  b.handleBytes(sub, encodePacket({ type: "subscribe", packetId: 1, filters: [{ filter: "x/#", qos: 2 }] }, 5), T0);
  b.handleBytes(pub, encodePacket({ type: "publish", topic: "x/y", payload: "hi", qos: 2, packetId: 3 }, 4), T0);
  pump();
  const publish = out.get(sub).find((p) => p.type === "publish");
  assert.equal(publish.topic, "x/y");
  assert.equal(new TextDecoder().decode(publish.payload), "hi");
  assert.equal(publish.qos, 2);
  assert.equal(out.get(pub).at(-1).type, "pubrec");
  assert.equal(b.stats().connections, 2);
  assert.equal(b.clients().length, 2);
  assert.ok(b.pollTimeout() > T0);
  b.free();
  assert.throws(() => b.stats(), (e) => e instanceof Error && !(e instanceof WebAssembly.RuntimeError));
});

test(`random bytes on many connections never trap, and the broker keeps working (seed ${SEED})`, () => {
  const next = rng(SEED);
  const b = new Broker({ maxPacketSize: 4096 }, T0);
  let now = T0;
  const valid = [
    connectBytes("fuzz", 5),
    connectBytes("fuzz3", 4),
    encodePacket({ type: "subscribe", packetId: 1, filters: ["#", "a/+"] }, 5),
    encodePacket({ type: "publish", topic: "a/b", payload: "p", qos: 1, packetId: 2 }, 5),
    encodePacket({ type: "pingreq" }, 5),
  ];
  for (let round = 0; round < 300; round++) {
    const conn = b.accept(now);
    for (let i = 0; i < 8; i++) {
      // Valid frames, mutated frames and noise, split anywhere.
      let bytes;
      const kind = next();
      if (kind < 0.4) bytes = Uint8Array.from(valid[Math.floor(next() * valid.length)]);
      else bytes = Uint8Array.from({ length: Math.floor(next() * 40) }, () => Math.floor(next() * 256));
      if (kind >= 0.4 && kind < 0.7 && bytes.length) bytes[0] = valid[0][0]; // looks like a CONNECT
      if (next() < 0.3 && bytes.length) bytes[Math.floor(next() * bytes.length)] ^= 1 << Math.floor(next() * 8);
      const cut = Math.floor(next() * (bytes.length + 1));
      noTrap(() => b.handleBytes(conn, bytes.subarray(0, cut), now), `round ${round}`);
      noTrap(() => b.handleBytes(conn, bytes.subarray(cut), now), `round ${round}`);
      noTrap(() => decodePacket(bytes, next() < 0.5 ? 4 : 5), `decode round ${round}`);
      now += Math.floor(next() * 1000);
      if (next() < 0.05) noTrap(() => b.handleTimeout(now), "timeout");
      if (next() < 0.05) noTrap(() => b.handleCongested(conn, now), "congested");
      if (next() < 0.05) noTrap(() => b.handleDrained(conn, now), "drained");
    }
    if (next() < 0.5) b.handleClosed(conn, now);
    b.drain();
  }
  // Still a working broker.
  const c = b.accept(now);
  b.handleBytes(c, connectBytes("after-fuzz", 5), now);
  const sent = b.drain().filter((o) => o.type === "send" && o.conn === c);
  assert.equal(decodePacket(sent[0].data, 5).type, "connack");
});

test(`random objects for every API taking JS values throw Errors, never trap (seed ${SEED})`, () => {
  const next = rng(SEED + 1);
  const pick = (xs) => xs[Math.floor(next() * xs.length)];
  const scalars = [undefined, null, true, 0, -1, 1.5, 2 ** 53, NaN, Infinity, "", "a/+", "#", "\0", 5n, Symbol("s"), [], {}, new Uint8Array(3), () => 1];
  const keys = ["type", "topic", "payload", "qos", "packetId", "properties", "filters", "reasonCode", "clientId", "will", "userProperties", "protocolVersion", "maxPacketSize", "seed"];
  const types = ["connect", "connack", "publish", "puback", "subscribe", "suback", "unsubscribe", "unsuback", "pingreq", "disconnect", "auth", "nope"];
  const value = (depth) => {
    const r = next();
    if (depth > 2 || r < 0.5) return pick(scalars);
    if (r < 0.7) return Array.from({ length: Math.floor(next() * 3) }, () => value(depth + 1));
    const o = {};
    for (let i = Math.floor(next() * 4); i > 0; i--) o[pick(keys)] = value(depth + 1);
    if (next() < 0.7) o.type = pick(types);
    return o;
  };
  const b = new Broker({}, T0);
  const matcher = new TopicMatcher();
  for (let i = 0; i < 2000; i++) {
    const v = value(0);
    noTrap(() => encodePacket(v, pick([undefined, 4, 5, 6, "5"])), `encodePacket #${i}`);
    noTrap(() => new Broker(v, pick([T0, undefined, -5, "x"])), `new Broker #${i}`);
    noTrap(() => b.accept(T0, v), `accept #${i}`);
    noTrap(() => b.publish(v, T0), `publish #${i}`);
    noTrap(() => b.restore(pick([v, [v], [[v, v]]]), T0), `restore #${i}`);
    noTrap(() => b.handleBytes(pick([1, v]), v, pick([T0, v])), `handleBytes #${i}`);
    noTrap(() => b.authDecision(1, v, T0), `authDecision #${i}`);
    noTrap(() => b.handleCongested(pick([1, v]), pick([T0, v])), `handleCongested #${i}`);
    noTrap(() => matcher.add(v, v), `matcher.add #${i}`);
    noTrap(() => matcher.match(v), `matcher.match #${i}`);
    noTrap(() => m.validateTopicFilter(v), `validateTopicFilter #${i}`);
    noTrap(() => new PacketDecoder(v, v), `PacketDecoder #${i}`);
    b.drain();
  }
});

test("a hook that calls back into the broker is reported, not a trap", () => {
  let b;
  b = new Broker(null, T0, {
    authenticate: () => {
      b.stats(); // re-entrant use: refused by wasm-bindgen with a JS error
      return true;
    },
  });
  const c = b.accept(T0);
  b.handleBytes(c, connectBytes("reentrant", 5), T0);
  const outs = b.drain();
  const report = outs.find((o) => o.type === "hookError");
  assert.equal(report?.hook, "authenticate");
  assert.ok(report.error instanceof Error);
  const connack = decodePacket(outs.find((o) => o.type === "send").data, 5);
  assert.equal(connack.reasonCode, 0x87);
});
