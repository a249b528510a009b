//! The documented limits on every size that comes from input, in one place.
//!
//! Why it exists: `ft` allocates in proportion to what it is told (streams, steps, layers,
//! experts, threads, sweep points, file sizes), and a careless or hostile input must get a
//! clear error naming the input and the limit before anything is allocated, never an abort
//! on allocation, a hang or a wrapped multiply. Each limit is a named constant with the
//! reason for its value; every check goes through [`check`] (or [`read_bounded`] for files),
//! so the message has one shape: `--steps 1000000000000: more than the limit of 100000
//! (why)`.
//!
//! The limits sit far above anything a real model, host or experiment uses (the largest
//! preset has 89 layers of 512 experts; the largest host 2 x 192 cores) and far below what
//! would exhaust a 2 GiB address space.

use std::io::Read as _;
use std::path::Path;

use crate::error::{ModelError, Result};

/// Most concurrent decode streams: 4096. The largest decode batches served are a few
/// hundred streams; per-step routing tables grow with streams x layers x top-k, and 4096
/// keeps one step's table of the largest geometry under 100 MB.
pub const MAX_STREAMS: usize = 4096;

/// Most decode steps of a simulation or a traffic count: 100,000. A simulation keeps a
/// record per step (a few kB), so this bounds it to a few hundred MB; experiments use at
/// most a few thousand steps, where the rates have long converged.
pub const MAX_STEPS: usize = 100_000;

/// Most context tokens per stream: 16,777,216 (2^24). The longest contexts any model
/// supports are about 10M tokens; beyond this the KV bytes of one stream overflow nothing
/// but mean nothing either.
pub const MAX_CONTEXT_TOKENS: usize = 1 << 24;

/// Prompt tokens per prefill chunk: a chunk longer than the longest context is not a chunk.
pub const MAX_PREFILL_CHUNK_TOKENS: usize = MAX_CONTEXT_TOKENS;

/// Most MoE layers of a model: 4096 (the largest presets have 89; the expert id's layer is a
/// `u16`, and per-layer tables are allocated up front).
pub const MAX_MOE_LAYERS: usize = 4096;

/// Most routed experts per layer: 65,536 (today's largest models route over 512; the cache,
/// the traffic counters and the routing tables hold one entry per expert).
pub const MAX_EXPERTS: usize = 1 << 16;

/// Most routed experts over all layers (`experts x moe_layers`): 4,194,304 (2^22).
/// Per-expert tables (cache index, counters, banks' offsets) are allocated for every expert
/// of every layer; four million entries keep each under a few hundred MB. The largest preset
/// has 24,576.
pub const MAX_TOTAL_EXPERTS: u64 = 1 << 22;

/// Most experts routed per token per layer: 1024 (real models use 1 to 16).
pub const MAX_TOP_K: usize = 1024;

/// Widest hidden or expert FFN dimension, in elements: 131,072 (2^17). The widest models
/// today are about 25,600 wide; a matrix of this width squared stays far inside `u64`.
pub const MAX_WIDTH: usize = 1 << 17;

/// Most shared experts per layer: 64 (real models have 0 to 2).
pub const MAX_SHARED_EXPERTS: usize = 64;

/// Most dense weight bytes per layer a model file may give: 1 TiB (the largest dense layers
/// are a few GB); times the layers it must still be a sane byte count.
pub const MAX_DENSE_BYTES_PER_LAYER: u64 = 1 << 40;

/// Most KV-cache bytes per context token per layer a model file may give: 1 MiB (real
/// models need 0.5 to 40 kB); times [`MAX_CONTEXT_TOKENS`] and [`MAX_STREAMS`] it stays far
/// inside `u64`.
pub const MAX_KV_BYTES_PER_TOKEN: u64 = 1 << 20;

/// Most CPU threads of an expert pool: 1024. The largest hosts have 2 x 192 cores (768
/// hardware threads); `ft run --threads 100000` would spawn that many OS threads and spin
/// for minutes instead of refusing.
pub const MAX_THREADS: usize = 1024;

/// Most repeated rounds of one command (`ft run --repeat`): 1000. Each round is a full run;
/// a thousand is hours of decoding already.
pub const MAX_REPEATS: usize = 1000;

