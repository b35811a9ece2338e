//! CPU time of this process and of local server processes, from Linux's `/proc`: what the
//! PostgreSQL and queue benches report per task, next to the tasks per second.

use std::collections::HashMap;

/// The CPU time used so far by this process and by every local process of one name.
pub(crate) struct CpuClocks {
    process: &'static str,
    client: Option<f64>,
    server: HashMap<u32, f64>,
}

impl CpuClocks {
    /// The clocks now, of this process and of each process named `process` (as
    /// `/proc/<pid>/stat` names it: `postgres`, `nats-server`, `beam.smp`).
    pub(crate) fn now(process: &'static str) -> Self {
        let server = processes_cpu_us(process);
        // Read after the scan of `/proc` (and, in `since`, before it), so that the scan's own
        // CPU time is not counted as the client's.
        Self {
            process,
            client: client_cpu_us(),
            server,
        }
    }

    /// The client's and the servers' CPU time since `self`, in microseconds: a server process
    /// that started meanwhile counts from zero; `None` where nothing can be read (off Linux, or
    /// no such process on this machine, as for a remote server).
    pub(crate) fn since(&self) -> (Option<f64>, Option<f64>) {
        let client = client_cpu_us()
            .zip(self.client)
            .map(|(after, before)| after - before);
        let after = processes_cpu_us(self.process);
        let server = (!after.is_empty()).then(|| {
            after
                .iter()
                .map(|(pid, cpu)| cpu - self.server.get(pid).copied().unwrap_or(0.0))
                .sum()
        });
        (client, server)
    }
}

/// The CPU time so far of each process named `name` on this machine, in microseconds.
fn processes_cpu_us(name: &str) -> HashMap<u32, f64> {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    processes
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (head, _) = stat.rsplit_once(')')?;
            (head.split_once('(')?.1 == name).then_some(())?;
            Some((pid, cpu_us_of(&stat)?))
        })
        .collect()
}

/// This process's CPU time (user and system, all threads) so far, in microseconds; `None` off
/// Linux. Its resolution is the kernel's clock tick (10 ms), fine for runs of a second or more.
pub(crate) fn client_cpu_us() -> Option<f64> {
    cpu_us_of(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// Input: a process's `/proc/<pid>/stat` line. Output: its CPU time (user and system), in
/// microseconds.
fn cpu_us_of(stat: &str) -> Option<f64> {
    // The fields after the command's name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index)?.parse::<f64>().ok();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; Linux
    // reports them in USER_HZ, 100 per second.
    Some((ticks(11)? + ticks(12)?) * 10_000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_whose_name_holds_spaces_and_parentheses_reads_its_own_times() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0 5 0 0";
        assert_eq!(cpu_us_of(stat), Some(3_250_000.0));
        assert_eq!(cpu_us_of("42 (cut"), None);
    }

    #[test]
    fn this_process_is_found_by_its_own_name_and_its_clock_only_moves_forward() {
        let name = std::fs::read_to_string("/proc/self/comm").unwrap();
        let name: &'static str = Box::leak(name.trim().to_owned().into_boxed_str());
        let clocks = CpuClocks::now(name);
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(50) {
            std::hint::black_box(spin.elapsed());
        }
        let (client, server) = clocks.since();
        assert!(client.is_some_and(|us| us >= 0.0), "{client:?}");
        assert!(server.is_some_and(|us| us >= 0.0), "{server:?}");
        assert_eq!(CpuClocks::now("no-such-process-here").since().1, None);
    }
}
