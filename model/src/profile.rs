//! The host profile: fitted parameters cached as JSON, keyed so that a stale one is never
//! silently reused.
//!
//! Probing takes minutes; a profile lets `ft predict`, `ft explain` and `ft serve` reuse a
//! fit. It is only valid for the machine, model and program it was measured with, so it
//! carries a [`ProfileKey`]: the host fingerprint (GPU name and driver, CPU model, hardware
//! threads, NUMA nodes), the model's geometry and expert format, and the program version.
//! [`load`] compares the stored key with the current one part by part and answers
//! [`Lookup::Stale`] naming every part that differs (the caller re-probes); a file that does
//! not parse as a profile is [`Lookup::Corrupt`] (reported, then replaced by the next
//! [`store`], never trusted).
//!
//! Where: `$FT_CACHE_DIR/profiles/` when `FT_CACHE_DIR` is set, else
//! `dirs::cache_dir()/ft/profiles/`; one file per model geometry and format
//! (`<model>-<format>-<hash>.json`), so a second machine or version overwrites it rather
//! than accumulating. Writes are atomic: a temporary file in the same directory, flushed to
//! disk, then renamed over the target, so a reader sees the old profile or the new one,
//! never half of one.
//!
//! A profile is data from disk, not trusted: every read ([`load`], [`Profile::read`]) is
//! bounded in size ([`crate::limits::MAX_PROFILE_BYTES`]; a symlink to `/dev/zero` is
//! refused, not read) and validated as a whole ([`Profile::validate`]: the key's geometry,
//! every parameter finite and within the physical ceilings of `crate::limits`, the
//! covariance square over distinct parameters, every sample a finite non-negative number).
//! A fit that missed its own held-out validation runs by more than
//! [`crate::limits::MAX_TRUSTED_VALIDATION_RMS`] is cached, marked untrusted
//! ([`Profile::untrusted`]), and every reader says so.
//!
//! The model's layer count is not part of the key: every parameter is a per-layer cost, the
//! end-to-end probe runs a few layers of any model, and `--layers N` serves the first N
//! layers of the same geometry, so `ft probe --layers 1` and `ft serve --layers 1` (or a
//! full-depth serve) share one profile.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{ModelError, Result};
use crate::format::ExpertFormat;
use crate::geometry::MoeGeometry;
use crate::host::HostSpec;
use crate::perf::fit::{CpuStepSample, FitReport, ProbeSamples};
use crate::perf::legacy::BenchBw;
use crate::perf::{ParamCovariance, ParamId, PerfModel, PerfParams};
use crate::preset::ModelSpec;

/// Version of the profile document's layout; a different one is stale.
pub const PROFILE_SCHEMA: u32 = 1;

/// Environment variable overriding the cache directory.
pub const CACHE_DIR_ENV: &str = "FT_CACHE_DIR";

/// The program version written into keys.
pub fn program_version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// What identifies the machine a profile was measured on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFingerprint {
    /// GPU name as the driver reports it.
    pub gpu_name: String,
    /// GPU driver version.
    pub gpu_driver: String,
    /// CPU model name.
    pub cpu_model: String,
    /// Hardware threads.
    pub threads: u32,
    /// NUMA nodes.
    pub numa_nodes: u32,
    /// The runtime's GPU paths where they are chosen at run time (the CUDA device's
    /// tuning and the GPU's activation path, e.g. `staged+pdl+split+cvt+wide, copies batch, int8
    /// activations`): a profile probed on other kernel, copy or activation paths timed other
    /// GPU work, so it is re-probed. Empty for simulated hosts and the
    /// host-emulated device (and in profiles written before the field existed).
    #[serde(default)]
    pub gpu_paths: String,
}

impl HostFingerprint {
    /// The fingerprint a host spec describes (for simulated hosts; the driver is
    /// `"simulated"`). The runtime builds the real one from the devices it finds.
    pub fn of_spec(host: &HostSpec) -> Self {
        HostFingerprint {
            gpu_name: host.gpu.name.clone(),
            gpu_driver: "simulated".to_string(),
            cpu_model: host.cpu.name.clone(),
            threads: host.cpu.threads,
            numa_nodes: host.cpu.numa_nodes,
            gpu_paths: String::new(),
        }
    }
}

/// The model part of a key: what the probes' byte counts and shapes depend on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelKey {
    /// Model name (for the file name; not compared).
    pub name: String,
    /// Expert format.
    pub format: ExpertFormat,
    /// Routed-expert geometry.
    pub geometry: MoeGeometry,
}

impl ModelKey {
    /// The key part of a model.
    pub fn of(model: &ModelSpec) -> Self {
        ModelKey {
            name: model.name.clone(),
            format: model.format,
            geometry: model.geometry,
        }
    }
}

/// The full key of a profile.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileKey {
    /// The machine.
    pub host: HostFingerprint,
    /// The model.
    pub model: ModelKey,
    /// The program version that fitted it.
    pub program_version: String,
    /// The document layout.
    pub schema: u32,
}

impl ProfileKey {
    /// A key for this program.
    pub fn new(host: HostFingerprint, model: &ModelSpec) -> Self {
        ProfileKey {
            host,
            model: ModelKey::of(model),
            program_version: program_version(),
            schema: PROFILE_SCHEMA,
        }
    }

    /// The parts of `self` (stored) that differ from `current`.
    pub fn mismatches(&self, current: &ProfileKey) -> Vec<Mismatch> {
        let mut out = Vec::new();
        let mut check = |part: KeyPart, a: String, b: String| {
            if a != b {
                out.push(Mismatch {
                    part,
                    stored: a,
                    current: b,
                });
            }
        };
        let (s, c) = (&self.host, &current.host);
        check(KeyPart::GpuName, s.gpu_name.clone(), c.gpu_name.clone());
        check(
            KeyPart::GpuDriver,
            s.gpu_driver.clone(),
            c.gpu_driver.clone(),
        );
        check(KeyPart::CpuModel, s.cpu_model.clone(), c.cpu_model.clone());
        check(
            KeyPart::Threads,
            s.threads.to_string(),
            c.threads.to_string(),
        );
        check(
            KeyPart::NumaNodes,
            s.numa_nodes.to_string(),
            c.numa_nodes.to_string(),
        );
        check(KeyPart::GpuPaths, s.gpu_paths.clone(), c.gpu_paths.clone());
        check(
            KeyPart::ModelGeometry,
            format!("{:?}", per_layer(&self.model.geometry)),
            format!("{:?}", per_layer(&current.model.geometry)),
        );
        check(
            KeyPart::ModelFormat,
            self.model.format.to_string(),
            current.model.format.to_string(),
        );
        check(
            KeyPart::ProgramVersion,
            self.program_version.clone(),
            current.program_version.clone(),
        );
        check(
            KeyPart::Schema,
            self.schema.to_string(),
            current.schema.to_string(),
        );
        out
    }

    /// The file name of the profile of this key's model: `<model>-<format>-<hash>.json`,
    /// the hash (FNV-1a, 64 bits) over the geometry and format only.
    pub fn file_name(&self) -> String {
        let clean: String = self
            .model
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let ident = format!(
            "{:?}/{}",
            per_layer(&self.model.geometry),
            self.model.format
        );
        format!(
            "{clean}-{}-{:016x}.json",
            self.model.format,
            fnv1a(ident.as_bytes())
        )
    }
}

/// The part of a geometry a profile depends on: everything but the layer count (see the
/// module docs), which is set to 0.
fn per_layer(g: &MoeGeometry) -> MoeGeometry {
    g.with_layers(0)
}

/// FNV-1a over bytes (stable across runs and platforms, unlike `std`'s hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ *b as u64).wrapping_mul(PRIME))
}

