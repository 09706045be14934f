//! Shared helpers for meshkit's criterion benchmarks.
//!
//! Every benchmark measures its subject beside a baseline in the same run; after criterion has
//! run, [`Run::report_ratios`] reads criterion's estimates back and prints subject / baseline,
//! so the figure that matters is printed, not left to arithmetic.
//!
//! Only what this run measured is read: a bench's `main` starts with [`Run::start`], and an
//! estimate file that was not written after that instant (left by an earlier run, because a
//! filter or `--test` kept this run from measuring that benchmark) is refused, never reported
//! as current. Under `--test`, `--list` or `--profile-time` (and `cargo test --benches`, which
//! criterion runs in test mode) nothing is measured and no ratio is printed.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// One ratio to report: `subject` and `baseline` are benchmark IDs within criterion `group`.
#[derive(Debug, Clone, Copy)]
pub struct Ratio<'a> {
    /// Criterion group name.
    pub group: &'a str,
    /// Benchmark ID of the subject.
    pub subject: &'a str,
    /// Benchmark ID of the baseline.
    pub baseline: &'a str,
}

/// What criterion does in this process, read from the arguments as criterion reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `cargo bench`: benchmarks are measured and their estimates saved.
    Measure,
    /// `-- --test`, or no `--bench` argument (`cargo test --benches`): each benchmark runs once
    /// and nothing is measured.
    Test,
    /// `-- --list`: benchmarks are listed, not run.
    List,
    /// `-- --profile-time N`: benchmarks run for a profiler; no estimates are saved.
    Profile,
}

impl Mode {
    /// The mode criterion picks for `args` (the program name first, as [`std::env::args`]
    /// gives them): `--list` wins, then test mode (`--test`, or no `--bench`), then
    /// `--profile-time`, else measurement.
    pub fn from_args<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (mut bench, mut test, mut list, mut profile) = (false, false, false, false);
        for arg in args.into_iter().skip(1) {
            match arg.as_ref() {
                "--bench" => bench = true,
                "--test" => test = true,
                "--list" => list = true,
                a if a == "--profile-time" || a.starts_with("--profile-time=") => profile = true,
                _ => {}
            }
        }
        if list {
            Mode::List
        } else if test || !bench {
            Mode::Test
        } else if profile {
            Mode::Profile
        } else {
            Mode::Measure
        }
    }
}

