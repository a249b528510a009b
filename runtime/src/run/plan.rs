//! A run's inputs validated into a plan before any device, bank or thread is made: the
//! machine's side ([`Setup`]: device kind, CPU workers, how they wait) and the run's
//! ([`RunPlan`]: the model as run, the variants with `auto` resolved, the engine's
//! configuration, the memory it needs checked against this machine, the routing of every
//! step drawn up front).

use ft_kernels::ActivationPath;
use ft_model::cache::{CachePolicy, CacheSize};
use ft_model::routing::{self, RoutingSource, StepRouting};
use ft_model::{ExpertFormat, GpuLayout, GpuPlacement, ModelSpec, StrategyKind};

use super::error::{Context, Result};
use super::memory::{available_ram, check_memory};
use super::variant::{resolve_variant, variant_specs, AutoHost, Variant};
use super::RunRequest;
use crate::cpu_pool::PoolWait;
use crate::device::DeviceKind;
use crate::engine::{draw_routing, record_routing, CombineOrder, EngineConfig, EngineMemory};
use crate::gather::GatherMethod;

/// Bytes per GiB.
const GIB: f64 = (1u64 << 30) as f64;

/// The machine's side of a run: checked limits, the device kind, the CPU workers and how
/// they wait.
#[derive(Debug, Clone)]
pub struct Setup {
    /// CPU cores of this machine.
    pub cores: usize,
    /// The device kind (`auto` resolved).
    pub kind: DeviceKind,
    /// CPU pool workers.
    pub threads: usize,
    /// How the pool waits between layers.
    pub pool_wait: PoolWait,
}

impl Setup {
    /// The setup of `req`, its sizes checked against their limits first.
    pub fn new(req: &RunRequest) -> Result<Self> {
        if req.repeat == 0 {
            bail!("--repeat must be at least 1");
        }
        check_limits(req)?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let kind = match req.device.to_ascii_lowercase().as_str() {
            "auto" => {
                if crate::cuda_available() {
                    DeviceKind::Cuda
                } else {
                    tracing::info!("no CUDA device here: using the host-emulated device");
                    DeviceKind::Host
                }
            }
            other => other.parse::<DeviceKind>().context("--device")?,
        };
        let threads = req.threads.unwrap_or(match kind {
            DeviceKind::Cuda => cores.saturating_sub(1).max(1),
            DeviceKind::Host => 1,
        });
        let pool_wait = match &req.pool_wait {
            Some(s) => s.parse::<PoolWait>()?,
            None => match kind {
                DeviceKind::Cuda => PoolWait::Spin,
                DeviceKind::Host => PoolWait::Park,
            },
        };
        Ok(Setup {
            cores,
            kind,
            threads,
            pool_wait,
        })
    }
}

/// A run ready to execute.
#[derive(Debug)]
pub struct RunPlan {
    /// The machine's side.
    pub setup: Setup,
    /// GPUs and how experts are laid out over them.
    pub layout: GpuLayout,
    /// The model as given.
    pub full: ModelSpec,
    /// The model as run (`--layers` applied).
    pub model: ModelSpec,
    /// The strategies, in the order given.
    pub variants: Vec<Variant>,
    /// A profile's CPU checks, to decide the auto fractions again at the check before the
    /// first round (single-GPU runs; `None` where nothing is decided there).
    pub auto_host: Option<AutoHost>,
    /// Cache slots (per GPU).
    pub cache_slots: usize,
    /// The engine's configuration (for the primary variant).
    pub cfg: EngineConfig,
    /// The memory the engine plans on each GPU of the layout, and the host's (checked
    /// against this machine).
    pub memory: EngineMemory,
    /// The routing of every step, warm-up first.
    pub routing: Vec<StepRouting>,
    /// Expert popularity for a static-hot cache without a hot list.
    pub popularity: Option<Vec<f64>>,
    /// Notes for the reports (fewer layers, ignored flags, contention).
    pub notes: Vec<String>,
}

