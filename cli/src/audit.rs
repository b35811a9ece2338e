//! The audit trail: one JSON line for every change an operator makes, from the command line
//! (`resolve`, `forget`) or from the dashboard's buttons, appended to `--audit-log PATH`; the
//! dashboard also writes each line on stderr, where its service manager keeps its log.

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sha2::{Digest, Sha256};

/// One change, as the trail records it.
#[derive(Debug, Serialize)]
pub(crate) struct Entry<'a> {
    /// Who: `cli:<user>`, or `dashboard:<token fingerprint>`.
    pub(crate) who: &'a str,
    /// `resolve_record`, `resolve_free` or `forget`.
    pub(crate) action: &'a str,
    pub(crate) task: &'a str,
    /// The digest of the caller key: always there, so that a trail of hashed keys still names
    /// the unit.
    pub(crate) digest: &'a str,
    /// The caller key, unless the keys are shown hashed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) key: Option<&'a str>,
    /// `ok`, or the failure's stable word (`changed`, `not_in_doubt`, …).
    pub(crate) outcome: &'a str,
    /// What happened, in words.
    pub(crate) detail: &'a str,
}

/// Input: the change, and the trail's file if one was given. Output: the JSON line written
/// (to the file, when there is one), or why the file could not take it.
pub(crate) fn record(entry: &Entry<'_>, file: Option<&Path>) -> Result<String, String> {
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let mut line = serde_json::json!({ "at_unix_ms": at.to_string() });
    if let (Some(fields), Ok(serde_json::Value::Object(more))) =
        (line.as_object_mut(), serde_json::to_value(entry))
    {
        fields.extend(more);
    }
    let line = line.to_string();
    if let Some(path) = file {
        // One `write_all` of a whole line on a file opened for appending: lines from the CLI and
        // the dashboard do not interleave.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()))
            .map_err(|err| format!("cannot append to the audit log {}: {err}", path.display()))?;
    }
    Ok(line)
}

/// Input: a secret. Output: the first 12 hex digits of its SHA-256, which name it in the trail
/// without giving it away.
pub(crate) fn fingerprint(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes())[..6])
}

/// Input: bytes. Output: their lowercase hex digits.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut text, byte| {
        let _ = write!(text, "{byte:02x}");
        text
    })
}

/// Who runs the CLI: `cli:<user>` from `USER`, or `cli`.
pub(crate) fn cli_user() -> String {
    std::env::var("USER").map_or_else(|_| "cli".to_owned(), |user| format!("cli:{user}"))
}
