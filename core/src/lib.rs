//! Meridian's sans-IO MQTT broker core.

pub mod codec;
pub mod topic;
