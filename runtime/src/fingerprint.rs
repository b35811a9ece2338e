//! Fingerprints of the arguments that must match when an idempotency key is reused.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::unit::hex;

/// The SHA-256 of some arguments' canonical JSON encoding.
///
/// A task that declares a fingerprint stores it in its marker; a later call with the same key
/// but a different fingerprint gets [`Error::KeyReuse`](crate::Error::KeyReuse) instead of the
/// first call's result, which catches two operations sharing one key by mistake.
///
/// The arguments are encoded as compact JSON with the members of every object sorted, so the
/// fingerprint depends only on the values and the names of fields and map keys: not on the
/// iteration order of a `HashMap` (random per process), nor on the order in which a struct
/// declares its fields. Values that JSON cannot tell apart (a `u8` and a `u64` holding 7, a
/// `Vec` and a tuple) have the same fingerprint. Numbers keep their exact text, never going
/// through a float: every `u128` and `i128` is its own, and a finite float is the shortest text
/// that reads back as the same float, so two different finite floats never share a fingerprint.
///
/// **What `serde_json` writes as `null` has one fingerprint.** JSON has no text for `NaN`,
/// `inf` or `-inf`: `serde_json` writes each of them as `null`, as it writes `None` and `()`. So
/// `f64::NAN`, `f64::INFINITY`, `f64::NEG_INFINITY`, `None::<f64>` and `Some(None::<u8>)` all
/// have the fingerprint of `null`, and a key reused with `NaN` where `inf` was first is not
/// [`Error::KeyReuse`](crate::Error::KeyReuse). Where arguments may hold a non-finite float and
/// the difference matters, fingerprint something that tells them apart (the float's
/// `to_bits()`, or its `to_string()`), or refuse them before the call.
///
/// ```
/// use std::collections::HashMap;
/// use idempotask::Fingerprint;
/// let a = Fingerprint::of(&(42_u64, "EUR"))?;
/// assert_eq!(a, Fingerprint::of(&(42_u64, "EUR"))?);
/// assert_ne!(a, Fingerprint::of(&(43_u64, "EUR"))?);
/// // The same map, built in another order, has the same fingerprint.
/// let forward: HashMap<_, _> = (0..64).map(|i| (i.to_string(), i)).collect();
/// let backward: HashMap<_, _> = (0..64).rev().map(|i| (i.to_string(), i)).collect();
/// assert_eq!(Fingerprint::of(&forward)?, Fingerprint::of(&backward)?);
/// // 2^64 and 2^64 + 1 are two values, in a map too.
/// let big = |n: u128| HashMap::from([("account", n)]);
/// assert_ne!(Fingerprint::of(&big(1 << 64))?, Fingerprint::of(&big((1 << 64) + 1))?);
/// // NaN, the infinities and None are all `null` to JSON, and so one fingerprint.
/// assert_eq!(Fingerprint::of(&(f64::NAN, "EUR"))?, Fingerprint::of(&(f64::INFINITY, "EUR"))?);
/// assert_eq!(Fingerprint::of(&(f64::NAN, "EUR"))?, Fingerprint::of(&(None::<f64>, "EUR"))?);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint of `value` (use a tuple for several arguments).
    ///
    /// # Errors
    /// When `value` cannot be serialised to JSON (a map with non-string keys, a failing
    /// `Serialize` implementation).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        // The writer, not a `serde_json::Value`: a tree holds no integer beyond 64 bits.
        let text = serde_json::to_vec(value)?;
        // `serde_json` has recursed as deep to write the text, so following it is no risk.
        let canonical = canonical(&text, usize::MAX).ok_or_else(|| {
            <serde_json::Error as serde::ser::Error>::custom(
                "the value's JSON encoding could not be read back",
            )
        })?;
        Ok(Self(hex(&Sha256::digest(&canonical))))
    }

    /// The fingerprint of a JSON text (a request body): the SHA-256 of its canonical form, so
    /// that two texts of one value have one fingerprint, whoever wrote them. `None` when `text`
    /// is not one JSON value (RFC 8259, UTF-8, nested at most 128 deep).
    ///
    /// The canonical form is what [`of`](Self::of) hashes, so the text of a value has the
    /// value's fingerprint:
    /// - no whitespace between tokens;
    /// - object members sorted by their names' bytes; members with equal names all count, in
    ///   their order (readers disagree on which one wins);
    /// - strings by the characters they stand for: `"\u0041"` is `"A"`;
    /// - **numbers by their exact text**, never through a float, so `18446744073709551616` and
    ///   `18446744073709551617`, or two decimals apart in their 21st digit, are two values. Only
    ///   the spelling of an exponent is normalised (`1E+02` is `1e2`), which no reader tells
    ///   apart. `1`, `1.0`, `1e0`, `100` and `1e2` stay five values, and `-0` is not `0`:
    ///   typed readers tell them apart (serde reads `1` into a `u64` and refuses `1.0`;
    ///   `-0` reads as a float, `0` as an integer), so treating them as one could replay the
    ///   answer to one to a request whose handler would have answered the other differently.
    ///
    /// ```
    /// use idempotask::Fingerprint;
    /// let of = |text: &str| Fingerprint::of_json(text.as_bytes()).unwrap();
    /// assert_eq!(of(r#"{"a": 1, "b": [true, "\u00e9"]}"#), of(r#"{"b":[true,"é"],"a":1}"#));
    /// assert_eq!(of(r#"{"a":1,"b":2}"#), Fingerprint::of(&serde_json::json!({"b": 2, "a": 1}))?);
    /// assert_ne!(of("18446744073709551616"), of("18446744073709551617"));
    /// assert_ne!(of("1.0"), of("1"));
    /// assert_ne!(of("-0"), of("0"));
    /// assert_eq!(of("1E+02"), of("1e2"));
    /// assert!(Fingerprint::of_json(b"{\"a\":").is_none());
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn of_json(text: &[u8]) -> Option<Self> {
        let canonical = canonical(text, MAX_DEPTH)?;
        Some(Self(hex(&Sha256::digest(&canonical))))
    }

    /// The fingerprint whose SHA-256 is `digest`: for an integration that hashes an encoding of
    /// its own (an HTTP request's method, path and body, fed to the hash as they are) instead of
    /// serialising a value to JSON first.
    ///
    /// The encoding must be unambiguous (length-prefix each part): two requests that must
    /// differ have to feed the hash different bytes.
    ///
    /// ```
    /// use idempotask::Fingerprint;
    /// use sha2::{Digest, Sha256};
    /// let fingerprint = Fingerprint::from_sha256(Sha256::digest(b"POST /payments").into());
    /// assert_eq!(fingerprint.as_str().len(), 64);
    /// ```
    pub fn from_sha256(digest: [u8; 32]) -> Self {
        Self(hex(&digest))
    }

    /// The lowercase hex digest, as stored in markers.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How deep [`Fingerprint::of_json`] follows arrays and objects in text from outside (a request
