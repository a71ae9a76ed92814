//! Prometheus's text exposition format (version 0.0.4): metric families with their
//! `# HELP` and `# TYPE` lines, samples with labels, and latency histograms as cumulative
//! `_bucket` series with power-of-two bounds in seconds (as ebpf_exporter's `exp2`
//! buckets are).

use std::fmt::Write as _;

use crate::profile::histogram::LatencyHistogram;

/// The `Content-Type` of [`Exposition::finish`]'s text.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The smallest and largest bucket bounds, as powers of two of nanoseconds: 1.024 µs
/// and 68.7 s. Every histogram has the same bounds, so a series keeps its buckets from
/// one scrape to the next (rates and quantiles over time need that).
const FIRST_BOUND_LOG2_NS: u32 = 10;
const LAST_BOUND_LOG2_NS: u32 = 36;

/// What a family's samples are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A label's name and value.
pub(crate) type Label<'a> = (&'a str, &'a str);

/// An exposition being written, family after family.
#[derive(Debug, Default)]
pub(crate) struct Exposition {
    text: String,
}

impl Exposition {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Starts family `name`: the samples that follow, until the next family, are its.
    pub(crate) fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {}", kind.name());
    }

    /// One sample of series `name` (the family's name, or it with a histogram's suffix).
    pub(crate) fn sample(&mut self, name: &str, labels: &[Label<'_>], value: f64) {
        self.text.push_str(name);
        write_labels(&mut self.text, labels, None);
        let _ = writeln!(self.text, " {}", number(value));
    }

    /// The samples of histogram `name` with `labels`: a cumulative bucket per bound in
    /// seconds, `+Inf`, `_sum` (the values' total, `sum_ns`) in seconds and `_count`.
    pub(crate) fn histogram(
        &mut self,
        name: &str,
        labels: &[Label<'_>],
        histogram: &LatencyHistogram,
        sum_ns: u64,
    ) {
        let bucket = format!("{name}_bucket");
        for log2 in FIRST_BOUND_LOG2_NS..=LAST_BOUND_LOG2_NS {
            let bound_ns = 1u64 << log2;
            // Bounds are powers of two, where no log-linear bucket straddles: exact.
            let count = histogram.count_below_ns(bound_ns);
            let le = number(bound_ns as f64 / 1e9);
            self.text.push_str(&bucket);
            write_labels(&mut self.text, labels, Some(&le));
            let _ = writeln!(self.text, " {count}");
        }
        let count = histogram.bucket_count();
        self.text.push_str(&bucket);
        write_labels(&mut self.text, labels, Some("+Inf"));
        let _ = writeln!(self.text, " {count}");
        self.sample(&format!("{name}_sum"), labels, sum_ns as f64 / 1e9);
        self.sample(&format!("{name}_count"), labels, count as f64);
    }

    /// The whole text.
    pub(crate) fn finish(self) -> String {
        self.text
    }
}

/// `{a="x",b="y"}` (with `le` last when given), or nothing without labels.
fn write_labels(out: &mut String, labels: &[Label<'_>], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let all = labels.iter().copied().chain(le.map(|le| ("le", le)));
    for (i, (name, value)) in all.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

/// A sample value as Prometheus reads it: the shortest decimal that reads back the same.
fn number(value: f64) -> String {
    match value {
        v if v.is_nan() => "NaN".into(),
        v if v == f64::INFINITY => "+Inf".into(),
        v if v == f64::NEG_INFINITY => "-Inf".into(),
        v => format!("{v}"),
    }
}

/// A metric name made of `prefix` and a latency's name: what is not a letter, digit or
/// underscore becomes an underscore (`gc_pause` stays, `sweep-phase` becomes
/// `sweep_phase`).
pub(crate) fn metric_name(prefix: &str, name: &str, suffix: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() {
            true => c.to_ascii_lowercase(),
            false => '_',
        })
        .collect();
    format!("{prefix}{cleaned}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_has_its_help_type_and_labelled_samples() {
        let mut out = Exposition::new();
        out.family("tracer_processes", Kind::Gauge, "Processes traced now.");
        out.sample("tracer_processes", &[], 3.0);
        out.family(
            "tracer_offcpu_seconds_total",
            Kind::Counter,
            "Time off CPU.\nBlocked.",
        );
        out.sample(
            "tracer_offcpu_seconds_total",
            &[("process", "say \"hi\"\\now\n")],
            1.5,
        );
        assert_eq!(
            out.finish(),
            "# HELP tracer_processes Processes traced now.\n\
             # TYPE tracer_processes gauge\n\
             tracer_processes 3\n\
             # HELP tracer_offcpu_seconds_total Time off CPU.\\nBlocked.\n\
             # TYPE tracer_offcpu_seconds_total counter\n\
             tracer_offcpu_seconds_total{process=\"say \\\"hi\\\"\\\\now\\n\"} 1.5\n"
        );
    }

    #[test]
    fn a_histogram_has_cumulative_power_of_two_buckets_in_seconds() {
        let mut hist = LatencyHistogram::new();
        // 3 values under 2^20 ns (1.048576 ms), 1 under 2^25 ns, one past the last bound.
        for ns in [500, 700_000, 1_000_000, 20_000_000, 100_000_000_000] {
            hist.record(ns);
        }
        let mut out = Exposition::new();
        out.family("tracer_gc_pause_seconds", Kind::Histogram, "GC pauses.");
        out.histogram(
            "tracer_gc_pause_seconds",
            &[("process", "java")],
            &hist,
            hist.total_ns(),
        );
        let text = out.finish();
        let value = |series: &str| -> &str {
            text.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        };
        let bucket = |le: &str| {
            value(&format!(
                "tracer_gc_pause_seconds_bucket{{process=\"java\",le=\"{le}\"}}"
            ))
        };
        assert_eq!(bucket("0.000001024"), "1");
        assert_eq!(bucket("0.000524288"), "1");
        assert_eq!(bucket("0.001048576"), "3");
        assert_eq!(bucket("0.016777216"), "3");
        assert_eq!(bucket("0.033554432"), "4");
        assert_eq!(bucket("68.719476736"), "4");
        assert_eq!(bucket("+Inf"), "5");
        assert_eq!(
            value("tracer_gc_pause_seconds_count{process=\"java\"}"),
            "5"
        );
        assert_eq!(
            value("tracer_gc_pause_seconds_sum{process=\"java\"}"),
            number(100_021_700_500.0 / 1e9)
        );
        // One line per bound, +Inf, _sum and _count, after HELP and TYPE.
        let bounds = (LAST_BOUND_LOG2_NS - FIRST_BOUND_LOG2_NS + 1) as usize;
        assert_eq!(text.lines().count(), 2 + bounds + 3);
    }

    #[test]
    fn names_keep_letters_digits_and_underscores() {
        assert_eq!(
            metric_name("tracer_", "gc_pause", "_seconds"),
            "tracer_gc_pause_seconds"
        );
        assert_eq!(
            metric_name("tracer_", "Sweep-Phase.2", "_seconds"),
            "tracer_sweep_phase_2_seconds"
        );
    }

    #[test]
    fn values_read_back_the_same() {
        assert_eq!(number(0.1), "0.1");
        assert_eq!(number(3.0), "3");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NAN), "NaN");
    }
}
