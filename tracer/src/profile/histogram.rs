//! Latency histograms in user space.
//!
//! The kernel counts latencies in the log-linear buckets of
//! [`tracer_common::histogram`] and keeps exact running totals in [`LatencyStats`], both
//! per CPU. [`LatencyHistogram`] sums them and answers the questions a report asks:
//! count, mean, min, max and percentiles. Percentiles assume values are spread evenly
//! inside a bucket, so they are off by at most one bucket width (12.5% of the value),
//! and are exact where the bucket maths allow (values below 8, the min and the max).

use tracer_common::LatencyStats;
use tracer_common::histogram::{BUCKETS, bucket_lower_bound, bucket_of, bucket_upper_bound};

/// A latency distribution: bucket counts plus exact count, total, min and max.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LatencyHistogram {
    /// Count per log-linear bucket; always `BUCKETS` long.
    buckets: Vec<u64>,
    /// Exact number of values, from [`LatencyStats`] or [`LatencyHistogram::record`].
    count: u64,
    total_ns: u64,
    /// Smallest value; `u64::MAX` while `count` is 0.
    min_ns: u64,
    max_ns: u64,
}

/// One bucket of the power-of-two view that bpftrace's `hist()` prints: index 0 holds
/// the value 0, index 1 the value 1, and index `k >= 2` the values `[2^(k-1), 2^k)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Log2Bucket {
    pub index: u32,
    pub count: u64,
}

impl Log2Bucket {
    /// Smallest value in the bucket.
    pub(crate) fn min(&self) -> u64 {
        match self.index {
            0 => 0,
            k => 1 << (k - 1),
        }
    }

    /// Largest value in the bucket (inclusive, so the top bucket fits in a `u64`).
    pub(crate) fn max(&self) -> u64 {
        match self.index {
            0 => 0,
            k => u64::MAX >> (64 - k),
        }
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    pub(crate) fn new() -> Self {
        Self {
            buckets: vec![0; BUCKETS as usize],
            count: 0,
            total_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
        }
    }

    /// Adds one value measured in user space (bucket and totals together).
    #[cfg(test)]
    pub(crate) fn record(&mut self, ns: u64) {
        self.merge_bucket(bucket_of(ns), 1);
        self.merge_stats(&LatencyStats {
            count: 1,
            total_ns: ns,
            min_ns: ns,
            max_ns: ns,
        });
    }

    /// Adds `count` values to `bucket` (one CPU's slot of the kernel's bucket map).
    /// Out-of-range buckets are ignored: they can only come from a mismatched eBPF object.
    pub(crate) fn merge_bucket(&mut self, bucket: u32, count: u64) {
        if let Some(slot) = self.buckets.get_mut(bucket as usize) {
            *slot = slot.saturating_add(count);
        }
    }

    /// Adds one CPU's running totals.
    pub(crate) fn merge_stats(&mut self, stats: &LatencyStats) {
        if stats.count == 0 {
            // min_ns is u64::MAX and max_ns 0 then: nothing to merge.
            return;
        }
        self.count = self.count.saturating_add(stats.count);
        self.total_ns = self.total_ns.saturating_add(stats.total_ns);
        self.min_ns = self.min_ns.min(stats.min_ns);
        self.max_ns = self.max_ns.max(stats.max_ns);
    }

    /// Adds everything from `other`.
    pub(crate) fn merge(&mut self, other: &LatencyHistogram) {
        for (bucket, &count) in other.buckets.iter().enumerate() {
            self.merge_bucket(bucket as u32, count);
        }
        self.merge_stats(&LatencyStats {
            count: other.count,
            total_ns: other.total_ns,
            min_ns: other.min_ns,
            max_ns: other.max_ns,
        });
    }

    /// True when nothing was recorded.
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0 && self.bucket_total() == 0
    }

    /// Number of values: the exact count when totals were merged, else the bucket sum.
    pub(crate) fn count(&self) -> u64 {
        if self.count > 0 {
            self.count
        } else {
            self.bucket_total()
        }
    }

    /// Sum of all values (exact totals only; 0 when only buckets were merged).
    pub(crate) fn total_ns(&self) -> u64 {
        self.total_ns
    }

    /// Mean value, rounded to the nearest nanosecond; `None` without exact totals.
    pub(crate) fn mean_ns(&self) -> Option<u64> {
        (self.count > 0).then(|| {
            ((u128::from(self.total_ns) + u128::from(self.count) / 2) / u128::from(self.count))
                as u64
        })
    }

    /// Smallest value: exact when totals were merged, else the bound of the first bucket.
    pub(crate) fn min_ns(&self) -> Option<u64> {
        self.value_range().map(|(min, _)| min)
    }

    /// Largest value: exact when totals were merged, else the bound of the last bucket.
    pub(crate) fn max_ns(&self) -> Option<u64> {
        self.value_range().map(|(_, max)| max)
    }

