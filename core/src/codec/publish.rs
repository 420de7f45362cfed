//! PUBLISH (MQTT 3.1.1 §3.3, MQTT 5.0 §3.3), and the borrowed [`OutgoingPublish`] the broker
//! encodes once per subscriber.

use bytes::Bytes;

use super::error::{DecodeError, EncodeError};
use super::fixed_header::PacketType;
use super::packet::{ProtocolVersion, Publish, PublishProperties, QoS};
use super::primitives::{Sink, put_packet_id, put_string, read_packet_id, read_string};
use super::properties::{self, PublishPropertiesView};
use super::reason::ReasonCode;

const DUP: u8 = 0b1000;
const QOS_SHIFT: u8 = 1;
const RETAIN: u8 = 0b0001;

/// A PUBLISH to encode without building a [`Publish`]: the broker's fan-out path encodes one
/// message for many subscribers from borrowed parts.
///
/// Everything shared comes from `properties`, except `properties.topic_alias`,
/// `properties.message_expiry_interval` and `properties.subscription_identifiers`: those are
/// ignored and replaced by the per-subscriber fields of the same names.
#[derive(Debug, Clone, Copy)]
pub struct OutgoingPublish<'a> {
    /// DUP flag: a re-send of an earlier attempt; never set at QoS 0.
    pub dup: bool,
    /// The QoS of this delivery.
    pub qos: QoS,
    /// RETAIN flag as sent to this subscriber.
    pub retain: bool,
    /// May be empty when `topic_alias` is set (MQTT 5.0).
    pub topic: &'a str,
    /// Present (and non-zero) exactly when `qos > 0`.
    pub packet_id: Option<u16>,
    /// The application payload.
    pub payload: &'a [u8],
    /// The properties every subscriber shares (three are replaced; see above).
    pub properties: &'a PublishProperties,
    /// Topic Alias on this subscriber's connection, in place of `properties.topic_alias`.
    pub topic_alias: Option<u16>,
    /// Seconds left before the message expires, in place of `properties.message_expiry_interval`.
    pub message_expiry_interval: Option<u32>,
    /// This subscriber's matching subscription identifiers, in place of
    /// `properties.subscription_identifiers`.
    pub subscription_identifiers: &'a [u32],
}

impl<'a> From<&'a Publish> for OutgoingPublish<'a> {
    /// The view that encodes exactly `p`.
    fn from(p: &'a Publish) -> Self {
        Self {
            dup: p.dup,
            qos: p.qos,
            retain: p.retain,
            topic: &p.topic,
            packet_id: p.packet_id,
            payload: &p.payload,
            properties: &p.properties,
            topic_alias: p.properties.topic_alias,
            message_expiry_interval: p.properties.message_expiry_interval,
            subscription_identifiers: &p.properties.subscription_identifiers,
        }
    }
}

impl OutgoingPublish<'_> {
    pub(crate) fn first_byte(&self) -> u8 {
        let mut flags = (self.qos as u8) << QOS_SHIFT;
        if self.dup {
            flags |= DUP;
        }
        if self.retain {
            flags |= RETAIN;
        }
        PacketType::Publish.first_byte(flags)
    }

    pub(crate) fn write<S: Sink>(
        &self,
        version: ProtocolVersion,
        s: &mut S,
    ) -> Result<(), EncodeError> {
        let v5 = version == ProtocolVersion::V5;
        if self.dup && self.qos == QoS::AtMostOnce {
            return Err(EncodeError::DupWithQoS0);
        }
        if self.topic.is_empty() && !(v5 && self.topic_alias.is_some()) {
            return Err(EncodeError::EmptyTopic);
        }
        put_string(s, self.topic)?;
        match (self.qos, self.packet_id) {
            (QoS::AtMostOnce, None) => {}
            (QoS::AtLeastOnce | QoS::ExactlyOnce, Some(id)) => put_packet_id(s, id)?,
            _ => return Err(EncodeError::PacketIdMismatch),
        }
        if v5 {
            s.put_block(&PublishPropertiesView {
                base: self.properties,
                topic_alias: self.topic_alias,
                message_expiry_interval: self.message_expiry_interval,
                subscription_identifiers: self.subscription_identifiers,
            })?;
        }
        s.put_slice(self.payload);
        Ok(())
    }
}

