//! Latency histograms as text, character for character in the format of bpftrace's
//! `print()` of a `hist()` map (so users can compare our output with their bpftrace
//! one-liners), followed by a one-line summary; and the same data as JSON.

use std::fmt::Write as _;

use crate::profile::histogram::{LatencyHistogram, Log2Bucket};

/// Width of the `@` bar of the fullest bucket, as in bpftrace.
const BAR_WIDTH: usize = 52;

/// Nanoseconds per microsecond: the unit our histograms are printed in.
pub(crate) const MICROSECONDS: u64 = 1_000;

/// The histogram exactly as bpftrace prints `@name = hist(value_ns / unit_ns)`: a
/// `@name: ` header line (bpftrace leaves a trailing space), one line per power-of-two
/// bucket from the first to the last non-empty one, then a blank line.
#[cfg(test)]
pub(crate) fn bpftrace_hist(name: &str, hist: &LatencyHistogram, unit_ns: u64) -> String {
    let mut out = header(name);
    write_bucket_lines(&mut out, &hist.log2_buckets(unit_ns));
    out.push('\n');
    out
}

/// The bpftrace histogram followed by [`summary_line`], then a blank line.
pub(crate) fn render_latency(name: &str, hist: &LatencyHistogram, unit_ns: u64) -> String {
    let mut out = header(name);
    write_bucket_lines(&mut out, &hist.log2_buckets(unit_ns));
    out.push_str(&summary_line(hist));
    out.push_str("\n\n");
    out
}

/// `count N, min X, mean Y, max Z, p50 A, p99 B` with human units (`12ns`, `850us`,
/// `20.1ms`, `1.50s`). Statistics the histogram cannot tell (a mean without exact
/// totals) are left out.
pub(crate) fn summary_line(hist: &LatencyHistogram) -> String {
    let mut line = format!("count {}", hist.count());
    let fields = [
        ("min", hist.min_ns()),
        ("mean", hist.mean_ns()),
        ("max", hist.max_ns()),
        ("p50", hist.percentile_ns(50.0)),
        ("p99", hist.percentile_ns(99.0)),
    ];
    for (label, value) in fields {
        if let Some(ns) = value {
            let _ = write!(line, ", {label} {}", format_ns(ns));
        }
    }
    line
}

/// The histogram's statistics and its power-of-two buckets in nanoseconds, for
/// machine-readable output. Unknown statistics (of an empty histogram) are `None`.
#[derive(Debug, serde::Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub(crate) struct HistogramSummary {
    /// How many.
    pub count: u64,
    /// Their total.
    pub total_ns: u64,
    /// The shortest, exact; null when there are none.
    pub min_ns: Option<u64>,
    /// The mean, exact; null when there are none.
    pub mean_ns: Option<u64>,
    /// The longest, exact; null when there are none.
    pub max_ns: Option<u64>,
    /// The median, within one 12.5% bucket; null when there are none.
    pub p50_ns: Option<u64>,
    /// The 90th percentile, within one 12.5% bucket; null when there are none.
    pub p90_ns: Option<u64>,
    /// The 99th percentile, within one 12.5% bucket; null when there are none.
    pub p99_ns: Option<u64>,
    /// bpftrace's power-of-two buckets, from the first that holds a value to the last.
    pub buckets: Vec<BucketSummary>,
}

/// One power-of-two bucket.
#[derive(Debug, serde::Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub(crate) struct BucketSummary {
    /// The least value it holds.
    pub min_ns: u64,
    /// The greatest value it holds.
    pub max_ns: u64,
    /// How many values it holds.
    pub count: u64,
}

impl HistogramSummary {
    pub(crate) fn of(hist: &LatencyHistogram) -> Self {
        let buckets = hist.log2_buckets(1).into_iter().map(|b| BucketSummary {
            min_ns: b.min(),
            max_ns: b.max(),
            count: b.count,
        });
        HistogramSummary {
            count: hist.count(),
            total_ns: hist.total_ns(),
            min_ns: hist.min_ns(),
            mean_ns: hist.mean_ns(),
            max_ns: hist.max_ns(),
            p50_ns: hist.percentile_ns(50.0),
            p90_ns: hist.percentile_ns(90.0),
            p99_ns: hist.percentile_ns(99.0),
            buckets: buckets.collect(),
        }
    }
}

