#!/usr/bin/env node
// An MQTT-over-WebSocket broker for Node: `ws` carries the bytes, meridian-mqtt-wasm (the sans-IO
// Meridian core compiled to WebAssembly) does all of MQTT 3.1.1 and 5.0. This file only
// translates IO: it feeds each input to the broker, carries out every output in order, and
// arms one timer for the broker's next deadline.
//
//   node server.mjs [--port 9001] [--host 127.0.0.1] [--path /mqtt] [--quiet]
import { parseArgs } from "node:util";
import { WebSocketServer } from "ws";
import { Broker } from "meridian-mqtt-wasm";

const { values: opts } = parseArgs({
  options: {
    port: { type: "string", default: "9001" },
    host: { type: "string", default: "127.0.0.1" },
    path: { type: "string", default: "/mqtt" },
    quiet: { type: "boolean", default: false },
  },
});
const port = Number(opts.port);
if (!Number.isInteger(port) || port < 0 || port > 65535) {
  console.error(`--port: expected 0..65535, got ${opts.port}`);
  process.exit(2);
}
const log = opts.quiet ? () => {} : (...args) => console.log(new Date().toISOString(), ...args);

/** A client that does not read what it is sent is dropped past this many buffered bytes. */
const MAX_BUFFERED_BYTES = 8 * 1024 * 1024;
/** Past this many, QoS 0 messages to it are dropped until half of them are written. */
const QOS0_BUFFERED_BYTES = 1024 * 1024;

const broker = new Broker({}, Date.now());
const sockets = new Map(); // connection id -> WebSocket
const congested = new Set(); // connection ids the broker was told are congested
// Persisted records (sessions, subscriptions, queued and retained messages). Kept in memory
// here; a real deployment writes them to disk or a KV store before the sends that follow, and
// feeds them to broker.restore() on start.
const store = new Map();
let timer;

/** Tells the broker which congested connections have written enough to take QoS 0 again. */
function releaseDrained() {
  for (const conn of congested) {
    const ws = sockets.get(conn);
    if (ws && ws.bufferedAmount > QOS0_BUFFERED_BYTES / 2) continue;
    congested.delete(conn);
    if (ws) broker.handleDrained(conn, Date.now());
  }
}

/** Carries out every pending output, in order, then re-arms the timer. */
function drive() {
  for (const out of broker.drain()) {
    switch (out.type) {
      case "send": {
        const ws = sockets.get(out.conn);
        if (!ws) break;
        ws.send(out.data);
        if (ws.bufferedAmount > MAX_BUFFERED_BYTES) ws.terminate();
        else if (ws.bufferedAmount > QOS0_BUFFERED_BYTES && !congested.has(out.conn)) {
          congested.add(out.conn);
          broker.handleCongested(out.conn, Date.now());
        }
        break;
      }
      case "close": {
        const ws = sockets.get(out.conn);
        sockets.delete(out.conn); // closed by the broker: no handleClosed for it
        ws?.close(); // after everything sent before, as the close frame follows the data
        break;
      }
      case "persist": {
        const key = Buffer.from(out.key).toString("base64");
        if (out.value) store.set(key, out.value);
        else store.delete(key);
        break;
      }
      case "event":
        log(out.event.type, JSON.stringify(out.event));
        break;
      case "hookError":
        console.error(`${out.hook} hook failed:`, out.error);
        break;
    }
  }
  clearTimeout(timer);
  const at = broker.pollTimeout();
  if (at !== undefined) {
    const delay = Math.min(Math.max(at - Date.now(), 0), 2 ** 31 - 1);
    timer = setTimeout(() => {
      releaseDrained();
      broker.handleTimeout(Date.now());
      drive();
    }, delay);
  }
}

const wss = new WebSocketServer({
  host: opts.host,
  port,
  path: opts.path,
  // MQTT over WebSocket names its subprotocol; MQTT.js needs the answer.
  handleProtocols: (protocols) =>
    protocols.has("mqtt") ? "mqtt" : protocols.has("mqttv3.1") ? "mqttv3.1" : false,
});

wss.on("connection", (ws, req) => {
  const remoteAddr = `${req.socket.remoteAddress}:${req.socket.remotePort}`;
  const conn = broker.accept(Date.now(), { remoteAddr });
  sockets.set(conn, ws);
  ws.on("message", (data, isBinary) => {
    if (!isBinary) {
      ws.close(1003, "MQTT needs binary frames");
      return;
    }
    releaseDrained();
    broker.handleBytes(conn, data, Date.now());
    drive();
  });
  ws.on("close", () => {
    if (sockets.delete(conn)) {
      broker.handleClosed(conn, Date.now());
      drive();
    }
  });
  ws.on("error", (err) => log("socket error", remoteAddr, err.message));
  drive(); // arms the connect timeout
});

wss.on("listening", () => {
  const { port: bound } = wss.address();
  console.log(`meridian: MQTT over WebSocket on ws://${opts.host}:${bound}${opts.path}`);
});
wss.on("error", (err) => {
  console.error(`meridian: ${err.message}`);
  process.exit(1);
});

function shutdown(signal) {
  log(`${signal}: closing every connection`);
  broker.shutdown(Date.now()); // MQTT 5.0 clients get DISCONNECT 0x8B (server shutting down)
  drive();
  clearTimeout(timer);
  wss.close(() => process.exit(0));
  setTimeout(() => process.exit(0), 2000); // clients that do not finish the close handshake
}
process.once("SIGINT", () => shutdown("SIGINT"));
process.once("SIGTERM", () => shutdown("SIGTERM"));
