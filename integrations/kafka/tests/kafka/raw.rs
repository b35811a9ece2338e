//! A Kafka producer written by hand, for the records rdkafka cannot write: a header whose name
//! is not UTF-8 (rdkafka's header names are `&str`). One `Produce` v3 request with one record
//! batch (magic 2) of one record, over a plain TCP connection.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Produces one record with `headers` (names as raw bytes) and `payload` to `partition` of
/// `topic` on the broker at `bootstrap` (`host:port`); answers its offset.
pub(super) fn produce(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    headers: &[(&[u8], &[u8])],
    payload: &[u8],
) -> i64 {
    let batch = record_batch(headers, payload);
    let mut body = Vec::new();
    body.extend_from_slice(&(-1_i16).to_be_bytes()); // transactional_id: null
    body.extend_from_slice(&(-1_i16).to_be_bytes()); // acks: all
    body.extend_from_slice(&10_000_i32.to_be_bytes()); // timeout_ms
    body.extend_from_slice(&1_i32.to_be_bytes()); // one topic
    put_string(&mut body, topic);
    body.extend_from_slice(&1_i32.to_be_bytes()); // one partition
    body.extend_from_slice(&partition.to_be_bytes());
    body.extend_from_slice(&len_i32(batch.len()).to_be_bytes());
    body.extend_from_slice(&batch);
    let reply = request(bootstrap, 0, 3, &body);
    // responses: [name, [index, error_code, base_offset, log_append_time]], throttle_time
    let mut at = 4;
    let name_len = usize::try_from(i16::from_be_bytes([reply[at], reply[at + 1]])).unwrap();
    at += 2 + name_len + 4 + 4;
    let error = i16::from_be_bytes([reply[at], reply[at + 1]]);
    assert_eq!(error, 0, "the broker refused the record");
    i64::from_be_bytes(reply[at + 2..at + 10].try_into().unwrap())
}

/// One record batch, magic 2, holding one record without a key.
fn record_batch(headers: &[(&[u8], &[u8])], payload: &[u8]) -> Vec<u8> {
    let mut record = vec![0]; // attributes
    put_varint(&mut record, 0); // timestamp delta
    put_varint(&mut record, 0); // offset delta
    put_varint(&mut record, -1); // no key
    put_varint(&mut record, i64::try_from(payload.len()).unwrap());
    record.extend_from_slice(payload);
    put_varint(&mut record, i64::try_from(headers.len()).unwrap());
    for (name, value) in headers {
        put_varint(&mut record, i64::try_from(name.len()).unwrap());
        record.extend_from_slice(name);
        put_varint(&mut record, i64::try_from(value.len()).unwrap());
        record.extend_from_slice(value);
    }
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    // What the CRC covers: from the attributes to the end.
    let mut checked = Vec::new();
    checked.extend_from_slice(&0_i16.to_be_bytes()); // attributes
    checked.extend_from_slice(&0_i32.to_be_bytes()); // last offset delta
    checked.extend_from_slice(&now.to_be_bytes()); // base timestamp
    checked.extend_from_slice(&now.to_be_bytes()); // max timestamp
    checked.extend_from_slice(&(-1_i64).to_be_bytes()); // producer id
    checked.extend_from_slice(&(-1_i16).to_be_bytes()); // producer epoch
    checked.extend_from_slice(&(-1_i32).to_be_bytes()); // base sequence
    checked.extend_from_slice(&1_i32.to_be_bytes()); // one record
    put_varint(&mut checked, i64::try_from(record.len()).unwrap());
    checked.extend_from_slice(&record);
    let mut after_length = Vec::new();
    after_length.extend_from_slice(&(-1_i32).to_be_bytes()); // partition leader epoch
    after_length.push(2); // magic
    after_length.extend_from_slice(&crc32c(&checked).to_be_bytes());
    after_length.extend_from_slice(&checked);
    let mut batch = Vec::new();
    batch.extend_from_slice(&0_i64.to_be_bytes()); // base offset
    batch.extend_from_slice(&len_i32(after_length.len()).to_be_bytes());
    batch.extend_from_slice(&after_length);
    batch
}

/// Sends one request (header v1) and answers the reply's body after its correlation id.
fn request(bootstrap: &str, api_key: i16, version: i16, body: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(bootstrap).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut message = Vec::new();
    message.extend_from_slice(&api_key.to_be_bytes());
    message.extend_from_slice(&version.to_be_bytes());
    message.extend_from_slice(&7_i32.to_be_bytes()); // correlation id
    put_string(&mut message, "raw-producer");
    message.extend_from_slice(body);
    stream
        .write_all(&len_i32(message.len()).to_be_bytes())
        .unwrap();
    stream.write_all(&message).unwrap();
    let mut size = [0; 4];
    stream.read_exact(&mut size).unwrap();
    let mut reply = vec![0; usize::try_from(i32::from_be_bytes(size)).unwrap()];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(
        reply[..4],
        7_i32.to_be_bytes(),
        "the reply to another request"
    );
    reply.split_off(4)
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&i16::try_from(text.len()).unwrap().to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// A zigzag varint, as record fields are written.
fn put_varint(out: &mut Vec<u8>, value: i64) {
    #[expect(clippy::cast_sign_loss, reason = "zigzag encoding reads the bits")]
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    loop {
        let byte = u8::try_from(zigzag & 0x7f).unwrap();
        zigzag >>= 7;
        if zigzag == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn len_i32(len: usize) -> i32 {
    i32::try_from(len).unwrap()
}

/// CRC-32C (Castagnoli), which record batches carry.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0_u32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn crc32c_matches_its_check_value() {
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
}
