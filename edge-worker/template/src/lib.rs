//! A Cloudflare Worker that runs the Meridian MQTT broker: the fetch handler and the
//! `MqttBroker` Durable Object class come from `meridian-mqtt-edge`, linked in here.
//! wrangler.toml binds and configures them.

use meridian_edge as _;
