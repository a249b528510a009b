//! `ft routing`: what a routing source looks like in the numbers engines publish, a process
//! fitted to such numbers, and routing logs imported from engines.
//!
//! - `stats`: for a preset, a process TOML or a trace, the hit rate against cache size (per
//!   layer and global slots, every policy), the coverage of a hot list learned on one half and
//!   scored on the other (beside the uniform baseline), reuse distances per layer, the union
//!   of experts per step against streams and the layer-to-layer prediction
//!   (`ft_model::routing::stats`).
//! - `fit`: the process knobs that reproduce published points (a TOML of hit rates, hot-list
//!   coverage, union sizes) or a trace's own statistics, with the residual of every point
//!   (`ft_model::routing::fit`).
//! - `import`: a per-token CSV of layer and expert ids into a JSON-lines trace
//!   (`ft_model::routing::import`).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

use ft_model::cache::CachePolicy;
use ft_model::routing::fit::{fit, points_from_trace, FitPoints, FitReport};
use ft_model::routing::stats::{self, StatsConfig};
use ft_model::routing::{self, RoutingProcess};

mod table;
use ft_model::MoeGeometry;

/// The field report's model, the default `--model`.
const DEFAULT_MODEL: &str = "qwen3.8-flash-next";

/// Arguments of `ft routing`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Hit rate against cache size, hot-list coverage, reuse distances, union growth and
    /// layer-to-layer prediction of a routing source.
    Stats(StatsArgs),
    /// Fit a routing process to published points (TOML) or to a trace's own statistics.
    Fit(FitArgs),
    /// Convert a per-token CSV of layer and expert ids (an engine's routing log) into a
    /// JSON-lines trace.
    Import(ImportArgs),
}

/// Arguments of `ft routing stats`.
#[derive(Debug, clap::Args)]
struct StatsArgs {
    /// Routing: a preset (uniform, mild, typical, skewed, legacy-typical), a process TOML or
    /// a trace file (its header gives the geometry; --model is then not needed).
    #[arg(long, default_value = "typical")]
    routing: String,
    /// Model whose geometry is routed: a preset or a model TOML file.
    #[arg(long, default_value = DEFAULT_MODEL)]
    model: String,
    /// Route only this many MoE layers (faster; per-layer statistics hardly change).
    #[arg(long)]
    layers: Option<usize>,
    /// Seed of a synthetic process (replaces the preset's).
    #[arg(long)]
    seed: Option<u64>,
    /// Measured steps (tokens per stream).
    #[arg(long, default_value_t = StatsConfig::default().steps)]
    steps: usize,
    /// Steps that fill the caches before counting (a static hot set learns on them).
    #[arg(long, default_value_t = StatsConfig::default().warmup_steps)]
    warmup: usize,
    /// Concurrent streams of the cache and hot-list statistics.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Largest stream count of the union curve.
    #[arg(long, default_value_t = StatsConfig::default().union_streams)]
    union_streams: usize,
    /// Per-layer cache sizes, in slots per layer (comma list).
    #[arg(long, value_delimiter = ',', default_values_t = StatsConfig::default().per_layer_slots)]
    per_layer: Vec<usize>,
    /// Global cache sizes, in slots per layer (the pool holds that many times the layers).
    #[arg(long, value_delimiter = ',', default_values_t = StatsConfig::default().global_slots)]
    global: Vec<usize>,
    /// Cache policies (comma list of lru, lfu, static-hot).
    #[arg(long, value_delimiter = ',', default_value = "lru,lfu,static-hot")]
    policy: Vec<String>,
    /// Hot-list sizes, in experts per layer (comma list).
    #[arg(long, value_delimiter = ',', default_values_t = StatsConfig::default().hot_k)]
    hot: Vec<usize>,
    /// Print the statistics as JSON (every layer's reuse distances included).
    #[arg(long)]
    json: bool,
}

