//! Resolving a strategy's `auto` parameters (hybrid's fetch fraction, layer split's number of
//! CPU layers) from a prediction, once for every command that runs or serves a strategy.
//!
//! `ft run`, `ft serve`, `ft probe` and `ft predict` each take a strategy whose parameter may
//! be `auto`; the engine needs numbers. The rule is the same everywhere: predict with the
//! parameter searched, and take the prediction's value for that strategy. A strategy with no
//! `auto` parameter needs no prediction and is returned as given.

use crate::error::{ModelError, Result};
use crate::perf::predict::{predict, PredictConfig, Prediction};
use crate::perf::{decide, PerfModel};
use crate::preset::ModelSpec;
use crate::strategy::{CpuLayers, FetchFraction, Strategy, StrategyKind};

/// What a command was asked to run: the model's choice, or a strategy (whose parameters may
/// be `auto`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StrategyRequest {
    /// The fastest feasible strategy by the prediction ([`decide`]).
    Auto,
    /// This strategy, its `auto` parameters resolved by the prediction.
    Given(Strategy),
}

impl std::str::FromStr for StrategyRequest {
    type Err = ModelError;

    /// `auto` (any case), or a strategy by its CLI name (`hybrid:0.4`, `layer-split:auto`).
    fn from_str(s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("auto") {
            Ok(StrategyRequest::Auto)
        } else {
            s.parse().map(StrategyRequest::Given)
        }
    }
}

/// True when the strategy has a parameter still to be resolved (`hybrid` with an `auto`
/// fetch fraction, a layer split with `auto` CPU layers).
pub fn has_auto(strategy: &Strategy) -> bool {
    match strategy {
        Strategy::Hybrid { fetch } => *fetch == FetchFraction::Auto,
        Strategy::LayerSplit { cpu_layers } | Strategy::LayerSplitCached { cpu_layers } => {
            *cpu_layers == CpuLayers::Auto
        }
        Strategy::Offload | Strategy::Resident | Strategy::Cpu => false,
    }
}

/// `base` set up to predict what `request` needs: a fixed parameter is predicted as given,
/// an `auto` one is searched; layer split is predicted only where it is asked for (or, for
/// [`StrategyRequest::Auto`], where `base` already asks for it).
pub fn predict_config_for(request: &StrategyRequest, base: &PredictConfig) -> PredictConfig {
    let mut config = base.clone();
    match request {
        StrategyRequest::Auto => {}
        StrategyRequest::Given(s) => {
            if let Strategy::Hybrid { fetch } = s {
                config.hybrid_fetch = *fetch;
            }
            if let Some(n) = s.cpu_layers() {
                config.layer_split = Some(n);
            }
        }
    }
    config
}

/// `strategy` with each `auto` parameter replaced by the resolved strategy of its kind that
/// `resolved_of` gives (from a [`Prediction`], a serving decision, ...); an error naming the
/// strategy where it has an `auto` parameter and `resolved_of` has none (or one still auto).
pub fn resolve_with(
    strategy: Strategy,
    resolved_of: impl Fn(StrategyKind) -> Option<Strategy>,
) -> Result<Strategy> {
    if !has_auto(&strategy) {
        return Ok(strategy);
    }
    match resolved_of(strategy.kind()) {
        Some(s) if s.kind() == strategy.kind() && !has_auto(&s) => Ok(s),
        _ => Err(ModelError::invalid(
            "strategy",
            format!(
                "'{}': the prediction holds no resolved {} to take its auto parameter from",
                strategy.cli_name(),
                strategy.kind().name()
            ),
        )),
    }
}

/// `strategy` with its `auto` parameters taken from `prediction` (see [`resolve_with`]).
pub fn from_prediction(strategy: Strategy, prediction: &Prediction) -> Result<Strategy> {
    resolve_with(strategy, |k| prediction.try_get(k).map(|p| p.strategy))
}

/// The strategy `request` names for `prediction`: the decision's choice for
/// [`StrategyRequest::Auto`], the given strategy with its `auto` parameters resolved
/// otherwise.
pub fn choose(request: &StrategyRequest, prediction: &Prediction) -> Result<Strategy> {
    match request {
        StrategyRequest::Auto => Ok(decide(prediction).choice),
        StrategyRequest::Given(s) => from_prediction(*s, prediction),
    }
}

/// A resolved strategy and the prediction it came from.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The strategy, every parameter a number.
    pub strategy: Strategy,
    /// The prediction it was resolved by (`None` where nothing was `auto`).
    pub prediction: Option<Prediction>,
}

