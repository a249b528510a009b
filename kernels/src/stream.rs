//! STREAM-style read bandwidth of the host, measured with the threads of a given pool.
//!
//! The CPU expert step at one token per expert is memory-bound, so its yardstick is how fast
//! the same threads can merely read memory: each thread of the pool sums its own contiguous
//! share of a buffer far larger than the last-level cache (one `broadcast`, so every thread
//! reads exactly once), with the widest SIMD loads the CPU has. GB/s means 1e9 bytes/s.
//!
//! Each thread reads its share as [`STREAMS_PER_THREAD`] concurrent sequential streams (the
//! share cut in equal parts, one 256-byte step of each per iteration). With a single stream
//! per core, the read rate is bounded by how far one hardware prefetch stream runs ahead, not
//! by the memory system: on the 2-core VM this was written on, one stream per thread read
//! 13 GB/s with 1 and with 2 threads, while the expert kernel (gate, up and scale planes: 4
//! to 6 streams per thread) read 18 GB/s. The expert kernels read several streams per thread
//! too, so this is the like-for-like ceiling.

use std::time::Instant;

use rayon::ThreadPool;
use serde::Serialize;

use crate::simd::SimdLevel;

/// Concurrent sequential streams each thread reads (see the module docs).
pub const STREAMS_PER_THREAD: usize = 4;

/// A buffer read for bandwidth is at least this many times the last-level cache, so that
/// its reads are cold.
pub const LLC_MULTIPLE: u64 = 4;

/// Bytes of this machine's last-level cache (Linux sysfs, CPU 0's level-3 cache), 0 where
/// unknown.
pub fn llc_bytes() -> u64 {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size")
        .unwrap_or_default();
    parse_cache_size(text.trim())
}

/// A sysfs cache size (`"32768K"`, `"480M"`, `"1024"`) in bytes; 0 where malformed.
fn parse_cache_size(t: &str) -> u64 {
    let (num, mul) = if let Some(k) = t.strip_suffix('K') {
        (k, 1 << 10)
    } else if let Some(m) = t.strip_suffix('M') {
        (m, 1 << 20)
    } else {
        (t, 1)
    };
    num.parse::<u64>().map(|n| n * mul).unwrap_or(0)
}

/// Bytes of a buffer whose read measures memory, not cache: `at_least`, or
/// [`LLC_MULTIPLE`] times the last-level cache where that is more.
pub fn cold_read_bytes(at_least: u64) -> u64 {
    at_least.max(LLC_MULTIPLE * llc_bytes())
}

/// The least window [`read_window`] reads: a ceiling read (the probe's and each `ft run`
/// round's) covers this many bytes, or [`cold_read_bytes`] of it where the cache is larger.
pub const CEILING_READ_BYTES: u64 = 512 << 20;

/// A STREAM read of a window of `buf` (for example the host bank the CPU kernels read) with
/// the threads of `pool`, `repeats` times: the window is [`cold_read_bytes`]`(at_least)`
/// long (all of `buf` where it is shorter), page-aligned, and starts at a different place
/// for each `round` where `buf` is longer, so that consecutive rounds read cold bytes. One
/// definition for every ceiling taken of a buffer, so that readings of different runs
/// compare.
pub fn read_window(
    pool: &ThreadPool,
    buf: &[u8],
    at_least: u64,
    round: usize,
    repeats: usize,
) -> StreamRead {
    let n = buf
        .len()
        .min(usize::try_from(cold_read_bytes(at_least)).unwrap_or(usize::MAX));
    let span = buf.len() - n;
    let start = if span == 0 {
        0
    } else {
        (round.wrapping_mul(n) % span) & !4095
    };
    stream_read(pool, &buf[start..start + n], repeats)
}

/// Alignment of each thread's share of the buffer (bytes): one cache line.
const SHARE_ALIGN: usize = 64;

/// A measured read bandwidth.
#[derive(Debug, Clone, Serialize)]
pub struct StreamRead {
    /// Bytes read per repeat.
    pub bytes: u64,
    /// Threads that read.
    pub threads: usize,
    /// Read bandwidth of each repeat (GB/s = 1e9 B/s), in run order.
    pub samples_gbs: Vec<f64>,
}