    /// The value below which `p` percent (0 to 100) of the values lie, interpolated
    /// linearly inside its bucket and clamped to [min, max]. `None` without bucket counts.
    pub(crate) fn percentile_ns(&self, p: f64) -> Option<u64> {
        let total = self.bucket_total();
        if total == 0 || p.is_nan() {
            return None;
        }
        let (min, max) = self.value_range()?;
        let rank = p.clamp(0.0, 100.0) / 100.0 * total as f64;
        let mut below = 0u64;
        for (bucket, &count) in self.buckets.iter().enumerate() {
            if count == 0 {
                continue;
            }
            if below.saturating_add(count) as f64 >= rank {
                let shape = self.shape(bucket as u32, count);
                let rank = rank - below as f64;
                if shape.at_min > 0 && rank <= shape.at_min as f64 {
                    return Some(min);
                }
                if rank > (shape.at_min + shape.spread) as f64 {
                    return Some(max);
                }
                let fraction = ((rank - shape.at_min as f64) / shape.spread as f64).clamp(0.0, 1.0);
                // Truncating keeps single-value buckets exact: [3, 4) always gives 3.
                let value = (shape.lo + fraction * (shape.hi - shape.lo)) as u64;
                let last_in_bucket = (shape.hi as u64).saturating_sub(1).max(shape.lo as u64);
                return Some(value.clamp(shape.lo as u64, last_in_bucket).clamp(min, max));
            }
            below = below.saturating_add(count);
        }
        Some(max)
    }

    /// The distribution in bpftrace's power-of-two buckets, of values divided by `unit_ns`
    /// (1 for nanoseconds, 1000 for microseconds), from the first to the last non-empty
    /// bucket. A log-linear bucket that straddles a boundary is split in proportion, so
    /// the counts still add up to the bucket total; with `unit_ns == 1` nothing straddles
    /// and the counts are exact.
    pub(crate) fn log2_buckets(&self, unit_ns: u64) -> Vec<Log2Bucket> {
        let unit = u128::from(unit_ns.max(1));
        let total = self.bucket_total();
        if total == 0 {
            return Vec::new();
        }
        let below = |units: u128| -> u64 {
            match u64::try_from(units * unit) {
                Ok(ns) => self.count_below(ns).round() as u64,
                Err(_) => total,
            }
        };
        let mut counts = Vec::with_capacity(65);
        let mut lower = 0;
        for index in 0..=64u32 {
            let bucket = Log2Bucket { index, count: 0 };
            let upper = below(u128::from(bucket.max()) + 1);
            counts.push(Log2Bucket {
                index,
                count: upper - lower,
            });
            lower = upper;
        }
        let first = counts.iter().position(|b| b.count > 0).unwrap_or(0);
        let last = counts.iter().rposition(|b| b.count > 0).unwrap_or(0);
        counts.truncate(last + 1);
        counts.drain(..first);
        counts
    }

    /// How many values the buckets hold.
    pub(crate) fn bucket_count(&self) -> u64 {
        self.bucket_total()
    }

    /// How many values of the buckets lie below `ns`; exact where `ns` is a power of two
    /// (no bucket straddles one), else shared in proportion within the bucket holding it.
    pub(crate) fn count_below_ns(&self, ns: u64) -> u64 {
        self.count_below(ns).round() as u64
    }

    fn bucket_total(&self) -> u64 {
        self.buckets
            .iter()
            .fold(0u64, |sum, &c| sum.saturating_add(c))
    }

    /// [min, max] of the values: exact from the totals when known, else the bounds of the
    /// outermost non-empty buckets.
    fn value_range(&self) -> Option<(u64, u64)> {
        if self.count > 0 && self.min_ns <= self.max_ns {
            return Some((self.min_ns, self.max_ns));
        }
        let first = self.buckets.iter().position(|&c| c > 0)?;
        let last = self.buckets.iter().rposition(|&c| c > 0)?;
        Some((
            bucket_lower_bound(first as u32),
            bucket_upper_bound(last as u32).saturating_sub(1),
        ))
    }

    /// How the values of `bucket` (holding `count`) are assumed to lie. When the exact
    /// min and max are known, one value sits exactly at the min (in the first non-empty
    /// bucket) and one at the max (in the last); the rest spread evenly over the bucket
    /// narrowed to [min, max]. That makes small samples exact, as bpftrace's are.
    fn shape(&self, bucket: u32, count: u64) -> BucketShape {
        let mut lo = bucket_lower_bound(bucket) as f64;
        let mut hi = bucket_upper_bound(bucket) as f64;
        let (mut at_min, mut at_max) = (0, 0);
        if let Some((min, max)) = self.exact_range() {
            // The kernel updates buckets and totals separately, so only narrow when the
            // result is not empty.
            let (narrow_lo, narrow_hi) = (lo.max(min as f64), hi.min(max as f64 + 1.0));
            if narrow_lo < narrow_hi {
                (lo, hi) = (narrow_lo, narrow_hi);
            }
            at_min = u64::from(bucket == bucket_of(min));
            at_max = u64::from(bucket == bucket_of(max) && count > at_min);
        }
        BucketShape {
            lo,
            hi,
            at_min,
            at_max,
            spread: count - at_min - at_max,
        }
    }

