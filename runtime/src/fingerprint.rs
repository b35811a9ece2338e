//! Fingerprints of the arguments that must match when an idempotency key is reused.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::unit::hex;

mod canonical;

use canonical::{MAX_DEPTH, canonical};

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
