/** MQTT protocol level: 4 = MQTT 3.1.1, 5 = MQTT 5.0. */
export type ProtocolVersion = 4 | 5;
export type QoS = 0 | 1 | 2;
/** Binary data: a Uint8Array (a Node Buffer is one), an ArrayBuffer, or a string (UTF-8). */
export type BinaryInput = Uint8Array | ArrayBuffer | string;
/** MQTT 5.0 user properties: [name, value] pairs, in order, names may repeat. Objects
 *  `{ name: value | value[] }` (MQTT.js style) are accepted as input too. */
export type UserProperties = Array<[string, string]>;
export type UserPropertiesInput = UserProperties | Record<string, string | string[]>;

/** Broker limits and capabilities; every field is optional (the core's safe defaults). Unknown
 *  fields are refused. See `meridian_core::Config` for what happens at each limit. */
export interface BrokerConfig {
  maxPacketSize?: number;
  receiveMaximum?: number;
  maxInflight?: number;
  maxInflightBytes?: number;
  maxQueuedMessages?: number;
  maxQueuedBytes?: number;
  maxSubscriptionsPerClient?: number;
  maxTopicLen?: number;
  maxTopicLevels?: number;
  maxClientIdLen?: number;
  connectTimeoutMs?: number;
  /** 0: no upper bound. */
  maxKeepAliveSecs?: number;
  maxSessionExpirySecs?: number;
  /** Sessions held at once, connected or not. */
  maxSessions?: number;
  v3SessionExpirySecs?: number;
  maxRetainedMessages?: number;
  /** Payload and topic bytes of every message held (retained, queued, in flight). */
  maxHeldBytes?: number;
  topicAliasMaximum?: number;
  outboundTopicAliasMaximum?: number;
  maximumQos?: QoS;
  retainAvailable?: boolean;
  wildcardSubscriptionAvailable?: boolean;
  subscriptionIdentifiersAvailable?: boolean;
  sharedSubscriptionAvailable?: boolean;
  reasonStrings?: boolean;
  responseTopicPrefix?: string;
  assignedClientIdPrefix?: string;
  /** How often the broker publishes its figures under `$SYS/broker/` (Mosquitto's topics), in
   *  milliseconds; 0 (the default): never. While it does, clients may not publish under `$SYS`. */
  sysIntervalMs?: number;
  /** Seed for everything the broker randomises (a safe integer or a bigint < 2^64). */
  seed?: number | bigint;
}

/** What the shell knows about a new connection. */
export interface ConnInfo {
  remoteAddr?: string;
  tlsIdentity?: string;
  /** A tighter packet-size limit for this listener than the broker-wide one. */
  maxPacketSize?: number;
}

/** What an `authenticate` hook is asked, on CONNECT and on each AUTH step. */
export interface AuthRequest {
  conn: number;
  clientId: string;
  username?: string;
  password?: Uint8Array;
  /** MQTT 5.0 enhanced authentication method. */
  method?: string;
  data?: Uint8Array;
  tlsIdentity?: string;
  remoteAddr?: string;
  continuation: boolean;
  reauthentication: boolean;
}

/** An authentication answer. `deny` takes a reason code >= 0x80 (false: 0x87 not authorized). */
export type AuthResult =
  | boolean
  | { allow: true; username?: string }
  | { deny: number }
  | { continue: BinaryInput };

export interface ClientRef {
  clientId: string;
  username: string | null;
}

/** Optional JS hooks. They run synchronously inside an input; a hook that throws refuses, and
 *  its error comes out as a `hookError` output. They must not call the broker. */
export interface BrokerHooks {
  authenticate?: (request: AuthRequest) => AuthResult | "pending";
  mayPublish?: (client: ClientRef, topic: string) => boolean;
  /** `"filtered"`: accept a subscription that reaches some topics the client may not
   *  receive; each message for it is then checked with `mayReceive` (which must be given). */
  maySubscribe?: (client: ClientRef, filter: string) => boolean | "filtered";
  mayReceive?: (client: ClientRef, topic: string) => boolean;
}