/// Arguments of `ft routing fit`.
#[derive(Debug, clap::Args)]
struct FitArgs {
    /// Published points to match: a TOML file (docs/routing.md, "Fitting").
    #[arg(long, conflicts_with = "trace", required_unless_present = "trace")]
    points: Option<PathBuf>,
    /// A trace whose own statistics are the points (per-layer LRU at 2 to 16 tokens' worth
    /// of slots, a hot list of a sixteenth of the experts, the union at its streams).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// With --trace: measured steps (the trace must hold warm-up + steps).
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    /// With --trace: warm-up steps.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// The process to start from (replaces the points file's `start`): a preset or TOML.
    #[arg(long)]
    start: Option<String>,
    /// Write the fitted process as TOML (a `--routing` file) to this path.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `ft routing import`.
#[derive(Debug, clap::Args)]
struct ImportArgs {
    /// The CSV: a header row with token, layer and experts columns (weights and request
    /// optional); docs/routing.md, "Importing an engine's routing log".
    input: PathBuf,
    /// The trace to write (.jsonl, or .ftrt for the binary form).
    output: PathBuf,
    /// Experts per layer (default: the largest id in the file + 1).
    #[arg(long)]
    experts: Option<usize>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// Run `ft routing`.
pub fn run(args: Args) -> Result<()> {
    match args.command {
        Command::Stats(a) => run_stats(a),
        Command::Fit(a) => run_fit(a),
        Command::Import(a) => run_import(a),
    }
}

fn run_stats(a: StatsArgs) -> Result<()> {
    let policies = a
        .policy
        .iter()
        .map(|p| p.trim().parse::<CachePolicy>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .context("--policy")?;
    let routing::NamedSource {
        source: mut src,
        what,
    } = routing::open_named(&a.routing, &a.model, a.layers, a.seed)
        .with_context(|| format!("--routing {}", a.routing))?;
    let cfg = StatsConfig {
        warmup_steps: a.warmup,
        steps: a.steps,
        streams: a.streams,
        union_streams: a.union_streams.max(1),
        per_layer_slots: a.per_layer,
        global_slots: a.global,
        policies,
        hot_k: a.hot,
        detail: true,
    };
    let g = *src.geometry();
    cfg.validate(&g)
        .context("--steps, --warmup, --streams, --per-layer, --global or --hot")?;
    tracing::info!(routing = %a.routing, steps = cfg.steps, "routing statistics");
    let st = stats::routing_stats(src.as_mut(), &cfg).context("routing statistics")?;
    // A trace's requests (its `request` and `token` tags), read over the whole file.
    let requests = if routing::names_trace(&a.routing) {
        Some(
            routing::trace_requests(Path::new(&a.routing))
                .with_context(|| format!("--routing {}", a.routing))?,
        )
    } else {
        None
    };
    if a.json {
        let mut v = serde_json::json!({ "routing": a.routing, "source": what, "stats": st });
        if let Some(r) = &requests {
            v["requests"] = serde_json::to_value(r)?;
        }
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    table::print_stats(&what, &st)?;
    if let Some(r) = &requests {
        table::print_requests(r)?;
    }
    Ok(())
}

fn run_fit(a: FitArgs) -> Result<()> {
    let points = match (&a.points, &a.trace) {
        (Some(p), _) => {
            FitPoints::from_toml_file(p).with_context(|| format!("--points {}", p.display()))?
        }
        (None, Some(t)) => points_from_trace(t, a.warmup, a.steps)
            .with_context(|| format!("--trace {}", t.display()))?,
        (None, None) => bail!("give --points FILE or --trace FILE"),
    };
    let start_name = a.start.clone().unwrap_or_else(|| points.start.clone());
    let start = RoutingProcess::named(&start_name)
        .with_context(|| format!("start process {start_name}"))?;
    tracing::info!(points = points.points.len(), start = %start_name, "fitting the routing process");
    let report = fit(&points, &start).context("routing fit")?;
    if let Some(out) = &a.out {
        let text = toml::to_string(&report.fitted).context("the fitted process as TOML")?;
        std::fs::write(out, text).with_context(|| format!("--out {}", out.display()))?;
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    print_fit(&report, &start_name)
}

fn print_fit(r: &FitReport, start_name: &str) -> Result<()> {
    let g: &MoeGeometry = &r.geometry;
    outln!(
        "fit of the routing process from {start_name} to: {}",
        r.source
    )?;
    outln!(
        "{} experts x top-{} x {} MoE layers; {} iterations ({})",
        g.experts,
        g.top_k,
        g.moe_layers,
        r.iterations,
        r.termination
    )?;
    outln!()?;
    outln!("  {:<16} {:>10} {:>10}", "knob", "start", "fitted")?;
    for p in &r.fit {
        outln!(
            "  {:<16} {:>10.4} {:>10.4}",
            p.field(),
            p.get(&r.start),
            p.get(&r.fitted)
        )?;
    }
    outln!()?;
    outln!(
        "  {:<22} {:>9} {:>9} {:>9} {:>9}",
        "point",
        "target",
        "start",
        "fitted",
        "residual"
    )?;
    for p in &r.points {
        outln!(
            "  {:<22} {:>9.4} {:>9.4} {:>9.4} {:>+9.4}",
            p.label,
            p.target,
            p.start,
            p.fitted,
            p.residual
        )?;
    }
    outln!()?;
    outln!(
        "rms residual {:.4} (fractions; a union's residual over streams x top_k)",
        r.rms
    )?;
    Ok(())
}

fn run_import(a: ImportArgs) -> Result<()> {
    let s = routing::import::import_csv(&a.input, &a.output, a.experts)
        .with_context(|| format!("import {} -> {}", a.input.display(), a.output.display()))?;
    if a.json {
        let v = serde_json::json!({
            "input": a.input,
            "output": a.output,
            "experts": s.geometry.experts,
            "top_k": s.geometry.top_k,
            "moe_layers": s.geometry.moe_layers,
            "steps": s.steps,
            "requests": s.requests,
            "layer_numbers": s.layer_numbers,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    outln!(
        "wrote {}: {} steps ({} requests in stream 0), {} experts x top-{} x {} layers (file layers {:?} renumbered from 0)",
        a.output.display(),
        s.steps,
        s.requests,
        s.geometry.experts,
        s.geometry.top_k,
        s.geometry.moe_layers,
        s.layer_numbers
    )?;
    Ok(())
}