/// A part of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyPart {
    /// GPU name.
    GpuName,
    /// GPU driver version.
    GpuDriver,
    /// CPU model.
    CpuModel,
    /// Hardware threads.
    Threads,
    /// NUMA nodes.
    NumaNodes,
    /// The GPU paths chosen at run time.
    GpuPaths,
    /// The model's routed-expert geometry.
    ModelGeometry,
    /// The expert format.
    ModelFormat,
    /// The program version.
    ProgramVersion,
    /// The document layout.
    Schema,
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyPart::GpuName => "GPU name",
            KeyPart::GpuDriver => "GPU driver",
            KeyPart::CpuModel => "CPU model",
            KeyPart::Threads => "hardware threads",
            KeyPart::NumaNodes => "NUMA nodes",
            KeyPart::GpuPaths => "GPU paths",
            KeyPart::ModelGeometry => "model geometry",
            KeyPart::ModelFormat => "expert format",
            KeyPart::ProgramVersion => "program version",
            KeyPart::Schema => "profile schema",
        })
    }
}

/// One differing key part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    /// Which part.
    pub part: KeyPart,
    /// Its stored value.
    pub stored: String,
    /// Its current value.
    pub current: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: stored '{}', now '{}'",
            self.part, self.stored, self.current
        )
    }
}

/// A fitted host profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// What it is valid for.
    pub key: ProfileKey,
    /// When it was written, in seconds since the Unix epoch.
    pub created_unix_s: u64,
    /// The fitted parameters.
    pub params: PerfParams,
    /// Their covariance (the fit's, over the host prior's for what was not fitted).
    pub covariance: ParamCovariance,
    /// Residual degrees of freedom of the fit.
    pub dof: Option<usize>,
    /// The fit's report (estimates, stages, residuals, validation).
    pub fit: Option<FitReport>,
    /// The raw probe samples the fit used.
    pub samples: ProbeSamples,
    /// The `ft bench bw` measurements (the legacy rule's inputs).
    pub bench_bw: Option<BenchBw>,
    /// Share of the machine's CPU time the hypervisor took while the probes ran (absent in
    /// profiles written before 2026-12-05, or where it cannot be read): above a few percent
    /// the CPU costs are fitted slow.
    #[serde(default)]
    pub probe_steal_fraction: Option<f64>,
    /// The probe's own timing of the CPU side, one per thread count it probed (absent in
    /// profiles written before 2026-12-06): what a later [`CpuCheck`] of the same work is
    /// set against to say how fast the machine's CPU side is now ([`Profile::cpu_speed`]).
    #[serde(default)]
    pub cpu_checks: Vec<CpuCheck>,
    /// Why the fit is not to be trusted, where it is not: its held-out validation runs
    /// missed by more than [`crate::limits::MAX_TRUSTED_VALIDATION_RMS`]
    /// ([`Profile::assess_fit`]). Such a profile is still cached (it is the best this host
    /// gave), but `ft predict` warns on stderr and in `--json`, and `ft serve` re-probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untrusted: Option<String>,
    /// The engine-terms section of a profile `ft calibrate` wrote: the runs it was
    /// calibrated to, which terms they identified and how well it fits them
    /// ([`crate::calibrate::CalibrationRecord`]). The fitted terms themselves are in
    /// [`Profile::params`] (`engine`, `overhead`, `cpu_serving_slowdown`, `gather_gbs`), so
    /// every reader uses them; absent in a probed or host-spec profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<crate::calibrate::CalibrationRecord>,
}

/// One short timing of the CPU side's own work: one layer of `experts` experts at
/// `tokens_per_expert` token(s) each, computed from the served bank by `threads` threads, the
/// median of `reps` repetitions (`ft_runtime::cpu_check`).
///
/// On a shared host the CPU side moves by up to 3x within minutes (the validation
/// experiment's drift run), while a profile is fitted to one probe of about 20 s. The probe
/// keeps its own checks in the profile; `ft serve` (at start) and `ft run` (before each
/// round) time the same work again, and the ratio ([`CpuCheck::speed_since`]) is the speed
/// [`PerfParams::with_cpu_speed`] scales the model's CPU side by.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuCheck {
    /// Experts of the layer timed.
    pub experts: u32,
    /// Tokens routed to each expert.
    pub tokens_per_expert: u32,
    /// Bytes of each expert.
    pub expert_bytes: f64,
    /// Threads that computed it.
    pub threads: u32,
    /// Median time of one layer, in us.
    pub time_us: f64,
    /// Repetitions timed.
    pub reps: u32,
}

impl CpuCheck {
    /// The check of `references` that timed the same work as `now` and how many times
    /// faster `now` ran ([`CpuCheck::speed_since`]); `None` where none timed that work.
    pub fn speed_against(
        references: &[CpuCheck],
        now: &CpuCheck,
    ) -> Result<Option<(f64, CpuCheck)>> {
        references
            .iter()
            .find(|c| c.same_work(now))
            .map(|c| Ok((c.speed_since(now)?, *c)))
            .transpose()
    }

    /// True when `other` timed the same work (experts, tokens, expert bytes and threads).
    pub fn same_work(&self, other: &CpuCheck) -> bool {
        self.experts == other.experts
            && self.tokens_per_expert == other.tokens_per_expert
            && self.expert_bytes == other.expert_bytes
            && self.threads == other.threads
    }

    /// How many times faster the CPU side ran in `now` than in this (earlier) check of the
    /// same work: `self.time_us / now.time_us`. An error when the two timed different work
    /// or either time is not a positive number.
    pub fn speed_since(&self, now: &CpuCheck) -> Result<f64> {
        if !self.same_work(now) {
            return Err(ModelError::invalid(
                "CPU check",
                format!(
                    "the check ({} experts x {} token(s) of {:.0} B at {} threads) does not time the reference's work ({} x {} of {:.0} B at {} threads)",
                    now.experts,
                    now.tokens_per_expert,
                    now.expert_bytes,
                    now.threads,
                    self.experts,
                    self.tokens_per_expert,
                    self.expert_bytes,
                    self.threads
                ),
            ));
        }
        for (what, t) in [("reference", self.time_us), ("check", now.time_us)] {
            if !(t.is_finite() && t > 0.0) {
                return Err(ModelError::invalid(
                    "CPU check",
                    format!("the {what}'s time {t} us is not a positive number"),
                ));
            }
        }
        Ok(self.time_us / now.time_us)
    }
}

impl Profile {
    /// How many times faster the CPU side runs in `now` than when the profile was probed:
    /// [`CpuCheck::speed_since`] against the profile's check of the same work, `None` where
    /// the profile holds none (an older profile, a what-if host's, or another thread count).
    pub fn cpu_speed(&self, now: &CpuCheck) -> Result<Option<f64>> {
        Ok(CpuCheck::speed_against(&self.cpu_checks, now)?.map(|(speed, _)| speed))
    }

    /// The profile of a host spec: its prior parameters and covariance
    /// ([`PerfModel::from_host`]) keyed by the spec's fingerprint and `model`, with no probe
    /// samples and no fit (what a what-if host predicts from, as a profile file).
    pub fn of_host_spec(host: &HostSpec, model: &ModelSpec) -> Result<Profile> {
        let perf = PerfModel::from_host(host)?;
        Ok(Profile {
            key: ProfileKey::new(HostFingerprint::of_spec(host), model),
            created_unix_s: now_unix_s(),
            params: perf.params,
            covariance: perf.covariance,
            dof: perf.dof,
            fit: None,
            samples: ProbeSamples::default(),
            bench_bw: None,
            probe_steal_fraction: None,
            cpu_checks: Vec::new(),
            untrusted: None,
            calibration: None,
        })
    }