export type BrokerEvent =
  | {
      type: "clientConnected";
      conn: number;
      clientId: string;
      username: string | null;
      protocolVersion: ProtocolVersion;
      sessionPresent: boolean;
    }
  | { type: "connectRefused"; conn: number; clientId: string | null; reasonCode: number; reason: string }
  | {
      type: "clientDisconnected";
      conn: number;
      clientId: string;
      cause: "client" | "connectionLost" | "server";
      reasonCode: number | null;
      reason: string | null;
      /** Whether this kind of disconnection publishes the client's will (if it has one):
       *  everything but a DISCONNECT with reason 0. */
      publishesWill: boolean;
    }
  | { type: "connectionClosed"; conn: number; reasonCode: number; reason: string; detail: string }
  | { type: "sessionEnded"; clientId: string }
  | { type: "sessionMoved"; clientId: string; to: string }
  | { type: "sessionArrived"; clientId: string }
  | { type: "routeAdded"; filter: string }
  | { type: "routeRemoved"; filter: string }
  /** Cluster mode: a frame from `peer` was refused (once per peer and kind of fault; every
   *  refusal is counted in `stats()`). `fault` names it, e.g. `NotOwner(RouteDelta)`. */
  | { type: "peerFault"; peer: string; fault: string }
  /** Cluster mode: node `peer` was forgotten (`reason`: `Command`, `Expired` or
   *  `Announced { by: ... }`). */
  | { type: "peerForgotten"; peer: string; reason: string; routes: number; droppedMessages: number };

/** One thing the shell must do, in order. A `persist` of durability `"now"` must be durable
 *  before any later output goes out (it may be what that output acknowledges); one of
 *  `"withNext"` may wait for the next that is. */
export type Output =
  | { type: "send"; conn: number; data: Uint8Array }
  | { type: "close"; conn: number }
  | { type: "persist"; key: Uint8Array; value: Uint8Array | null; durability: "now" | "withNext" }
  | { type: "event"; event: BrokerEvent }
  | { type: "hookError"; hook: "authenticate" | "mayPublish" | "maySubscribe" | "mayReceive"; error: unknown }
  /** Cluster mode: write `frame` to the link of node `peer`. */
  | { type: "toPeer"; peer: string; frame: Uint8Array }
  /** Cluster mode: write `frame` to every peer's link. */
  | { type: "broadcast"; frame: Uint8Array }
  /** Cluster mode: end the link with `peer` (it went past a bound); report `handlePeerDown`
   *  once it has ended. */
  | { type: "cutPeer"; peer: string };

export interface BrokerStats {
  connections: number;
  sessions: number;
  subscriptions: number;
  retainedMessages: number;
  /** Client ids claimed in the deployment, as known here. */
  claims: number;
  queuedMessages: number;
  inflightMessages: number;
  /** Payload and topic bytes of every message held (bounded by `maxHeldBytes`). */
  heldBytes: number;
  packetsReceived: number;
  packetsSent: number;
  bytesReceived: number;
  bytesSent: number;
  /** By QoS 0, 1, 2. */
  messagesReceived: [number, number, number];
  messagesSent: [number, number, number];
  droppedQueueFull: number;
  droppedTooLarge: number;
  droppedExpired: number;
  droppedQos0Offline: number;
  /** QoS 0 messages not sent to a connection reported with `handleCongested`. */
  droppedQos0Congested: number;
  droppedNotAuthorized: number;
  droppedRetainedFull: number;
  droppedPeerDown: number;
  /** QoS 0 forwards not sent to a peer reported with `handlePeerCongested`. */
  droppedPeerCongested: number;
  droppedOutboxFull: number;
  /** Deliveries and retained messages not held, and QoS 1/2 PUBLISHes refused, at `maxHeldBytes`. */
  droppedMemoryFull: number;
  /** QoS 1/2 forwards that waited for a node when it was forgotten. */
  droppedPeerForgotten: number;
  /** The oldest QoS 1/2 forwards for a node whose link is down, dropped to keep its outbox
   *  within bounds. */
  droppedPeerAbsent: number;
  /** Deliveries to a session that had the message already (it came two ways while the
   *  session moved between nodes). */
  droppedMovedTwice: number;
  /** Peer frames refused, by reason. */
  peerFramesNotOwner: number;
  peerFramesOverLimit: number;
  peerFramesClockAhead: number;
  peerFramesTooManyNodes: number;
  peerSessionsCut: number;
  peersForgotten: number;
  /** Messages kept from subscriptions a `maySubscribe` hook answered `"filtered"`. */
  withheldNotAuthorized: number;
  /** Subscriptions a `maySubscribe` hook refused. */
  subscriptionsNotAuthorized: number;
  /** New filters refused because the route set was at `maxRouteFilters`. */
  subscriptionsRouteSetFull: number;
  /** Sessions shipped to the node that took their client id over. */
  sessionsMovedOut: number;
  /** Sessions shipped here and joined to the one here. */
  sessionsMovedIn: number;
  /** Sessions shipped here that were not taken. */
  sessionsTransfersRefused: number;
  /** Peers' claims dropped: the authorizer did not vouch for them (no proof of the login). */
  claimsUnproven: number;
  /** Peers' claims not taken: another user's claim on the client id stands here. */
  claimsOfAnotherUser: number;
  /** Resumed sessions whose wait for a shipped session ran out. */
  sessionsTransferWaitsOver: number;
  /** Messages relayed to the node a session moved to. */
  messagesRelayed: number;
  /** Messages a relay from here still held for a session that came back: delivered here first. */
  messagesTakenBack: number;
  /** Messages a session that moved held back while older ones of their node could still come. */
  messagesHeldForOrder: number;
  /** Holds for order that ran out before the old node passed on everything older. */
  sessionOrderWaitsOver: number;
  /** Sessions resumed here that then learnt of another node's earlier claim: held for its part. */
  sessionShipmentsExpected: number;
  /** Messages delivered to a session that moved after a later one from the same node. */
  messagesDeliveredLate: number;
  /** Forwards and retained writes a data-residency rule kept from a node of another region. */
  residencyWithheld: number;
  /** CONNECTs of client ids pinned to a home region that it did not grant in time. */
  connectsHomeRefused: number;
  connectsRefused: number;
  protocolErrors: number;
}

