//! The tables of `docs/performance.md`: every measurement, and each target next to what was
//! measured. The targets depend on the server: with a native compare-and-set (Valkey 8.1+,
//! Redis 8.4+) a fresh task runs no script, and more is asked of it.

use std::fmt::Write as _;

use super::Measurement;

/// The most bytes a completed unit with a `()` result may take (`MEMORY USAGE`).
pub const MARKER_BYTES_TARGET: u64 = 160;

/// Input: every measurement of one `all` run. Output: Markdown with the measurements table and
/// the targets table (medians over rounds where a mode ran more than once).
pub fn markdown(measurements: &[Measurement]) -> String {
    let mut out = String::new();
    out.push_str(
        "| mode | round | C | keys | calls | tasks/s | cmds/task | Redis cmd µs/task | Redis CPU µs/task | client CPU µs/task | p50 µs | p99 µs | executions | lock keys left |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for m in measurements {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} |",
            m.mode,
            m.round,
            m.concurrency,
            m.tasks,
            m.deliveries,
            m.tasks_per_sec,
            m.redis_commands_per_task,
            m.redis_us_per_task,
            m.redis_cpu_us_per_task,
            m.client_cpu_us_per_task,
            m.p50_us,
            m.p99_us,
            m.executions,
            m.lock_keys_left
        );
    }
    out.push_str("\n| target | wanted | measured | |\n|---|---|---|---|\n");
    for target in targets(measurements) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            target.name,
            target.wanted,
            target.measured,
            match target.met {
                Some(true) => "met",
                Some(false) => "**missed**",
                None => "for comparison",
            }
        );
    }
    out
}

/// One target and how the measurements compare with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// What is measured.
    pub name: &'static str,
    /// The target, in words.
    pub wanted: &'static str,
    /// What was measured, in words.
    pub measured: String,
    /// Whether the target holds; `None` for a figure shown only for comparison.
    pub met: Option<bool>,
}

/// Input: the measurements of an `all` run. Output: each target it can judge.
pub fn targets(measurements: &[Measurement]) -> Vec<Target> {
    let of = |mode: &'static str| of(measurements, mode);
    let mut targets = Vec::new();
    for (mode, name, wanted, exact) in [
        ("fresh", "commands per `fresh` task", "exactly 2", 2.0),
        (
            "duplicate",
            "commands per `duplicate` task",
            "exactly 1",
            1.0,
        ),
        ("fenced", "commands per `fenced` task", "exactly 2", 2.0),
    ] {
        let costs: Vec<f64> = of(mode).map(|m| m.redis_commands_per_task).collect();
        if costs.is_empty() {
            continue;
        }
        targets.push(Target {
            name,
            wanted,
            measured: join(&costs, 2),
            #[allow(clippy::float_cmp, reason = "counts divided by counts are exact here")]
            met: Some(costs.iter().all(|cost| *cost == exact)),
        });
    }
    targets.extend(ratio_targets(measurements));
    if let Some(m) = of("latency").next()
        && let Some(ping) = m.ping_p50_us
    {
        let bound = 2 * ping + 50;
        targets.push(Target {
            name: "`latency` p50 (C = 1)",
            wanted: "≤ 2 × PING p50 + 50 µs",
            measured: format!(
                "{} µs; PING {ping} µs, so the bound is {bound} µs",
                m.p50_us
            ),
            met: Some(m.p50_us <= bound),
        });
    }
    let scaling = |c: usize| of("scaling").filter(move |m| m.concurrency == c);
    // Within each round, as for the other ratios.
    let ratios: Vec<f64> = scaling(1024)
        .filter_map(|m| {
            let base = scaling(64).find(|b| b.round == m.round)?;
            Some(m.tasks_per_sec / base.tasks_per_sec)
        })
        .collect();
    let rate = |c| median(scaling(c).map(|m| m.tasks_per_sec).collect());
    if let (Some(ratio), Some(at_1024), Some(at_64)) =
        (median(ratios.clone()), rate(1024), rate(64))
    {
        targets.push(Target {
            name: "`scaling` C = 1024 ÷ C = 64 (tasks/s)",
            wanted: "≥ 0.90",
            measured: format!(
                "{ratio:.3} (rounds: {}; {at_1024:.0} vs {at_64:.0} tasks/s)",
                join(&ratios, 2)
            ),
            met: Some(ratio >= 0.9),
        });
    }
    let left: u64 = measurements.iter().map(|m| m.lock_keys_left).sum();
    targets.push(Target {
        name: "lock keys left after each measurement",
        wanted: "0",
        measured: left.to_string(),
        met: Some(left == 0),
    });
    if let Some(bytes) = measurements.iter().find_map(|m| m.marker_bytes) {
        targets.push(Target {
            name: "`MEMORY USAGE` of a completed unit, `()` result",
            wanted: "≤ 160 bytes",
            measured: format!("{bytes} bytes"),
            met: Some(bytes <= MARKER_BYTES_TARGET),
        });
    }
    targets
}

