//! The `process_*` metrics of Prometheus's client conventions, read from `/proc/self` at each
//! scrape (Linux; elsewhere, or when a file cannot be read, the metric is left out).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Debug)]
pub(crate) struct ProcessCollector;

impl ProcessCollector {
    pub(crate) fn new() -> Self {
        Self
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // CPU time on the CPU, user and system together, in nanoseconds: the first field of
        // schedstat (no clock-tick constant needed, unlike /proc/self/stat).
        if let Some(ns) = read("/proc/self/schedstat")
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        {
            let counter = ConstCounter::new(ns as f64 / 1e9);
            let metric = encoder.encode_descriptor(
                "process_cpu_seconds",
                "CPU time the process has spent, user and system",
                None,
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        if let Some(status) = read("/proc/self/status") {
            for (field, name, help) in [
                (
                    "VmRSS:",
                    "process_resident_memory_bytes",
                    "Resident memory of the process",
                ),
                (
                    "VmSize:",
                    "process_virtual_memory_bytes",
                    "Virtual memory of the process",
                ),
            ] {
                if let Some(kib) = status_field(&status, field) {
                    gauge(&mut encoder, name, help, kib.saturating_mul(1024))?;
                }
            }
            if let Some(threads) = status_field(&status, "Threads:") {
                gauge(
                    &mut encoder,
                    "process_threads",
                    "Threads of the process",
                    threads,
                )?;
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            gauge(
                &mut encoder,
                "process_open_fds",
                "Open file descriptors of the process",
                fds.count() as u64,
            )?;
        }
        if let Some(max) = read("/proc/self/limits").and_then(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))?
                .split_whitespace()
                .nth(3)?
                .parse::<u64>()
                .ok()
        }) {
            gauge(
                &mut encoder,
                "process_max_fds",
                "The limit on open file descriptors of the process",
                max,
            )?;
        }
        Ok(())
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
    let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
    gauge.encode(metric)
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The number of a `/proc/self/status` line such as `VmRSS:    1234 kB`.
fn status_field(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_their_units() {
        let status = "Name:\tx\nVmSize:\t  2048 kB\nVmRSS:\t   512 kB\nThreads:\t7\n";
        assert_eq!(status_field(status, "VmRSS:"), Some(512));
        assert_eq!(status_field(status, "VmSize:"), Some(2048));
        assert_eq!(status_field(status, "Threads:"), Some(7));
        assert_eq!(status_field(status, "VmSwap:"), None);
    }
}
