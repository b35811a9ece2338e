//! The plotting code on a few made-up but plausible JSON lines of the sweeps: the medians it
//! takes, and an SVG that holds every line and its legend label. No server, no timing.

use idempotask_bench::BenchError;
use idempotask_bench::plot::{Chart, Series, samples};

/// The text of every `<text>` element of `svg`, trimmed, in order.
fn texts(svg: &str) -> Vec<&str> {
    svg.split("<text")
        .skip(1)
        .map(|element| {
            let start = element.find('>').expect("a <text> element is closed") + 1;
            let end = element.find("</text>").expect("a <text> element ends");
            element[start..end].trim()
        })
        .collect()
}

/// Three rounds of `http-compare --sweep` on one server at 1, 16 and 256 in flight, a line of
/// another server, and a blank line.
const SWEEP: &str = r#"{"server":"Valkey 8.1.1","implementation":"idempotask","round":1,"concurrency":1,"tasks":2000,"tasks_per_sec":6100.0}
{"server":"Valkey 8.1.1","implementation":"hand-written","round":1,"concurrency":1,"tasks":2000,"tasks_per_sec":3400.0}
{"server":"Valkey 8.1.1","implementation":"idempotent 2.0","round":1,"concurrency":1,"tasks":2000,"tasks_per_sec":2500.0}
{"server":"Valkey 8.1.1","implementation":"idempotask","round":1,"concurrency":16,"tasks":2000,"tasks_per_sec":21000.0}
{"server":"Valkey 8.1.1","implementation":"hand-written","round":1,"concurrency":16,"tasks":2000,"tasks_per_sec":17000.0}
{"server":"Valkey 8.1.1","implementation":"idempotent 2.0","round":1,"concurrency":16,"tasks":2000,"tasks_per_sec":9000.0}
{"server":"Valkey 8.1.1","implementation":"idempotask","round":1,"concurrency":256,"tasks":2000,"tasks_per_sec":26000.0}
{"server":"Valkey 8.1.1","implementation":"hand-written","round":1,"concurrency":256,"tasks":2000,"tasks_per_sec":30000.0}
{"server":"Valkey 8.1.1","implementation":"idempotent 2.0","round":1,"concurrency":256,"tasks":2000,"tasks_per_sec":11000.0}

{"server":"Valkey 8.1.1","implementation":"idempotask","round":2,"concurrency":1,"tasks":2000,"tasks_per_sec":5000.0}
{"server":"Valkey 8.1.1","implementation":"hand-written","round":2,"concurrency":1,"tasks":2000,"tasks_per_sec":3300.0}
{"server":"Valkey 8.1.1","implementation":"idempotent 2.0","round":2,"concurrency":1,"tasks":2000,"tasks_per_sec":2400.0}
{"server":"Valkey 8.1.1","implementation":"idempotask","round":3,"concurrency":1,"tasks":2000,"tasks_per_sec":900.0}
{"server":"Valkey 8.1.1","implementation":"hand-written","round":3,"concurrency":1,"tasks":2000,"tasks_per_sec":3600.0}
{"server":"Valkey 8.1.1","implementation":"idempotent 2.0","round":3,"concurrency":1,"tasks":2000,"tasks_per_sec":2600.0}
{"server":"Redis 7.0.15","implementation":"idempotask","round":1,"concurrency":1,"tasks":2000,"tasks_per_sec":4000.0}
"#;

/// `queue-bench` lines: two brokers, the three consumers.
const QUEUES: &str = r#"{"broker":"nats","consumer":"bare","in_flight":1,"round":0,"messages":1000,"bodies":1000,"exactly_once":1000,"msgs_per_sec":9684.0,"redis_rtt_us":65.7}
{"broker":"nats","consumer":"handwritten","in_flight":1,"round":0,"messages":1000,"bodies":1000,"exactly_once":1000,"msgs_per_sec":1862.0,"redis_rtt_us":65.7}
{"broker":"nats","consumer":"idempotask","in_flight":1,"round":0,"messages":1000,"bodies":1000,"exactly_once":1000,"msgs_per_sec":3984.0,"redis_rtt_us":65.7}
{"broker":"nats","consumer":"bare","in_flight":64,"round":0,"messages":1000,"bodies":1000,"exactly_once":1000,"msgs_per_sec":110489.0,"redis_rtt_us":65.7}
{"broker":"nats","consumer":"handwritten","in_flight":64,"round":0,"messages":1000,"bodies":1000,"exactly_once":1000,"msgs_per_sec":30717.0,"redis_rtt_us":65.7}
{"broker":"nats","consumer":"idempotask","in_flight":64,"round":0,"messages":1000,"bodies":1000,"exactly_once":1000,"msgs_per_sec":29247.0,"redis_rtt_us":65.7}
{"broker":"rabbitmq","consumer":"bare","in_flight":1,"round":0,"messages":1000,"bodies":1000,"exactly_once":1000,"msgs_per_sec":5940.0,"redis_rtt_us":65.7}
"#;

