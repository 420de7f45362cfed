//! CONNECT (MQTT 3.1.1 §3.1, MQTT 5.0 §3.1).
//!
//! The decoder reads the protocol name and level itself: CONNECT is the packet that tells which
//! version the rest of the connection speaks.

use bytes::Bytes;

use super::error::{DecodeError, EncodeError};
use super::packet::{Connect, ConnectProperties, LastWill, ProtocolVersion, QoS, WillProperties};
use super::primitives::{
    Sink, put_binary, put_string, read_binary, read_string, read_u8, read_u16,
};
use super::properties;
use super::publish::check_topic_name;
use super::reason::ReasonCode;

const PROTOCOL_NAME: &str = "MQTT";

const RESERVED: u8 = 0x01;
const CLEAN_START: u8 = 0x02;
const WILL: u8 = 0x04;
const WILL_QOS_SHIFT: u8 = 3;
const WILL_RETAIN: u8 = 0x20;
const PASSWORD: u8 = 0x40;
const USERNAME: u8 = 0x80;

fn unsupported(detail: &'static str) -> DecodeError {
    DecodeError::new(ReasonCode::UNSUPPORTED_PROTOCOL_VERSION, detail)
}

pub(crate) fn decode(buf: &mut Bytes) -> Result<Connect, DecodeError> {
    if read_binary(buf)? != PROTOCOL_NAME.as_bytes() {
        return Err(unsupported("protocol name is not MQTT"));
    }
    let protocol = match read_u8(buf)? {
        4 => ProtocolVersion::V311,
        5 => ProtocolVersion::V5,
        _ => {
            return Err(unsupported(
                "protocol level is neither 4 (3.1.1) nor 5 (5.0)",
            ));
        }
    };
    let v5 = protocol == ProtocolVersion::V5;

    let flags = read_u8(buf)?;
    if flags & RESERVED != 0 {
        return Err(DecodeError::malformed("CONNECT reserved flag set"));
    }
    let will_flag = flags & WILL != 0;
    let will_retain = flags & WILL_RETAIN != 0;
    let will_qos = (flags >> WILL_QOS_SHIFT) & 0b11;
    if !will_flag && (will_qos != 0 || will_retain) {
        return Err(DecodeError::malformed(
            "will QoS or retain set without will flag",
        ));
    }
    let will_qos = QoS::from_u8(will_qos).ok_or(DecodeError::malformed("will QoS 3"))?;
    let has_password = flags & PASSWORD != 0;
    let has_username = flags & USERNAME != 0;
    if !v5 && has_password && !has_username {
        return Err(DecodeError::malformed(
            "password flag without user name flag",
        ));
    }

    let keep_alive = read_u16(buf)?;
    let properties = if v5 {
        properties::read_connect(buf)?
    } else {
        ConnectProperties::default()
    };
    let client_id = read_string(buf)?;
    let will = if will_flag {
        let properties = if v5 {
            properties::read_will(buf)?
        } else {
            WillProperties::default()
        };
        let topic = read_string(buf)?;
        if topic.is_empty() {
            return Err(DecodeError::new(
                ReasonCode::TOPIC_NAME_INVALID,
                "empty will topic",
            ));
        }
        check_topic_name(&topic)?;
        let payload = read_binary(buf)?;
        Some(LastWill {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            properties,
        })
    } else {
        None
    };
    let username = if has_username {
        Some(read_string(buf)?)
    } else {
        None
    };
    let password = if has_password {
        Some(read_binary(buf)?)
    } else {
        None
    };

    Ok(Connect {
        protocol,
        clean_start: flags & CLEAN_START != 0,
        keep_alive,
        client_id,
        will,
        username,
        password,
        properties,
    })
}

