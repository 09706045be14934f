//! Shared helpers for meshkit's criterion benchmarks.
//!
//! Every benchmark measures its subject beside a baseline in the same run; after criterion has
//! run, [`report_ratios`] reads criterion's estimates back and prints subject / baseline, so the
//! figure that matters is printed, not left to arithmetic.

use std::path::PathBuf;
use std::process::Command;

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

/// The median point estimate, in nanoseconds, of one benchmark of the last run.
pub fn median_ns(group: &str, id: &str) -> Option<f64> {
    let path = criterion_dir()
        .join(group)
        .join(id)
        .join("new")
        .join("estimates.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    json.get("median")?.get("point_estimate")?.as_f64()
}

/// Prints each ratio `subject / baseline` of median times (above 1: the subject is slower).
/// Benchmarks that did not run (a filter, or `--test` mode) are reported as such.
pub fn report_ratios(ratios: &[Ratio<'_>]) {
    println!("\nratios (median time, subject / baseline):");
    for r in ratios {
        match (
            median_ns(r.group, r.subject),
            median_ns(r.group, r.baseline),
        ) {
            (Some(s), Some(b)) if b > 0.0 && s > 0.0 => println!(
                "  {group}: {subject} {s:.0} ns / {baseline} {b:.0} ns = {ratio:.3} \
                 ({pct:+.1}% time; throughput ratio {speed:.3})",
                group = r.group,
                subject = r.subject,
                baseline = r.baseline,
                ratio = s / b,
                pct = (s / b - 1.0) * 100.0,
                speed = b / s,
            ),
            _ => println!(
                "  {}: {} vs {}: no estimates from this run",
                r.group, r.subject, r.baseline
            ),
        }
    }
}
