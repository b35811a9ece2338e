//! Throughput against tasks in flight, drawn as SVG: one line per implementation through the
//! median of its rounds at each concurrency, on a logarithmic axis of tasks in flight.
//!
//! The input is the JSON lines of the sweeps: [`SweepPoint`](crate::sweep::SweepPoint)s
//! (`bench --sweep`, `http-compare --sweep`) and [`QueueMeasurement`](crate::queues::QueueMeasurement)s
//! (`queue-bench --in-flight 1,4,16,64,256`). [`samples`] reads them, [`Chart::from_samples`]
//! keeps one server's or one broker's and takes the medians, [`Chart::svg`] draws it and
//! [`Chart::markdown`] writes its medians as a table.
//! `src/bin/plot.rs` (`bench-plot`) is the command line; `scripts/bench-plot.sh` draws the
//! pictures of `docs/performance.md`.
//!
//! Only plotters' SVG backend is used: it writes text as `<text>` elements for the viewer to
//! render, so drawing needs no font files and no fontconfig.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use plotters::prelude::*;
use serde_json::Value;

use crate::BenchError;
use crate::queues::{Broker, Consumer};

/// One measurement, whatever bench made it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Where it ran: the server (`Redis 7.0.15`) or the broker (`NATS JetStream`, `RabbitMQ`).
    pub group: String,
    /// Who ran it: the line it belongs to.
    pub series: String,
    /// Tasks (or messages) in flight.
    pub in_flight: usize,
    /// Tasks (or messages) per second.
    pub per_sec: f64,
}

/// Input: JSON lines of `bench --sweep`, `http-compare --sweep` or `queue-bench`, blank lines
/// allowed. Output: one [`Sample`] per line.
///
/// # Errors
/// A line that is not JSON, or JSON of neither shape, with its line number.
pub fn samples(text: &str) -> Result<Vec<Sample>, BenchError> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: &str| BenchError(format!("line {}: {why}: {line}", number + 1));
        let value: Value = serde_json::from_str(line).map_err(|err| bad(&err.to_string()))?;
        let text = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_owned);
        let count = |name: &str| {
            value
                .get(name)
                .and_then(Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
        };
        let rate = |name: &str| value.get(name).and_then(Value::as_f64);
        let sample = if let Some(series) = text("implementation") {
            text("server")
                .zip(count("concurrency"))
                .zip(rate("tasks_per_sec"))
                .map(|((group, in_flight), per_sec)| Sample {
                    group,
                    series,
                    in_flight,
                    per_sec,
                })
        } else if let Some(consumer) = parse::<Consumer>(&value, "consumer") {
            // Named as the queue tables name them, `hand-written` rather than the JSON's
            // `handwritten`, so that a consumer has one name everywhere.
            parse::<Broker>(&value, "broker")
                .zip(count("in_flight"))
                .zip(rate("msgs_per_sec"))
                .map(|((broker, in_flight), per_sec)| Sample {
                    group: broker.name().to_owned(),
                    series: consumer.name().to_owned(),
                    in_flight,
                    per_sec,
                })
        } else {
            None
        };
        out.push(sample.ok_or_else(|| {
            bad("expected a sweep point (implementation, server, concurrency, tasks_per_sec) or a queue measurement (consumer, broker, in_flight, msgs_per_sec)")
        })?);
    }
    Ok(out)
}

/// The field `name` of `value` as a `T`, if it is one.
fn parse<T: serde::de::DeserializeOwned>(value: &Value, name: &str) -> Option<T> {
    serde_json::from_value(value.get(name)?.clone()).ok()
}

/// One line of a chart: the medians of an implementation's rounds, by tasks in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend's label.
    pub label: String,
    /// (tasks in flight, median per second), by tasks in flight.
    pub points: Vec<(usize, f64)>,
}

/// What one SVG shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// The caption: the server and the machine.
    pub title: String,
    /// What the x axis counts: `tasks in flight` unless set otherwise.
    pub x_label: String,
    /// What the y axis counts, e.g. `tasks/s`.
    pub y_label: String,
    /// The lines, in the order their implementations first appear in the input.
    pub series: Vec<Series>,
}