/// Writes the variable header and payload; the version is `c.protocol`.
pub(crate) fn write<S: Sink>(c: &Connect, s: &mut S) -> Result<(), EncodeError> {
    let v5 = c.protocol == ProtocolVersion::V5;
    if !v5 && c.password.is_some() && c.username.is_none() {
        return Err(EncodeError::PasswordWithoutUsername);
    }
    let mut flags = 0;
    if c.clean_start {
        flags |= CLEAN_START;
    }
    if let Some(will) = &c.will {
        flags |= WILL | (will.qos as u8) << WILL_QOS_SHIFT;
        if will.retain {
            flags |= WILL_RETAIN;
        }
    }
    if c.password.is_some() {
        flags |= PASSWORD;
    }
    if c.username.is_some() {
        flags |= USERNAME;
    }

    put_string(s, PROTOCOL_NAME)?;
    s.put_u8(c.protocol.level());
    s.put_u8(flags);
    s.put_u16(c.keep_alive);
    if v5 {
        s.put_block(&c.properties)?;
    }
    put_string(s, &c.client_id)?;
    if let Some(will) = &c.will {
        if v5 {
            s.put_block(&will.properties)?;
        }
        put_string(s, &will.topic)?;
        put_binary(s, &will.payload)?;
    }
    if let Some(username) = &c.username {
        put_string(s, username)?;
    }
    if let Some(password) = &c.password {
        put_binary(s, password)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Packet;
    use crate::codec::test_util::{assert_error, decode_one, encode_vec, round_trip};
    use ProtocolVersion::*;

    /// MQTT 3.1.1: clean session, keep alive 60, client id "c", will "w/t" QoS 1 retained
    /// payload "bye", user "u", password "p".
    const V311_FULL: &[u8] = &[
        0x10,
        29, // fixed header
        0,
        4,
        b'M',
        b'Q',
        b'T',
        b'T',
        4,           // protocol name, level
        0b1110_1110, // username, password, will retain, will QoS 1, will, clean session
        0,
        60, // keep alive
        0,
        1,
        b'c', // client id
        0,
        3,
        b'w',
        b'/',
        b't', // will topic
        0,
        3,
        b'b',
        b'y',
        b'e', // will payload
        0,
        1,
        b'u', // user name
        0,
        1,
        b'p', // password
    ];

    fn full(protocol: ProtocolVersion) -> Connect {
        Connect {
            protocol,
            clean_start: true,
            keep_alive: 60,
            client_id: "c".into(),
            will: Some(LastWill {
                topic: "w/t".into(),
                payload: Bytes::from_static(b"bye"),
                qos: QoS::AtLeastOnce,
                retain: true,
                properties: WillProperties::default(),
            }),
            username: Some("u".into()),
            password: Some(Bytes::from_static(b"p")),
            properties: ConnectProperties::default(),
        }
    }

    #[test]
    fn v311_connect_bytes() {
        let p = Packet::Connect(full(V311));
        assert_eq!(decode_one(V311_FULL, V311), Ok(p.clone()));
        // CONNECT is recognised whatever version the caller assumed.
        assert_eq!(decode_one(V311_FULL, V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V311), V311_FULL);
    }

    #[test]
    fn v311_minimal_connect_bytes() {
        let bytes = [0x10, 12, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x00, 0, 0, 0, 0];
        let p = Packet::Connect(Connect {
            protocol: V311,
            clean_start: false,
            keep_alive: 0,
            client_id: String::new(),
            will: None,
            username: None,
            password: None,
            properties: ConnectProperties::default(),
        });
        assert_eq!(decode_one(&bytes, V311), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V311), bytes);
    }

    #[test]
    fn v5_connect_bytes() {
        let bytes: &[u8] = &[
            0x10,
            49, // fixed header
            0,
            4,
            b'M',
            b'Q',
            b'T',
            b'T',
            5,           // protocol name, level
            0b1100_0110, // username, password, will QoS 0, will, clean start
            0,
            10, // keep alive
            14, // properties
            0x11,
            0,
            0,
            0,
            30, // session expiry interval 30
            0x21,
            0,
            20, // receive maximum 20
            0x15,
            0,
            3,
            b'S',
            b'C',
            b'R', // authentication method
            0,
            2,
            b'i',
            b'd', // client id
            7,    // will properties
            0x18,
            0,
            0,
            0,
            5, // will delay interval 5
            0x01,
            1, // payload format indicator: UTF-8
            0,
            1,
            b't', // will topic
            0,
            2,
            b'h',
            b'i', // will payload
            0,
            1,
            b'u', // user name
            0,
            0, // password (empty)
        ];
        let p = Packet::Connect(Connect {
            protocol: V5,
            clean_start: true,
            keep_alive: 10,
            client_id: "id".into(),
            will: Some(LastWill {
                topic: "t".into(),
                payload: Bytes::from_static(b"hi"),
                qos: QoS::AtMostOnce,
                retain: false,
                properties: WillProperties {
                    will_delay_interval: Some(5),
                    payload_format_indicator: Some(1),
                    ..Default::default()
                },
            }),
            username: Some("u".into()),
            password: Some(Bytes::new()),
            properties: ConnectProperties {
                session_expiry_interval: Some(30),
                receive_maximum: Some(20),
                authentication_method: Some("SCR".into()),
                ..Default::default()
            },
        });
        assert_eq!(decode_one(bytes, V311), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), bytes);
    }

    #[test]
    fn connect_full_v5_round_trips() {
        let mut c = full(V5);
        c.properties = ConnectProperties {
            session_expiry_interval: Some(1),
            receive_maximum: Some(2),
            maximum_packet_size: Some(3),
            topic_alias_maximum: Some(4),
            request_response_information: Some(true),
            request_problem_information: Some(false),
            user_properties: vec![("a".into(), "b".into()), ("a".into(), "c".into())],
            authentication_method: Some("m".into()),
            authentication_data: Some(Bytes::from_static(b"d")),
        };
        c.will.as_mut().unwrap().properties = WillProperties {
            will_delay_interval: Some(1),
            payload_format_indicator: Some(0),
            message_expiry_interval: Some(2),
            content_type: Some("text/plain".into()),
            response_topic: Some("r".into()),
            correlation_data: Some(Bytes::from_static(b"x")),
            user_properties: vec![("k".into(), "v".into())],
        };
        round_trip(&Packet::Connect(c), V5);
    }

    fn with_flags(flags: u8) -> Vec<u8> {
        let mut v = V311_FULL.to_vec();
        v[9] = flags;
        v
    }

    #[test]
    fn connect_reserved_flag_is_malformed() {
        assert_error(&with_flags(0b1110_1111), V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn connect_will_qos_without_will_flag_is_malformed() {
        let bytes = [
            0x10,
            12,
            0,
            4,
            b'M',
            b'Q',
            b'T',
            b'T',
            4,
            0b0000_1000,
            0,
            0,
            0,
            0,
        ];
        assert_error(&bytes, V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn connect_will_retain_without_will_flag_is_malformed() {
        let bytes = [
            0x10,
            12,
            0,
            4,
            b'M',
            b'Q',
            b'T',
            b'T',
            4,
            0b0010_0000,
            0,
            0,
            0,
            0,
        ];
        assert_error(&bytes, V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn connect_will_qos3_is_malformed() {
        assert_error(&with_flags(0b1111_1110), V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn connect_v311_password_without_username_is_malformed() {
        // Password flag only; the payload is client id "" and password "p".
        let bytes = [
            0x10, 15, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x40, 0, 0, 0, 0, 0, 1, b'p',
        ];
        assert_error(&bytes, V311, ReasonCode::MALFORMED_PACKET);
        // MQTT 5.0 allows it.
        let mut v5 = bytes.to_vec();
        v5[1] = 16;
        v5[8] = 5;
        v5.insert(12, 0); // empty property block
        let Ok(Packet::Connect(c)) = decode_one(&v5, V5) else {
            panic!("v5 refused")
        };
        assert_eq!(
            (c.username, c.password),
            (None, Some(Bytes::from_static(b"p")))
        );
    }

    #[test]
    fn connect_trailing_bytes_are_malformed() {
        let mut bytes = V311_FULL.to_vec();
        bytes[1] += 1;
        bytes.push(0);
        assert_error(&bytes, V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn connect_truncated_is_malformed() {
        let mut bytes = V311_FULL.to_vec();
        bytes[1] -= 1;
        bytes.pop();
        assert_error(&bytes, V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn connect_will_topic_with_wildcard_is_topic_name_invalid() {
        let mut bytes = V311_FULL.to_vec();
        bytes[18] = b'+';
        assert_error(&bytes, V311, ReasonCode::TOPIC_NAME_INVALID);
        bytes[18] = b'#';
        assert_error(&bytes, V311, ReasonCode::TOPIC_NAME_INVALID);
    }

    #[test]
    fn connect_unknown_level_is_unsupported_protocol_version() {
        for level in [0, 3, 6, 255] {
            let bytes = [0x10, 12, 0, 4, b'M', b'Q', b'T', b'T', level, 0, 0, 0, 0, 0];
            assert_error(&bytes, V311, ReasonCode::UNSUPPORTED_PROTOCOL_VERSION);
        }
    }

    #[test]
    fn connect_wrong_protocol_name_is_unsupported_protocol_version() {
        let bytes = [0x10, 12, 0, 4, b'M', b'Q', b'T', b'X', 4, 0, 0, 0, 0, 0];
        assert_error(&bytes, V5, ReasonCode::UNSUPPORTED_PROTOCOL_VERSION);
    }

    #[test]
    fn connect_mqisdp_level3_is_unsupported_protocol_version() {
        let bytes = [
            0x10, 14, 0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 0, 0, 0, 0, 0,
        ];
        assert_error(&bytes, V311, ReasonCode::UNSUPPORTED_PROTOCOL_VERSION);
    }

    #[test]
    fn connect_authentication_data_without_method_is_protocol_error() {
        let bytes = [
            0x10, 17, 0, 4, b'M', b'Q', b'T', b'T', 5, 0, 0, 0, //
            4, 0x16, 0, 1, b'x', // authentication data only
            0, 0,
        ];
        assert_error(&bytes, V5, ReasonCode::PROTOCOL_ERROR);
    }

    #[test]
    fn connect_property_not_allowed_is_malformed() {
        // Topic alias (0x23) is a PUBLISH property.
        let bytes = [
            0x10, 16, 0, 4, b'M', b'Q', b'T', b'T', 5, 0, 0, 0, 3, 0x23, 0, 1, 0, 0,
        ];
        assert_error(&bytes, V5, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn connect_receive_maximum_0_is_protocol_error() {
        let bytes = [
            0x10, 16, 0, 4, b'M', b'Q', b'T', b'T', 5, 0, 0, 0, 3, 0x21, 0, 0, 0, 0,
        ];
        assert_error(&bytes, V5, ReasonCode::PROTOCOL_ERROR);
    }

    #[test]
    fn connect_maximum_packet_size_0_is_protocol_error() {
        let bytes = [
            0x10, 18, 0, 4, b'M', b'Q', b'T', b'T', 5, 0, 0, 0, 5, 0x27, 0, 0, 0, 0, 0, 0,
        ];
        assert_error(&bytes, V5, ReasonCode::PROTOCOL_ERROR);
    }

    #[test]
    fn connect_request_information_not_boolean_is_protocol_error() {
        for id in [0x17, 0x19] {
            let bytes = [
                0x10, 15, 0, 4, b'M', b'Q', b'T', b'T', 5, 0, 0, 0, 2, id, 2, 0, 0,
            ];
            assert_error(&bytes, V5, ReasonCode::PROTOCOL_ERROR);
        }
    }

    #[test]
    fn will_payload_format_indicator_not_0_or_1_is_protocol_error() {
        let bytes = [
            0x10, 21, 0, 4, b'M', b'Q', b'T', b'T', 5, WILL, 0, 0, 0, 0, 0, //
            2, 0x01, 2, // will properties: payload format indicator 2
            0, 1, b't', 0, 0,
        ];
        assert_error(&bytes, V5, ReasonCode::PROTOCOL_ERROR);
    }

    #[test]
    fn v311_password_without_username_is_encode_error() {
        let mut c = full(V311);
        c.username = None;
        assert_eq!(
            crate::codec::encoded_len(&Packet::Connect(c), V311),
            Err(EncodeError::PasswordWithoutUsername)
        );
    }
}
