//! What `ft predict` and `ft explain` predict from, and what they report: the host model a
//! `--host` or `--profile` gives (with the profile's trust and a CPU check's speed applied),
//! the resolved plan of a prediction with its header line, and the `--json` document.
//!
//! A program that wants `ft predict`'s answer without the binary builds a [`PredictPlan`]
//! (a model, a [`HostModel`] and a [`PredictConfig`]) and calls [`PredictPlan::report`].

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::cache::CacheSize;
use crate::error::{ModelError, Result};
use crate::perf::breakeven::{break_evens, BreakEvens};
use crate::perf::legacy::BenchBw;
use crate::perf::predict::{MissMode, PredictConfig};
use crate::perf::prefill::{measure_prediction, MeasureSpec, StrategyMeasure};
use crate::perf::{decide, predict, CpuSpeedSource, Decision, PerfModel, PerfParams, Prediction};
use crate::preset::ModelSpec;
use crate::profile::{CpuCheck, Profile};

/// Where a prediction's host comes from: a fitted profile (`--profile`, or a `--host` that
/// is a `.json` file) or a host spec (a preset or a TOML file).
#[derive(Debug, Clone, PartialEq)]
pub enum HostInput {
    /// A profile JSON and the flag that named it.
    Profile {
        /// The file.
        path: PathBuf,
        /// `--profile` or `--host`.
        flag: &'static str,
    },
    /// A preset name or a host TOML file.
    Spec(String),
}

impl HostInput {
    /// `--profile` when given, else `--host` (a profile when it ends in `.json`).
    pub fn from_flags(host: &str, profile: Option<&Path>) -> Self {
        match profile {
            Some(p) => HostInput::Profile {
                path: p.to_path_buf(),
                flag: "--profile",
            },
            None if host.to_ascii_lowercase().ends_with(".json") => HostInput::Profile {
                path: PathBuf::from(host),
                flag: "--host",
            },
            None => HostInput::Spec(host.to_string()),
        }
    }

    /// The input as the user gave it (`--profile p.json`, `--host h100`).
    pub fn label(&self) -> String {
        match self {
            HostInput::Profile { path, flag } => format!("{flag} {}", path.display()),
            HostInput::Spec(h) => format!("--host {h}"),
        }
    }

    /// The profile, for a profile input (read and validated).
    pub fn read_profile(&self) -> Result<Option<Profile>> {
        match self {
            HostInput::Profile { path, .. } => Profile::read(path)
                .map(Some)
                .map_err(|e| ModelError::invalid(self.label(), e.to_string())),
            HostInput::Spec(_) => Ok(None),
        }
    }
}

/// The CPU side's speed now against the profile's probe (`--cpu-check`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CheckedSpeed {
    /// `probe.time_us / now.time_us`: what the CPU side was scaled by.
    pub speed: f64,
    /// The check taken now.
    pub now: CpuCheck,
    /// The profile's check of the same work.
    pub probe: CpuCheck,
}

impl CheckedSpeed {
    /// `now` against the check of `probe_checks` that timed the same work; `None` where
    /// none did.
    pub fn against(probe_checks: &[CpuCheck], now: CpuCheck) -> Result<Option<Self>> {
        Ok(
            CpuCheck::speed_against(probe_checks, &now)?.map(|(speed, probe)| CheckedSpeed {
                speed,
                now,
                probe,
            }),
        )
    }

    /// `perf` with its CPU side at this speed ([`PerfModel::at_cpu_speed`]), its source
    /// saying which check it was (`when` it was taken: "now", "at start", "before the first
    /// round") and the two times: the one way `ft predict --cpu-check`, `ft serve`'s check
    /// at start and `ft run`'s check before its first round rescale a model.
    pub fn scale(&self, perf: &PerfModel, when: &str) -> Result<PerfModel> {
        let why = CpuSpeedSource::Checked {
            when: when.into(),
            now_us: self.now.time_us,
            probe_us: self.probe.time_us,
        };
        perf.at_cpu_speed(self.speed, &why)
    }
}

/// A host as a prediction uses it.
#[derive(Debug, Clone)]
pub struct HostModel {
    /// The parameters with their uncertainty.
    pub perf: PerfModel,
    /// A measured `ft bench bw` pair for the legacy rule (a profile's), if any.
    pub bench: Option<BenchBw>,
    /// Where the host came from, for the header (`profile P`, `host H`).
    pub label: String,
    /// Why the profile's fit is not to be trusted, where it is not (`Profile::trust_issue`).
    pub profile_untrusted: Option<String>,
    /// The CPU check the CPU side was scaled by.
    pub cpu_check: Option<CheckedSpeed>,
}