/// A duration with three significant digits in the largest unit that keeps it at least
/// 1: `12ns`, `8.52us`, `850us`, `20.1ms`, `1.50s`.
pub(crate) fn format_ns(ns: u64) -> String {
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    const UNITS: [(&str, f64); 3] = [("us", 1e3), ("ms", 1e6), ("s", 1e9)];
    for (i, (unit, scale)) in UNITS.iter().enumerate() {
        let value = ns as f64 / scale;
        // 999.7us would print as "1000us"; move up a unit once rounding reaches 1000.
        if value < 999.5 || i == UNITS.len() - 1 {
            return if value >= 99.95 {
                format!("{value:.0}{unit}")
            } else if value >= 9.995 {
                format!("{value:.1}{unit}")
            } else {
                format!("{value:.2}{unit}")
            };
        }
    }
    unreachable!("the last unit always returns")
}

fn header(name: &str) -> String {
    format!("@{}: \n", name.trim_start_matches('@'))
}

fn write_bucket_lines(out: &mut String, buckets: &[Log2Bucket]) {
    let max = buckets.iter().map(|b| b.count).max().unwrap_or(0);
    for bucket in buckets {
        let label = match bucket.index {
            0 => "[0]".to_string(),
            1 => "[1]".to_string(),
            k => format!("[{}, {})", power_label(k - 1), power_label(k)),
        };
        // bpftrace computes the bar in single-precision float; do the same so the
        // truncation matches in every case.
        let bar = (bucket.count as f32 / max as f32 * BAR_WIDTH as f32) as usize;
        let _ = writeln!(
            out,
            "{label:<16}{count:>8} |{bar:<BAR_WIDTH$}|",
            count = bucket.count,
            bar = "@".repeat(bar),
        );
    }
}