/// A topic name may not hold wildcards (MQTT 5.0 §4.7.1): `TOPIC_NAME_INVALID`.
pub(crate) fn check_topic_name(topic: &str) -> Result<(), DecodeError> {
    if topic.bytes().any(|b| b == b'+' || b == b'#') {
        return Err(DecodeError::new(
            ReasonCode::TOPIC_NAME_INVALID,
            "wildcard in topic name",
        ));
    }
    Ok(())
}

/// Decodes the body; `flags` were checked by the fixed header (QoS 3, DUP on QoS 0).
pub(crate) fn decode(
    flags: u8,
    buf: &mut Bytes,
    version: ProtocolVersion,
) -> Result<Publish, DecodeError> {
    let qos = QoS::from_u8((flags >> QOS_SHIFT) & 0b11)
        .ok_or(DecodeError::malformed("PUBLISH with QoS 3"))?;
    let topic = read_string(buf)?;
    check_topic_name(&topic)?;
    let packet_id = match qos {
        QoS::AtMostOnce => None,
        QoS::AtLeastOnce | QoS::ExactlyOnce => Some(read_packet_id(buf)?),
    };
    let properties = match version {
        ProtocolVersion::V5 => properties::read_publish(buf)?,
        ProtocolVersion::V311 => PublishProperties::default(),
    };
    if topic.is_empty() && properties.topic_alias.is_none() {
        return Err(DecodeError::protocol(
            "empty topic name without topic alias",
        ));
    }
    Ok(Publish {
        dup: flags & DUP != 0,
        qos,
        retain: flags & RETAIN != 0,
        topic,
        packet_id,
        payload: std::mem::take(buf),
        properties,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::test_util::{assert_error, decode_one, encode_vec, round_trip};
    use crate::codec::{Packet, decode, encode_publish, publish_len};
    use ProtocolVersion::*;
    use bytes::BytesMut;

    fn publish(qos: QoS, packet_id: Option<u16>) -> Publish {
        Publish {
            dup: false,
            qos,
            retain: false,
            topic: "a/b".into(),
            packet_id,
            payload: Bytes::from_static(b"hi"),
            properties: PublishProperties::default(),
        }
    }

    #[test]
    fn v311_publish_qos0_bytes() {
        let bytes = [0x31, 7, 0, 3, b'a', b'/', b'b', b'h', b'i'];
        let mut p = publish(QoS::AtMostOnce, None);
        p.retain = true;
        let p = Packet::Publish(p);
        assert_eq!(decode_one(&bytes, V311), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V311), bytes);
    }

    #[test]
    fn v311_publish_qos2_dup_bytes() {
        let bytes = [0x3C, 9, 0, 3, b'a', b'/', b'b', 0x12, 0x34, b'h', b'i'];
        let mut p = publish(QoS::ExactlyOnce, Some(0x1234));
        p.dup = true;
        let p = Packet::Publish(p);
        assert_eq!(decode_one(&bytes, V311), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V311), bytes);
    }

    #[test]
    fn v5_publish_bytes() {
        let bytes = [
            0x32, 20, 0, 3, b'a', b'/', b'b', 0, 1, // topic, packet id 1
            8, // properties
            0x01, 1, // payload format indicator
            0x23, 0, 5, // topic alias 5
            0x0B, 0x80, 0x01, // subscription identifier 128
            b'h', b'i', // payload... (rest)
            b'!', b'!',
        ];
        let p = Packet::Publish(Publish {
            payload: Bytes::from_static(b"hi!!"),
            properties: PublishProperties {
                payload_format_indicator: Some(1),
                topic_alias: Some(5),
                subscription_identifiers: vec![128],
                ..Default::default()
            },
            ..publish(QoS::AtLeastOnce, Some(1))
        });
        assert_eq!(decode_one(&bytes, V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), bytes);
    }

    #[test]
    fn v5_publish_empty_properties_bytes() {
        let bytes = [0x30, 8, 0, 3, b'a', b'/', b'b', 0, b'h', b'i'];
        let p = Packet::Publish(publish(QoS::AtMostOnce, None));
        assert_eq!(decode_one(&bytes, V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), bytes);
    }

    #[test]
    fn v5_publish_all_properties_round_trip() {
        let p = Packet::Publish(Publish {
            properties: PublishProperties {
                payload_format_indicator: Some(0),
                message_expiry_interval: Some(60),
                topic_alias: Some(1),
                response_topic: Some("r/t".into()),
                correlation_data: Some(Bytes::from_static(b"\x00\x01")),
                user_properties: vec![("a".into(), "1".into()), ("a".into(), "2".into())],
                subscription_identifiers: vec![1, 268_435_455],
                content_type: Some("json".into()),
            },
            ..publish(QoS::ExactlyOnce, Some(65_535))
        });
        round_trip(&p, V5);
    }

    #[test]
    fn publish_payload_is_zero_copy() {
        let mut buf = BytesMut::from(&[0x30, 7, 0, 3, b'a', b'/', b'b', b'h', b'i'][..]);
        let payload_addr = buf[7..].as_ptr();
        let Ok(Some(Packet::Publish(p))) = decode(&mut buf, V311, 1024) else {
            panic!()
        };
        assert_eq!(p.payload.as_ptr(), payload_addr);
    }

    #[test]
    fn publish_topic_with_wildcard_is_topic_name_invalid() {
        assert_error(
            &[0x30, 5, 0, 3, b'a', b'/', b'+'],
            V311,
            ReasonCode::TOPIC_NAME_INVALID,
        );
        assert_error(
            &[0x30, 6, 0, 3, b'a', b'/', b'#', 0],
            V5,
            ReasonCode::TOPIC_NAME_INVALID,
        );
    }

    #[test]
    fn publish_empty_topic_without_alias_is_protocol_error() {
        assert_error(&[0x30, 2, 0, 0], V311, ReasonCode::PROTOCOL_ERROR);
        assert_error(&[0x30, 3, 0, 0, 0], V5, ReasonCode::PROTOCOL_ERROR);
    }

    #[test]
    fn publish_empty_topic_with_alias_is_allowed_in_v5() {
        let bytes = [0x30, 6, 0, 0, 3, 0x23, 0, 7];
        let Ok(Packet::Publish(p)) = decode_one(&bytes, V5) else {
            panic!()
        };
        assert_eq!((p.topic.as_str(), p.properties.topic_alias), ("", Some(7)));
        assert_eq!(encode_vec(&Packet::Publish(p), V5), bytes);
    }

    #[test]
    fn publish_topic_alias_0_is_topic_alias_invalid() {
        assert_error(
            &[0x30, 7, 0, 1, b't', 3, 0x23, 0, 0],
            V5,
            ReasonCode::TOPIC_ALIAS_INVALID,
        );
    }

    #[test]
    fn publish_packet_id_0_is_malformed() {
        assert_error(
            &[0x32, 5, 0, 1, b't', 0, 0],
            V311,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn publish_subscription_identifier_0_is_protocol_error() {
        assert_error(
            &[0x30, 6, 0, 1, b't', 2, 0x0B, 0],
            V5,
            ReasonCode::PROTOCOL_ERROR,
        );
    }

    #[test]
    fn publish_repeated_subscription_identifiers_and_user_properties_are_allowed() {
        let bytes = [
            0x30, 22, 0, 1, b't', 18, //
            0x0B, 1, 0x0B, 2, // two subscription identifiers
            0x26, 0, 1, b'k', 0, 1, b'v', 0x26, 0, 1, b'k', 0, 1, b'w', // two user properties
        ];
        let Ok(Packet::Publish(p)) = decode_one(&bytes, V5) else {
            panic!()
        };
        assert_eq!(p.properties.subscription_identifiers, [1, 2]);
        assert_eq!(p.properties.user_properties.len(), 2);
    }

    #[test]
    fn duplicate_property_is_protocol_error() {
        // Message expiry interval twice.
        let bytes = [0x30, 14, 0, 1, b't', 10, 0x02, 0, 0, 0, 1, 0x02, 0, 0, 0, 1];
        assert_error(&bytes, V5, ReasonCode::PROTOCOL_ERROR);
    }

    #[test]
    fn property_not_allowed_in_packet_is_malformed() {
        // Session expiry interval is not a PUBLISH property.
        assert_error(
            &[0x30, 9, 0, 1, b't', 5, 0x11, 0, 0, 0, 1],
            V5,
            ReasonCode::MALFORMED_PACKET,
        );
        // 0x00 and 0x7F are not properties at all.
        assert_error(
            &[0x30, 5, 0, 1, b't', 1, 0x00],
            V5,
            ReasonCode::MALFORMED_PACKET,
        );
        assert_error(
            &[0x30, 5, 0, 1, b't', 1, 0x7F],
            V5,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn property_length_exceeding_packet_is_malformed() {
        assert_error(
            &[0x30, 6, 0, 1, b't', 9, 0x01, 0],
            V5,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn property_value_cut_by_property_length_is_malformed() {
        // The block is 2 bytes but message expiry interval needs 5.
        assert_error(
            &[0x30, 9, 0, 1, b't', 2, 0x02, 0, 0, 0, 1],
            V5,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn publish_payload_format_indicator_not_0_or_1_is_protocol_error() {
        assert_error(
            &[0x30, 6, 0, 1, b't', 2, 0x01, 2],
            V5,
            ReasonCode::PROTOCOL_ERROR,
        );
    }

    #[test]
    fn publish_topic_with_nul_is_malformed() {
        assert_error(
            &[0x30, 4, 0, 2, b't', 0],
            V311,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn publish_truncated_topic_is_malformed() {
        assert_error(&[0x30, 3, 0, 5, b't'], V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn outgoing_publish_overrides_properties() {
        let base = PublishProperties {
            topic_alias: Some(9),
            message_expiry_interval: Some(100),
            subscription_identifiers: vec![7],
            content_type: Some("c".into()),
            ..Default::default()
        };
        let out = OutgoingPublish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: "x",
            packet_id: Some(3),
            payload: b"p",
            properties: &base,
            topic_alias: None,
            message_expiry_interval: Some(40),
            subscription_identifiers: &[1, 2],
        };
        let mut buf = BytesMut::new();
        encode_publish(&out, V5, &mut buf).unwrap();
        assert_eq!(publish_len(&out, V5), Ok(buf.len()));
        let expected = Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: "x".into(),
            packet_id: Some(3),
            payload: Bytes::from_static(b"p"),
            properties: PublishProperties {
                message_expiry_interval: Some(40),
                subscription_identifiers: vec![1, 2],
                content_type: Some("c".into()),
                ..Default::default()
            },
        };
        assert_eq!(
            decode(&mut buf, V5, 1024),
            Ok(Some(Packet::Publish(expected)))
        );
    }

    #[test]
    fn publish_encode_errors() {
        let len = |p: Publish, v| crate::codec::encoded_len(&Packet::Publish(p), v);
        assert_eq!(
            len(publish(QoS::AtLeastOnce, None), V5),
            Err(EncodeError::PacketIdMismatch)
        );
        assert_eq!(
            len(publish(QoS::AtMostOnce, Some(1)), V5),
            Err(EncodeError::PacketIdMismatch)
        );
        assert_eq!(
            len(publish(QoS::AtLeastOnce, Some(0)), V5),
            Err(EncodeError::ZeroPacketId)
        );
        let mut dup = publish(QoS::AtMostOnce, None);
        dup.dup = true;
        assert_eq!(len(dup, V5), Err(EncodeError::DupWithQoS0));
        let mut empty = publish(QoS::AtMostOnce, None);
        empty.topic.clear();
        assert_eq!(len(empty.clone(), V5), Err(EncodeError::EmptyTopic));
        empty.properties.topic_alias = Some(1);
        assert_eq!(len(empty, V311), Err(EncodeError::EmptyTopic));
        let mut zero_alias = publish(QoS::AtMostOnce, None);
        zero_alias.properties.topic_alias = Some(0);
        assert!(matches!(
            len(zero_alias, V5),
            Err(EncodeError::PropertyOutOfRange { .. })
        ));
        let mut big_id = publish(QoS::AtMostOnce, None);
        big_id.properties.subscription_identifiers = vec![268_435_456];
        assert!(matches!(
            len(big_id, V5),
            Err(EncodeError::PropertyOutOfRange { .. })
        ));
    }

    #[test]
    fn v311_publish_drops_properties() {
        let mut p = publish(QoS::AtMostOnce, None);
        p.properties.content_type = Some("c".into());
        let bytes = encode_vec(&Packet::Publish(p), V311);
        assert_eq!(bytes, [0x30, 7, 0, 3, b'a', b'/', b'b', b'h', b'i']);
    }
}