impl HostModel {
    /// The host `input` names, for `model`: a profile (`profile`, as
    /// [`HostInput::read_profile`] read it) checked against the model, with its trust
    /// assessed (an untrusted one is logged as a warning); or a spec, with the caveat of a
    /// CPU rate for a format without a kernel logged.
    pub fn resolve(
        input: &HostInput,
        profile: Option<&Profile>,
        model: &ModelSpec,
    ) -> Result<Self> {
        match (input, profile) {
            (HostInput::Profile { path, .. }, Some(p)) => {
                let label_in = input.label();
                p.check_for(&label_in, model, None)?;
                let profile_untrusted = p.trust_issue();
                if let Some(why) = &profile_untrusted {
                    tracing::warn!("{label_in}: UNTRUSTED profile: {why}; re-probe (ft probe --force) before relying on this prediction");
                }
                let label = format!("profile {}", path.display());
                Ok(HostModel {
                    perf: p.perf_model(&label),
                    bench: p.bench_bw,
                    label,
                    profile_untrusted,
                    cpu_check: None,
                })
            }
            (HostInput::Profile { .. }, None) => Err(ModelError::invalid(
                input.label(),
                "the profile was not read",
            )),
            (HostInput::Spec(h), _) => {
                let host = crate::hosts::resolve(h)
                    .map_err(|e| ModelError::invalid(input.label(), e.to_string()))?;
                if let Some(c) = crate::import::cpu_rate_caveat(model.format, host.cpu.moe_gbs) {
                    tracing::warn!("{c}");
                }
                Ok(HostModel {
                    label: format!("host {}", host.name),
                    perf: host.perf,
                    bench: host.bench,
                    profile_untrusted: None,
                    cpu_check: None,
                })
            }
        }
    }

    /// The CPU side at the speed a check taken now gives (rates times it, fixed costs
    /// divided by it), recorded.
    pub fn at_checked_speed(mut self, c: CheckedSpeed) -> Result<Self> {
        self.perf = c.scale(&self.perf, "now")?;
        self.cpu_check = Some(c);
        Ok(self)
    }

    /// The CPU side at `speed` times its speed, given by the user with `flag` (1: as it is).
    pub fn at_given_speed(mut self, speed: f64, flag: &str) -> Result<Self> {
        if speed != 1.0 {
            let why = CpuSpeedSource::Given { flag: flag.into() };
            self.perf = self.perf.at_cpu_speed(speed, &why)?;
        }
        Ok(self)
    }
}

/// A warning when a cache of `bytes` (asked for by `input`) is larger than the GPU's memory
/// of `gpu_bytes`: the prediction then assumes a cache the GPU cannot hold.
pub fn cache_warning(input: &str, bytes: f64, gpu_bytes: f64) -> Option<String> {
    let gib = (1u64 << 30) as f64;
    (bytes > gpu_bytes).then(|| {
        format!(
            "{input}: the expert cache ({:.2} GiB) is larger than the GPU's memory ({:.2} GiB): the prediction assumes a cache this GPU cannot hold",
            bytes / gib,
            gpu_bytes / gib
        )
    })
}

/// Everything a prediction is made from, resolved and validated.
#[derive(Debug, Clone)]
pub struct PredictPlan {
    /// The model.
    pub model: ModelSpec,
    /// Parameters with their uncertainty.
    pub perf: PerfModel,
    /// The prediction's configuration.
    pub config: PredictConfig,
    /// Where the host came from, for the header.
    pub host_label: String,
    /// The CPU check the CPU side was scaled by (`--cpu-check`).
    pub cpu_check: Option<CheckedSpeed>,
    /// Why the profile's fit is not to be trusted, where it is not.
    pub profile_untrusted: Option<String>,
    /// Inputs that are legal but implausible (a cache larger than the GPU).
    pub warnings: Vec<String>,
}

/// `ft predict --json`: the prediction, the choice, the other measures, the break-evens
/// and what the prediction rests on (fields in alphabetical order, the order of the JSON).
#[derive(Debug, Clone, Serialize)]
pub struct PredictReport {
    /// How far each uncertain input must move for the choice to flip.
    pub break_evens: BreakEvens,
    /// The CPU check the CPU side was scaled by.
    pub cpu_check: Option<CheckedSpeed>,
    /// The choice.
    pub decision: Decision,
    /// Every strategy in the measure asked for (`None` for decode).
    pub measure: Option<Vec<StrategyMeasure>>,
    /// Every strategy's prediction.
    pub prediction: Prediction,
    /// Why the profile's fit is not to be trusted, where it is not.
    pub profile_untrusted: Option<String>,
    /// Inputs that are legal but implausible.
    pub warnings: Vec<String>,
}