/// Why a benchmark's estimate is not reported.
#[derive(Debug)]
pub enum NotMeasured {
    /// This run does not measure at all (`--test`, `--list`, `--profile-time`).
    Mode(Mode),
    /// No estimate file: the benchmark has never been measured here.
    Missing(PathBuf),
    /// The estimate file was written before this run started: an earlier run's result.
    Stale {
        /// The estimate file.
        path: PathBuf,
        /// When it was last written.
        modified: SystemTime,
        /// When this run started.
        started: SystemTime,
    },
    /// The estimate file cannot be read or does not hold a positive median.
    Unreadable {
        /// The estimate file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

impl fmt::Display for NotMeasured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotMeasured::Mode(mode) => write!(f, "not measured ({mode:?} mode)"),
            NotMeasured::Missing(path) => {
                write!(f, "not measured in this run ({} absent)", path.display())
            }
            NotMeasured::Stale {
                path,
                modified,
                started,
            } => {
                let age = started.duration_since(*modified).unwrap_or_default();
                write!(
                    f,
                    "not measured in this run ({} is from an earlier run, {:.0} s before \
                     this one started)",
                    path.display(),
                    age.as_secs_f64()
                )
            }
            NotMeasured::Unreadable { path, reason } => {
                write!(f, "unreadable estimate {}: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for NotMeasured {}

/// One bench process: when it started and what criterion does in it.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    started: SystemTime,
    mode: Mode,
}

impl Run {
    /// Records the start of this run, now, and its mode from the process arguments. Call it
    /// first in a bench's `main`, before criterion runs anything.
    pub fn start() -> Self {
        Self::new(SystemTime::now(), Mode::from_args(std::env::args()))
    }

    /// A run that started at `started` in `mode`.
    pub fn new(started: SystemTime, mode: Mode) -> Self {
        Self { started, mode }
    }

    /// What criterion does in this run.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// When this run started.
    pub fn started(&self) -> SystemTime {
        self.started
    }

    /// The median point estimate, in nanoseconds, of benchmark `id` in `group` as this run
    /// measured it.
    ///
    /// # Errors
    ///
    /// [`NotMeasured`] when this run measures nothing, or did not write the estimate (it is
    /// absent or older than the run), or it cannot be read.
    pub fn median_ns(&self, group: &str, id: &str) -> Result<f64, NotMeasured> {
        if self.mode != Mode::Measure {
            return Err(NotMeasured::Mode(self.mode));
        }
        median_ns_since(&estimates_path(&criterion_dir(), group, id), self.started)
    }

    /// Prints each ratio `subject / baseline` of median times (above 1: the subject is slower).
    /// A benchmark this run did not measure (a filter, or `--test` mode) is reported as such,
    /// with no ratio; outside measurement mode nothing is printed but that.
    pub fn report_ratios(&self, ratios: &[Ratio<'_>]) {
        if self.mode != Mode::Measure {
            println!("\nratios: none, {}", NotMeasured::Mode(self.mode));
            return;
        }
        println!("\nratios (median time, subject / baseline):");
        for r in ratios {
            match (
                self.median_ns(r.group, r.subject),
                self.median_ns(r.group, r.baseline),
            ) {
                (Ok(s), Ok(b)) => println!(
                    "  {group}: {subject} {s:.0} ns / {baseline} {b:.0} ns = {ratio:.3} \
                     ({pct:+.1}% time; throughput ratio {speed:.3})",
                    group = r.group,
                    subject = r.subject,
                    baseline = r.baseline,
                    ratio = s / b,
                    pct = (s / b - 1.0) * 100.0,
                    speed = b / s,
                ),
                (s, b) => {
                    println!("  {}: {} vs {}: no ratio", r.group, r.subject, r.baseline);
                    for (id, e) in [(r.subject, s.err()), (r.baseline, b.err())] {
                        if let Some(e) = e {
                            println!("    {id}: {e}");
                        }
                    }
                }
            }
        }
    }
}

/// Where criterion writes its results: `$CRITERION_HOME`, else `$CARGO_TARGET_DIR/criterion`,
/// else the target directory `cargo metadata` reports, else `target/criterion` (criterion's own
/// order).
pub fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("criterion");
    }
    let metadata = std::env::var_os("CARGO").and_then(|cargo| {
        let out = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .output()
            .ok()?;
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(PathBuf::from(json.get("target_directory")?.as_str()?))
    });
    metadata
        .unwrap_or_else(|| PathBuf::from("target"))
        .join("criterion")
}

/// The file in which criterion saves the estimates of its latest measurement of `id` in
/// `group`, under `criterion_dir`.
pub fn estimates_path(criterion_dir: &Path, group: &str, id: &str) -> PathBuf {
    criterion_dir
        .join(group)
        .join(id)
        .join("new")
        .join("estimates.json")
}

/// The median point estimate, in nanoseconds, in criterion's estimate file `path`, provided the
/// file was written at or after `since` (the start of the run asking).
///
/// # Errors
///
/// [`NotMeasured::Stale`] when the file was last modified before `since`;
/// [`NotMeasured::Missing`] when it does not exist; [`NotMeasured::Unreadable`] when its time
/// or its median cannot be read, or the median is not positive.
pub fn median_ns_since(path: &Path, since: SystemTime) -> Result<f64, NotMeasured> {
    let unreadable = |reason: String| NotMeasured::Unreadable {
        path: path.to_owned(),
        reason,
    };
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(NotMeasured::Missing(path.to_owned()));
        }
        Err(e) => return Err(unreadable(e.to_string())),
    };
    let modified = meta.modified().map_err(|e| unreadable(e.to_string()))?;
    if modified < since {
        return Err(NotMeasured::Stale {
            path: path.to_owned(),
            modified,
            started: since,
        });
    }
    let bytes = std::fs::read(path).map_err(|e| unreadable(e.to_string()))?;
    let json: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| unreadable(e.to_string()))?;
    match json
        .get("median")
        .and_then(|m| m.get("point_estimate"))
        .and_then(serde_json::Value::as_f64)
    {
        Some(ns) if ns > 0.0 => Ok(ns),
        Some(ns) => Err(unreadable(format!("median {ns} is not positive"))),
        None => Err(unreadable("no median.point_estimate".to_owned())),
    }
}

