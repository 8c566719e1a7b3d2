//! I/O metrics of a served array: per kind of request (read, write, flush, trim, write zeroes) the requests,
//! bytes and errors, and a latency histogram, counted where the NBD server hands a request to the array (the
//! array's own time: member I/O, parity, the log; not the wait for a worker or the socket). WRITEs the NBD server
//! merged (`--merge-write-kib`) count as the one array write they became. Shown by `paraid status` (`io` in
//! `--json`).
//!
//! The histogram is log-linear: exact below 8 µs, then 8 buckets per power of two (each bucket at most 12.5 %
//! wide), so a percentile is read to within 12.5 % from 512 counters, with no lock on the data path. Percentiles
//! are reported as the upper bound of their bucket (never below the true value). The non-empty buckets are in
//! the JSON too, so that a tool can take two snapshots and compute percentiles over the interval between them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::{json, Value};

/// Sub-buckets per power of two: 2^3 = 8.
const SUB_BITS: u32 = 3;
const SUBS: usize = 1 << SUB_BITS;
/// Enough buckets for any u64 value.
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUBS;

/// The bucket of `value` (µs).
fn bucket_of(value: u64) -> usize {
    if value < SUBS as u64 {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros(); // >= SUB_BITS
    let sub = (value >> (exponent - SUB_BITS)) as usize & (SUBS - 1);
    (exponent - SUB_BITS + 1) as usize * SUBS + sub
}

/// The largest value (µs) that falls in `bucket`.
fn bucket_upper(bucket: usize) -> u64 {
    if bucket < SUBS {
        return bucket as u64;
    }
    let exponent = (bucket / SUBS) as u32 + SUB_BITS - 1;
    let sub = (bucket % SUBS) as u64;
    let lower = (SUBS as u64 + sub) << (exponent - SUB_BITS);
    lower + ((1u64 << (exponent - SUB_BITS)) - 1)
}

/// Latencies in µs, counted without locks.
pub struct LatencyHistogram {
    buckets: Box<[AtomicU64]>,
    sum_us: AtomicU64,
    max_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    pub fn record(&self, us: u64) {
        self.buckets[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// (bucket upper bound µs, count) of every non-empty bucket, in order.
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        self.buckets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let n = b.load(Ordering::Relaxed);
                (n > 0).then(|| (bucket_upper(i), n))
            })
            .collect()
    }

    /// Latency summary: mean, percentiles, max (µs), and the non-empty buckets.
    pub fn to_json(&self) -> Value {
        let buckets = self.buckets();
        let count: u64 = buckets.iter().map(|(_, n)| n).sum();
        if count == 0 {
            return json!({});
        }
        let max = self.max_us.load(Ordering::Relaxed);
        let sum_us = self.sum_us.load(Ordering::Relaxed);
        json!({
            "sum": sum_us,
            "mean": sum_us as f64 / count as f64,
            "p50": percentile(&buckets, 50.0).min(max),
            "p90": percentile(&buckets, 90.0).min(max),
            "p99": percentile(&buckets, 99.0).min(max),
            "p99_9": percentile(&buckets, 99.9).min(max),
            "max": max,
            "buckets": buckets.iter().map(|(upper, n)| json!([upper, n])).collect::<Vec<_>>(),
        })
    }
}

/// The upper bound of the bucket holding the `pct`-th percentile of `buckets` ((upper bound, count), in order).
pub fn percentile(buckets: &[(u64, u64)], pct: f64) -> u64 {
    let count: u64 = buckets.iter().map(|(_, n)| n).sum();
    // The rank of the percentile, 1-based: the smallest value with at least pct % of the samples at or below it.
    let rank = ((pct / 100.0 * count as f64).ceil() as u64).clamp(1, count.max(1));
    let mut seen = 0;
    for &(upper, n) in buckets {
        seen += n;
        if seen >= rank {
            return upper;
        }
    }
    buckets.last().map_or(0, |(upper, _)| *upper)
}

/// One kind of request.
#[derive(Default)]
pub struct OpStats {
    requests: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency: LatencyHistogram,
}

impl OpStats {
    /// Counts one request of `bytes` that started at `started` and ended now, failed or not.
    pub fn record(&self, started: Instant, bytes: u64, ok: bool) {
        let us = started.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.latency.record(us);
    }

    pub fn to_json(&self) -> Value {
        json!({
            "requests": self.requests.load(Ordering::Relaxed),
            "bytes": self.bytes.load(Ordering::Relaxed),
            "errors": self.errors.load(Ordering::Relaxed),
            "latency_us": self.latency.to_json(),
        })
    }
}

/// Every kind of request the array serves.
#[derive(Default)]
pub struct IoMetrics {
    pub read: OpStats,
    pub write: OpStats,
    pub flush: OpStats,
    pub trim: OpStats,
    pub write_zeroes: OpStats,
}

impl IoMetrics {
    pub fn to_json(&self) -> Value {
        json!({
            "read": self.read.to_json(),
            "write": self.write.to_json(),
            "flush": self.flush.to_json(),
            "trim": self.trim.to_json(),
            "write_zeroes": self.write_zeroes.to_json(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_contiguous_and_at_most_an_eighth_wide() {
        let mut previous_upper: Option<u64> = None;
        for bucket in 0..BUCKETS {
            let upper = bucket_upper(bucket);
            let lower = previous_upper.map_or(0, |u| u + 1);
            assert_eq!(bucket_of(lower), bucket, "lower bound of bucket {bucket}");
            assert_eq!(bucket_of(upper), bucket, "upper bound of bucket {bucket}");
            if lower >= SUBS as u64 {
                assert!(
                    (upper - lower + 1) * 8 <= lower,
                    "bucket {bucket} [{lower}, {upper}] is wider than 1/8 of its values"
                );
            }
            if upper == u64::MAX {
                break;
            }
            previous_upper = Some(upper);
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_come_from_the_recorded_values() {
        let h = LatencyHistogram::default();
        for us in 1..=1000u64 {
            h.record(us);
        }
        let v = h.to_json();
        assert_eq!(v["max"], 1000);
        assert!((v["mean"].as_f64().unwrap() - 500.5).abs() < 1e-9);
        // Each reported percentile is the upper bound of the bucket holding the true value: at most 12.5 % above.
        for (key, exact) in [("p50", 500u64), ("p90", 900), ("p99", 990), ("p99_9", 999)] {
            let got = v[key].as_u64().unwrap();
            assert!(
                got >= exact && got <= exact + exact / 8,
                "{key}: {got} for {exact}"
            );
        }
        // A single slow request is the max and the top of the tail, not the median.
        h.record(50_000);
        let v = h.to_json();
        assert_eq!(v["max"], 50_000);
        assert!(v["p50"].as_u64().unwrap() <= 563);
        let total: u64 = v["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b[1].as_u64().unwrap())
            .sum();
        assert_eq!(total, 1001);
    }

    #[test]
    fn nothing_recorded_reports_no_latency() {
        let stats = OpStats::default();
        let v = stats.to_json();
        assert_eq!(v["requests"], 0);
        assert_eq!(v["latency_us"], json!({}));
    }

    #[test]
    fn failed_requests_are_counted_as_errors_too() {
        let stats = OpStats::default();
        stats.record(Instant::now(), 4096, true);
        stats.record(Instant::now(), 4096, false);
        let v = stats.to_json();
        assert_eq!(v["requests"], 2);
        assert_eq!(v["bytes"], 8192);
        assert_eq!(v["errors"], 1);
    }
}
