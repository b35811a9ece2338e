//! Figures that reliability scenarios measure, collected for `docs/reliability.md`.
//!
//! Each scenario prints its row and appends it to `<target tmp>/reliability-rows.md`;
//! `scripts/reliability.sh` turns the rows of one run into the committed report.

use std::io::Write;
use std::path::PathBuf;

/// `target/tmp/reliability-rows.md`: a test binary runs from `target/<profile>/deps/`.
fn rows_file() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let target = exe.parent()?.parent()?.parent()?;
    let dir = target.join("tmp");
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir.join("reliability-rows.md"))
}

/// Records one scenario's figures (`what held` in words, then the numbers).
pub fn record(scenario: &str, figures: &str) {
    let row = format!("| {scenario} | {figures} |");
    println!("{row}");
    let Some(path) = rows_file() else {
        return;
    };
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(file, "{row}");
    }
}
