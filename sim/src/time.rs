//! Simulated time: integer nanoseconds, and the conversions every resource uses.
//!
//! Integer time makes the event order exact and runs reproducible across machines: two
//! events at the same nanosecond are ordered by their sequence number, never by a float
//! rounding. Durations computed in floating point (bytes over a bandwidth) are rounded up
//! to the next nanosecond once, where they enter the queue.

/// A point in simulated time or a duration, in nanoseconds.
pub type Nanos = u64;

/// Nanoseconds per microsecond.
pub const NS_PER_US: f64 = 1e3;
/// Nanoseconds per second.
pub const NS_PER_S: f64 = 1e9;

/// Round a duration in (fractional) nanoseconds up to whole nanoseconds; negative and NaN
/// durations become 0.
pub fn ceil_ns(ns: f64) -> Nanos {
    if ns.is_nan() || ns <= 0.0 {
        0
    } else if ns >= u64::MAX as f64 {
        u64::MAX
    } else {
        ns.ceil() as Nanos
    }
}

/// Microseconds (f64) to nanoseconds, rounded up.
pub fn us_to_ns(us: f64) -> Nanos {
    ceil_ns(us * NS_PER_US)
}

/// Seconds (f64) to nanoseconds, rounded up.
pub fn s_to_ns(s: f64) -> Nanos {
    ceil_ns(s * NS_PER_S)
}

/// Nanoseconds to seconds.
pub fn ns_to_s(ns: Nanos) -> f64 {
    ns as f64 / NS_PER_S
}

/// A bandwidth in GB/s (1e9 bytes per second) as bytes per nanosecond (numerically equal).
pub fn gbs_to_bytes_per_ns(gbs: f64) -> f64 {
    gbs
}

/// Time to move `bytes` at `gbs` GB/s, in fractional nanoseconds (bytes / (bytes per ns)).
pub fn transfer_ns(bytes: f64, gbs: f64) -> f64 {
    if bytes <= 0.0 {
        0.0
    } else {
        bytes / gbs_to_bytes_per_ns(gbs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(ceil_ns(0.2), 1);
        assert_eq!(ceil_ns(-3.0), 0);
        assert_eq!(ceil_ns(f64::NAN), 0);
        assert_eq!(us_to_ns(7.0), 7_000);
        assert_eq!(s_to_ns(1.5), 1_500_000_000);
        assert!((ns_to_s(2_500_000_000) - 2.5).abs() < 1e-12);
        // 24 GB/s moves 24 bytes per ns: 2.4 MB in 100 us.
        assert!((transfer_ns(2.4e6, 24.0) - 1e5).abs() < 1e-6);
        assert_eq!(transfer_ns(0.0, 24.0), 0.0);
    }
}