impl PredictPlan {
    /// A plan of `config` for `model` on `host` (the config validated).
    pub fn new(model: ModelSpec, host: HostModel, config: PredictConfig) -> Result<Self> {
        config.validate()?;
        Ok(PredictPlan {
            model,
            perf: host.perf,
            config,
            host_label: host.label,
            cpu_check: host.cpu_check,
            profile_untrusted: host.profile_untrusted,
            warnings: Vec::new(),
        })
    }

    /// Warn (on stderr and in [`PredictPlan::warnings`]) when the cache the configuration
    /// gives (`--cache-slots` or `--cache-gb`) is larger than the GPU's memory.
    pub fn warn_if_cache_exceeds_gpu(&mut self) {
        let (input, bytes) = match self.config.cache {
            Some(CacheSize::GiB(g)) => (format!("--cache-gb {g}"), g * (1u64 << 30) as f64),
            Some(CacheSize::Slots(n)) => (
                format!("--cache-slots {n}"),
                n as f64 * self.model.expert_bytes() as f64,
            ),
            None => return,
        };
        if let Some(w) = cache_warning(&input, bytes, self.perf.params.gpu_memory_bytes) {
            tracing::warn!("{w}");
            self.warnings.push(w);
        }
    }

    /// Run the prediction.
    pub fn predict(&self) -> Result<Prediction> {
        tracing::info!(model = %self.model.name, source = %self.perf.source, streams = self.config.streams, "predicting");
        predict(&self.model, &self.perf, &self.config)
    }

    /// The parameters (for the explanation).
    pub fn params(&self) -> &PerfParams {
        &self.perf.params
    }

    /// How far each uncertain input must move for `pred`'s choice to flip.
    pub fn break_evens(&self, pred: &Prediction, d: &Decision) -> Result<BreakEvens> {
        break_evens(&self.model, &self.perf, &self.config, pred, d.kind)
    }

    /// Every strategy of `pred` in the measure `spec` asks for (`None` for decode).
    pub fn measure(
        &self,
        pred: &Prediction,
        spec: &MeasureSpec,
    ) -> Result<Option<Vec<StrategyMeasure>>> {
        if spec.measure == crate::observe::Measure::Decode {
            return Ok(None);
        }
        measure_prediction(
            self.params(),
            &self.model,
            pred,
            spec,
            &self.params().engine.prefill_config(),
        )
        .map(Some)
    }

    /// Predict, decide, measure and find the break-evens: `ft predict`'s whole answer.
    pub fn report(&self, spec: &MeasureSpec) -> Result<PredictReport> {
        let prediction = self.predict()?;
        let decision = decide(&prediction);
        let measure = self.measure(&prediction, spec)?;
        let break_evens = self.break_evens(&prediction, &decision)?;
        Ok(PredictReport {
            break_evens,
            cpu_check: self.cpu_check,
            decision,
            measure,
            prediction,
            profile_untrusted: self.profile_untrusted.clone(),
            warnings: self.warnings.clone(),
        })
    }

