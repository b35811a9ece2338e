//! What the Redis server says about a run: commands it executed, lock keys left, marker size.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};

use super::BenchError;

/// Calls and CPU time of one command since the server started, from `INFO commandstats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CommandStat {
    pub(crate) calls: u64,
    pub(crate) usec: u64,
    /// Calls that ran and answered an error (Redis 7 and later; 0 where not reported).
    pub(crate) failed_calls: u64,
}

/// `INFO commandstats` as command name → totals, summed over `servers`.
pub(crate) async fn command_stats(
    servers: &mut [ConnectionManager],
) -> Result<HashMap<String, CommandStat>, BenchError> {
    let mut total: HashMap<String, CommandStat> = HashMap::new();
    for conn in servers {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await?;
        for (name, stat) in parse_command_stats(&info) {
            let sum = total.entry(name).or_default();
            sum.calls += stat.calls;
            sum.usec += stat.usec;
            sum.failed_calls += stat.failed_calls;
        }
    }
    Ok(total)
}

fn parse_command_stats(info: &str) -> HashMap<String, CommandStat> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
            };
            let stat = CommandStat {
                calls: field("calls")?,
                usec: field("usec")?,
                failed_calls: field("failed_calls").unwrap_or(0),
            };
            Some((name.to_owned(), stat))
        })
        .collect()
}

/// Which commands a workload's client sends itself, as opposed to those its scripts run.
///
/// `INFO commandstats` also counts every `redis.call` made inside `EVAL`/`EVALSHA`, and Redis 7
/// keeps no per-client count, so each workload says what its scripts run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counting {
    /// idempotask: the client sends plain `SET`s (and a `PTTL` when busy), `LRANGE` (a unit's
    /// journal, at its first step) and `EVALSHA`. On the hot paths the scripts are `finish`
    /// (one `GET`, one `SET`), `begin_fenced` (`GET`, `TIME`, `SET`) and `step` (`GET`,
    /// `LLEN`, `RPUSH`, two `PEXPIRE`s, no `SET`); `TIME` runs only in `begin_fenced` and
    /// `LLEN` only in `step`, so their counts tell them apart.
    Idempotask,
    /// The hand-written pattern: the client sends `SET`, `GET` and `EVAL`; each `EVAL` (the
    /// release) runs one `GET` and at most one `DEL` inside.
    Handwritten,
}

/// Commands the server ran as `client_calls` of the client and the CPU time they took,
/// between two `INFO commandstats` snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ClientCost {
    pub(crate) client_calls: u64,
    pub(crate) usec: u64,
}

/// Input: two `INFO commandstats` snapshots and how the workload sends commands. Output: the
/// commands its client sent, and the server time they took (a script's time includes the
/// commands it ran). The bench's own `INFO` and `PING`, and replicas' `REPLCONF`, are left out.
pub(crate) fn client_cost(
    before: &HashMap<String, CommandStat>,
    after: &HashMap<String, CommandStat>,
    counting: Counting,
) -> ClientCost {
    const SCRIPTS: [&str; 4] = ["evalsha", "eval", "script|load", "script"];
    // What idempotask's client never sends itself: only its scripts run these.
    const SCRIPT_ONLY: [&str; 5] = ["time", "llen", "lindex", "rpush", "pexpire"];
    let delta = |name: &str| {
        let now = after.get(name).copied().unwrap_or_default();
        let then = before.get(name).copied().unwrap_or_default();
        CommandStat {
            calls: now.calls.saturating_sub(then.calls),
            usec: now.usec.saturating_sub(then.usec),
            failed_calls: now.failed_calls.saturating_sub(then.failed_calls),
        }
    };
    let mut cost = ClientCost::default();
    for name in after.keys() {
        let stat = delta(name);
        let counted = match counting {
            Counting::Idempotask => !SCRIPT_ONLY.contains(&name.as_str()),
            Counting::Handwritten => name != "del",
        };
        // Besides the bench's own INFO and PING: replicas acknowledge replication to their
        // master once a second with REPLCONF, which commandstats counts like a client command.
        if counted && !matches!(name.as_str(), "info" | "ping" | "replconf") {
            cost.client_calls += stat.calls;
            cost.usec += stat.usec;
        }
    }
    let scripts = SCRIPTS.iter().map(|name| delta(name).calls).sum::<u64>();
    // The `GET`s and `SET`s that ran inside scripts, taken back out with their share of time.
    // Every script but `step` (one `LLEN` each) runs one `SET`.
    let inner_writes = match counting {
        Counting::Idempotask => scripts.saturating_sub(delta("llen").calls),
        Counting::Handwritten => 0,
    };
    // And idempotask's capability probe: on a server without `SET … IFEQ`, the store asks
    // again every 5 s whether it has it now, with a `SET … IFEQ` that the server refuses (a
    // failed call). One command per 5 s of the store's life, not a task's: counted, it would
    // make a measurement of 20,000 tasks read 2.00005 commands per task.
    let probes = match counting {
        Counting::Idempotask => delta("set").failed_calls,
        Counting::Handwritten => 0,
    };
    for (name, inner) in [("get", scripts), ("set", inner_writes + probes)] {
        let stat = delta(name);
        cost.client_calls = cost.client_calls.saturating_sub(inner);
        let usec = stat.usec.saturating_mul(inner).checked_div(stat.calls);
        cost.usec = cost.usec.saturating_sub(usec.unwrap_or(0));
    }
    cost
}

/// CPU time `servers` have used since they started (user and system), from `INFO cpu`.
pub(crate) async fn server_cpu(servers: &mut [ConnectionManager]) -> Result<Duration, BenchError> {
    let mut total = Duration::ZERO;
    for conn in servers {
        let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
        let seconds: f64 = info
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(':')?;
                matches!(name, "used_cpu_user" | "used_cpu_sys")
                    .then(|| value.trim().parse::<f64>().ok())?
            })
            .sum();
        total += Duration::from_secs_f64(seconds);
    }
    Ok(total)
}