export interface ClientSummary {
  clientId: string;
  username: string | null;
  protocolVersion: ProtocolVersion;
  connected: boolean;
  conn: number | null;
  subscriptions: Array<{ filter: string; qos: QoS }>;
  inflight: number;
  queued: number;
  /** Reported with `handleCongested` and not yet drained: QoS 0 messages to it are dropped. */
  congested: boolean;
}

export interface RestoreReport {
  sessions: number;
  subscriptions: number;
  messages: number;
  retained: number;
  unreadable: Array<{ key: Uint8Array; kind: string; detail: string }>;
}

/** This node's identity in a deployment, for `broker.enableCluster`. */
export interface ClusterConfig {
  /** 1 to 255 printable characters. */
  node: string;
  /** Must grow on every start of the node. */
  incarnation: number;
  region: string;
  routeBatchMs?: number;
  digestIntervalMs?: number;
  tombstoneBudget?: number;
  snapshotChunkFilters?: number;
  outboxWindow?: number;
  outboxMaxMessages?: number;
  outboxMaxBytes?: number;
  /** A connected peer that acknowledged nothing this long with its outbox full counts as
   *  not there: its oldest messages make room instead of publishers being refused. */
  outboxStallMs?: number;
  /** Nodes this node keeps state for. */
  maxNodes?: number;
  /** A node with no link for this long is forgotten. */
  peerExpiryMs?: number;
  /** A leaf (`addLeaf`) without a link for this long is forgotten. */
  leafExpiryMs?: number;
  /** Filters one leaf may bring (they join this node's route set). */
  leafMaxFilters?: number;
  /**
   * Distinct filters this node's route set may hold for a SUBSCRIBE to add one (past it,
   * SUBACK 0x97); default `peerMaxFilters`' default.
   */
  maxRouteFilters?: number;
  /** Retained writes stamped further ahead of this node's clock are refused. */
  maxClockDriftMs?: number;
  /**
   * A client resuming here a session another node holds waits at most this long for it
   * before its QoS 1/2 messages go out.
   */
  sessionTransferWaitMs?: number;
  /**
   * A session that moved here holds back each node's QoS 1/2 messages at most this long while
   * older ones of that node may still come by the node it left, so they arrive in order.
   */
  sessionOrderWaitMs?: number;
  /**
   * Client ids pinned to a home region (`*` for any run of characters): their CONNECT is
   * answered once a node of that region granted it, after the node serving the client closed
   * its connection.
   */
  homeRegions?: { clientIds: string; region: string }[];
  /** How long a pinned client's CONNECT waits for its home region (then 0x88). */
  homeWaitMs?: number;
  /** What one peer may make this node hold. */
  peerMaxFilters?: number;
  peerMaxPendingDeltaBytes?: number;
  peerMaxSnapshotBytes?: number;
  peerMaxRetainedMessages?: number;
  peerMaxRetainedBytes?: number;
  /** Client ids one peer may claim here. */
  peerMaxClaims?: number;
  /** Bytes of those claims (client ids, users, proofs). */
  peerMaxClaimBytes?: number;
  /** Bytes of sessions one peer ships here being assembled. */
  peerMaxTransferBytes?: number;
}