    /// The header line describing what was predicted.
    pub fn header(&self, pred: &Prediction) -> String {
        let miss = match pred.config.miss {
            MissMode::FixedOffload { miss_rate } => {
                format!("cache calibrated to offload miss {:.1}%", 100.0 * miss_rate)
            }
            MissMode::Simulated => "cache as given".to_string(),
        };
        let layout = self.perf.params.layout;
        let gpus = if layout.is_multi() {
            format!(
                " ({} GPUs, {}; slots per GPU)",
                layout.count(),
                layout.placement.name()
            )
        } else {
            String::new()
        };
        format!(
            "{} ({}, {:.2} MB experts, {} layers) on {}{} [{}]: {} stream(s), context {}, {} expert slots ({}; {}), routing {}, offload miss rate {:.1}%",
            pred.model,
            self.model.format,
            pred.expert_bytes as f64 / 1e6,
            pred.layers,
            self.host_label,
            gpus,
            self.perf.source,
            pred.config.streams,
            pred.config.context,
            pred.cache_slots,
            pred.config.cache_options,
            miss,
            pred.config.routing,
            100.0 * pred.offload_miss_rate
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::Measure;

    #[test]
    fn host_inputs_follow_the_flags() {
        assert_eq!(
            HostInput::from_flags("h100", None),
            HostInput::Spec("h100".into())
        );
        let p = HostInput::from_flags("My.JSON", None);
        assert_eq!(p.label(), "--host My.JSON");
        let q = HostInput::from_flags("h100", Some(Path::new("p.json")));
        assert_eq!(q.label(), "--profile p.json");
        let e = HostInput::from_flags("/nonexistent/p.json", None)
            .read_profile()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--host /nonexistent/p.json"), "{e}");
        assert_eq!(HostInput::Spec("x".into()).read_profile().unwrap(), None);
    }

    /// A check against the probe's of the same work scales the CPU side by the ratio of
    /// their times and says which check it was; a check of other work finds none.
    #[test]
    fn a_checked_speed_scales_the_cpu_side_and_names_the_check() {
        let check = |threads: u32, time_us: f64| CpuCheck {
            experts: 10,
            tokens_per_expert: 1,
            expert_bytes: 2.77e6,
            threads,
            time_us,
            reps: 40,
        };
        let probe = [check(8, 700.0), check(24, 755.0)];
        let c = CheckedSpeed::against(&probe, check(24, 812.0))
            .unwrap()
            .unwrap();
        assert_eq!(c.probe, probe[1]);
        assert_eq!(c.speed, 755.0 / 812.0);
        let m = PerfModel::from_host(&crate::host::HostSpec::field_report()).unwrap();
        let q = c.scale(&m, "at start").unwrap();
        assert_eq!(q.params, m.params.with_cpu_speed(755.0 / 812.0).unwrap());
        assert_eq!(
            q.source,
            format!(
                "{}; CPU side at 0.930x the probe's (the CPU check at start: 812 us, the probe's 755 us)",
                m.source
            )
        );
        assert_eq!(
            CheckedSpeed::against(&probe, check(16, 812.0)).unwrap(),
            None
        );
    }

    #[test]
    fn a_cache_larger_than_the_gpu_is_warned_about() {
        let gib = (1u64 << 30) as f64;
        assert_eq!(cache_warning("--cache-gb 8", 8.0 * gib, 24.0 * gib), None);
        let w = cache_warning("--cache-gb 30", 30.0 * gib, 24.0 * gib).unwrap();
        assert!(
            w.starts_with("--cache-gb 30: the expert cache (30.00 GiB)"),
            "{w}"
        );
        assert!(w.contains("(24.00 GiB)"), "{w}");
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let input = HostInput::from_flags(crate::hosts::DEFAULT_HOST, None);
        let host = HostModel::resolve(&input, None, &model).unwrap();
        let gpu_gib = host.perf.params.gpu_memory_bytes / gib;
        for (cache, warned) in [
            (None, false),
            (Some(CacheSize::GiB(gpu_gib / 2.0)), false),
            (Some(CacheSize::GiB(gpu_gib * 2.0)), true),
            (Some(CacheSize::Slots(1_000_000)), true),
        ] {
            let config = PredictConfig {
                cache,
                ..PredictConfig::default()
            };
            let mut plan = PredictPlan::new(model.clone(), host.clone(), config).unwrap();
            plan.warn_if_cache_exceeds_gpu();
            assert_eq!(plan.warnings.len(), usize::from(warned), "{cache:?}");
        }
    }

    /// A preset host's plan: its report is the prediction, the decision of it, and the
    /// break-evens of that decision; its header names the model, the host and the streams.
    #[test]
    fn a_preset_plan_reports_its_prediction_and_choice() {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let input = HostInput::from_flags(crate::hosts::DEFAULT_HOST, None);
        let host = HostModel::resolve(&input, None, &model)
            .unwrap()
            .at_given_speed(1.0, "--cpu-speed")
            .unwrap();
        assert_eq!(host.label, format!("host {}", crate::hosts::DEFAULT_HOST));
        let config = PredictConfig {
            streams: 2,
            warmup_steps: 10,
            steps: 10,
            ..PredictConfig::default()
        };
        let plan = PredictPlan::new(model, host, config).unwrap();
        let spec = MeasureSpec {
            measure: Measure::Decode,
            prompt_tokens: 1200,
            output_tokens: 256,
        };
        let r = plan.report(&spec).unwrap();
        assert_eq!(r.decision, decide(&r.prediction));
        assert!(r.measure.is_none());
        let h = plan.header(&r.prediction);
        assert!(
            h.starts_with("qwen3.8-flash-next (")
                && h.contains(&format!("on host {}", crate::hosts::DEFAULT_HOST))
                && h.contains("2 stream(s)"),
            "{h}"
        );
        // The JSON's fields in the order `ft predict --json` has always printed them.
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.starts_with("{\"break_evens\":"), "{}", &text[..40]);
        assert!(text.ends_with(",\"profile_untrusted\":null,\"warnings\":[]}"));
        // A faster CPU side is recorded in the source the header prints.
        let faster = HostModel::resolve(&input, None, &plan.model)
            .unwrap()
            .at_given_speed(2.0, "--cpu-speed")
            .unwrap();
        assert!(
            faster.perf.source.contains("--cpu-speed"),
            "{}",
            faster.perf.source
        );
    }
}