impl RunPlan {
    /// The plan of `req` on `setup`.
    pub fn new(req: &RunRequest, setup: Setup) -> Result<Self> {
        let Setup {
            cores,
            kind,
            threads,
            pool_wait,
        } = setup;
        let placement: GpuPlacement = req.placement.parse().context("--placement")?;
        let layout = GpuLayout::new(req.gpus, placement).context("--gpus")?;
        if req.streams == 0 {
            bail!("--streams: must be at least 1");
        }
        if req.steps == 0 {
            bail!("--steps: must be at least 1");
        }
        let name = req.model.as_str();
        let full = ModelSpec::resolve(name).with_context(|| format!("--model {name}"))?;
        if !full.format.has_kernel() {
            bail!(
                "--model {name}: ft has no kernel for {}: predict and simulate it (ft predict, ft \
                 simulate), or run it in a format ft has (--model with format = nvfp4, q4_0, ...)",
                full.format
            );
        }
        let mut notes = Vec::new();
        let model = match req.layers {
            Some(n) if n < full.geometry.moe_layers => {
                notes.push(format!(
                    "ran {n} of the model's {} MoE layers (--layers): the same geometry, fewer layers; \
                     per-layer numbers are the model's, per-step numbers scale with the layer count",
                    full.geometry.moe_layers
                ));
                full.first_layers(n)?
            }
            Some(n) => full.first_layers(n)?,
            None => full.clone(),
        };
        let g = model.geometry;
        let policy = req.cache_options.clone();
        let specs = variant_specs(req)?;
        // The kind that sizes the cache: the first that needs one (cpu keeps a cache only when
        // given one), so a missing size is reported against it.
        let sk = specs
            .iter()
            .map(|v| v.kind)
            .find(|&k| k != StrategyKind::Cpu)
            .unwrap_or(StrategyKind::Cpu);
        let cache_slots = match sk {
            StrategyKind::Resident | StrategyKind::LayerSplit => {
                if req.cache_slots.is_some() || req.cache_gb.is_some() {
                    notes.push(format!(
                        "{sk} holds its GPU layers' experts resident: the cache size flags were ignored"
                    ));
                }
                0
            }
            StrategyKind::Offload
            | StrategyKind::Hybrid
            | StrategyKind::Cpu
            | StrategyKind::LayerSplitCached => match (req.cache_slots, req.cache_gb) {
                (None, None) if policy.slots_per_layer.is_some() => {
                    policy.fit_slots(0, g.moe_layers)?
                }
                (Some(n), _) => {
                    CacheSize::Slots(n).slots(model.expert_bytes(), g.total_experts())?
                }
                // Under tensor parallelism a GPU's budget holds slices (GpuLayout::slots_per_gpu).
                (None, Some(x)) if layout.is_multi() => {
                    if !(x.is_finite() && x >= 0.0) {
                        bail!("--cache-gb {x}: must be a non-negative number of GiB");
                    }
                    layout
                        .slots_per_gpu((x * GIB) as u64, model.expert_bytes())
                        .min(g.total_experts() as usize)
                }
                (None, Some(x)) => {
                    CacheSize::GiB(x).slots(model.expert_bytes(), g.total_experts())?
                }
                (None, None) if sk == StrategyKind::Cpu => 0,
                (None, None) => {
                    bail!("{sk} needs a cache size: give --cache-slots N or --cache-gb X")
                }
            },
        };
        let mut auto_host = None;
        let variants = specs
            .iter()
            .map(|spec| {
                resolve_variant(
                    req,
                    spec,
                    &model,
                    cache_slots,
                    &policy,
                    &mut auto_host,
                    &mut notes,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        // A profile's CPU checks, for deciding the auto fractions again at the check before the
        // first round (single-GPU runs; a multi-GPU run keeps the probed speed).
        let auto_host = auto_host.filter(|h| !req.no_cpu_check && !h.cpu_checks.is_empty());
        if variants.len() > 1 && layout.is_multi() {
            bail!(
                "--interleave: only a run on one GPU interleaves (--gpus {})",
                layout.gpus
            );
        }
        // The engine is built for the first variant that gathers (its staging slots serve every
        // variant), else the first.
        let primary = variants.iter().find(|v| v.gathers).unwrap_or(&variants[0]);
        let strategy = primary.strategy;
        let cfg = EngineConfig {
            strategy,
            cache_slots,
            cache_options: policy.clone(),
            max_streams: req.streams,
            max_context: req.context + req.warmup + req.steps,
            threads,
            pool_wait,
            gpu_path: parse_path("--gpu-act", req.gpu_act.as_deref(), model.format)?,
            cpu_path: parse_path("--cpu-act", req.cpu_act.as_deref(), model.format)?,
            combine: req.combine.parse::<CombineOrder>()?,
            gather: match req.gather.as_str() {
                "copy-engine" => GatherMethod::CopyEngine,
                "zero-copy" => GatherMethod::ZeroCopy,
                other => bail!("--gather: '{other}' is neither copy-engine nor zero-copy"),
            },
            seed: req.seed,
            settings: req.engine,
            timeline: !req.no_timeline,
            // The emulated device is sized to the plan below; a GPU keeps the default reserve.
            reserve_bytes: match kind {
                DeviceKind::Host => 0,
                DeviceKind::Cuda => crate::slots::DEFAULT_RESERVE_BYTES,
            },
        };
        let spinning = match pool_wait {
            PoolWait::Spin => threads,
            PoolWait::SpinBeside => threads + 1,
            PoolWait::Park => 0,
        };
        if kind == DeviceKind::Host && spinning > cores {
            notes.push(format!(
                "{spinning} spinning threads (CPU workers and the host thread) exceed this \
                 machine's {cores} cores: expect contention (use --pool-wait park)"
            ));
        }
        let available = available_ram().unwrap_or(u64::MAX);
        let memory = check_memory(
            &model,
            full.geometry.moe_layers,
            &cfg,
            &layout,
            kind,
            available,
        )?;

        // The routing of the whole run, drawn up front (and recorded if asked).
        let source = routing::resolve(&req.routing, &g, Some(req.seed))
            .with_context(|| format!("--routing {}", req.routing))?;
        let mut source = source;
        let routing = draw_routing(source.as_mut(), req.streams, req.warmup + req.steps)?;
        if let Some(path) = &req.record {
            record_routing(path, &g, &routing, req.warmup)
                .with_context(|| format!("--record {}", path.display()))?;
        }
        let popularity = if matches!(&policy.policy, CachePolicy::StaticHot { hot } if hot.is_empty())
            && sk != StrategyKind::Resident
        {
            let mut src: Box<dyn RoutingSource> =
                routing::resolve(&req.routing, &g, Some(req.seed))?;
            Some(ft_model::traffic::measure_popularity(
                src.as_mut(),
                req.warmup.max(1),
                req.streams,
            )?)
        } else {
            None
        };
        Ok(RunPlan {
            setup: Setup {
                cores,
                kind,
                threads,
                pool_wait,
            },
            layout,
            full,
            model,
            variants,
            auto_host,
            cache_slots,
            cfg,
            memory,
            routing,
            popularity,
            notes,
        })
    }
}

/// An activation path flag, or the format's preferred path where it is not given.
fn parse_path(flag: &str, s: Option<&str>, format: ExpertFormat) -> Result<ActivationPath> {
    match s {
        Some(s) => s
            .parse::<ActivationPath>()
            .with_context(|| flag.to_string()),
        None => Ok(ActivationPath::preferred(format)),
    }
}

/// Every input-derived size against its documented limit (`ft_model::limits`), before a
/// device, a bank or a thread is made.
fn check_limits(req: &RunRequest) -> Result<()> {
    use ft_model::limits;
    if let Some(t) = req.threads {
        limits::check_threads("--threads", t as u64)?;
    }
    limits::check_streams("--streams", req.streams as u64)?;
    limits::check_steps("--steps", req.steps as u64)?;
    limits::check_steps("--warmup", req.warmup as u64)?;
    limits::check_context("--context", req.context as u64)?;
    limits::check(
        &format!("--repeat {}", req.repeat),
        req.repeat,
        limits::MAX_REPEATS,
        "ft_model::limits::MAX_REPEATS",
    )?;
    if let Some(l) = req.layers {
        limits::check(
            &format!("--layers {l}"),
            l,
            limits::MAX_MOE_LAYERS,
            "ft_model::limits::MAX_MOE_LAYERS",
        )?;
    }
    if let Some(n) = req.cache_slots {
        limits::check(
            &format!("--cache-slots {n}"),
            n as u64,
            limits::MAX_TOTAL_EXPERTS,
            "ft_model::limits::MAX_TOTAL_EXPERTS: more slots than any model has experts",
        )?;
    }
    Ok(())
}
