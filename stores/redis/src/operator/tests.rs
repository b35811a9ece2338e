//! The value layout read back from the read script's replies, and the forget scripts' replies.

use super::*;

fn reply(kind: &str, value: Value, pttl: i64) -> Value {
    Value::Array(vec![
        Value::SimpleString(kind.into()),
        value,
        Value::Int(pttl),
        Value::Array(vec![
            Value::BulkString(b"1700000000".to_vec()),
            Value::BulkString(b"250".to_vec()),
        ]),
    ])
}

#[test]
fn a_lock_without_an_expiry_has_no_ttl() {
    let read =
        Reading::from_reply(&reply("string", Value::BulkString(b"Labc.7".to_vec()), -1)).unwrap();
    assert!(matches!(
        read.stored,
        Stored::Lock {
            fencing_token: Some(7),
            lock_ttl_remaining: None
        }
    ));
    assert_eq!(read.server_time_us, 1_700_000_000_000_250);
}

#[test]
fn values_are_read_by_their_tag() {
    let marker = Stored::parse(b"Dgarbage", Some(Duration::from_secs(5)));
    assert!(matches!(
        marker,
        Stored::Marker { ref bytes, ttl: Some(_), marker: Err(_) } if bytes == b"Dgarbage"
    ));
    assert!(matches!(
        Stored::parse(b"T17", None),
        Stored::Released {
            fencing_token: Some(17)
        }
    ));
    assert!(matches!(
        Stored::parse(b"Labc.x", None),
        Stored::Lock {
            fencing_token: None,
            ..
        }
    ));
    assert!(matches!(Stored::parse(b"", None), Stored::Foreign { .. }));
    assert_eq!(forgot_from_reply(&Value::Int(-1)), Some(Forgot::Changed));
    assert_eq!(forgot_from_reply(&Value::Int(2)), None);
}

#[test]
fn other_types_and_foreign_strings_are_named() {
    let hash = Reading::from_reply(&reply("hash", Value::Nil, -1)).unwrap();
    assert!(matches!(hash.stored, Stored::OtherType { kind } if kind == "hash"));
    let foreign =
        Reading::from_reply(&reply("string", Value::BulkString(b"OK".to_vec()), 5)).unwrap();
    assert!(matches!(foreign.stored, Stored::Foreign { .. }));
    let gone = Reading::from_reply(&reply("none", Value::Nil, -2)).unwrap();
    assert!(matches!(gone.stored, Stored::Missing));
    assert!(Reading::from_reply(&Value::Int(1)).is_err());
}
