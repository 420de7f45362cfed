//! MQTT 3.1.1 and 5.0 wire format: every control packet, both directions.

mod packet;
mod reason;

pub use packet::*;
pub use reason::ReasonCode;