/// `2^power` in bpftrace's notation: the largest power of 1024 becomes a suffix
/// (`512`, `1K`, `16M`).
fn power_label(power: u32) -> String {
    let decade = (power / 10) as usize;
    let mantissa = 1u64 << (power - 10 * decade as u32);
    match decade {
        0 => mantissa.to_string(),
        _ => format!("{mantissa}{}", &"KMGTPE"[decade - 1..decade]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from_values(values: impl IntoIterator<Item = u64>) -> LatencyHistogram {
        let mut hist = LatencyHistogram::new();
        values.into_iter().for_each(|v| hist.record(v));
        hist
    }

    /// Output of bpftrace v0.17.0:
    /// `bpftrace -e 'BEGIN { @h = hist(1); @h = hist(3); @h = hist(300); @h = hist(1500);
    /// @h = hist(2000000); exit(); }'`
    const GOLDEN_RAW: &str = "\
@h: 
[1]                    1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[2, 4)                 1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[4, 8)                 0 |                                                    |
[8, 16)                0 |                                                    |
[16, 32)               0 |                                                    |
[32, 64)               0 |                                                    |
[64, 128)              0 |                                                    |
[128, 256)             0 |                                                    |
[256, 512)             1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[512, 1K)              0 |                                                    |
[1K, 2K)               1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[2K, 4K)               0 |                                                    |
[4K, 8K)               0 |                                                    |
[8K, 16K)              0 |                                                    |
[16K, 32K)             0 |                                                    |
[32K, 64K)             0 |                                                    |
[64K, 128K)            0 |                                                    |
[128K, 256K)           0 |                                                    |
[256K, 512K)           0 |                                                    |
[512K, 1M)             0 |                                                    |
[1M, 2M)               1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

";

    /// bpftrace v0.17.0: `@h = hist(0)` three times, then 5, 6 and 100 (bar scaling and
    /// the `[0]` bucket).
    const GOLDEN_SCALED: &str = "\
@h: 
[0]                    3 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[1]                    0 |                                                    |
[2, 4)                 0 |                                                    |
[4, 8)                 2 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@                  |
[8, 16)                0 |                                                    |
[16, 32)               0 |                                                    |
[32, 64)               0 |                                                    |
[64, 128)              1 |@@@@@@@@@@@@@@@@@                                   |

";

    /// bpftrace v0.17.0: `@gc_pause_us = hist(NS / 1000)` for NS in 850000, 1000000,
    /// 20100000, 12000, 300000, 300000.
    const GOLDEN_MICROSECONDS: &str = "\
@gc_pause_us: 
[8, 16)                1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |
[16, 32)               0 |                                                    |
[32, 64)               0 |                                                    |
[64, 128)              0 |                                                    |
[128, 256)             0 |                                                    |
[256, 512)             2 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[512, 1K)              2 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[1K, 2K)               0 |                                                    |
[2K, 4K)               0 |                                                    |
[4K, 8K)               0 |                                                    |
[8K, 16K)              0 |                                                    |
[16K, 32K)             1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |

";

    #[test]
    fn matches_bpftrace_raw_values() {
        let hist = from_values([1, 3, 300, 1500, 2_000_000]);
        assert_eq!(bpftrace_hist("h", &hist, 1), GOLDEN_RAW);
    }

    #[test]
    fn matches_bpftrace_bar_scaling() {
        let hist = from_values([0, 0, 0, 5, 6, 100]);
        assert_eq!(bpftrace_hist("@h", &hist, 1), GOLDEN_SCALED);
    }

    #[test]
    fn matches_bpftrace_microseconds() {
        let hist = from_values([850_000, 1_000_000, 20_100_000, 12_000, 300_000, 300_000]);
        assert_eq!(
            bpftrace_hist("gc_pause_us", &hist, MICROSECONDS),
            GOLDEN_MICROSECONDS
        );
    }

    #[test]
    fn bar_truncates_like_single_precision() {
        // 7/27 and 1/27 of 52 are 13.48 and 1.93 in bpftrace's output.
        let hist = from_values(
            std::iter::repeat_n(3, 27)
                .chain(std::iter::repeat_n(5_000, 7))
                .chain([70_000]),
        );
        let text = bpftrace_hist("a", &hist, 1);
        assert!(text.contains(&format!(
            "[4K, 8K)               7 |{:<52}|",
            "@".repeat(13)
        )));
        assert!(text.contains(&format!("[64K, 128K)            1 |{:<52}|", "@")));
    }

    #[test]
    fn labels_use_binary_suffixes() {
        assert_eq!(power_label(0), "1");
        assert_eq!(power_label(9), "512");
        assert_eq!(power_label(10), "1K");
        assert_eq!(power_label(21), "2M");
        assert_eq!(power_label(30), "1G");
        assert_eq!(power_label(45), "32T");
        assert_eq!(power_label(63), "8E");
        assert_eq!(power_label(64), "16E");
    }

    #[test]
    fn empty_histogram_prints_like_bpftrace() {
        let hist = LatencyHistogram::new();
        assert_eq!(bpftrace_hist("h", &hist, 1), "@h: \n\n");
        assert_eq!(render_latency("h", &hist, 1), "@h: \ncount 0\n\n");
    }

    #[test]
    fn summary_uses_human_units() {
        let hist = from_values([12, 850_000, 20_100_000]);
        let line = summary_line(&hist);
        assert!(
            line.starts_with("count 3, min 12ns, mean 6.98ms, max 20.1ms, p50 "),
            "{line}"
        );
        assert!(line.contains(", p99 "), "{line}");
        let rendered = render_latency("lat_us", &hist, MICROSECONDS);
        assert!(rendered.starts_with("@lat_us: \n[0]  "), "{rendered}");
        assert!(rendered.ends_with(&format!("{line}\n\n")), "{rendered}");
    }

    #[test]
    fn formats_durations() {
        assert_eq!(format_ns(0), "0ns");
        assert_eq!(format_ns(12), "12ns");
        assert_eq!(format_ns(999), "999ns");
        assert_eq!(format_ns(1_000), "1.00us");
        assert_eq!(format_ns(8_524), "8.52us");
        assert_eq!(format_ns(85_240), "85.2us");
        assert_eq!(format_ns(850_000), "850us");
        assert_eq!(format_ns(999_700), "1.00ms");
        assert_eq!(format_ns(20_100_000), "20.1ms");
        assert_eq!(format_ns(1_500_000_000), "1.50s");
        assert_eq!(format_ns(4_000_000_000_000), "4000s");
    }

    #[test]
    fn json_summary() {
        let hist = from_values([100, 300, 300, 5_000]);
        let json = serde_json::to_value(HistogramSummary::of(&hist)).unwrap();
        assert_eq!(json["count"], 4);
        assert_eq!(json["total_ns"], 5_700);
        assert_eq!(json["min_ns"], 100);
        assert_eq!(json["mean_ns"], 1_425);
        assert_eq!(json["max_ns"], 5_000);
        for key in ["p50_ns", "p90_ns", "p99_ns"] {
            assert!(json[key].is_u64(), "{key}: {json}");
        }
        let buckets = json["buckets"].as_array().unwrap();
        assert_eq!(
            buckets.first().unwrap(),
            &json!({"min_ns": 64, "max_ns": 127, "count": 1})
        );
        assert_eq!(
            buckets.last().unwrap(),
            &json!({"min_ns": 4096, "max_ns": 8191, "count": 1})
        );
        let total: u64 = buckets.iter().map(|b| b["count"].as_u64().unwrap()).sum();
        assert_eq!(total, 4);

        let empty = serde_json::to_value(HistogramSummary::of(&LatencyHistogram::new())).unwrap();
        assert_eq!(empty["count"], 0);
        assert!(empty["p50_ns"].is_null());
        assert_eq!(empty["buckets"], json!([]));
    }
}