impl Chart {
    /// The chart of the samples whose group contains `group` (ignoring case; an empty `group`
    /// keeps all): one series per implementation, through the median of its rounds at each
    /// number in flight.
    ///
    /// # Errors
    /// No sample matches `group`.
    pub fn from_samples(
        samples: &[Sample],
        group: &str,
        title: impl Into<String>,
        y_label: impl Into<String>,
    ) -> Result<Self, BenchError> {
        let group = group.to_lowercase();
        let mut order: Vec<&str> = Vec::new();
        let mut rates: BTreeMap<(&str, usize), Vec<f64>> = BTreeMap::new();
        for sample in samples {
            if !sample.group.to_lowercase().contains(&group) {
                continue;
            }
            if !order.contains(&sample.series.as_str()) {
                order.push(&sample.series);
            }
            rates
                .entry((&sample.series, sample.in_flight))
                .or_default()
                .push(sample.per_sec);
        }
        if order.is_empty() {
            return Err(BenchError(format!("no measurement of `{group}` to plot")));
        }
        let series = order
            .into_iter()
            .map(|label| Series {
                label: label.to_owned(),
                points: rates
                    .iter_mut()
                    .filter(|((series, _), _)| *series == label)
                    .map(|((_, in_flight), rates)| (*in_flight, median(rates)))
                    .collect(),
            })
            .collect();
        Ok(Self {
            title: title.into(),
            x_label: "tasks in flight".to_owned(),
            y_label: y_label.into(),
            series,
        })
    }

    /// The chart as an SVG document, 800 × 480.
    ///
    /// # Errors
    /// plotters could not lay the chart out.
    pub fn svg(&self) -> Result<String, BenchError> {
        let mut svg = String::new();
        self.draw(&mut svg)
            .map_err(|err| BenchError(format!("drawing `{}`: {err}", self.title)))?;
        Ok(svg)
    }

    /// Input: the chart. Output: its SVG in `svg`.
    fn draw(&self, svg: &mut String) -> Result<(), Box<dyn std::error::Error + '_>> {
        let ticks: Vec<f64> = self.in_flight().iter().map(|&n| as_f64(n)).collect();
        let (low, high) = (
            ticks.first().copied().unwrap_or(1.0),
            ticks.last().copied().unwrap_or(1.0),
        );
        let top = self
            .series
            .iter()
            .flat_map(|series| series.points.iter().map(|point| point.1))
            .fold(0.0_f64, f64::max);
        let root = SVGBackend::with_string(svg, (800, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        // A factor of 1.25 on each side of the log axis keeps the end points off the frame.
        let x_range = (low / 1.25..high * 1.25).log_scale().with_key_points(ticks);
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(x_range, 0.0..(top * 1.15).max(1.0))?;
        chart
            .configure_mesh()
            .x_desc(format!("{} (log scale)", self.x_label))
            .y_desc(&self.y_label)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .axis_desc_style(("sans-serif", 17))
            .label_style(("sans-serif", 15))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        for series in &self.series {
            let color = color_of(&series.label, &self.series);
            let points: Vec<(f64, f64)> = series
                .points
                .iter()
                .map(|&(n, rate)| (as_f64(n), rate))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(&series.label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|point| Circle::new(point, 4, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 17))
            .draw()?;
        root.present()?;
        Ok(())
    }

    /// The medians as a markdown table: a row per number in flight, a column per series (`–`
    /// where a series has no point).
    pub fn markdown(&self) -> String {
        let mut out = format!("| {} |", self.x_label);
        let mut rule = String::from("| ---: |");
        for series in &self.series {
            let _ = write!(out, " {} |", series.label);
            rule.push_str(" ---: |");
        }
        let _ = write!(out, "\n{rule}\n");
        for n in self.in_flight() {
            let _ = write!(out, "| {n} |");
            for series in &self.series {
                match series.points.iter().find(|point| point.0 == n) {
                    Some((_, rate)) => {
                        let _ = write!(out, " {rate:.0} |");
                    }
                    None => out.push_str(" – |"),
                }
            }
            out.push('\n');
        }
        out
    }

    /// Every number in flight that some series has, in order.
    fn in_flight(&self) -> Vec<usize> {
        let mut all: Vec<usize> = self
            .series
            .iter()
            .flat_map(|series| series.points.iter().map(|point| point.0))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// The same colour for an implementation in every chart: ours blue, the hand-written pattern
/// orange, no idempotency grey, anything else from the rest of the palette by its place.
fn color_of(label: &str, all: &[Series]) -> RGBColor {
    const OTHERS: [RGBColor; 4] = [
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
    ];
    match label {
        "idempotask" => RGBColor(31, 119, 180),
        "hand-written" => RGBColor(255, 127, 14),
        "bare" => RGBColor(110, 110, 110),
        _ => {
            let place = all
                .iter()
                .filter(|series| {
                    !matches!(
                        series.label.as_str(),
                        "idempotask" | "hand-written" | "bare"
                    )
                })
                .position(|series| series.label == label)
                .unwrap_or(0);
            OTHERS[place % OTHERS.len()]
        }
    }
}

/// The median of `rates` (the upper middle one of an even count, as the queue tables take it),
/// which it sorts.
fn median(rates: &mut [f64]) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(f64::NAN)
}

#[allow(
    clippy::cast_precision_loss,
    reason = "numbers in flight are far below 2^52"
)]
fn as_f64(n: usize) -> f64 {
    n as f64
}
