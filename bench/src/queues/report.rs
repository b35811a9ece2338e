//! The queue bench's markdown tables: throughput, and where the CPU went.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::config::{Broker, Consumer, QueueMeasurement};

/// The markdown table of a run: min, median and max msg/s of each (broker, in flight,
/// consumer), the ratios of the medians, and at 1 in flight what each message costs over the
/// bare consumer, next to two Redis round trips.
pub fn markdown(measurements: &[QueueMeasurement]) -> String {
    let mut rates: BTreeMap<(Broker, usize, Consumer), Vec<f64>> = BTreeMap::new();
    for m in measurements {
        rates
            .entry((m.broker, m.in_flight, m.consumer))
            .or_default()
            .push(m.msgs_per_sec);
    }
    let median_of = |key| {
        rates
            .get(&key)
            .map_or(f64::NAN, |rates| median(&mut rates.clone()))
    };
    let mut rtts: Vec<f64> = measurements.iter().map(|m| m.redis_rtt_us).collect();
    let rtt = median(&mut rtts);
    let mut out = String::from(
        "| broker | in flight | consumer | min msg/s | median msg/s | max msg/s | × hand-written | × bare | µs/msg over bare |\n| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (&(broker, in_flight, consumer), samples) in &rates {
        let mut samples = samples.clone();
        let med = median(&mut samples);
        let min = samples.first().copied().unwrap_or(f64::NAN);
        let max = samples.last().copied().unwrap_or(f64::NAN);
        let hand = median_of((broker, in_flight, Consumer::Handwritten));
        let bare = median_of((broker, in_flight, Consumer::Bare));
        let over_bare = 1e6 / med - 1e6 / bare;
        let _ = writeln!(
            out,
            "| {} | {in_flight} | {} | {min:.0} | {med:.0} | {max:.0} | {:.2} | {:.2} | {over_bare:.1} |",
            broker.name(),
            consumer.name(),
            med / hand,
            med / bare,
        );
    }
    let _ = writeln!(
        out,
        "\nRedis round trip (`PING`, median of each round's 1,000, median over the rounds): {rtt:.1} µs; two round trips: {:.1} µs.",
        2.0 * rtt
    );
    out.push_str(&cpu_table(measurements));
    out
}

/// The markdown table of where the CPU went: the client's, Redis's and the broker's CPU time
/// per message of each (broker, in flight, consumer), medians over the rounds ("–" where it
/// could not be read).
fn cpu_table(measurements: &[QueueMeasurement]) -> String {
    type Samples = [Vec<f64>; 3];
    let mut cpu: BTreeMap<(Broker, usize, Consumer), Samples> = BTreeMap::new();
    for m in measurements {
        let samples = cpu.entry((m.broker, m.in_flight, m.consumer)).or_default();
        let readings = [
            m.client_cpu_us_per_msg,
            Some(m.redis_cpu_us_per_msg),
            m.broker_cpu_us_per_msg,
        ];
        for (sample, reading) in samples.iter_mut().zip(readings) {
            sample.extend(reading);
        }
    }
    let mut out = String::from(
        "\nCPU time per message while consuming, in µs (medians over the rounds): the client is this process, Redis its `INFO cpu`, the broker its processes on this machine (Redis Streams' broker is the Redis: \"–\", its time in the Redis column).\n\n| broker | in flight | consumer | client | Redis | broker | sum |\n| --- | ---: | --- | ---: | ---: | ---: | ---: |\n",
    );
    for (&(broker, in_flight, consumer), samples) in &cpu {
        let [client, redis, server] = samples.clone().map(|mut s| median(&mut s));
        // Redis Streams' broker is the Redis: its time is in the Redis column already.
        let sum = if broker.process().is_none() {
            client + redis
        } else {
            client + redis + server
        };
        let cell = |us: f64| {
            if us.is_nan() {
                "–".to_owned()
            } else {
                format!("{us:.1}")
            }
        };
        let _ = writeln!(
            out,
            "| {} | {in_flight} | {} | {} | {} | {} | {} |",
            broker.name(),
            consumer.name(),
            cell(client),
            cell(redis),
            cell(server),
            cell(sum),
        );
    }
    out
}

/// The median of `samples`, which it sorts; NaN when empty.
fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}