fn of<'a>(
    measurements: &'a [Measurement],
    mode: &'a str,
) -> impl Iterator<Item = &'a Measurement> + 'a {
    measurements.iter().filter(move |m| m.mode == mode)
}

/// One ratio target: its name, our mode, the baseline mode, the bound (none: for comparison),
/// the figure compared, whether higher is better, and whether it compares the runs at C = 1
/// instead of the rounds' concurrency.
type Row = (
    &'static str,
    &'static str,
    &'static str,
    Option<(&'static str, f64)>,
    fn(&Measurement) -> f64,
    bool,
    bool,
);

/// Input: the measurements of an `all` run. Output: idempotask's throughput and Redis CPU
/// against the hand-written pattern's, fresh, duplicate, fenced and a unit of three steps.
fn ratio_targets(measurements: &[Measurement]) -> Vec<Target> {
    // The targets hold at the rounds' concurrency; `all` also runs both at C = 1.
    let first = of(measurements, "fresh").next();
    let rounds_c = first.map_or(0, |m| m.concurrency);
    let mut targets = Vec::new();
    let rows = ratio_rows(first.is_some_and(|m| m.native_cas));
    for (name, ours, theirs, wanted, figure, higher_is_better, at_one) in rows {
        let c = if at_one { 1 } else { rounds_c };
        if at_one && rounds_c == 1 {
            continue;
        }
        let at = |mode| of(measurements, mode).filter(move |m| m.concurrency == c);
        // Ratios within each round: both sides saw the same machine.
        let ratios: Vec<f64> = at(ours)
            .filter_map(|m| {
                let base = at(theirs).find(|b| b.round == m.round)?;
                Some(figure(m) / figure(base))
            })
            .collect();
        let value = |mode| median(at(mode).map(figure).collect());
        if let (Some(ratio), Some(a), Some(b)) =
            (median(ratios.clone()), value(ours), value(theirs))
        {
            let unit = if higher_is_better { "tasks/s" } else { "µs" };
            targets.push(Target {
                name,
                wanted: wanted.map_or("—", |(words, _)| words),
                measured: format!(
                    "{ratio:.2} (rounds: {}; {a:.1} vs {b:.1} {unit})",
                    join(&ratios, 2)
                ),
                met: wanted.map(|(_, bound)| {
                    if higher_is_better {
                        ratio >= bound
                    } else {
                        ratio <= bound
                    }
                }),
            });
        }
    }
    targets
}

/// The ratio targets; with a native compare-and-set (`native`), more is asked of a fresh task.
fn ratio_rows(native: bool) -> [Row; 8] {
    let pick = |scripted: (&'static str, f64), native_cas: (&'static str, f64)| {
        if native { native_cas } else { scripted }
    };
    let throughput = |m: &Measurement| m.tasks_per_sec;
    let redis_cpu = |m: &Measurement| m.redis_cpu_us_per_task;
    [
        (
            "Redis CPU per `fresh` task ÷ `handwritten-fresh`'s",
            "fresh",
            "handwritten-fresh",
            Some(pick(("≤ 0.6", 0.6), ("≤ 0.4", 0.4))),
            redis_cpu,
            false,
            false,
        ),
        (
            "`fresh` ÷ `handwritten-fresh` (tasks/s)",
            "fresh",
            "handwritten-fresh",
            Some(pick(("≥ 1.5", 1.5), ("≥ 2.0", 2.0))),
            throughput,
            true,
            false,
        ),
        (
            "`duplicate` ÷ `handwritten-duplicate` (tasks/s)",
            "duplicate",
            "handwritten-duplicate",
            Some(("≥ 2.0", 2.0)),
            throughput,
            true,
            false,
        ),
        (
            "`duplicate-cached` ÷ `duplicate` (tasks/s; a `LocalResultCache`)",
            "duplicate-cached",
            "duplicate",
            Some(("> 1.0", 1.0)),
            throughput,
            true,
            false,
        ),
        (
            "`fenced` ÷ `handwritten-fresh` (tasks/s)",
            "fenced",
            "handwritten-fresh",
            Some(pick(("≥ 1.1", 1.1), ("≥ 1.3", 1.3))),
            throughput,
            true,
            false,
        ),
        (
            "`fresh` ÷ `handwritten-fresh` at C = 1 (round-trip bound)",
            "fresh",
            "handwritten-fresh",
            None,
            throughput,
            true,
            true,
        ),
        (
            "Redis CPU per `steps` unit ÷ `handwritten-steps`'s",
            "steps",
            "handwritten-steps",
            None,
            redis_cpu,
            false,
            false,
        ),
        (
            "`steps` ÷ `handwritten-steps` (tasks/s; a unit of three steps)",
            "steps",
            "handwritten-steps",
            None,
            throughput,
            true,
            false,
        ),
    ]
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    match values.len() {
        0 => None,
        len if len % 2 == 1 => Some(values[mid]),
        _ => Some(f64::midpoint(values[mid - 1], values[mid])),
    }
}

fn join(values: &[f64], decimals: usize) -> String {
    values
        .iter()
        .map(|v| format!("{v:.decimals$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_midpoint() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }
}