/** What `forgetPeer` withdrew and dropped. */
export interface ForgottenPeer {
  routes: number;
  droppedMessages: number;
}

export interface PeerSummary {
  node: string;
  connected: boolean;
  region: string | null;
  /** The incarnation of it known here (0: none yet): what a forget of it names. */
  incarnation: number;
  routes: number;
  routeVersion: number;
  announcedVersion: number;
  outboxMessages: number;
  outboxBytes: number;
  forwardedTo: number;
  forwardedFrom: number;
  /** A leaf of this node (`addLeaf`) rather than a member of the mesh. */
  leaf: boolean;
  /** When its link came up (ms, the clock fed in), while it is up. */
  upSinceMs: number | null;
}

/** A message published by the embedding app. */
export interface PublishMessage {
  topic: string;
  payload?: BinaryInput;
  qos?: QoS;
  retain?: boolean;
  properties?: PublishProperties;
}

export interface TopicFilterInfo {
  filter: string;
  /** What is matched against topic names (without `$share/{group}/`). */
  pattern: string;
  shareGroup: string | null;
  hasWildcards: boolean;
}

// ----- packets: decodePacket returns these shapes (Uint8Array for binary data, absent optional
// fields left out); encodePacket accepts them with the optional fields marked below. -----

export interface ConnectProperties {
  sessionExpiryInterval?: number;
  receiveMaximum?: number;
  maximumPacketSize?: number;
  topicAliasMaximum?: number;
  requestResponseInformation?: boolean;
  requestProblemInformation?: boolean;
  userProperties?: UserProperties;
  authenticationMethod?: string;
  authenticationData?: Uint8Array;
}

export interface WillProperties {
  willDelayInterval?: number;
  payloadFormatIndicator?: number;
  messageExpiryInterval?: number;
  contentType?: string;
  responseTopic?: string;
  correlationData?: Uint8Array;
  userProperties?: UserProperties;
}

export interface LastWill {
  topic: string;
  payload: Uint8Array;
  qos: QoS;
  retain: boolean;
  properties: WillProperties;
}

export interface ConnAckProperties {
  sessionExpiryInterval?: number;
  receiveMaximum?: number;
  maximumQos?: QoS;
  retainAvailable?: boolean;
  maximumPacketSize?: number;
  assignedClientIdentifier?: string;
  topicAliasMaximum?: number;
  reasonString?: string;
  userProperties?: UserProperties;
  wildcardSubscriptionAvailable?: boolean;
  subscriptionIdentifiersAvailable?: boolean;
  sharedSubscriptionAvailable?: boolean;
  serverKeepAlive?: number;
  responseInformation?: string;
  serverReference?: string;
  authenticationMethod?: string;
  authenticationData?: Uint8Array;
}

export interface PublishProperties {
  payloadFormatIndicator?: number;
  messageExpiryInterval?: number;
  topicAlias?: number;
  responseTopic?: string;
  correlationData?: Uint8Array;
  userProperties?: UserProperties;
  subscriptionIdentifiers?: number[];
  contentType?: string;
}

export interface ReasonProperties {
  reasonString?: string;
  userProperties?: UserProperties;
}

export interface SubscribeFilter {
  filter: string;
  qos: QoS;
  noLocal: boolean;
  retainAsPublished: boolean;
  /** 0: send retained on subscribe, 1: only on a new subscription, 2: never. */
  retainHandling: 0 | 1 | 2;
}

export interface DisconnectProperties {
  sessionExpiryInterval?: number;
  reasonString?: string;
  userProperties?: UserProperties;
  serverReference?: string;
}

export interface AuthProperties {
  authenticationMethod?: string;
  authenticationData?: Uint8Array;
  reasonString?: string;
  userProperties?: UserProperties;
}