/// Resident memory of this process in bytes, from the kernel's `VmRSS` in `/proc/self/status`
/// (which the kernel reports in KiB, so no page size is assumed). `None` off Linux or when the
/// line is absent.
pub fn resident_bytes() -> Option<u64> {
    parse_vm_rss(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// The `VmRSS:` line of a `/proc/<pid>/status` text, in bytes.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut fields = line["VmRSS:".len()..].split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next()? {
        "kB" => value.checked_mul(1024),
        _ => None,
    }
}

/// A deterministic stream of pseudo-random numbers (a 64-bit linear congruential generator,
/// the high bits of each step), so that a bench's inputs are the same in every run.
pub fn deterministic_numbers(seed: u64) -> impl FnMut() -> usize {
    let mut state = seed;
    move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        (state >> 33) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// A fresh directory holding one criterion estimate file with median 1234.5 ns, last
    /// modified at `modified`.
    fn estimate_file(modified: SystemTime) -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "meshkit-benches-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let path = estimates_path(&dir, "group", "id");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            &path,
            r#"{"median":{"point_estimate":1234.5,"standard_error":1.0}}"#,
        )
        .unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(modified)
            .unwrap();
        path
    }

    #[test]
    fn an_estimate_written_before_the_run_started_is_refused() {
        let started = SystemTime::now();
        let path = estimate_file(started - Duration::from_secs(3600));
        let got = median_ns_since(&path, started);
        assert!(
            matches!(got, Err(NotMeasured::Stale { .. })),
            "a file from an earlier run must not be reported as this run's: {got:?}"
        );
        std::fs::remove_dir_all(path.ancestors().nth(4).unwrap()).unwrap();
    }

    #[test]
    fn an_estimate_written_during_the_run_is_read() {
        let started = SystemTime::now() - Duration::from_secs(60);
        let path = estimate_file(started + Duration::from_secs(30));
        assert_eq!(median_ns_since(&path, started).unwrap(), 1234.5);
        std::fs::remove_dir_all(path.ancestors().nth(4).unwrap()).unwrap();
    }

    #[test]
    fn an_absent_estimate_is_missing() {
        let path = std::env::temp_dir().join("meshkit-benches-absent/new/estimates.json");
        assert!(matches!(
            median_ns_since(&path, SystemTime::now()),
            Err(NotMeasured::Missing(_))
        ));
    }

    #[test]
    fn test_list_and_profile_runs_measure_nothing() {
        let mode = |args: &[&str]| Mode::from_args(args.iter().copied());
        assert_eq!(mode(&["xds", "--bench"]), Mode::Measure);
        assert_eq!(mode(&["xds", "--bench", "update_one"]), Mode::Measure);
        assert_eq!(mode(&["xds", "--bench", "--test"]), Mode::Test);
        // `cargo test --benches` passes no `--bench`: criterion runs each benchmark once.
        assert_eq!(mode(&["xds"]), Mode::Test);
        assert_eq!(mode(&["xds", "--bench", "--list"]), Mode::List);
        assert_eq!(
            mode(&["xds", "--bench", "--profile-time", "5"]),
            Mode::Profile
        );
        let run = Run::new(SystemTime::now(), Mode::Test);
        assert!(matches!(
            run.median_ns("group", "id"),
            Err(NotMeasured::Mode(Mode::Test))
        ));
    }

    #[test]
    fn resident_memory_is_read_in_kib() {
        let status = "Name:\tbench\nVmHWM:\t  9000 kB\nVmRSS:\t   1234 kB\nRssAnon:\t 1000 kB\n";
        assert_eq!(parse_vm_rss(status), Some(1234 * 1024));
        assert_eq!(parse_vm_rss("Name:\tbench\n"), None);
        assert!(resident_bytes().is_some_and(|b| b > 0));
    }
}