    /// A profile re-expressed at `threads` serving threads: the CPU streaming rate becomes the
    /// model's own rate at that count ([`PerfParams::cpu_rate_gbs`]), the per-expert cost and the
    /// per-token rate likewise (`cpu_expert_cost_us`, `cpu_token_rate_gmacs`), and the
    /// covariance is carried through the same map (its Jacobian: the streaming rate and the
    /// per-expert cost depend on themselves and on the thread exponent, the token rate on
    /// itself). The serving slowdown becomes its value at that count
    /// ([`PerfParams::serving_slowdown`]; with the standard error measured there, where the
    /// end-to-end probe ran at that count). Every other parameter is unchanged.
    ///
    /// Where the probe measured the CPU step at exactly `threads` threads (isolated, one token
    /// per expert: `ft probe` does at a half and a quarter of the serving threads), the streaming
    /// rate is taken from those samples instead ([`cpu_rate_at_threads`]): the single power law
    /// through 4, 8 and 15 threads missed the 4-thread samples of the H200 by 4%, and a sample at
    /// the very thread count beats an interpolation through it.
    pub fn at_threads(&self, threads: u32) -> Result<Profile> {
        let p = self;
        if threads == 0 {
            return Err(ModelError::invalid("threads", "must be at least 1"));
        }
        let old = &p.params;
        let t = threads as f64;
        let r = t / old.cpu_threads as f64;
        let mut q = p.clone();
        let (params, rate_se) = params_at_threads(old, &p.samples.cpu_step, threads);
        params.validate()?;
        q.params = params;
        let ids = &p.covariance.params;
        let n = ids.len();
        let idx = |id: ParamId| ids.iter().position(|x| *x == id);
        let mut jac = vec![vec![0.0; n]; n];
        for (i, row) in jac.iter_mut().enumerate() {
            row[i] = 1.0;
        }
        if let Some(g) = idx(ParamId::CpuGbs) {
            jac[g][g] = r.powf(old.cpu_thread_exponent);
            if let Some(e) = idx(ParamId::CpuThreadExponent) {
                jac[g][e] = q.params.cpu_gbs * r.ln();
            }
        }
        if let Some(k) = idx(ParamId::CpuTokenGmacs) {
            jac[k][k] = r;
        }
        if let Some(x) = idx(ParamId::CpuExpertUs) {
            jac[x][x] = r.powf(-old.cpu_thread_exponent);
            if let Some(e) = idx(ParamId::CpuThreadExponent) {
                jac[x][e] = -q.params.cpu_expert_us * r.ln();
            }
        }
        let c = &p.covariance.matrix;
        let mut out = vec![vec![0.0; n]; n];
        for a in 0..n {
            for b in 0..n {
                let mut s = 0.0;
                for i in 0..n {
                    for j in 0..n {
                        s += jac[a][i] * c[i][j] * jac[b][j];
                    }
                }
                out[a][b] = s;
            }
        }
        q.covariance.matrix = out;
        // A slowdown measured at this very count: its own standard error, no longer tied to
        // the serving count's.
        let measured_slowdown = old
            .cpu_serving_slowdown_at
            .iter()
            .find(|k| k.threads == threads && k.se.is_finite());
        // A parameter measured at this count has its own standard error and no covariance.
        let pin = |m: &mut Vec<Vec<f64>>, i: usize, se: f64| {
            m[i].fill(0.0);
            for row in m.iter_mut() {
                row[i] = 0.0;
            }
            m[i][i] = se * se;
        };
        if let (Some(k), Some(s)) = (measured_slowdown, idx(ParamId::CpuServingSlowdown)) {
            pin(&mut q.covariance.matrix, s, k.se);
        }
        // The streaming rate measured at this count: no longer a function of the exponent.
        if let (Some(se), Some(g)) = (rate_se, idx(ParamId::CpuGbs)) {
            pin(&mut q.covariance.matrix, g, se);
        }
        Ok(q)
    }

    /// The model prediction uses.
    pub fn perf_model(&self, source: &str) -> PerfModel {
        PerfModel {
            params: self.params.clone(),
            covariance: self.covariance.clone(),
            dof: self.dof,
            source: source.to_string(),
        }
    }