#[test]
fn a_sweep_becomes_one_line_per_implementation_through_its_medians() {
    let all = samples(SWEEP).unwrap();
    assert_eq!(all.len(), 16, "the blank line is skipped");
    let chart = Chart::from_samples(&all, "valkey", "Valkey 8.1.1, 2 cores", "tasks/s").unwrap();
    let labels: Vec<&str> = chart.series.iter().map(|s| s.label.as_str()).collect();
    assert_eq!(labels, ["idempotask", "hand-written", "idempotent 2.0"]);
    // At 1 in flight the rounds gave 6100, 5000 and 900: the median is 5000, not the mean.
    assert_eq!(
        chart.series[0],
        Series {
            label: "idempotask".to_owned(),
            points: vec![(1, 5000.0), (16, 21000.0), (256, 26000.0)],
        }
    );
    // The Redis line is another chart's.
    let redis = Chart::from_samples(&all, "redis", "Redis", "tasks/s").unwrap();
    assert_eq!(redis.series.len(), 1);
    assert_eq!(redis.series[0].points, [(1, 4000.0)]);
}

#[test]
fn the_svg_has_a_line_and_a_legend_label_for_every_implementation() {
    let all = samples(SWEEP).unwrap();
    let title = "Valkey 8.1.1: tasks per second, 2 cores";
    let svg = Chart::from_samples(&all, "valkey", title, "tasks/s")
        .unwrap()
        .svg()
        .unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<svg").count(), svg.matches("</svg>").count());
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    let texts = texts(&svg);
    for text in [
        title,
        "idempotask",
        "hand-written",
        "idempotent 2.0",
        "tasks/s",
        "tasks in flight (log scale)",
    ] {
        assert_eq!(
            texts.iter().filter(|t| **t == text).count(),
            1,
            "`{text}` is written once, as text: {texts:?}"
        );
    }
    // Every number in flight measured is a tick label of the x axis, and no other power of
    // 2 or 10 below 256 is (the y axis counts in thousands).
    for tick in ["1", "16", "256"] {
        assert!(texts.contains(&tick), "tick {tick}: {texts:?}");
    }
    for not_measured in ["2", "4", "10", "64", "100"] {
        assert!(!texts.contains(&not_measured), "{not_measured}: {texts:?}");
    }
    // Three lines of data and three short ones in the legend are drawn 2 wide; the axes and
    // ticks are 1 wide.
    assert_eq!(
        svg.split("<polyline")
            .filter(|e| e
                .split("/>")
                .next()
                .unwrap()
                .contains(r#"stroke-width="2""#))
            .count(),
        6
    );
    // Three points on each of the three lines.
    assert_eq!(svg.matches("<circle").count(), 9);
}

#[test]
fn queue_lines_plot_by_broker() {
    let all = samples(QUEUES).unwrap();
    let mut nats = Chart::from_samples(&all, "nats", "NATS JetStream", "messages/s").unwrap();
    nats.x_label = "messages in flight".to_owned();
    let labels: Vec<&str> = nats.series.iter().map(|s| s.label.as_str()).collect();
    // `handwritten` in the JSON, `hand-written` as the queue tables name it.
    assert_eq!(labels, ["bare", "hand-written", "idempotask"]);
    assert_eq!(nats.series[0].points, [(1, 9684.0), (64, 110_489.0)]);
    assert_eq!(nats.series[2].points, [(1, 3984.0), (64, 29247.0)]);
    let svg = nats.svg().unwrap();
    let texts = texts(&svg);
    assert!(
        texts.contains(&"messages in flight (log scale)"),
        "{texts:?}"
    );
    for label in labels {
        assert!(texts.contains(&label), "{label}: {texts:?}");
    }
    assert_eq!(
        Chart::from_samples(&all, "rabbitmq", "RabbitMQ", "messages/s")
            .unwrap()
            .series
            .len(),
        1
    );
}

#[test]
fn lines_of_another_shape_and_missing_groups_are_refused() {
    let bench_line = r#"{"mode":"fresh","round":1,"tasks":10,"concurrency":4,"tasks_per_sec":1.0}"#;
    let err = samples(&format!(
        "{}\n{bench_line}\n",
        SWEEP.lines().next().unwrap()
    ))
    .unwrap_err();
    assert!(err.0.starts_with("line 2: expected a sweep point"), "{err}");
    assert!(samples("{not json").unwrap_err().0.starts_with("line 1: "));
    let all = samples(SWEEP).unwrap();
    assert_eq!(
        Chart::from_samples(&all, "dragonfly", "t", "tasks/s"),
        Err(BenchError(
            "no measurement of `dragonfly` to plot".to_owned()
        ))
    );
}

#[test]
fn the_medians_are_also_a_table() {
    let all = samples(SWEEP).unwrap();
    let chart = Chart::from_samples(&all, "valkey", "Valkey", "tasks/s").unwrap();
    assert_eq!(
        chart.markdown(),
        "| tasks in flight | idempotask | hand-written | idempotent 2.0 |\n\
         | ---: | ---: | ---: | ---: |\n\
         | 1 | 5000 | 3400 | 2500 |\n\
         | 16 | 21000 | 17000 | 9000 |\n\
         | 256 | 26000 | 30000 | 11000 |\n"
    );
}
