//! Log-linear latency buckets, shared so the kernel and user space agree on them.
//!
//! Values below `SUB_BUCKETS` get a bucket each; above, every power of two is split into
//! `SUB_BUCKETS` equal slices, so a bucket is at most 1/8 (12.5%) wide relative to its
//! value. That keeps percentiles honest while the kernel only increments a counter. The
//! power-of-two buckets of bpftrace's `hist()` are unions of these.

/// log2 of the number of slices per power of two.
pub const SUB_BUCKET_BITS: u32 = 3;
pub const SUB_BUCKETS: u64 = 1 << SUB_BUCKET_BITS;
/// Buckets needed to cover every u64.
pub const BUCKETS: u32 = ((64 - SUB_BUCKET_BITS + 1) as u64 * SUB_BUCKETS) as u32;

/// Index of the highest set bit of a non-zero value, by binary search: BPF has no
/// count-leading-zeros instruction and the verifier prefers straight-line code.
#[inline(always)]
pub fn log2_floor(mut v: u64) -> u32 {
    let mut r = 0;
    if v >= 1 << 32 {
        v >>= 32;
        r += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        r += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        r += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        r += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        r += 2;
    }
    if v >= 1 << 1 {
        r += 1;
    }
    r
}

/// The bucket that holds `value`.
#[inline(always)]
pub fn bucket_of(value: u64) -> u32 {
    if value < SUB_BUCKETS {
        return value as u32;
    }
    let exp = log2_floor(value);
    let shift = exp - SUB_BUCKET_BITS;
    let sub = ((value >> shift) & (SUB_BUCKETS - 1)) as u32;
    (shift + 1) * SUB_BUCKETS as u32 + sub
}

/// The smallest value in `bucket`.
pub fn bucket_lower_bound(bucket: u32) -> u64 {
    let sub_buckets = SUB_BUCKETS as u32;
    if bucket < sub_buckets {
        return u64::from(bucket);
    }
    let shift = bucket / sub_buckets - 1;
    let sub = u64::from(bucket % sub_buckets);
    (SUB_BUCKETS + sub) << shift
}

/// One past the largest value in `bucket` (saturating at `u64::MAX`).
pub fn bucket_upper_bound(bucket: u32) -> u64 {
    if bucket + 1 >= BUCKETS {
        u64::MAX
    } else {
        bucket_lower_bound(bucket + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_have_their_own_bucket() {
        for v in 0..SUB_BUCKETS {
            assert_eq!(bucket_of(v), v as u32);
            assert_eq!(bucket_lower_bound(v as u32), v);
        }
    }

    #[test]
    fn every_value_lies_within_its_bucket() {
        let mut v = 1u64;
        while v < u64::MAX / 3 {
            for probe in [v - 1, v, v + 1, v + v / 3] {
                let b = bucket_of(probe);
                assert!(b < BUCKETS, "{probe} -> {b}");
                assert!(bucket_lower_bound(b) <= probe, "{probe} below bucket {b}");
                assert!(probe < bucket_upper_bound(b), "{probe} above bucket {b}");
            }
            v = v * 3 + 1;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn buckets_are_at_most_an_eighth_wide() {
        for b in SUB_BUCKETS as u32..BUCKETS - 1 {
            let lo = bucket_lower_bound(b);
            let width = bucket_upper_bound(b) - lo;
            assert!(width * SUB_BUCKETS <= lo, "bucket {b} [{lo}, +{width})");
        }
    }

    #[test]
    fn log2_matches_leading_zeros() {
        for shift in 0..64 {
            let v = 1u64 << shift;
            assert_eq!(log2_floor(v), shift);
            assert_eq!(log2_floor(v | (v >> 1)), shift);
        }
    }
}