    /// Read a profile file directly (`--profile FILE`): bounded in size, parsed and
    /// validated as a whole ([`Profile::parse`]); errors name the file.
    pub fn read(path: &Path) -> Result<Self> {
        let text = crate::limits::read_bounded(path, crate::limits::MAX_PROFILE_BYTES)?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parse a profile document and validate it ([`Profile::validate`]); `origin` names it
    /// in errors. The one parser behind every read of a profile (and the fuzz target's).
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        // The path of the field that failed (`params.cpu_gbs: invalid type: null ...`).
        let mut de = serde_json::Deserializer::from_str(text);
        let p: Profile = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let at = e.path().to_string();
            ModelError::Json {
                path: origin.to_string(),
                message: if at == "." {
                    e.inner().to_string()
                } else {
                    format!("{at}: {}", e.inner())
                },
            }
        })?;
        de.end().map_err(|e| ModelError::Json {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        p.validate().map_err(|e| ModelError::Json {
            path: origin.to_string(),
            message: format!("not a valid profile: {e}"),
        })?;
        Ok(p)
    }

    /// Check the whole profile, not only its parameters: the key's geometry and thread
    /// count, every parameter ([`PerfParams::validate`]) and within the physical ceilings
    /// of [`crate::limits`] (a claim of 10^12 GB/s is a broken profile, not a fast host),
    /// the covariance (square, over distinct parameters, finite, variances >= 0; also the
    /// fit report's), every probe sample a finite number >= 0, every CPU check a positive
    /// time, the steal share in [0, 1]. Errors name the field.
    pub fn validate(&self) -> Result<()> {
        use crate::limits::{self as lim};
        self.key.model.geometry.validate(self.key.model.format)?;
        lim::check(
            "key.host.threads",
            self.key.host.threads as usize,
            lim::MAX_THREADS,
            "ft_model::limits::MAX_THREADS",
        )?;
        let p = &self.params;
        p.validate()?;
        lim::check(
            "perf.cpu_threads",
            p.cpu_threads as usize,
            lim::MAX_THREADS,
            "ft_model::limits::MAX_THREADS",
        )?;
        let ceilings: [(&str, f64, f64, &str); 16] = [
            (
                "gather_gbs",
                p.gather_gbs,
                lim::MAX_RATE_GBS,
                "MAX_RATE_GBS",
            ),
            (
                "activation_link_gbs",
                p.activation_link_gbs,
                lim::MAX_RATE_GBS,
                "MAX_RATE_GBS",
            ),
            ("peer_gbs", p.peer_gbs, lim::MAX_RATE_GBS, "MAX_RATE_GBS"),
            ("cpu_gbs", p.cpu_gbs, lim::MAX_RATE_GBS, "MAX_RATE_GBS"),
            ("dram_gbs", p.dram_gbs, lim::MAX_RATE_GBS, "MAX_RATE_GBS"),
            (
                "gpu_hbm_gbs",
                p.gpu_hbm_gbs,
                lim::MAX_RATE_GBS,
                "MAX_RATE_GBS",
            ),
            (
                "dense_hbm_gbs",
                p.dense_rate_gbs(),
                lim::MAX_RATE_GBS,
                "MAX_RATE_GBS",
            ),
            (
                "cpu_token_gmacs",
                p.cpu_token_gmacs,
                lim::MAX_GMACS,
                "MAX_GMACS",
            ),
            (
                "gpu_token_gmacs",
                p.gpu_token_gmacs,
                lim::MAX_GMACS,
                "MAX_GMACS",
            ),
            (
                "gpu_memory_bytes",
                p.gpu_memory_bytes,
                lim::MAX_GPU_MEMORY_BYTES,
                "MAX_GPU_MEMORY_BYTES",
            ),
            (
                "gather_layer_us",
                p.gather_layer_us,
                lim::MAX_FIXED_US,
                "MAX_FIXED_US",
            ),
            (
                "cpu_layer_us",
                p.cpu_layer_us,
                lim::MAX_FIXED_US,
                "MAX_FIXED_US",
            ),
            (
                "gpu_launch_us",
                p.gpu_launch_us,
                lim::MAX_FIXED_US,
                "MAX_FIXED_US",
            ),
            (
                "dense_layer_us",
                p.dense_layer_us,
                lim::MAX_FIXED_US,
                "MAX_FIXED_US",
            ),
            ("sync_us", p.sync_us, lim::MAX_FIXED_US, "MAX_FIXED_US"),
            (
                "peer_latency_us",
                p.peer_latency_us,
                lim::MAX_FIXED_US,
                "MAX_FIXED_US",
            ),
        ];
        for (name, v, ceiling, why) in ceilings {
            if v > ceiling {
                return Err(ModelError::invalid(
                    format!("params.{name}"),
                    format!(
                        "{v} is beyond the physical ceiling {ceiling} \
                         (ft_model::limits::{why}): a broken profile, not a fast host"
                    ),
                ));
            }
        }
        for (name, v) in [
            ("overhead.offload_us", p.overhead.offload_us),
            ("overhead.hybrid_us", p.overhead.hybrid_us),
            ("overhead.resident_us", p.overhead.resident_us),
            ("overhead.cpu_us", p.overhead.cpu_us),
            ("engine.rest_stream_us", p.engine.rest_stream_us),
            (
                "engine.rest_context_us_per_ktok",
                p.engine.rest_context_us_per_ktok,
            ),
        ] {
            if v > lim::MAX_FIXED_US {
                return Err(ModelError::invalid(
                    format!("params.{name}"),
                    format!(
                        "{v} is beyond the physical ceiling {} \
                         (ft_model::limits::MAX_FIXED_US): a broken profile, not a slow engine",
                        lim::MAX_FIXED_US
                    ),
                ));
            }
        }
        if let Some(c) = &self.calibration {
            c.validate()?;
        }
        check_covariance("covariance", &self.covariance)?;
        if let Some(fit) = &self.fit {
            check_covariance("fit.covariance", &fit.covariance)?;
        }
        let samples = serde_json::to_value(&self.samples)
            .map_err(|e| ModelError::invalid("samples", format!("cannot be re-encoded: {e}")))?;
        check_numbers("samples", &samples)?;
        for (i, c) in self.cpu_checks.iter().enumerate() {
            if c.threads == 0 || !(c.time_us.is_finite() && c.time_us > 0.0) {
                return Err(ModelError::invalid(
                    format!("cpu_checks[{i}]"),
                    format!(
                        "{} threads, {} us: needs a thread and a positive time",
                        c.threads, c.time_us
                    ),
                ));
            }
        }
        if let Some(f) = self.probe_steal_fraction {
            if !(0.0..=1.0).contains(&f) {
                return Err(ModelError::invalid(
                    "probe_steal_fraction",
                    format!("{f} is not a share (0 to 1)"),
                ));
            }
        }
        Ok(())
    }

    /// Check the profile against what it is about to be used for: `model`'s expert format
    /// and per-layer geometry (any layer count; see the module docs) and, where given, the
    /// serving `threads` (at least 1, at most [`crate::limits::MAX_THREADS`]; the profile
    /// is re-expressed there by [`Profile::at_threads`]). `input` names the profile in the
    /// error (`--profile P`).
    pub fn check_for(&self, input: &str, model: &ModelSpec, threads: Option<usize>) -> Result<()> {
        let want = ModelKey::of(model);
        let have = &self.key.model;
        if have.format != want.format || per_layer(&have.geometry) != per_layer(&want.geometry) {
            return Err(ModelError::invalid(
                input,
                format!(
                    "was probed for model '{}' ({}, {} x {} wide, {} experts, top-{}), not for \
                     '{}' ({}, {} x {} wide, {} experts, top-{}): probe this model, or give \
                     its --model",
                    have.name,
                    have.format,
                    have.geometry.hidden,
                    have.geometry.intermediate,
                    have.geometry.experts,
                    have.geometry.top_k,
                    want.name,
                    want.format,
                    want.geometry.hidden,
                    want.geometry.intermediate,
                    want.geometry.experts,
                    want.geometry.top_k,
                ),
            ));
        }
        if let Some(t) = threads {
            if t == 0 {
                return Err(ModelError::invalid("threads", "must be at least 1"));
            }
            crate::limits::check(
                "threads",
                t,
                crate::limits::MAX_THREADS,
                "ft_model::limits::MAX_THREADS",
            )?;
        }
        Ok(())
    }

    /// The model this profile was probed for, as a [`ModelSpec`]: the built-in preset of
    /// that name where its geometry and format match (so its dense part too), else the key's
    /// geometry with the dense part estimated.
    pub fn probed_model(&self) -> ModelSpec {
        let k = &self.key.model;
        match ModelSpec::preset(&k.name) {
            Ok(m) if m.format == k.format && per_layer(&m.geometry) == per_layer(&k.geometry) => {
                m.with_layers(k.geometry.moe_layers)
            }
            _ => ModelSpec {
                name: k.name.clone(),
                format: k.format,
                geometry: k.geometry,
                dense: None,
            },
        }
    }

    /// Why the fit should not be trusted, if it should not: the stored mark
    /// ([`Profile::untrusted`]) or, for a profile written without it, the same assessment
    /// of its fit report ([`Profile::assess_fit`]).
    pub fn trust_issue(&self) -> Option<String> {
        self.untrusted.clone().or_else(|| self.assess_fit())
    }

    /// Assess the fit against its held-out validation runs: per strategy, the root mean
    /// square of the relative residuals of the validation step samples; any above
    /// [`crate::limits::MAX_TRUSTED_VALIDATION_RMS`] makes the fit untrusted (the reason
    /// names each strategy and its error). `None` where there is no fit or it validates.
    pub fn assess_fit(&self) -> Option<String> {
        let fit = self.fit.as_ref()?;
        let limit = crate::limits::MAX_TRUSTED_VALIDATION_RMS;
        let mut bad = Vec::new();
        for kind in crate::strategy::StrategyKind::ALL {
            let rels: Vec<f64> = fit
                .validation
                .iter()
                .filter(|r| {
                    self.samples
                        .step
                        .get(r.index)
                        .is_some_and(|s| s.strategy == kind)
                })
                .map(|r| r.rel)
                .collect();
            if rels.is_empty() {
                continue;
            }
            let rms = (rels.iter().map(|r| r * r).sum::<f64>() / rels.len() as f64).sqrt();
            if rms.is_nan() || rms > limit {
                bad.push(format!("{kind} {:.0}%", 100.0 * rms));
            }
        }
        (!bad.is_empty()).then(|| {
            format!(
                "the fit missed its own validation runs by more than {:.0}% rms ({})",
                100.0 * limit,
                bad.join(", ")
            )
        })
    }
}

/// A covariance must be square over distinct parameters, finite, with variances >= 0: an
/// error naming `field` otherwise (indexing it would panic or mislead).
fn check_covariance(field: &str, c: &ParamCovariance) -> Result<()> {
    let n = c.params.len();
    if c.matrix.len() != n || c.matrix.iter().any(|row| row.len() != n) {
        return Err(ModelError::invalid(
            format!("{field}.matrix"),
            format!(
                "is not {n} x {n} over its {n} parameters (rows: {:?})",
                c.matrix.iter().map(Vec::len).collect::<Vec<_>>()
            ),
        ));
    }
    for (i, p) in c.params.iter().enumerate() {
        if c.params[..i].contains(p) {
            return Err(ModelError::invalid(
                format!("{field}.params"),
                format!("names {p} twice"),
            ));
        }
        let var = c.matrix[i][i];
        if var.is_nan() || var < 0.0 {
            return Err(ModelError::invalid(
                format!("{field}.matrix"),
                format!("the variance of {p} is {var}, not >= 0"),
            ));
        }
    }
    if let Some(v) = c.matrix.iter().flatten().find(|v| !v.is_finite()) {
        return Err(ModelError::invalid(
            format!("{field}.matrix"),
            format!("holds {v}, not a finite number"),
        ));
    }
    Ok(())
}