/// body), so that such text cannot exhaust the stack: deeper text is not JSON to it, as it is
/// not to `serde_json`'s parser, whose limit is about the same.
const MAX_DEPTH: usize = 128;

/// Input: JSON text. Output: its canonical form ([`Fingerprint::of_json`] says what that is),
/// written to a buffer that is returned; `None` when the text is not one JSON value or is
/// nested deeper than `max_depth`.
///
/// One pass over the text, building no tree: the output grows in one buffer, each object's
/// members are written where they come and reordered in place when they are not in order,
/// through one scratch buffer and one list of member spans shared by all objects.
fn canonical(text: &[u8], max_depth: usize) -> Option<Vec<u8>> {
    // UTF-8 checked once, up front: the strings' bytes are then copied as they are.
    std::str::from_utf8(text).ok()?;
    let mut canonical = Canonical {
        text,
        at: 0,
        // Never longer than the text: dropping whitespace, decoding escapes and respelling
        // exponents only shorten it.
        out: Vec::with_capacity(text.len()),
        members: Vec::new(),
        scratch: Vec::new(),
        depth_left: max_depth,
    };
    canonical.whitespace();
    canonical.value()?;
    canonical.whitespace();
    (canonical.at == text.len()).then_some(canonical.out)
}

/// Where one object member sits in the output: its name (quoted) at `start..name_end`, then `:`
/// and its value up to `end`.
#[derive(Clone, Copy)]
struct Member {
    start: usize,
    name_end: usize,
    end: usize,
}

struct Canonical<'a> {
    text: &'a [u8],
    at: usize,
    out: Vec<u8>,
    /// The members of every object being written, innermost last.
    members: Vec<Member>,
    scratch: Vec<u8>,
    depth_left: usize,
}