/// Most points of a sweep's cross product: 100,000. Each point is a simulation; at a few ms
/// each this is minutes already, and the results are held in memory.
pub const MAX_SWEEP_POINTS: usize = 100_000;

/// Largest profile (or report) JSON read, in bytes: 64 MiB. A profile with every probe
/// sample is a few hundred kB, a run's report less; a larger file (or `/dev/zero` behind a
/// symlink) is refused before it is read into memory.
pub const MAX_PROFILE_BYTES: u64 = 64 << 20;

/// Largest TOML input read (model, host, routing process), in bytes: 1 MiB. These files are
/// a few hundred bytes.
pub const MAX_TOML_BYTES: u64 = 1 << 20;

/// Largest relative root-mean-square error of a probe's held-out step validation (any
/// strategy) for the fit to be trusted: 0.5 (50%). A fit that misses its own validation
/// runs by more is still cached, marked untrusted (`Profile::untrusted`), and every reader
/// says so; good fits validate within 5 to 15%, and the bad one missed by 346%.
pub const MAX_TRUSTED_VALIDATION_RMS: f64 = 0.5;

/// Fastest byte rate a profile may claim for anything (the link, DRAM, the CPU's stream,
/// GPU memory), in GB/s: 100,000 (100 TB/s). Real hardware stays below 10 TB/s (B200 HBM3e
/// 8 TB/s, NVLink-C2C 450 GB/s a way, two 12-channel DDR5 sockets 1.7 TB/s), but the
/// host-emulated device's "link" and "GPU memory" are memory copies that can run from the
/// CPU's caches (its probes have fitted 2 to 3 TB/s), so the ceiling is set where no memory
/// system reaches: a claim beyond it (the 10^12 GB/s) is a broken profile.
pub const MAX_RATE_GBS: f64 = 1e5;

/// Fastest multiply-accumulate rate a profile may claim (GPU or CPU), in GMAC/s: 10^7
/// (10 PMAC/s; a B200 does about 4.5 PMAC/s dense at 4 bits).
pub const MAX_GMACS: f64 = 1e7;

/// Largest GPU memory a profile may claim, in bytes: 16 TiB (one GPU has at most a few
/// hundred GB; a layout of several counts per GPU).
pub const MAX_GPU_MEMORY_BYTES: f64 = (1u64 << 44) as f64;

/// Largest fixed cost a profile may claim, in us: 10^7 (10 s for one layer's launch, copy
/// or wake-up is a broken measurement, not a slow host).
pub const MAX_FIXED_US: f64 = 1e7;

/// Check that `value`, given as `input` (a flag with its value, a file key), is at most
/// `limit`; the error names the input, the limit and why the limit exists.
pub fn check<T: PartialOrd + std::fmt::Display>(
    input: &str,
    value: T,
    limit: T,
    why: &str,
) -> Result<()> {
    if value > limit {
        return Err(ModelError::invalid(
            input,
            format!("{value} is more than the limit of {limit} ({why})"),
        ));
    }
    Ok(())
}

/// [`check`] of a stream count given as `flag` (`--streams`): at least 1, at most
/// [`MAX_STREAMS`].
pub fn check_streams(flag: &str, streams: u64) -> Result<()> {
    if streams == 0 {
        return Err(ModelError::invalid(
            format!("{flag} 0"),
            "must be at least 1",
        ));
    }
    check(
        &format!("{flag} {streams}"),
        streams,
        MAX_STREAMS as u64,
        "ft_model::limits::MAX_STREAMS: routing tables grow with the streams",
    )
}

/// [`check`] of a step count given as `flag` (`--steps`, `--warmup`): at most [`MAX_STEPS`].
pub fn check_steps(flag: &str, steps: u64) -> Result<()> {
    check(
        &format!("{flag} {steps}"),
        steps,
        MAX_STEPS as u64,
        "ft_model::limits::MAX_STEPS: a record is kept per step",
    )
}