/// CPU time this process has used (user and system, all threads), from `/proc/self/stat`;
/// zero where there is no such file.
pub(crate) fn client_cpu() -> Duration {
    Duration::from_secs_f64(crate::cpu::client_cpu_us().unwrap_or(0.0) / 1e6)
}

/// How many locks of idempotask and of the hand-written pattern exist on `servers`, via `SCAN`
/// (and, for idempotask, whose one key per unit holds a lock or a marker, a `GET` of each key).
pub(crate) async fn lock_keys(servers: &mut [ConnectionManager]) -> Result<u64, BenchError> {
    let mut count = 0;
    for conn in servers {
        count += u64::try_from(scan(conn, "handwritten:*:lock").await?.len()).unwrap_or(u64::MAX);
        // A unit's journal (a list) and a `forget` receipt are named `…:{<unit's key>}:…`:
        // no unit, and a `GET` of the list would fail.
        let mut units = scan(conn, "idempotask:v2:*").await?;
        units.retain(|key| !key.contains(":{"));
        for batch in units.chunks(1000) {
            let mut pipe = redis::pipe();
            for key in batch {
                pipe.get(key);
            }
            let values: Vec<Option<Vec<u8>>> = pipe.query_async(conn).await?;
            count += u64::try_from(
                values
                    .iter()
                    .filter(|value| value.as_ref().is_some_and(|v| v.first() == Some(&b'L')))
                    .count(),
            )
            .unwrap_or(u64::MAX);
        }
    }
    Ok(count)
}

async fn scan(conn: &mut ConnectionManager, pattern: &str) -> Result<Vec<String>, BenchError> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(10_000)
            .query_async(conn)
            .await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// `MEMORY USAGE` of `key` in bytes: the key, its value and the server's bookkeeping for it.
pub(crate) async fn memory_usage(
    conn: &mut impl ConnectionLike,
    key: &str,
) -> Result<Option<u64>, BenchError> {
    Ok(redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# Commandstats\r\ncmdstat_get:calls=10,usec=10,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=1,usec=5,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n";

    /// What `client_cost` makes of the change from [`BEFORE`] to `after`.
    fn cost(after: &str, counting: Counting) -> ClientCost {
        client_cost(
            &parse_command_stats(BEFORE),
            &parse_command_stats(after),
            counting,
        )
    }

    #[test]
    fn idempotask_counts_its_plain_sets_and_script_calls_not_what_scripts_run() {
        // Two fresh tasks on Redis 7: SET NX GET, then EVALSHA of `finish` (GET, SET) each;
        // one fenced: EVALSHA of `begin_fenced` (GET, TIME, SET), then of `finish`.
        let after = "cmdstat_get:calls=14,usec=14,usec_per_call=1.00\r\ncmdstat_set:calls=6,usec=12,usec_per_call=2.00\r\ncmdstat_time:calls=1,usec=1\r\ncmdstat_evalsha:calls=4,usec=80,usec_per_call=20.00\r\ncmdstat_info:calls=2,usec=10,usec_per_call=5.00\r\ncmdstat_replconf:calls=4,usec=4,usec_per_call=1.00\r\n";
        let expected = ClientCost {
            client_calls: 2 + 4,
            usec: 4 + 80,
        };
        assert_eq!(cost(after, Counting::Idempotask), expected);
    }

    #[test]
    fn idempotask_counts_a_step_as_one_script_call_without_a_set_inside() {
        // One unit of three steps on Redis 7: SET NX GET, LRANGE, three EVALSHAs of `step`
        // (GET, LLEN, RPUSH, PEXPIRE, PEXPIRE each), EVALSHA of `finish` (GET, SET).
        let after = "cmdstat_get:calls=14,usec=14\r\ncmdstat_set:calls=2,usec=4,usec_per_call=2.00\r\ncmdstat_lrange:calls=1,usec=1\r\ncmdstat_llen:calls=3,usec=3\r\ncmdstat_rpush:calls=3,usec=3\r\ncmdstat_pexpire:calls=6,usec=6\r\ncmdstat_evalsha:calls=4,usec=80\r\n";
        let expected = ClientCost {
            client_calls: 1 + 1 + 4,
            usec: 2 + 1 + 80,
        };
        assert_eq!(cost(after, Counting::Idempotask), expected);
    }

    #[test]
    fn idempotask_leaves_out_the_refused_capability_probe() {
        // One fresh task on Redis 7 (SET NX GET, EVALSHA of `finish`: GET, SET) and the store's
        // probe for `SET … IFEQ`, refused.
        let after = "cmdstat_get:calls=11,usec=11\r\ncmdstat_set:calls=3,usec=6,usec_per_call=2.00,rejected_calls=0,failed_calls=1\r\ncmdstat_evalsha:calls=1,usec=20\r\n";
        let expected = ClientCost {
            client_calls: 2,
            usec: 2 + 20,
        };
        assert_eq!(cost(after, Counting::Idempotask), expected);
    }

    #[test]
    fn handwritten_takes_the_release_scripts_own_get_back_out() {
        // One fresh task: SET NX, GET, SET, EVAL (which runs GET and DEL).
        let after = "cmdstat_get:calls=12,usec=12\r\ncmdstat_set:calls=2,usec=4\r\ncmdstat_eval:calls=1,usec=9\r\ncmdstat_del:calls=1,usec=1\r\n";
        let expected = ClientCost {
            client_calls: 4,
            usec: 4 + 1 + 9,
        };
        assert_eq!(cost(after, Counting::Handwritten), expected);
    }
}
