//! Figures that reliability scenarios measure, collected for `docs/reliability.md`.
//!
//! Each scenario prints its row and appends it to `<target tmp>/reliability-rows.md`;
//! `scripts/reliability.sh` turns the rows of one run into the committed report.

use std::io::Write;

/// Records one scenario's figures (`what held` in words, then the numbers).
pub fn record(scenario: &str, figures: &str) {
    let row = format!("| {scenario} | {figures} |");
    println!("{row}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("reliability-rows.md");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(file, "{row}");
    }
}