    /// The exact [min, max] from the totals, if they agree with the buckets: the min in
    /// the first non-empty bucket, the max in the last.
    fn exact_range(&self) -> Option<(u64, u64)> {
        if self.count == 0 || self.min_ns > self.max_ns {
            return None;
        }
        let first = self.buckets.iter().position(|&c| c > 0)? as u32;
        let last = self.buckets.iter().rposition(|&c| c > 0)? as u32;
        (bucket_of(self.min_ns) == first && bucket_of(self.max_ns) == last)
            .then_some((self.min_ns, self.max_ns))
    }

    /// How many values are below `ns`, per [`LatencyHistogram::shape`].
    fn count_below(&self, ns: u64) -> f64 {
        let mut below = 0u64;
        let mut partial = 0.0;
        for (bucket, &count) in self.buckets.iter().enumerate() {
            let bucket = bucket as u32;
            if count == 0 {
                continue;
            }
            if bucket_lower_bound(bucket) >= ns {
                break;
            }
            if bucket_upper_bound(bucket) <= ns {
                below = below.saturating_add(count);
                continue;
            }
            let shape = self.shape(bucket, count);
            let (min, max) = self.exact_range().unwrap_or((u64::MAX, u64::MAX));
            let spread_below = ((ns as f64 - shape.lo) / (shape.hi - shape.lo)).clamp(0.0, 1.0);
            partial += shape.spread as f64 * spread_below;
            partial +=
                (shape.at_min * u64::from(min < ns) + shape.at_max * u64::from(max < ns)) as f64;
        }
        below as f64 + partial
    }
}

/// See [`LatencyHistogram::shape`]: `at_min` and `at_max` values (0 or 1) sit at the exact
/// min and max, `spread` values lie evenly in `[lo, hi)`.
struct BucketShape {
    lo: f64,
    hi: f64,
    at_min: u64,
    at_max: u64,
    spread: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One bucket width relative to the value: the promised accuracy of percentiles.
    fn assert_within_bucket(actual: Option<u64>, expected: u64) {
        let actual = actual.expect("percentile of a non-empty histogram") as f64;
        let expected = expected as f64;
        assert!(
            (actual - expected).abs() <= expected / 8.0,
            "{actual} is not within 12.5% of {expected}"
        );
    }

    fn from_values(values: impl IntoIterator<Item = u64>) -> LatencyHistogram {
        let mut hist = LatencyHistogram::new();
        values.into_iter().for_each(|v| hist.record(v));
        hist
    }

    #[test]
    fn empty_histogram_has_no_statistics() {
        let hist = LatencyHistogram::new();
        assert!(hist.is_empty());
        assert_eq!(hist.count(), 0);
        assert_eq!(hist.mean_ns(), None);
        assert_eq!(hist.min_ns(), None);
        assert_eq!(hist.max_ns(), None);
        assert_eq!(hist.percentile_ns(50.0), None);
        assert!(hist.log2_buckets(1).is_empty());
    }

    #[test]
    fn min_max_mean_are_exact() {
        let hist = from_values([1_234, 5_000_000, 77, 1_000_001]);
        assert_eq!(hist.count(), 4);
        assert_eq!(hist.total_ns(), 1_234 + 5_000_000 + 77 + 1_000_001);
        assert_eq!(hist.min_ns(), Some(77));
        assert_eq!(hist.max_ns(), Some(5_000_000));
        assert_eq!(hist.mean_ns(), Some(1_500_328));
    }

    #[test]
    fn uniform_distribution_percentiles() {
        let hist = from_values(1..=100_000);
        for p in [1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 99.0, 99.9] {
            assert_within_bucket(hist.percentile_ns(p), (p * 1_000.0) as u64);
        }
        assert_eq!(hist.percentile_ns(0.0), Some(1));
        assert_eq!(hist.percentile_ns(100.0), Some(100_000));
    }

    #[test]
    fn bimodal_distribution_percentiles() {
        // 90 fast values at 100us, 10 slow ones at 10ms: p50 and p90 are fast, p99 slow.
        let hist = from_values(
            std::iter::repeat_n(100_000, 90).chain(std::iter::repeat_n(10_000_000, 10)),
        );
        assert_within_bucket(hist.percentile_ns(50.0), 100_000);
        assert_within_bucket(hist.percentile_ns(90.0), 100_000);
        assert_within_bucket(hist.percentile_ns(99.0), 10_000_000);
    }

