//! The process's own metrics, under the names Prometheus's client libraries give them (no
//! `staleguard_` prefix, so dashboards and alerts written for any exporter work):
//! `process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
//! `process_open_fds`, `process_max_fds`, `process_start_time_seconds`. Read from `/proc`
//! at each scrape, never on the request path; where `/proc` is missing (not Linux) they are
//! left out.

use std::fs;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second in `/proc/<pid>/stat` (Linux's `USER_HZ`, 100 on every
/// architecture it exports to user space; Prometheus's procfs reader assumes the same).
const USER_HZ: f64 = 100.0;

/// Reads `/proc/self` at each scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// What one scrape read.
#[derive(Debug, Default, PartialEq)]
pub struct Reading {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<f64>,
    pub virtual_bytes: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
    pub start_time_seconds: Option<f64>,
}

impl Reading {
    /// This process, now.
    pub fn now() -> Reading {
        let stat = fs::read_to_string("/proc/self/stat").ok();
        let fields = stat.as_deref().and_then(stat_fields);
        let boot = fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        let status = fs::read_to_string("/proc/self/status").ok();
        let kb = |key: &str| status.as_deref().and_then(|s| status_kb(s, key));
        Reading {
            cpu_seconds: fields
                .as_ref()
                .map(|f| (f.utime + f.stime) as f64 / USER_HZ),
            resident_bytes: kb("VmRSS:").map(|k| k as f64 * 1024.0),
            virtual_bytes: kb("VmSize:").map(|k| k as f64 * 1024.0),
            open_fds: fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as f64),
            max_fds: fs::read_to_string("/proc/self/limits")
                .ok()
                .and_then(|s| max_open_files(&s)),
            start_time_seconds: fields
                .as_ref()
                .zip(boot)
                .map(|(f, boot)| boot as f64 + f.starttime as f64 / USER_HZ),
        }
    }
}

/// The fields of `/proc/<pid>/stat` used here, in clock ticks.
#[derive(Debug, PartialEq)]
struct StatFields {
    utime: u64,
    stime: u64,
    starttime: u64,
}

/// Fields 14, 15 and 22 of `/proc/<pid>/stat`, counted after the command name (field 2,
/// in parentheses, may hold spaces and parentheses itself: the last `)` ends it).
fn stat_fields(stat: &str) -> Option<StatFields> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (the state).
    let f: Vec<&str> = rest.split_whitespace().collect();
    let at = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some(StatFields {
        utime: at(14)?,
        stime: at(15)?,
        starttime: at(22)?,
    })
}

/// `btime` of `/proc/stat`: the boot time, Unix seconds.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// A `Key:   1234 kB` line of `/proc/<pid>/status`.
fn status_kb(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits` (`unlimited` is left out).
fn max_open_files(limits: &str) -> Option<f64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .map(|n| n as f64)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = Reading::now();
        if let Some(v) = r.cpu_seconds {
            let c = ConstCounter::new(v);
            let e = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                c.metric_type(),
            )?;
            c.encode(e)?;
        }
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                r.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                r.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                r.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                r.max_fds,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                r.start_time_seconds,
            ),
        ] {
            let Some(v) = value else { continue };
            let g = ConstGauge::new(v);
            let e = encoder.encode_descriptor(name, help, None, g.metric_type())?;
            g.encode(e)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (sg (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 1234 567 0 0 20 0 9 0 8888 100000 2000 18446744073709551615";
        assert_eq!(
            stat_fields(stat),
            Some(StatFields {
                utime: 1234,
                stime: 567,
                starttime: 8888
            })
        );
        assert_eq!(stat_fields("garbage"), None);
        assert_eq!(
            boot_time("cpu 1 2 3\nbtime 1796186056\n"),
            Some(1_796_186_056)
        );
        assert_eq!(
            status_kb("Name:\tx\nVmRSS:\t   10240 kB\n", "VmRSS:"),
            Some(10240)
        );
        assert_eq!(
            max_open_files("Limit Soft Hard Units\nMax open files            20000                20000                files\n"),
            Some(20000.0)
        );
        assert_eq!(
            max_open_files("Max open files  unlimited unlimited files\n"),
            None
        );
    }

    #[test]
    fn this_process_reads_itself() {
        let r = Reading::now();
        if std::path::Path::new("/proc/self/stat").exists() {
            assert!(r.cpu_seconds.is_some_and(|c| c >= 0.0), "{r:?}");
            assert!(r.resident_bytes.is_some_and(|b| b > 1_000_000.0), "{r:?}");
            assert!(r.open_fds.is_some_and(|n| n >= 3.0), "{r:?}");
            assert!(r.max_fds.is_some_and(|n| n >= 64.0), "{r:?}");
            let started = r.start_time_seconds.unwrap_or(0.0);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            assert!(
                started > now - 3600.0 && started <= now + 1.0,
                "started {started}, now {now}"
            );
        }
    }
}