export interface ConnectPacket {
  type: "connect";
  protocolVersion: ProtocolVersion;
  cleanStart: boolean;
  /** Seconds; 0 turns keep alive off. */
  keepAlive: number;
  clientId: string;
  will?: LastWill;
  username?: string;
  password?: Uint8Array;
  properties: ConnectProperties;
}
export interface ConnAckPacket {
  type: "connack";
  sessionPresent: boolean;
  /** MQTT 5.0 reason code (3.1.1 return codes are mapped to and from it). */
  reasonCode: number;
  properties: ConnAckProperties;
}
export interface PublishPacket {
  type: "publish";
  topic: string;
  payload: Uint8Array;
  qos: QoS;
  retain: boolean;
  dup: boolean;
  /** Present exactly when qos > 0. */
  packetId?: number;
  properties: PublishProperties;
}
export interface AckPacket {
  type: "puback" | "pubrec" | "pubrel" | "pubcomp";
  packetId: number;
  reasonCode: number;
  properties: ReasonProperties;
}
export interface SubscribePacket {
  type: "subscribe";
  packetId: number;
  filters: SubscribeFilter[];
  properties: { subscriptionIdentifier?: number; userProperties?: UserProperties };
}
export interface SubAckPacket {
  type: "suback";
  packetId: number;
  reasonCodes: number[];
  properties: ReasonProperties;
}
export interface UnsubscribePacket {
  type: "unsubscribe";
  packetId: number;
  filters: string[];
  properties: { userProperties?: UserProperties };
}
export interface UnsubAckPacket {
  type: "unsuback";
  packetId: number;
  /** Empty for MQTT 3.1.1. */
  reasonCodes: number[];
  properties: ReasonProperties;
}
export interface PingPacket {
  type: "pingreq" | "pingresp";
}
export interface DisconnectPacket {
  type: "disconnect";
  reasonCode: number;
  properties: DisconnectProperties;
}
export interface AuthPacket {
  type: "auth";
  reasonCode: number;
  properties: AuthProperties;
}

/** Every MQTT control packet, as `decodePacket` returns it. */
export type Packet =
  | ConnectPacket
  | ConnAckPacket
  | PublishPacket
  | AckPacket
  | SubscribePacket
  | SubAckPacket
  | UnsubscribePacket
  | UnsubAckPacket
  | PingPacket
  | DisconnectPacket
  | AuthPacket;

/** Makes the listed keys optional. */
type Loose<T, K extends keyof T> = Omit<T, K> & Partial<Pick<T, K>>;
/** Binary fields of `T` also accept strings and ArrayBuffers. */
type BinaryLoose<T> = { [K in keyof T]: T[K] extends Uint8Array | undefined ? BinaryInput | Exclude<T[K], Uint8Array> : T[K] };

/** What `encodePacket` accepts: a `Packet`, with defaults for the fields marked optional
 *  (reasonCode 0, properties {}, flags false, qos 0, cleanStart true, keepAlive 60,
 *  clientId "", protocolVersion: the `version` argument) and strings for binary fields. */
export type PacketInput =
  | (Loose<BinaryLoose<Omit<ConnectPacket, "will" | "properties">>, "protocolVersion" | "cleanStart" | "keepAlive" | "clientId"> & {
      will?: Loose<BinaryLoose<Omit<LastWill, "properties">>, "payload" | "qos" | "retain"> & { properties?: BinaryLoose<WillProperties> & { userProperties?: UserPropertiesInput } };
      properties?: BinaryLoose<ConnectProperties> & { userProperties?: UserPropertiesInput };
    })
  | (Loose<Omit<ConnAckPacket, "properties">, "sessionPresent" | "reasonCode"> & { properties?: BinaryLoose<ConnAckProperties> & { userProperties?: UserPropertiesInput } })
  | (Loose<BinaryLoose<Omit<PublishPacket, "properties">>, "payload" | "qos" | "retain" | "dup"> & { properties?: BinaryLoose<PublishProperties> & { userProperties?: UserPropertiesInput } })
  | (Loose<AckPacket, "reasonCode" | "properties">)
  | (Omit<SubscribePacket, "filters" | "properties"> & {
      filters: Array<string | Loose<SubscribeFilter, "qos" | "noLocal" | "retainAsPublished" | "retainHandling">>;
      properties?: { subscriptionIdentifier?: number; userProperties?: UserPropertiesInput };
    })
  | (Loose<SubAckPacket, "properties">)
  | (Loose<UnsubscribePacket, "properties">)
  | (Loose<UnsubAckPacket, "reasonCodes" | "properties">)
  | PingPacket
  | (Loose<DisconnectPacket, "reasonCode" | "properties">)
  | (Loose<AuthPacket, "reasonCode" | "properties"> & { properties?: BinaryLoose<AuthProperties> });
