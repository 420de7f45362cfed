// Type-checked (never run) by types.test.mjs with `tsc --noEmit`: the generated declarations
// must compile under `strict`, describe the API as used here, and refuse the misuse below.
import {
  Broker,
  PacketDecoder,
  TopicMatcher,
  decodePacket,
  encodePacket,
  reasonName,
  topicMatches,
  validateTopicFilter,
  type BrokerEvent,
  type BrokerStats,
  type ForgottenPeer,
  type Output,
  type Packet,
  type PacketInput,
} from "../pkg/meridian_wasm.js";

const now = Date.now();
const broker = new Broker({ maxPacketSize: 65536, maximumQos: 1, seed: 7n }, now);
new Broker();
new Broker(null, undefined, {
  authenticate: (req) => (req.username === "admin" ? { allow: true } : "pending"),
  mayPublish: (client, topic) => client.clientId !== "" && !topic.startsWith("$"),
});
const conn: number = broker.accept(now);
broker.accept(now, { remoteAddr: "127.0.0.1:1883" });
broker.handleBytes(conn, new Uint8Array([0xc0, 0]), now);
broker.handleCongested(conn, now);
broker.handleDrained(conn, now);
broker.handleClosed(conn, now);
broker.handleTimeout(now);
broker.authDecision(conn, { deny: 0x87 }, now);

function apply(out: Output): string {
  switch (out.type) {
    case "send": {
      const data: Uint8Array = out.data;
      return `${out.conn}: ${data.length} bytes`;
    }
    case "close":
      return `close ${out.conn}`;
    case "persist": {
      const value: Uint8Array | null = out.value;
      const durability: "now" | "withNext" = out.durability;
      return `persist ${out.key.length} ${value?.length ?? "delete"} ${durability}`;
    }
    case "event": {
      const e: BrokerEvent = out.event;
      return e.type === "clientConnected" ? `${e.clientId} v${e.protocolVersion}` : e.type;
    }
    case "hookError":
      return out.hook;
    case "toPeer":
      return `${out.peer}: ${out.frame.length}`;
    case "broadcast":
      return `all: ${out.frame.length}`;
    case "cutPeer":
      return `cut ${out.peer}`;
    default: {
      const unreachable: never = out;
      return unreachable;
    }
  }
}
broker.drain().map(apply);
const next: Output | undefined = broker.pollOutput();
const deadline: number | undefined = broker.pollTimeout();
const stats: BrokerStats = broker.stats();
const sent: number = stats.messagesSent[2];
const dropped: number = stats.droppedQos0Congested;
const delivered: number = broker.publish({ topic: "a", payload: "x", qos: 1 }, now);
broker.restore([[new Uint8Array(1), new Uint8Array(2)]], now).unreadable.map((u) => u.detail);
broker.disconnectClient("c1", now, 0x98);
broker.shutdown(now);

const node = new Broker(null, now);
node.enableCluster(
  {
  node: "eu-1",
  incarnation: 3,
  region: "eu",
  routeBatchMs: 20,
  peerExpiryMs: 3_600_000,
  leafExpiryMs: 600_000,
  leafMaxFilters: 10_000,
  maxRouteFilters: 10_000,
  outboxStallMs: 30_000,
  peerMaxFilters: 100_000,
  },
  now,
);
node.handlePeerUp("us-1", now);
node.handlePeerBytes("us-1", new Uint8Array(0), now);
node.handlePeerCongested("us-1", now);
node.handlePeerDrained("us-1", now);
node.handlePeerDown("us-1", now);
node.addLeaf("edge-eu", now);
const peerRegions: Array<string | null> = node.peers().map((p) => p.region);
void peerRegions;
const leaves: Array<[boolean, number | null]> = node.peers().map((p) => [p.leaf, p.upSinceMs]);
void leaves;
const forgotten: ForgottenPeer = node.forgetPeer("us-1", now);
const withdrawn: number = forgotten.routes + forgotten.droppedMessages;
void withdrawn;
const forgottenPeers: number = node.stats().peersForgotten;
void forgottenPeers;

const input: PacketInput = { type: "publish", topic: "a", payload: "x", qos: 1, packetId: 1 };
const packet: Packet = decodePacket(encodePacket(input, 5), 5);
if (packet.type === "publish") {
  const topic: string = packet.topic;
  const qos: 0 | 1 | 2 = packet.qos;
  const payload: Uint8Array = packet.payload;
  void [topic, qos, payload];
}
encodePacket({ type: "subscribe", packetId: 1, filters: ["a/+", { filter: "b", qos: 2 }] });
encodePacket({ type: "connect", clientId: "c", will: { topic: "w", payload: "bye" } }, 4);

const decoder = new PacketDecoder(4, 1024);
const packets: Packet[] = decoder.push(new Uint8Array([0xd0, 0]));
const buffered: number = decoder.buffered;

const matcher = new TopicMatcher();
matcher.add("sport/+/score");
matcher.add("sport/#", { handler: "all sport" });
const values: unknown[] = matcher.match("sport/tennis/score");
const filters: string[] = matcher.matchFilters("sport/tennis/score");
const group: string | null = validateTopicFilter("$share/g/a").shareGroup;
const matches: boolean = topicMatches("a/#", "a/b");
const name: string = reasonName(0x87);
broker.free();

// @ts-expect-error QoS 3 does not exist
encodePacket({ type: "publish", topic: "a", qos: 3 });
// @ts-expect-error unknown packet type
encodePacket({ type: "launch" });
// @ts-expect-error a publish needs a topic
encodePacket({ type: "publish" });
// @ts-expect-error misspelt config field
new Broker({ maxPacketSiz: 1 });
// @ts-expect-error protocol level 3 is not supported
decodePacket(new Uint8Array(), 3);
// @ts-expect-error handleBytes takes bytes, not a string
broker.handleBytes(conn, "CONNECT", now);

void [next, deadline, sent, delivered, packets, buffered, values, filters, group, matches, name];