impl StreamRead {
    /// Median of the samples (GB/s).
    pub fn median_gbs(&self) -> f64 {
        crate::stream::median(&self.samples_gbs)
    }
}

pub use ft_model::stats::{median, quantile};

/// The median of `reps` timings of `f` after one warm-up call whose result is dropped
/// (`f` is passed the call's index, 0 for the warm-up): the first call of a timed piece pays
/// its one-time costs (module loads, first-touch, cold caches). The first error is returned.
pub fn warm_median<E>(reps: usize, mut f: impl FnMut(usize) -> Result<f64, E>) -> Result<f64, E> {
    f(0)?;
    let t = (1..=reps).map(&mut f).collect::<Result<Vec<_>, E>>()?;
    Ok(median(&t))
}

/// Allocate `bytes` and touch every page from the pool's threads (each its own share, so that
/// first-touch places pages near the thread that will read them).
pub fn alloc_touched(pool: &ThreadPool, bytes: usize) -> Vec<u8> {
    let mut buf: Vec<u8> = Vec::with_capacity(bytes);
    let threads = pool.current_num_threads();
    let ptr = SendPtr(buf.as_mut_ptr());
    pool.broadcast(|ctx| {
        let r = share(bytes, threads, ctx.index());
        // SAFETY: each thread writes its own disjoint share of the allocation.
        unsafe { std::ptr::write_bytes(ptr.get().add(r.start), 0x5A, r.len()) };
    });
    // SAFETY: every byte of 0..bytes was written above.
    unsafe { buf.set_len(bytes) };
    buf
}

#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: used only for disjoint writes by the threads of one broadcast.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(&self) -> *mut u8 {
        self.0
    }
}

/// Thread `i`'s share of `bytes` among `threads` (cache-line aligned, the last takes the rest).
fn share(bytes: usize, threads: usize, i: usize) -> std::ops::Range<usize> {
    let per = (bytes / threads) / SHARE_ALIGN * SHARE_ALIGN;
    let start = per * i;
    let end = if i + 1 == threads { bytes } else { start + per };
    start..end
}

/// Read `buf` `repeats` times with all threads of `pool` and report the bandwidth of each.
pub fn stream_read(pool: &ThreadPool, buf: &[u8], repeats: usize) -> StreamRead {
    let threads = pool.current_num_threads();
    let level = SimdLevel::detect();
    let mut samples = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let t0 = Instant::now();
        let sums: Vec<u64> =
            pool.broadcast(|ctx| sum_bytes(level, &buf[share(buf.len(), threads, ctx.index())]));
        let dt = t0.elapsed().as_secs_f64();
        std::hint::black_box(sums);
        samples.push(buf.len() as f64 / dt / 1e9);
    }
    StreamRead {
        bytes: buf.len() as u64,
        threads,
        samples_gbs: samples,
    }
}

/// Sum of `b` as u64 words (wrapping), the widest way this CPU can; the result only keeps
/// the reads from being optimised away.
pub fn sum_bytes(level: SimdLevel, b: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 {
            // SAFETY: the level was detected on this CPU.
            return unsafe { sum_512(b) };
        }
        if level >= SimdLevel::Avx2 {
            // SAFETY: as above.
            return unsafe { sum_256(b) };
        }
    }
    let _ = level;
    sum_scalar(b)
}

fn sum_scalar(b: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = b.chunks_exact(64);
    for c in &mut it {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = a.wrapping_add(u64::from_le_bytes(c[8 * k..8 * k + 8].try_into().unwrap()));
        }
    }
    let tail: u64 = it.remainder().iter().map(|&x| x as u64).sum();
    acc.iter().fold(tail, |s, &a| s.wrapping_add(a))
}