/// [`check`] of a context length in tokens given as `flag` (`--context`): at most
/// [`MAX_CONTEXT_TOKENS`].
pub fn check_context(flag: &str, tokens: u64) -> Result<()> {
    check(
        &format!("{flag} {tokens}"),
        tokens,
        MAX_CONTEXT_TOKENS as u64,
        "ft_model::limits::MAX_CONTEXT_TOKENS: longer than any model's context",
    )
}

/// [`check`] of a count of expert cache slots given as `flag` (`--cache-slots`): at most
/// [`MAX_TOTAL_EXPERTS`] (a cache never needs more slots than a model has experts).
pub fn check_cache_slots(flag: &str, slots: u64) -> Result<()> {
    check(
        &format!("{flag} {slots}"),
        slots,
        MAX_TOTAL_EXPERTS,
        "ft_model::limits::MAX_TOTAL_EXPERTS: more slots than any model has experts",
    )
}

/// [`check`] of a CPU thread count given as `flag` (`--threads`): at least 1, at most
/// [`MAX_THREADS`].
pub fn check_threads(flag: &str, threads: u64) -> Result<()> {
    if threads == 0 {
        return Err(ModelError::invalid(
            format!("{flag} 0"),
            "must be at least 1",
        ));
    }
    check(
        &format!("{flag} {threads}"),
        threads,
        MAX_THREADS as u64,
        "ft_model::limits::MAX_THREADS: one OS thread each",
    )
}

/// Read a text file of at most `max_bytes` bytes; errors name the file. A path that is not a
/// regular file (a device such as `/dev/zero`, a FIFO, a directory; symlinks are followed)
/// is refused before it is opened, and a file that grows past the limit while it is read is
/// refused at the limit: nothing larger than `max_bytes + 1` is ever held.
pub fn read_bounded(path: &Path, max_bytes: u64) -> Result<String> {
    let name = path.display().to_string();
    let io = |source| ModelError::Io {
        path: name.clone(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(ModelError::invalid(
            name.clone(),
            "is not a regular file (a device, FIFO or directory is not read)",
        ));
    }
    let too_big = |n: u64| {
        ModelError::invalid(
            name.clone(),
            format!(
                "{n} bytes or more is larger than the limit of {max_bytes} bytes for this input"
            ),
        )
    };
    if meta.len() > max_bytes {
        return Err(too_big(meta.len()));
    }
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes)
        .map_err(|e| ModelError::invalid(name.clone(), format!("is not UTF-8 text ({e})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_input_and_the_limit() {
        assert!(check("--steps 5", 5usize, MAX_STEPS, "why").is_ok());
        let e = check(
            "--steps 1000000",
            1_000_000usize,
            MAX_STEPS,
            "a record per step",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--steps 1000000") && e.contains("100000"), "{e}");
        assert!(e.contains("a record per step"), "{e}");
        assert!(check_cache_slots("--cache-slots", MAX_TOTAL_EXPERTS).is_ok());
        let e = check_cache_slots("--cache-slots", MAX_TOTAL_EXPERTS + 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--cache-slots 4194305"), "{e}");
        assert!(e.contains("more slots than any model has experts"), "{e}");
    }

    #[test]
    fn read_bounded_refuses_devices_large_files_and_binary() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("ok.toml");
        std::fs::write(&ok, "a = 1\n").unwrap();
        assert_eq!(read_bounded(&ok, 100).unwrap(), "a = 1\n");
        // Larger than the limit: refused, naming the file and the limit.
        let e = read_bounded(&ok, 3).unwrap_err().to_string();
        assert!(
            e.contains("ok.toml") && e.contains("limit of 3 bytes"),
            "{e}"
        );
        // A symlink to /dev/zero is refused before it is read.
        let link = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = read_bounded(&link, MAX_PROFILE_BYTES)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("zero.json") && e.contains("not a regular file"),
            "{e}"
        );
        // A directory is refused the same way; binary is not text.
        assert!(read_bounded(dir.path(), 100).is_err());
        let bin = dir.path().join("bin");
        std::fs::write(&bin, [0xff, 0xfe, 0x00]).unwrap();
        let e = read_bounded(&bin, 100).unwrap_err().to_string();
        assert!(e.contains("UTF-8"), "{e}");
        let e = read_bounded(&dir.path().join("none"), 100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("none"), "{e}");
    }
}