impl Canonical<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.text.get(self.at..end)? == word).then_some(())?;
        self.out.extend_from_slice(word);
        self.at = end;
        Some(())
    }

    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'{' => self.nested(Self::object),
            b'[' => self.nested(Self::array),
            b'"' => self.string(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn nested(&mut self, container: fn(&mut Self) -> Option<()>) -> Option<()> {
        self.depth_left = self.depth_left.checked_sub(1)?;
        container(self)?;
        self.depth_left += 1;
        Some(())
    }

    /// Writes the `open` bracket read; `true` when `close` follows at once, which is then
    /// written too.
    fn opens_empty(&mut self, open: u8, close: u8) -> Option<bool> {
        self.at += 1;
        self.out.push(open);
        self.whitespace();
        let empty = self.peek()? == close;
        if empty {
            self.at += 1;
            self.out.push(close);
        }
        Some(empty)
    }

    /// After an item: `true` on a comma (written), `false` on `close` (not yet written).
    fn another(&mut self, close: u8) -> Option<bool> {
        self.whitespace();
        match self.next()? {
            b',' => {
                self.out.push(b',');
                Some(true)
            }
            byte => (byte == close).then_some(false),
        }
    }

    fn array(&mut self) -> Option<()> {
        if self.opens_empty(b'[', b']')? {
            return Some(());
        }
        loop {
            self.whitespace();
            self.value()?;
            if !self.another(b']')? {
                break;
            }
        }
        self.out.push(b']');
        Some(())
    }

    /// Members sorted by their names' bytes (as decoded); members with equal names keep their
    /// order, and all of them count: readers disagree on which of two equal names wins.
    fn object(&mut self) -> Option<()> {
        if self.opens_empty(b'{', b'}')? {
            return Some(());
        }
        let region = self.out.len();
        let first = self.members.len();
        loop {
            self.whitespace();
            if self.peek()? != b'"' {
                return None;
            }
            let start = self.out.len();
            self.string()?;
            let name_end = self.out.len();
            self.whitespace();
            if self.next()? != b':' {
                return None;
            }
            self.out.push(b':');
            self.whitespace();
            self.value()?;
            let end = self.out.len();
            self.members.push(Member {
                start,
                name_end,
                end,
            });
            if !self.another(b'}')? {
                break;
            }
        }
        let out = &self.out;
        let members = &mut self.members[first..];
        let name = |member: &Member| decoded(&out[member.start + 1..member.name_end - 1]);
        if !members.is_sorted_by(|a, b| name(a).le(name(b))) {
            // Unstable but deterministic: equal names are ordered by where they came.
            members.sort_unstable_by(|a, b| name(a).cmp(name(b)).then(a.start.cmp(&b.start)));
            self.scratch.clear();
            self.scratch.extend_from_slice(&self.out[region..]);
            self.out.truncate(region);
            for (index, member) in members.iter().enumerate() {
                if index > 0 {
                    self.out.push(b',');
                }
                let from = member.start - region;
                self.out
                    .extend_from_slice(&self.scratch[from..member.end - region]);
            }
        }
        self.members.truncate(first);
        self.out.push(b'}');
        Some(())
    }

    /// A string, written as `serde_json` writes one: `"` and `\\` escaped, the control
    /// characters as `\b`, `\t`, `\n`, `\f`, `\r` or `\u00xx`, everything else as itself.
    fn string(&mut self) -> Option<()> {
        self.at += 1;
        self.out.push(b'"');
        loop {
            let run = self.text[self.at..]
                .iter()
                .position(|&byte| byte == b'"' || byte == b'\\' || byte < 0x20)?;
            self.out
                .extend_from_slice(&self.text[self.at..self.at + run]);
            self.at += run;
            match self.next()? {
                b'"' => break,
                b'\\' => {
                    let unescaped = match self.next()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.escaped_char()?,
                        _ => return None,
                    };
                    write_char(&mut self.out, unescaped);
                }
                // A raw control character.
                _ => return None,
            }
        }
        self.out.push(b'"');
        Some(())
    }

    /// The character of a `\u` escape (whose `\u` is read), a surrogate pair's as one; a lone
    /// surrogate is not JSON to `serde_json`, nor here.
    fn escaped_char(&mut self) -> Option<char> {
        let high = self.hex4()?;
        if !(0xd800..0xdc00).contains(&high) {
            return char::from_u32(high);
        }
        if self.next()? != b'\\' || self.next()? != b'u' {
            return None;
        }
        let low = self.hex4()?;
        if !(0xdc00..0xe000).contains(&low) {
            return None;
        }
        char::from_u32(0x1_0000 + ((high - 0xd800) << 10) + (low - 0xdc00))
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.text.get(self.at..self.at + 4)?;
        let mut value = 0;
        for &digit in digits {
            value = value * 16 + char::from(digit).to_digit(16)?;
        }
        self.at += 4;
        Some(value)
    }

    /// A number, as its text: only the exponent's spelling is normalised (`E` as `e`, no `+`,
    /// no leading zeros), which no reader tells apart.
    fn number(&mut self) -> Option<()> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        self.out.extend_from_slice(&self.text[start..self.at]);
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            let negative = match self.peek() {
                Some(sign @ (b'-' | b'+')) => {
                    self.at += 1;
                    sign == b'-'
                }
                _ => false,
            };
            let digits = self.at;
            self.some_digits()?;
            let exponent = &self.text[digits..self.at];
            self.out.push(b'e');
            match exponent.iter().position(|&digit| digit != b'0') {
                Some(first) => {
                    if negative {
                        self.out.push(b'-');
                    }
                    self.out.extend_from_slice(&exponent[first..]);
                }
                None => self.out.push(b'0'),
            }
        }
        Some(())
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }
}