/// Byte length of each of the [`STREAMS_PER_THREAD`] parts of `b` (a multiple of 256).
fn part_len(b: &[u8]) -> usize {
    b.len() / STREAMS_PER_THREAD / 256 * 256
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_512(b: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let part = part_len(b);
    let p = b.as_ptr();
    let mut acc = [_mm512_setzero_si512(); STREAMS_PER_THREAD];
    let mut i = 0;
    while i < part {
        for (s, a) in acc.iter_mut().enumerate() {
            let q = p.add(s * part + i);
            let x = _mm512_add_epi64(
                _mm512_loadu_si512(q.cast()),
                _mm512_loadu_si512(q.add(64).cast()),
            );
            let y = _mm512_add_epi64(
                _mm512_loadu_si512(q.add(128).cast()),
                _mm512_loadu_si512(q.add(192).cast()),
            );
            *a = _mm512_add_epi64(*a, _mm512_add_epi64(x, y));
        }
        i += 256;
    }
    let mut t = _mm512_setzero_si512();
    for a in acc {
        t = _mm512_add_epi64(t, a);
    }
    let mut lanes = [0u64; 8];
    _mm512_storeu_si512(lanes.as_mut_ptr().cast(), t);
    lanes
        .iter()
        .fold(sum_scalar(&b[STREAMS_PER_THREAD * part..]), |s, &a| {
            s.wrapping_add(a)
        })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_256(b: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let part = part_len(b);
    let p = b.as_ptr();
    let mut acc = [_mm256_setzero_si256(); STREAMS_PER_THREAD];
    let mut i = 0;
    while i < part {
        for (s, a) in acc.iter_mut().enumerate() {
            let q = p.add(s * part + i);
            for k in 0..8 {
                *a = _mm256_add_epi64(*a, _mm256_loadu_si256(q.add(32 * k).cast()));
            }
        }
        i += 256;
    }
    let mut t = _mm256_setzero_si256();
    for a in acc {
        t = _mm256_add_epi64(t, a);
    }
    let mut lanes = [0u64; 4];
    _mm256_storeu_si256(lanes.as_mut_ptr().cast(), t);
    lanes
        .iter()
        .fold(sum_scalar(&b[STREAMS_PER_THREAD * part..]), |s, &a| {
            s.wrapping_add(a)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_median_drops_the_warm_up_and_stops_at_an_error() {
        // Call 0 (the warm-up) is far off; the others are 1, 2, 3.
        let got: Result<f64, ()> = warm_median(3, |i| Ok(if i == 0 { 1e9 } else { i as f64 }));
        assert_eq!(got, Ok(2.0));
        let mut calls = 0;
        let err = warm_median(5, |i| {
            calls += 1;
            if i == 2 {
                Err("second timing")
            } else {
                Ok(1.0)
            }
        });
        assert_eq!(err, Err("second timing"));
        assert_eq!(calls, 3);
    }

    #[test]
    fn a_window_is_the_cold_read_or_the_whole_buffer() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let small = vec![1u8; 1 << 20];
        for round in 0..3 {
            let r = read_window(&pool, &small, CEILING_READ_BYTES, round, 2);
            assert_eq!(r.bytes, small.len() as u64, "a short buffer is read whole");
            assert_eq!(r.samples_gbs.len(), 2);
            assert!(r.median_gbs() > 0.0);
        }
        let big = vec![2u8; 3 << 20];
        let r = read_window(&pool, &big, 1 << 20, 1, 1);
        assert_eq!(r.bytes, cold_read_bytes(1 << 20).min(big.len() as u64));
    }

    #[test]
    fn cache_sizes_parse_and_cold_reads_cover_the_cache() {
        assert_eq!(parse_cache_size("32768K"), 32 << 20);
        assert_eq!(parse_cache_size("480M"), 480 << 20);
        assert_eq!(parse_cache_size("1024"), 1024);
        assert_eq!(parse_cache_size(""), 0);
        assert_eq!(parse_cache_size("big"), 0);
        let n = cold_read_bytes(1 << 30);
        assert!(n >= 1 << 30 && n >= LLC_MULTIPLE * llc_bytes());
    }

    #[test]
    fn sums_agree_across_levels_and_bandwidth_is_positive() {
        let b: Vec<u8> = (0..100_003u32).map(|i| (i * 31 % 251) as u8).collect();
        let want = sum_scalar(&b);
        for l in SimdLevel::available_levels() {
            assert_eq!(sum_bytes(l, &b), want, "{l}");
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let buf = alloc_touched(&pool, 1 << 20);
        assert!(buf.iter().all(|&x| x == 0x5A));
        let r = stream_read(&pool, &buf, 3);
        assert_eq!(r.samples_gbs.len(), 3);
        assert!(r.median_gbs() > 0.0);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.5);
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.0), 1.0);
    }
}