/// Every number under `v` finite and >= 0 (probe samples are counts, sizes and times), no
/// `time_us` missing; an error naming the path of the first that is not.
fn check_numbers(path: &str, v: &serde_json::Value) -> Result<()> {
    use serde_json::Value;
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(x) if x.is_finite() && x >= 0.0 => Ok(()),
            _ => Err(ModelError::invalid(
                path,
                format!("{n} is not a finite number >= 0"),
            )),
        },
        Value::Array(a) => a
            .iter()
            .enumerate()
            .try_for_each(|(i, x)| check_numbers(&format!("{path}[{i}]"), x)),
        Value::Object(o) => o
            .iter()
            .try_for_each(|(k, x)| check_numbers(&format!("{path}.{k}"), x)),
        Value::Null if path.ends_with(".time_us") => Err(ModelError::invalid(
            path,
            "a measured time that is not a number",
        )),
        _ => Ok(()),
    }
}

/// The outcome of looking a profile up.
#[derive(Debug)]
pub enum Lookup {
    /// A profile for this key.
    Fresh(Box<Profile>),
    /// A profile whose key differs; re-probe.
    Stale {
        /// Where it is.
        path: PathBuf,
        /// What differs.
        mismatches: Vec<Mismatch>,
    },
    /// None stored.
    Missing {
        /// Where it would be.
        path: PathBuf,
    },
    /// A file that is not a valid profile: reported, replaced by the next store, never used.
    Corrupt {
        /// Where it is.
        path: PathBuf,
        /// Why it was refused.
        reason: String,
    },
}

/// `params` re-expressed at `threads` threads ([`PerfParams::at_threads`]) with the CPU
/// streaming rate measured at exactly that count where the probe's samples have it
/// ([`cpu_rate_at_threads`]), and that rate's standard error. The one re-expression both a
/// prediction at another count ([`Profile::at_threads`]) and the fit of the end-to-end
/// blocks run there use, so that the two agree.
pub fn params_at_threads(
    params: &PerfParams,
    samples: &[CpuStepSample],
    threads: u32,
) -> (PerfParams, Option<f64>) {
    let mut q = params.at_threads(threads);
    let se = cpu_rate_at_threads(&q, samples, threads).map(|(rate, se)| {
        q.cpu_gbs = rate;
        se
    });
    (q, se)
}

/// The CPU streaming rate at `threads` threads from the probe's isolated one-token
/// `cpu-step` samples at exactly that count, in GB/s, with its standard error: the one-
/// parameter least squares of `time - fixed = bytes / rate` (the fixed part, per layer and
/// per expert, from `params`), over at least two samples. `None` where there are fewer.
pub fn cpu_rate_at_threads(
    params: &PerfParams,
    samples: &[CpuStepSample],
    threads: u32,
) -> Option<(f64, f64)> {
    use crate::perf::{ExpertShape, BYTES_PER_US_PER_GBS};
    let t = threads as f64;
    // (bytes over 1 GB/s in us, the time left after the fixed part in us)
    let points: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.threads == threads && !s.contended && s.tokens_per_expert == 1)
        .map(|s| {
            let shape = ExpertShape {
                bytes: s.expert_bytes,
                macs: s.expert_macs,
            };
            let n = s.experts as f64;
            let fixed = params.cpu_fixed_us(n, n, shape, t);
            (n * s.expert_bytes / BYTES_PER_US_PER_GBS, s.time_us - fixed)
        })
        .collect();
    if points.len() < 2 {
        return None;
    }
    let saa: f64 = points.iter().map(|(a, _)| a * a).sum();
    let x = points.iter().map(|(a, z)| a * z).sum::<f64>() / saa; // us per (B / 1e3) = 1 / rate
    if !(x.is_finite() && x > 0.0) {
        return None;
    }
    let rss: f64 = points.iter().map(|(a, z)| (z - a * x).powi(2)).sum();
    let se_x = (rss / (points.len() - 1) as f64 / saa).sqrt();
    Some((1.0 / x, se_x / (x * x)))
}

/// The profile directory: `$FT_CACHE_DIR/profiles`, else `dirs::cache_dir()/ft/profiles`.
pub fn profile_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(CACHE_DIR_ENV) {
        if !dir.is_empty() {
            return Ok(PathBuf::from(dir).join("profiles"));
        }
    }
    dirs::cache_dir()
        .map(|d| d.join("ft").join("profiles"))
        .ok_or_else(|| {
            ModelError::invalid(
                "cache directory",
                format!("this system has no user cache directory; set {CACHE_DIR_ENV}"),
            )
        })
}

/// Look up the profile for `key` in `dir`.
pub fn load(dir: &Path, key: &ProfileKey) -> Result<Lookup> {
    let path = dir.join(key.file_name());
    // A path that is not there (a dangling symlink too) is missing; anything else that
    // cannot be read as a bounded text file (a device, a directory, a symlink loop, too
    // large, not UTF-8, unreadable) is corrupt: reported and replaced by the next store,
    // never read until memory runs out.
    if matches!(std::fs::metadata(&path), Err(ref e) if e.kind() == std::io::ErrorKind::NotFound) {
        return Ok(Lookup::Missing { path });
    }
    let corrupt = |path: PathBuf, reason: String| {
        tracing::warn!(path = %path.display(), "corrupt profile; it will be replaced: {reason}");
        Ok(Lookup::Corrupt { path, reason })
    };
    let text = match crate::limits::read_bounded(&path, crate::limits::MAX_PROFILE_BYTES) {
        Ok(t) => t,
        Err(e) => return corrupt(path, e.to_string()),
    };
    let profile = match Profile::parse(&text, &path.display().to_string()) {
        Ok(p) => p,
        Err(e) => return corrupt(path, e.to_string()),
    };
    let mismatches = profile.key.mismatches(key);
    if mismatches.is_empty() {
        Ok(Lookup::Fresh(Box::new(profile)))
    } else {
        Ok(Lookup::Stale { path, mismatches })
    }
}

/// Distinguishes temporary files of concurrent writers within one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Write `profile` into `dir` atomically ([`write_atomic`]); returns the path. Replaces
/// whatever was there (a stale or corrupt file).
pub fn store(dir: &Path, profile: &Profile) -> Result<PathBuf> {
    let path = dir.join(profile.key.file_name());
    let body = serde_json::to_vec_pretty(profile).map_err(|e| ModelError::Json {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    write_atomic(&path, &body)?;
    Ok(path)
}

/// Write `bytes` to `path` atomically: a temporary file beside it (its directory created
/// where missing), synced, renamed over it, so that a reader sees the old file or the new
/// one, never a part; the temporary file is removed on failure.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |path: &Path, source: std::io::Error| ModelError::Io {
        path: path.display().to_string(),
        source,
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let Some(name) = path.file_name() else {
        return Err(ModelError::invalid(
            path.display().to_string(),
            "not a file path",
        ));
    };
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(&tmp, e));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(path, e));
    }
    Ok(())
}