/// Resolve `request` for `model` on `perf`: predict (with `base`, set up by
/// [`predict_config_for`]) only where something is `auto`.
pub fn resolve(
    request: &StrategyRequest,
    model: &ModelSpec,
    perf: &PerfModel,
    base: &PredictConfig,
) -> Result<Resolved> {
    if let StrategyRequest::Given(s) = request {
        if !has_auto(s) {
            return Ok(Resolved {
                strategy: *s,
                prediction: None,
            });
        }
    }
    let prediction = predict(model, perf, &predict_config_for(request, base))?;
    Ok(Resolved {
        strategy: choose(request, &prediction)?,
        prediction: Some(prediction),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheSize;
    use crate::host::HostSpec;

    fn setup() -> (ModelSpec, PerfModel, PredictConfig) {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let perf = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let config = PredictConfig {
            cache: Some(CacheSize::Slots(2048)),
            warmup_steps: 10,
            steps: 20,
            ..PredictConfig::default()
        };
        (model, perf, config)
    }

    #[test]
    fn fixed_strategies_need_no_prediction() {
        let (model, perf, config) = setup();
        for s in [
            Strategy::Offload,
            Strategy::Cpu,
            Strategy::Resident,
            Strategy::Hybrid {
                fetch: FetchFraction::Fixed(0.3),
            },
            Strategy::LayerSplit {
                cpu_layers: CpuLayers::Fixed(4),
            },
        ] {
            let r = resolve(&StrategyRequest::Given(s), &model, &perf, &config).unwrap();
            assert_eq!(r.strategy, s);
            assert!(r.prediction.is_none(), "{s}");
        }
    }

    /// The resolved fraction and N are the prediction's own (the reference: `predict` called
    /// directly with the parameter searched).
    #[test]
    fn auto_parameters_come_from_the_prediction() {
        let (model, perf, config) = setup();
        let hybrid = Strategy::Hybrid {
            fetch: FetchFraction::Auto,
        };
        let r = resolve(&StrategyRequest::Given(hybrid), &model, &perf, &config).unwrap();
        let direct = predict(&model, &perf, &config).unwrap();
        let f = direct.get(StrategyKind::Hybrid).fetch_fraction;
        assert_eq!(r.strategy.fixed_fetch_fraction(), Some(f));
        assert!(!has_auto(&r.strategy));

        let split = Strategy::LayerSplit {
            cpu_layers: CpuLayers::Auto,
        };
        let r = resolve(&StrategyRequest::Given(split), &model, &perf, &config).unwrap();
        let mut c = config.clone();
        c.layer_split = Some(CpuLayers::Auto);
        let direct = predict(&model, &perf, &c).unwrap();
        let n = direct.get(StrategyKind::LayerSplit).cpu_layers.unwrap();
        assert_eq!(r.strategy.cpu_layers(), Some(CpuLayers::Fixed(n)));

        let auto = resolve(&StrategyRequest::Auto, &model, &perf, &config).unwrap();
        let p = auto.prediction.as_ref().unwrap();
        assert_eq!(auto.strategy, decide(p).choice);
    }

    #[test]
    fn an_auto_parameter_without_a_resolution_is_an_error() {
        let split = Strategy::LayerSplit {
            cpu_layers: CpuLayers::Auto,
        };
        let e = resolve_with(split, |_| None).unwrap_err().to_string();
        assert!(e.contains("layer-split"), "{e}");
        // A resolution that is itself auto is no resolution.
        assert!(resolve_with(split, |_| Some(split)).is_err());
        assert_eq!(
            resolve_with(Strategy::Cpu, |_| None).unwrap(),
            Strategy::Cpu
        );
    }

    #[test]
    fn a_request_reads_auto_or_a_strategy_by_its_cli_name() {
        assert_eq!(
            "AUTO".parse::<StrategyRequest>().unwrap(),
            StrategyRequest::Auto
        );
        for s in [
            Strategy::Offload,
            Strategy::Hybrid {
                fetch: FetchFraction::Fixed(0.25),
            },
            Strategy::LayerSplit {
                cpu_layers: CpuLayers::Auto,
            },
        ] {
            let r: StrategyRequest = s.cli_name().parse().unwrap();
            assert_eq!(r, StrategyRequest::Given(s));
        }
        assert!("fastest".parse::<StrategyRequest>().is_err());
    }
}