/// Input: the inside of a string as [`Canonical`] writes it. Output: the bytes of the string it
/// stands for, for sorting names as `serde_json`'s map sorts them.
fn decoded(written: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut bytes = written.iter().copied();
    std::iter::from_fn(move || {
        let byte = bytes.next()?;
        if byte != b'\\' {
            return Some(byte);
        }
        Some(match bytes.next()? {
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            // `\u00xx`: a control character.
            b'u' => {
                let digits: [u8; 4] = std::array::from_fn(|_| bytes.next().unwrap_or(b'0'));
                // Lower-case hex digits, as `write_char` writes them.
                let hex = |digit: u8| match digit {
                    b'0'..=b'9' => digit - b'0',
                    b'a'..=b'f' => digit - b'a' + 10,
                    _ => 0,
                };
                hex(digits[2]) << 4 | hex(digits[3])
            }
            // `\"` and `\\`.
            escaped => escaped,
        })
    })
}

/// Writes `c` inside a string as `serde_json` does.
fn write_char(out: &mut Vec<u8>, c: char) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    match c {
        '"' => out.extend_from_slice(b"\\\""),
        '\\' => out.extend_from_slice(b"\\\\"),
        '\u{8}' => out.extend_from_slice(b"\\b"),
        '\u{c}' => out.extend_from_slice(b"\\f"),
        '\n' => out.extend_from_slice(b"\\n"),
        '\r' => out.extend_from_slice(b"\\r"),
        '\t' => out.extend_from_slice(b"\\t"),
        '\0'..='\u{1f}' => {
            let byte = c as u8;
            out.extend_from_slice(b"\\u00");
            out.push(DIGITS[usize::from(byte >> 4)]);
            out.push(DIGITS[usize::from(byte & 0x0f)]);
        }
        _ => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    fn canonical_text(text: &str) -> Option<String> {
        canonical(text.as_bytes(), MAX_DEPTH).map(|out| String::from_utf8(out).unwrap())
    }

    #[test]
    fn the_canonical_form_sorts_object_keys_at_every_depth() {
        assert_eq!(
            canonical_text(r#" {"b": [1, {"z": null, "a": "x"}], "a": {"d": 1.5, "c": true}} "#)
                .unwrap(),
            r#"{"a":{"c":true,"d":1.5},"b":[1,{"a":"x","z":null}]}"#
        );
    }

    #[test]
    fn numbers_keep_their_text_but_for_the_exponents_spelling() {
        for (text, canonical) in [
            ("18446744073709551617", "18446744073709551617"),
            (
                "-170141183460469231731687303715884105729",
                "-170141183460469231731687303715884105729",
            ),
            ("0.123456789012345678901234", "0.123456789012345678901234"),
            ("1.0", "1.0"),
            ("1.50", "1.50"),
            ("-0", "-0"),
            ("-0.0", "-0.0"),
            ("1E+02", "1e2"),
            ("1e-007", "1e-7"),
            ("2.5E00", "2.5e0"),
            ("1e-0", "1e0"),
            ("-1E-00", "-1e0"),
        ] {
            assert_eq!(canonical_text(text).as_deref(), Some(canonical), "{text}");
        }
        for not_a_number in [
            "01", "1.", ".5", "-", "1e", "1e+", "+1", "0x10", "1.e2", "NaN",
        ] {
            assert_eq!(canonical_text(not_a_number), None, "{not_a_number}");
        }
    }

    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        let text = r#""\u0041\/\b\f\n\r\t\u0001\u001f\"\\é\ud83d\ude00\u007f\u2028""#;
        let expected = serde_json::to_string(&serde_json::from_str::<String>(text).unwrap());
        assert_eq!(canonical_text(text), Some(expected.unwrap()));
        for not_a_string in [
            r#""\ud83d""#,
            r#""\ude00""#,
            r#""\x""#,
            "\"\u{1}\"",
            r#""a"#,
        ] {
            assert_eq!(canonical_text(not_a_string), None, "{not_a_string}");
        }
        assert_eq!(canonical(b"\"\xff\"", MAX_DEPTH), None);
    }

    #[test]
    fn names_sort_by_what_they_stand_for_and_equal_names_all_count() {
        // `\n` (0x0a) sorts before `A` (0x41), though its escape `\` (0x5c) sorts after.
        assert_eq!(
            canonical_text(r#"{"A":1,"\n":2,"\u0001":3}"#).unwrap(),
            r#"{"\u0001":3,"\n":2,"A":1}"#
        );
        assert_eq!(
            canonical_text(r#"{"b":1,"a":2,"b":0}"#).unwrap(),
            r#"{"a":2,"b":1,"b":0}"#
        );
        assert_ne!(
            canonical_text(r#"{"a":1,"a":2}"#),
            canonical_text(r#"{"a":2}"#)
        );
        assert_ne!(
            canonical_text(r#"{"a":1,"a":2}"#),
            canonical_text(r#"{"a":2,"a":1}"#)
        );
    }

    #[test]
    fn what_is_not_one_json_value_has_no_canonical_form() {
        for text in [
            "",
            " ",
            "{",
            "[1,]",
            "[1 2]",
            r#"{"a"}"#,
            r#"{"a":1,}"#,
            "{1:2}",
            "tru",
            "nul",
            "1 2",
            "{}x",
            "\u{feff}{}",
        ] {
            assert_eq!(canonical_text(text), None, "{text:?}");
        }
        let deep = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert!(canonical_text(&deep(MAX_DEPTH)).is_some());
        assert_eq!(canonical_text(&deep(MAX_DEPTH + 1)), None);
        assert_eq!(canonical_text("[[]] \n").as_deref(), Some("[[]]"));
    }

    /// How fingerprints were computed through a `serde_json::Value`, which holds floats as
    /// `f64`: for texts without fractions or exponents the canonical form is the same, so the
    /// markers such requests stored keep matching.
    fn through_a_tree(text: &str) -> String {
        fn write(out: &mut String, value: &serde_json::Value) {
            match value {
                serde_json::Value::Array(items) => {
                    out.push('[');
                    for (index, item) in items.iter().enumerate() {
                        if index > 0 {
                            out.push(',');
                        }
                        write(out, item);
                    }
                    out.push(']');
                }
                serde_json::Value::Object(map) => {
                    out.push('{');
                    for (index, (name, item)) in map.iter().enumerate() {
                        if index > 0 {
                            out.push(',');
                        }
                        out.push_str(&serde_json::to_string(name).unwrap());
                        out.push(':');
                        write(out, item);
                    }
                    out.push('}');
                }
                leaf => out.push_str(&leaf.to_string()),
            }
        }
        let mut out = String::new();
        write(&mut out, &serde_json::from_str(text).unwrap());
        out
    }

    #[test]
    fn integers_and_strings_keep_the_form_they_had_through_a_tree() {
        for text in [
            r#"{"amount":4200,"currency":"EUR"}"#,
            r#" { "z" : [ -1 , 0 , 18446744073709551615, null, false ], "a\u00e9\n": {"y": "\"q\"\t"} }"#,
            r#"[{"b":{"d":1,"c":2},"a":"\u0007"}, "\u00e9\ud83d\ude00", -9223372036854775808]"#,
        ] {
            assert_eq!(
                canonical_text(text).unwrap(),
                through_a_tree(text),
                "{text}"
            );
        }
    }

    // Maps serialise in their iteration order, which for a `HashMap` is random per instance:
    // redeliveries with identical arguments must still match.
    #[test]
    fn maps_have_one_fingerprint_whatever_their_order() {
        let sorted: BTreeMap<String, u32> = (0..50).map(|i| (format!("k{i}"), i)).collect();
        let expected = Fingerprint::of(&sorted).unwrap();
        for _ in 0..50 {
            let map: HashMap<String, u32> = sorted.clone().into_iter().collect();
            assert_eq!(
                Fingerprint::of(&(7_u64, &map)).unwrap(),
                Fingerprint::of(&(7_u64, &sorted)).unwrap()
            );
            assert_eq!(Fingerprint::of(&map).unwrap(), expected);
        }
    }

    // Through a `serde_json::Value`, a value holding an integer beyond 64 bits fell back to
    // its unsorted encoding: a `HashMap` of `u128`s had a fingerprint per iteration order.
    #[test]
    fn integers_beyond_64_bits_are_exact_and_sorted_like_the_rest() {
        let big = Fingerprint::of(&(u128::MAX,)).unwrap();
        assert_eq!(big, Fingerprint::of(&(u128::MAX,)).unwrap());
        assert_ne!(big, Fingerprint::of(&(u128::MAX - 1,)).unwrap());
        assert_ne!(
            Fingerprint::of(&(i128::MIN,)).unwrap(),
            Fingerprint::of(&(i128::MIN + 1,)).unwrap()
        );
        let sorted: BTreeMap<String, u128> = (0..50_u128)
            .map(|i| (format!("k{i}"), u128::MAX - i))
            .collect();
        let expected = Fingerprint::of(&sorted).unwrap();
        for _ in 0..20 {
            let map: HashMap<String, u128> = sorted.clone().into_iter().collect();
            assert_eq!(Fingerprint::of(&map).unwrap(), expected);
        }
        assert_eq!(
            Fingerprint::of(&sorted).unwrap(),
            Fingerprint::of_json(serde_json::to_string(&sorted).unwrap().as_bytes()).unwrap()
        );
    }

    #[test]
    fn floats_are_exact() {
        // Each float and its neighbour, small and beyond 2^53.
        for float in [1.0_f64, 9_007_199_254_740_992.0, 1e300] {
            let next = f64::from_bits(float.to_bits() + 1);
            assert_ne!(
                Fingerprint::of(&float).unwrap(),
                Fingerprint::of(&next).unwrap()
            );
        }
        assert_ne!(
            Fingerprint::of(&-0.0_f64).unwrap(),
            Fingerprint::of(&0.0_f64).unwrap()
        );
        assert_ne!(
            Fingerprint::of(&1.0_f64).unwrap(),
            Fingerprint::of(&1_u8).unwrap()
        );
    }

    // The docs promised that no two values of a type share a fingerprint, but serde_json
    // writes NaN, both infinities and `None` as `null`: this pins what they share.
    #[test]
    fn non_finite_floats_and_none_share_the_fingerprint_of_null() {
        let null = Fingerprint::of(&()).unwrap();
        assert_eq!(null, Fingerprint::of_json(b"null").unwrap());
        for float in [f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(Fingerprint::of(&float).unwrap(), null, "{float}");
            assert_eq!(Fingerprint::of(&Some(float)).unwrap(), null, "{float}");
        }
        assert_eq!(Fingerprint::of(&f32::NAN).unwrap(), null);
        assert_eq!(Fingerprint::of(&None::<f64>).unwrap(), null);
        assert_eq!(Fingerprint::of(&Some(None::<u8>)).unwrap(), null);
        // Inside arguments too: the other members do not keep them apart.
        assert_eq!(
            Fingerprint::of(&(7_u64, f64::NAN)).unwrap(),
            Fingerprint::of(&(7_u64, None::<f64>)).unwrap()
        );
        // What the docs suggest instead tells them apart.
        assert_ne!(
            Fingerprint::of(&f64::NAN.to_bits()).unwrap(),
            Fingerprint::of(&f64::INFINITY.to_bits()).unwrap()
        );
        assert_ne!(null, Fingerprint::of(&f64::MAX).unwrap());
    }

    #[test]
    fn a_text_and_its_value_have_one_fingerprint() {
        let text = r#"{ "b": [1, "\u00e9"], "a": {"y": null, "x": true} }"#;
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            Fingerprint::of_json(text.as_bytes()).unwrap(),
            Fingerprint::of(&value).unwrap()
        );
    }

    #[test]
    fn different_values_have_different_fingerprints() {
        let a = Fingerprint::of(&serde_json::json!({"a": 1, "b": 2})).unwrap();
        let b = Fingerprint::of(&serde_json::json!({"a": 2, "b": 1})).unwrap();
        assert_ne!(a, b);
    }
}