/// Seconds since the Unix epoch now (0 if the clock is before it).
pub fn now_unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The profile the tests of this crate share: the field report's host spec for `model`
/// (its prior, no samples) with the field report's `ft bench bw` pair (46.12 GB/s CPU,
/// 24.25 GB/s PCIe, over 8 experts of 7,974,912 B) and, where given, the pair measured
/// with both sides running at once (`overlap`: CPU GB/s, PCIe GB/s).
#[cfg(test)]
pub(crate) fn test_profile(model: &ModelSpec, overlap: Option<(f64, f64)>) -> Profile {
    Profile {
        bench_bw: Some(BenchBw {
            expert_bytes: 7_974_912,
            experts: 8,
            cpu_moe_gbs: 46.12,
            pcie_gather_gbs: 24.25,
            cpu_moe_overlap_gbs: overlap.map(|o| o.0),
            pcie_gather_overlap_gbs: overlap.map(|o| o.1),
        }),
        ..Profile::of_host_spec(&HostSpec::field_report(), model).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::StrategyKind as StrategyKindT;
    /// A profile of the field report's host spec (its prior, no samples) for
    /// qwen3.8-flash-next.
    fn field_profile() -> Profile {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        Profile::of_host_spec(&HostSpec::field_report(), &model).unwrap()
    }

    fn check(threads: u32, time_us: f64) -> CpuCheck {
        CpuCheck {
            experts: 10,
            tokens_per_expert: 1,
            expert_bytes: 2.77e6,
            threads,
            time_us,
            reps: 50,
        }
    }

    #[test]
    fn the_cpu_speed_is_the_probes_check_over_the_check_of_the_same_work_now() {
        let mut p = field_profile();
        // No check in the profile (a host spec's, an older profile): no speed.
        assert_eq!(p.cpu_speed(&check(15, 500.0)).unwrap(), None);
        p.cpu_checks = vec![check(15, 800.0), check(4, 2000.0)];
        // Twice as fast as the probe at 15 threads; half as fast at 4.
        assert_eq!(p.cpu_speed(&check(15, 400.0)).unwrap(), Some(2.0));
        assert_eq!(p.cpu_speed(&check(4, 4000.0)).unwrap(), Some(0.5));
        // Another thread count or expert size: no reference, no speed.
        assert_eq!(p.cpu_speed(&check(8, 400.0)).unwrap(), None);
        let other = CpuCheck {
            expert_bytes: 1.0e6,
            ..check(15, 400.0)
        };
        assert_eq!(p.cpu_speed(&other).unwrap(), None);
        // A time that is not a positive number is refused, naming the check.
        let e = p.cpu_speed(&check(15, 0.0)).unwrap_err().to_string();
        assert!(
            e.contains("CPU check") && e.contains("not a positive"),
            "{e}"
        );
        // Different work compared directly is an error, not a ratio.
        let e = check(15, 1.0)
            .speed_since(&check(4, 1.0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not time the reference's work"), "{e}");
    }

    #[test]
    fn a_profile_without_cpu_checks_still_reads_and_one_with_them_round_trips() {
        let mut p = field_profile();
        let mut v = serde_json::to_value(&p).unwrap();
        v.as_object_mut().unwrap().remove("cpu_checks");
        let old: Profile = serde_json::from_value(v).unwrap();
        assert!(old.cpu_checks.is_empty());
        p.cpu_checks = vec![check(15, 812.5)];
        let back: Profile = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back.cpu_checks, p.cpu_checks);
    }

    #[test]
    fn at_threads_moves_the_cpu_rates_along_the_models_own_scaling() {
        let p = field_profile();
        let q = p.at_threads(6).unwrap();
        let (a, b) = (&p.params, &q.params);
        // Same rates at every thread count: only the reference point moved.
        for t in [1.0, 6.0, 12.0, 24.0] {
            assert!(
                (a.cpu_rate_gbs(t) - b.cpu_rate_gbs(t)).abs() < 1e-9 * a.cpu_rate_gbs(t),
                "{t}"
            );
            assert!(
                (a.cpu_token_rate_gmacs(t) - b.cpu_token_rate_gmacs(t)).abs()
                    < 1e-9 * a.cpu_token_rate_gmacs(t)
            );
            assert!(
                (a.cpu_expert_cost_us(t) - b.cpu_expert_cost_us(t)).abs()
                    <= 1e-9 * a.cpu_expert_cost_us(t).max(1e-12),
                "{t}: the per-expert cost follows the same law"
            );
        }
        assert_eq!(b.cpu_threads, 6);
        // The covariance of the moved rate is the delta method's.
        let r = 6.0 / 24.0f64;
        let se = |c: &crate::perf::ParamCovariance, id| c.se(id);
        let want = se(&p.covariance, ParamId::CpuTokenGmacs) * r;
        assert!((se(&q.covariance, ParamId::CpuTokenGmacs) - want).abs() < 1e-9 * want.max(1e-12));
        assert_eq!(
            se(&q.covariance, ParamId::GatherGbs),
            se(&p.covariance, ParamId::GatherGbs)
        );
        assert!(p.at_threads(0).is_err());

        // With probe samples at the target count, the rate is theirs, not the power law's.
        let mut p2 = p.clone();
        let want = 0.8 * a.cpu_rate_gbs(6.0);
        let mut truth = a.clone();
        truth.cpu_gbs = want;
        truth.cpu_expert_us = a.cpu_expert_cost_us(6.0);
        truth.cpu_threads = 6;
        let shape = crate::perf::ExpertShape {
            bytes: 2.77e6,
            macs: 4.9e6,
        };
        for (n, tpe, th) in [(8, 1, 6), (10, 1, 6), (20, 1, 6), (10, 4, 6), (10, 1, 24)] {
            let e = n as f64;
            p2.samples.cpu_step.push(crate::perf::fit::CpuStepSample {
                experts: n,
                tokens_per_expert: tpe,
                expert_bytes: shape.bytes,
                expert_macs: shape.macs,
                threads: th,
                contended: false,
                time_us: truth.cpu_step_us(e, e * tpe as f64, shape, th as f64),
            });
        }
        let q2 = p2.at_threads(6).unwrap();
        assert!((q2.params.cpu_rate_gbs(6.0) - want).abs() < 1e-9 * want);
        assert!(q2.covariance.se(ParamId::CpuGbs) < 1e-6 * want);
        // No samples at 5 threads: the power law.
        let q3 = p2.at_threads(5).unwrap();
        assert!(
            (q3.params.cpu_rate_gbs(5.0) - a.cpu_rate_gbs(5.0)).abs() < 1e-9 * a.cpu_rate_gbs(5.0)
        );
    }

    fn model() -> ModelSpec {
        ModelSpec::preset("qwen3.8-flash-next").unwrap()
    }

    #[test]
    fn a_stored_profile_is_found_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let p = test_profile(&model(), None);
        let path = store(dir.path(), &p).unwrap();
        assert!(path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("qwen3.8-flash-next-nvfp4-"));
        match load(dir.path(), &p.key).unwrap() {
            Lookup::Fresh(back) => {
                assert_eq!(back.key, p.key);
                assert_eq!(back.bench_bw, p.bench_bw);
                assert!((back.params.cpu_gbs - p.params.cpu_gbs).abs() < 1e-12 * p.params.cpu_gbs);
            }
            other => panic!("expected fresh, got {other:?}"),
        }
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_different_key_is_stale_and_says_which_part() {
        let dir = tempfile::tempdir().unwrap();
        let p = test_profile(&model(), None);
        store(dir.path(), &p).unwrap();
        let mut key = p.key.clone();
        key.host.gpu_driver = "560.35".to_string();
        key.host.gpu_paths = "direct+split, copies split".to_string();
        key.program_version = "9.9.9".to_string();
        match load(dir.path(), &key).unwrap() {
            Lookup::Stale { mismatches, .. } => {
                let parts: Vec<KeyPart> = mismatches.iter().map(|m| m.part).collect();
                assert_eq!(
                    parts,
                    vec![
                        KeyPart::GpuDriver,
                        KeyPart::GpuPaths,
                        KeyPart::ProgramVersion
                    ]
                );
                assert!(mismatches[0].to_string().contains("560.35"));
            }
            other => panic!("expected stale, got {other:?}"),
        }
        // Another format of the same model is another file: missing, not stale.
        let other = ProfileKey::new(
            p.key.host.clone(),
            &model().with_format(ExpertFormat::Mxfp4),
        );
        assert!(matches!(
            load(dir.path(), &other).unwrap(),
            Lookup::Missing { .. }
        ));
    }

    #[test]
    fn a_key_written_before_the_gpu_paths_reads_with_none() {
        let key = test_profile(&model(), None).key;
        let mut v = serde_json::to_value(&key).unwrap();
        v["host"].as_object_mut().unwrap().remove("gpu_paths");
        let old: ProfileKey = serde_json::from_value(v).unwrap();
        assert_eq!(old.host.gpu_paths, "");
        let mut now = key.clone();
        now.host.gpu_paths = "staged+pdl, copies each".into();
        let parts: Vec<KeyPart> = old.mismatches(&now).iter().map(|m| m.part).collect();
        assert_eq!(parts, vec![KeyPart::GpuPaths]);
    }

    #[test]
    fn a_corrupt_file_is_reported_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let p = test_profile(&model(), None);
        let path = dir.path().join(p.key.file_name());
        std::fs::write(&path, b"{\"key\": {\"host\": ").unwrap();
        match load(dir.path(), &p.key).unwrap() {
            Lookup::Corrupt { reason, path: at } => {
                assert_eq!(at, path);
                assert!(!reason.is_empty());
            }
            other => panic!("expected corrupt, got {other:?}"),
        }
        // Valid JSON with invalid parameters is corrupt too.
        let mut bad = serde_json::to_value(&p).unwrap();
        bad["params"]["gather_gbs"] = serde_json::json!(-3.0);
        std::fs::write(&path, serde_json::to_vec(&bad).unwrap()).unwrap();
        assert!(matches!(
            load(dir.path(), &p.key).unwrap(),
            Lookup::Corrupt { .. }
        ));
        store(dir.path(), &p).unwrap();
        assert!(matches!(
            load(dir.path(), &p.key).unwrap(),
            Lookup::Fresh(_)
        ));
        let e = Profile::read(&dir.path().join("none.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.json"), "{e}");
    }

    #[test]
    fn a_profile_is_validated_as_a_whole_on_every_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = test_profile(&model(), None);
        let path = dir.path().join(p.key.file_name());
        let good = serde_json::to_value(&p).unwrap();
        // (edit, the field the error must name)
        type Edit = fn(&mut serde_json::Value);
        fn e(edit: Edit, field: &'static str) -> (Edit, &'static str) {
            (edit, field)
        }
        let cases: Vec<(Edit, &str)> = vec![
            // The issue's panic: a covariance that does not match its parameter list.
            e(
                |v| {
                    v["covariance"]["matrix"].as_array_mut().unwrap().pop();
                },
                "covariance.matrix",
            ),
            e(
                |v| {
                    v["covariance"]["matrix"][0]
                        .as_array_mut()
                        .unwrap()
                        .push(1.0.into());
                },
                "covariance.matrix",
            ),
            e(
                |v| {
                    let first = v["covariance"]["params"][0].clone();
                    v["covariance"]["params"][1] = first;
                },
                "covariance.params",
            ),
            e(
                |v| v["covariance"]["matrix"][0][0] = (-1.0).into(),
                "covariance.matrix",
            ),
            // A field of the wrong type is named by its path.
            e(
                |v| v["params"]["cpu_gbs"] = serde_json::Value::Null,
                "params.cpu_gbs",
            ),
            // A claim beyond the physical ceilings.
            e(
                |v| v["params"]["gather_gbs"] = 1e12.into(),
                "params.gather_gbs",
            ),
            e(|v| v["params"]["dram_gbs"] = 5e6.into(), "params.dram_gbs"),
            e(
                |v| v["params"]["cpu_threads"] = 100_000.into(),
                "perf.cpu_threads",
            ),
            e(
                |v| v["params"]["gpu_memory_bytes"] = 1e20.into(),
                "params.gpu_memory_bytes",
            ),
            // A key whose geometry is not one.
            e(
                |v| v["key"]["model"]["geometry"]["experts"] = 0.into(),
                "geometry.experts",
            ),
            e(
                |v| v["key"]["model"]["geometry"]["hidden"] = (1u64 << 40).into(),
                "geometry.hidden",
            ),
            // Samples and checks that are not measurements.
            e(
                |v| {
                    v["samples"]["round_trip"] =
                        serde_json::json!([{"streams": 1, "hidden": 64, "time_us": -4.0}]);
                },
                "samples.round_trip[0].time_us",
            ),
            e(
                |v| {
                    v["cpu_checks"] = serde_json::json!([{"experts": 1, "tokens_per_expert": 1, "expert_bytes": 1.0, "threads": 0, "time_us": 1.0, "reps": 1}]);
                },
                "cpu_checks[0]",
            ),
            e(
                |v| v["probe_steal_fraction"] = 3.0.into(),
                "probe_steal_fraction",
            ),
        ];
        for (edit, field) in cases {
            let mut v = good.clone();
            edit(&mut v);
            std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
            let err = Profile::read(&path).unwrap_err().to_string();
            assert!(
                err.contains(field) && err.contains(&path.display().to_string()),
                "{field}: {err}"
            );
            match load(dir.path(), &p.key).unwrap() {
                Lookup::Corrupt { reason, .. } => assert!(reason.contains(field), "{reason}"),
                other => panic!("{field}: expected corrupt, got {other:?}"),
            }
        }
        // The unedited profile reads back.
        std::fs::write(&path, serde_json::to_vec(&good).unwrap()).unwrap();
        assert_eq!(Profile::read(&path).unwrap().key, p.key);
    }

    #[test]
    fn a_cache_file_that_is_a_device_or_too_large_is_corrupt_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = test_profile(&model(), None);
        let path = dir.path().join(p.key.file_name());
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        match load(dir.path(), &p.key).unwrap() {
            Lookup::Corrupt { reason, .. } => {
                assert!(reason.contains("not a regular file"), "{reason}")
            }
            other => panic!("expected corrupt, got {other:?}"),
        }
        let e = Profile::read(&path).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // `probe` replaces it: the store renames over the link.
        store(dir.path(), &p).unwrap();
        assert!(matches!(
            load(dir.path(), &p.key).unwrap(),
            Lookup::Fresh(_)
        ));
        // A sparse file beyond the limit is refused from its size, unread.
        let big = dir.path().join("big.json");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(crate::limits::MAX_PROFILE_BYTES + 1).unwrap();
        let e = Profile::read(&big).unwrap_err().to_string();
        assert!(e.contains("limit") && e.contains("big.json"), "{e}");
        // A dangling symlink is simply missing.
        let dir2 = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/nonexistent/x", dir2.path().join(p.key.file_name())).unwrap();
        assert!(matches!(
            load(dir2.path(), &p.key).unwrap(),
            Lookup::Missing { .. }
        ));
    }

    #[test]
    fn the_layer_count_is_not_part_of_the_key_but_the_geometry_is() {
        let m = model();
        let p = test_profile(&m, None);
        let one = ProfileKey::new(p.key.host.clone(), &m.first_layers(1).unwrap());
        assert_eq!(one.file_name(), p.key.file_name());
        assert!(p.key.mismatches(&one).is_empty());
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), &p).unwrap();
        assert!(matches!(load(dir.path(), &one).unwrap(), Lookup::Fresh(_)));
        // Any other part of the geometry is another profile.
        let mut wider = m.clone();
        wider.geometry.intermediate *= 2;
        let k = ProfileKey::new(p.key.host.clone(), &wider);
        assert_ne!(k.file_name(), p.key.file_name());
        assert_eq!(
            p.key
                .mismatches(&k)
                .iter()
                .map(|m| m.part)
                .collect::<Vec<_>>(),
            vec![KeyPart::ModelGeometry]
        );
        // check_for: the same model at any depth passes; another model is refused, named.
        p.check_for("--profile p.json", &m.first_layers(3).unwrap(), Some(8))
            .unwrap();
        let other = ModelSpec::preset("gpt-oss-120b").unwrap();
        let e = p
            .check_for("--profile p.json", &other, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--profile p.json")
                && e.contains("qwen3.8-flash-next")
                && e.contains("gpt-oss-120b"),
            "{e}"
        );
        assert!(p.check_for("--profile p.json", &m, Some(0)).is_err());
        assert!(p
            .check_for("--profile p.json", &m, Some(100_000))
            .unwrap_err()
            .to_string()
            .contains("limit"));
        // The probed model comes back from the key (the preset, at the key's depth).
        assert_eq!(p.probed_model(), m);
    }

    #[test]
    fn a_fit_that_misses_its_validation_is_untrusted() {
        use crate::perf::fit::{Residual, SampleRole, StepSample};
        let mut p = test_profile(&model(), None);
        assert_eq!(p.trust_issue(), None, "no fit: nothing to distrust");
        let mut fit = FitReport {
            params: p.params.clone(),
            covariance: ParamCovariance::none(),
            estimates: Vec::new(),
            stages: Vec::new(),
            residuals: Vec::new(),
            validation: Vec::new(),
            dof: 0,
        };
        let shape = crate::perf::StepShape::new(&model(), 1, 1024);
        let step = |strategy| StepSample {
            strategy,
            role: SampleRole::Validation,
            shape,
            layers: Vec::new(),
            time_us: 1000.0,
            threads: None,
        };
        p.samples.step = vec![step(StrategyKindT::Offload), step(StrategyKindT::Cpu)];
        let res = |index, rel: f64| Residual {
            probe: "step".into(),
            index,
            measured_us: 1000.0,
            predicted_us: 1000.0 * (1.0 + rel),
            rel,
        };
        fit.validation = vec![res(0, 0.1), res(1, -0.05)];
        p.fit = Some(fit.clone());
        assert_eq!(p.assess_fit(), None);
        // The issue's: offload validated at 346% rms.
        fit.validation = vec![res(0, 3.46), res(1, -0.05)];
        p.fit = Some(fit);
        let why = p.assess_fit().unwrap();
        assert!(
            why.contains("offload 346%") && !why.contains("cpu"),
            "{why}"
        );
        assert_eq!(p.trust_issue(), Some(why.clone()));
        // The mark survives the round trip; a profile without it is assessed on read.
        p.untrusted = Some(why.clone());
        let back: Profile = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back.untrusted, Some(why));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;
        use serde_json::Value;

        /// JSON pointers of every leaf and array of `v` (what a mutation may replace).
        fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
            match v {
                Value::Object(o) => {
                    for (k, x) in o {
                        pointers(x, format!("{at}/{k}"), out);
                    }
                }
                Value::Array(a) => {
                    out.push(at.clone());
                    for (i, x) in a.iter().enumerate() {
                        pointers(x, format!("{at}/{i}"), out);
                    }
                }
                _ => out.push(at),
            }
        }

        fn replacement() -> impl Strategy<Value = Value> {
            prop_oneof![
                any::<f64>().prop_map(
                    |x| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
                ),
                Just(Value::from(1e300)),
                Just(Value::from(-1.0)),
                Just(Value::from(0)),
                Just(Value::from(u64::MAX)),
                Just(Value::Null),
                Just(Value::from("x")),
                Just(Value::Array(Vec::new())),
                Just(serde_json::json!([[1.0, 2.0], [3.0]])),
            ]
        }

        /// Use a profile the way predict and serve do; any panic fails the property.
        fn exercise(p: &Profile) {
            let m = p.perf_model("prop");
            for id in m.covariance.params.clone() {
                assert!(m.covariance.se(id) >= 0.0);
            }
            let g = vec![1.0; m.covariance.params.len()];
            let _ = m.covariance.quadratic_form(&g);
            for t in [1, 3, p.params.cpu_threads] {
                if let Ok(q) = p.at_threads(t) {
                    q.params.validate().unwrap();
                }
            }
            let _ = p.check_for("p", &p.probed_model(), Some(4));
            let _ = p.trust_issue();
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(192))]

            #[test]
            fn any_text_gives_a_profile_or_a_named_error(text in "\\PC{0,300}") {
                match Profile::parse(&text, "any.json") {
                    Ok(p) => exercise(&p),
                    Err(e) => prop_assert!(e.to_string().contains("any.json"), "{}", e),
                }
            }

            /// A valid profile with some leaves replaced: valid and usable, or refused.
            #[test]
            fn mutated_profiles_are_valid_or_refused(
                edits in prop::collection::vec((any::<prop::sample::Index>(), replacement()), 1..6),
            ) {
                let mut v = serde_json::to_value(test_profile(&model(), None)).unwrap();
                for (at, with) in edits {
                    let mut ptrs = Vec::new();
                    pointers(&v, String::new(), &mut ptrs);
                    let ptr = &ptrs[at.index(ptrs.len())];
                    if let Some(slot) = v.pointer_mut(ptr) {
                        *slot = with;
                    }
                }
                let text = serde_json::to_string(&v).unwrap();
                match Profile::parse(&text, "mut.json") {
                    Ok(p) => {
                        prop_assert!(p.validate().is_ok());
                        exercise(&p);
                    }
                    Err(e) => prop_assert!(e.to_string().contains("mut.json"), "{}", e),
                }
            }
        }
    }

    /// Atomicity: concurrent writers and a reader that polls throughout never see a partial
    /// file (every read is a whole profile of one of the writers).
    #[test]
    fn concurrent_writes_are_atomic() {
        let dir = tempfile::tempdir().unwrap();
        let base = test_profile(&model(), None);
        store(dir.path(), &base).unwrap();
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let dir = dir.path().to_path_buf();
                let mut p = base.clone();
                // Writers differ in size, so a torn file would not parse.
                p.samples.round_trip = (0..(50 * (w + 1)))
                    .map(|i| crate::perf::fit::RoundTripSample {
                        streams: 1,
                        hidden: 2560,
                        time_us: 10.0 + i as f64,
                    })
                    .collect();
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        store(&dir, &p).unwrap();
                    }
                })
            })
            .collect();
        let mut reads = 0;
        while writers.iter().any(|w| !w.is_finished()) {
            match load(dir.path(), &base.key).unwrap() {
                Lookup::Fresh(p) => {
                    let n = p.samples.round_trip.len();
                    assert!(n == 0 || n % 50 == 0, "torn read: {n} samples");
                    reads += 1;
                }
                other => panic!("a reader saw {other:?}"),
            }
        }
        for w in writers {
            w.join().unwrap();
        }
        assert!(reads > 0);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "temporary files left: {names:?}");
    }

    #[test]
    fn the_directory_honours_the_environment() {
        // Only this test touches the variable.
        std::env::set_var(CACHE_DIR_ENV, "/tmp/ft-test-cache");
        assert_eq!(
            profile_dir().unwrap(),
            PathBuf::from("/tmp/ft-test-cache/profiles")
        );
        std::env::remove_var(CACHE_DIR_ENV);
        if let Some(c) = dirs::cache_dir() {
            assert_eq!(profile_dir().unwrap(), c.join("ft").join("profiles"));
        }
    }

    #[test]
    fn atomic_writes_leave_no_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("p.json");
        write_atomic(&path, b"{}").unwrap();
        write_atomic(&path, b"{\"a\":1}").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":1}");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1);
        assert!(
            write_atomic(dir.path(), b"{}").is_err(),
            "a directory is no file"
        );
    }
}