    #[test]
    fn single_value_percentiles_are_that_value() {
        let hist = from_values([4_321_000; 7]);
        for p in [0.0, 50.0, 99.0, 100.0] {
            assert_eq!(hist.percentile_ns(p), Some(4_321_000));
        }
    }

    #[test]
    fn small_values_are_exact() {
        let hist = from_values([1, 2, 3, 4]);
        assert_eq!(hist.percentile_ns(25.0), Some(1));
        assert_eq!(hist.percentile_ns(50.0), Some(2));
        assert_eq!(hist.percentile_ns(75.0), Some(3));
        assert_eq!(hist.percentile_ns(100.0), Some(4));
    }

    #[test]
    fn per_cpu_merge_matches_recording() {
        let values = [3u64, 900, 15_000, 15_001, 2_000_000_000];
        let recorded = from_values(values);

        // Two CPUs, as read from the kernel's per-CPU maps.
        let mut merged = LatencyHistogram::new();
        for cpu_values in [&values[..2], &values[2..]] {
            let mut stats = LatencyStats {
                min_ns: u64::MAX,
                ..Default::default()
            };
            for &v in cpu_values {
                merged.merge_bucket(bucket_of(v), 1);
                stats.count += 1;
                stats.total_ns += v;
                stats.min_ns = stats.min_ns.min(v);
                stats.max_ns = stats.max_ns.max(v);
            }
            merged.merge_stats(&stats);
        }
        // An idle CPU reports count 0 and min u64::MAX; it must not disturb anything.
        merged.merge_stats(&LatencyStats {
            min_ns: u64::MAX,
            ..Default::default()
        });
        merged.merge_bucket(BUCKETS, 5);
        assert_eq!(merged, recorded);

        let mut twice = recorded.clone();
        twice.merge(&recorded);
        assert_eq!(twice.count(), 10);
        assert_eq!(twice.min_ns(), Some(3));
        assert_eq!(twice.max_ns(), Some(2_000_000_000));
    }

    #[test]
    fn buckets_without_totals_still_give_estimates() {
        let mut hist = LatencyHistogram::new();
        hist.merge_bucket(bucket_of(1_000), 10);
        assert!(!hist.is_empty());
        assert_eq!(hist.count(), 10);
        assert_eq!(hist.mean_ns(), None);
        assert_eq!(hist.min_ns(), Some(bucket_lower_bound(bucket_of(1_000))));
        assert_within_bucket(hist.percentile_ns(50.0), 1_000);
    }

    #[test]
    fn log2_buckets_in_nanoseconds_are_exact() {
        let hist = from_values([0, 1, 3, 300, 300, 1_500, 2_000_000]);
        let buckets = hist.log2_buckets(1);
        let view: Vec<(u64, u64, u64)> = buckets
            .iter()
            .map(|b| (b.min(), b.max(), b.count))
            .collect();
        assert_eq!(view[0], (0, 0, 1));
        assert_eq!(view[1], (1, 1, 1));
        assert_eq!(view[2], (2, 3, 1));
        assert_eq!(view[3], (4, 7, 0));
        assert_eq!(view[9], (256, 511, 2));
        assert_eq!(view[11], (1024, 2047, 1));
        assert_eq!(*view.last().unwrap(), (1 << 20, (1 << 21) - 1, 1));
        assert_eq!(buckets.iter().map(|b| b.count).sum::<u64>(), 7);
    }

    #[test]
    fn log2_buckets_in_microseconds() {
        // 1ms = 1000us lies in [512, 1K) even though its log-linear bucket straddles 1024us.
        let hist = from_values([1_000_000, 300_000, 999, 5_000]);
        let buckets = hist.log2_buckets(1_000);
        let find = |us: u64| {
            buckets
                .iter()
                .find(|b| b.min() <= us && us <= b.max())
                .unwrap()
        };
        assert_eq!(find(0).count, 1);
        assert_eq!(find(5).count, 1);
        assert_eq!(find(300).count, 1);
        assert_eq!(find(1_000).count, 1);
        assert_eq!(buckets.last().unwrap().max(), 1_023);
        assert_eq!(buckets.iter().map(|b| b.count).sum::<u64>(), 4);
    }

    #[test]
    fn log2_bucket_bounds_cover_u64() {
        let top = Log2Bucket {
            index: 64,
            count: 0,
        };
        assert_eq!(top.min(), 1 << 63);
        assert_eq!(top.max(), u64::MAX);
        let hist = from_values([u64::MAX]);
        let buckets = hist.log2_buckets(1);
        assert_eq!(
            buckets,
            vec![Log2Bucket {
                index: 64,
                count: 1
            }]
        );
    }
}
