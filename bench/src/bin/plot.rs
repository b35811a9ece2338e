//! Draws throughput against tasks in flight as SVG from the JSON lines of the sweeps (see
//! `idempotask_bench::plot`).
//!
//! ```text
//! cargo run --release -p idempotask-bench --bin bench-plot -- --group valkey \
//!     --title "Valkey 8.1.1, 2 cores" [--x-label "tasks in flight"] [--y-label tasks/s] --out docs/img/throughput-valkey.svg \
//!     [--markdown medians.md] sweep.jsonl [more.jsonl…]
//! ```
//!
//! `--group` keeps the measurements whose server or broker contains it (ignoring case); without
//! it, all of them. `scripts/bench-plot.sh` draws the pictures of `docs/performance.md`.

use idempotask_bench::plot::{Chart, samples};

const USAGE: &str = "usage: bench-plot [--group TEXT] --title TITLE [--x-label LABEL] [--y-label LABEL] --out PATH [--markdown PATH] FILE.jsonl…";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut group, mut title, mut out, mut markdown) = (String::new(), None, None, None);
    let (mut x_label, mut y_label) = (None, "tasks/s".to_owned());
    let mut inputs = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{arg} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--group" => group = value()?,
            "--title" => title = Some(value()?),
            "--x-label" => x_label = Some(value()?),
            "--y-label" => y_label = value()?,
            "--out" => out = Some(value()?),
            "--markdown" => markdown = Some(value()?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            flag if flag.starts_with("--") => {
                return Err(format!("unknown argument `{flag}`\n{USAGE}").into());
            }
            _ => inputs.push(arg),
        }
    }
    let (Some(title), Some(out)) = (title, out) else {
        return Err(format!("--title and --out are needed\n{USAGE}").into());
    };
    if inputs.is_empty() {
        return Err(format!("name the JSON lines to draw\n{USAGE}").into());
    }
    let mut all = Vec::new();
    for input in &inputs {
        let text = std::fs::read_to_string(input).map_err(|err| format!("{input}: {err}"))?;
        all.extend(samples(&text).map_err(|err| format!("{input}: {err}"))?);
    }
    let mut chart = Chart::from_samples(&all, &group, title, y_label)?;
    if let Some(x_label) = x_label {
        chart.x_label = x_label;
    }
    std::fs::write(&out, chart.svg()?).map_err(|err| format!("{out}: {err}"))?;
    if let Some(path) = markdown {
        std::fs::write(&path, chart.markdown()).map_err(|err| format!("{path}: {err}"))?;
    }
    for series in &chart.series {
        let points: Vec<String> = series
            .points
            .iter()
            .map(|(in_flight, rate)| format!("{in_flight}: {rate:.0}"))
            .collect();
        eprintln!("{out}: {}: {}", series.label, points.join(", "));
    }
    Ok(())
}
