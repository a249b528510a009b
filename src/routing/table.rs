//! The tables `ft routing stats` prints: the statistics and a trace's requests.

use anyhow::Result;

use ft_model::cache::CacheTopology;
use ft_model::routing::stats::{self, RoutingStats};
use ft_model::routing::TraceRequests;

/// A trace's requests: how many, their lengths, and the first few.
pub fn print_requests(r: &TraceRequests) -> Result<()> {
    outln!()?;
    if r.tagged == 0 {
        outln!(
            "requests: none tagged ({} steps, up to {} streams; the trace carries no request ids)",
            r.steps,
            r.streams
        )?;
        return Ok(());
    }
    outln!(
        "requests: {} over {} steps and up to {} streams ({} of {} stream-steps tagged); tokens per request {}..{}, mean {:.1}; {} token-position gap(s)",
        r.requests,
        r.steps,
        r.streams,
        r.tagged,
        r.stream_steps,
        r.tokens_min,
        r.tokens_max,
        r.tokens_mean,
        r.token_gaps
    )?;
    outln!(
        "  {:>6} {:<24} {:>10} {:>7} {:>13}",
        "stream",
        "request",
        "first step",
        "tokens",
        "token range"
    )?;
    for q in &r.listed {
        let range = match (q.first_token, q.last_token) {
            (Some(a), Some(b)) => format!("{a}..{b}"),
            _ => "-".to_string(),
        };
        outln!(
            "  {:>6} {:<24} {:>10} {:>7} {:>13}",
            q.stream,
            q.request,
            q.first_step,
            q.tokens,
            range
        )?;
    }
    if r.requests > r.listed.len() as u64 {
        outln!(
            "  (the first {} of {}; all counted above)",
            r.listed.len(),
            r.requests
        )?;
    }
    Ok(())
}

/// The statistics of a routing source.
pub fn print_stats(what: &str, st: &RoutingStats) -> Result<()> {
    let g = &st.geometry;
    let c = &st.config;
    outln!("routing {what}")?;
    outln!(
        "{} experts x top-{} x {} MoE layers; {} stream(s), {} steps after {} warm-up",
        g.experts,
        g.top_k,
        g.moe_layers,
        c.streams,
        c.steps,
        c.warmup_steps
    )?;
    outln!()?;
    outln!("expert-level hit rate by cache size (offload; slots per layer, a global pool holds that x layers)")?;
    for topology in [CacheTopology::PerLayer, CacheTopology::Global] {
        let sizes = match topology {
            CacheTopology::PerLayer => &c.per_layer_slots,
            CacheTopology::Global => &c.global_slots,
        };
        if sizes.is_empty() {
            continue;
        }
        let mut head = format!("  {:<11} {:<10}", "policy", "topology");
        for n in sizes {
            head += &format!(" {:>7}", n);
        }
        outln!("{head}")?;
        for p in &c.policies {
            let mut row = format!("  {:<11} {:<10}", p.name(), topology.name());
            for &n in sizes {
                match st.hit_rate(p.name(), topology, n) {
                    Some(h) => row += &format!(" {:>6.1}%", 100.0 * h),
                    None => row += &format!(" {:>7}", "-"),
                }
            }
            outln!("{row}")?;
        }
    }
    outln!()?;
    outln!("hot list per layer, learned on the first half of the steps, scored on the second")?;
    outln!("  {:>6} {:>9} {:>9}", "k", "coverage", "uniform")?;
    for h in &st.hot {
        outln!(
            "  {:>6} {:>8.1}% {:>8.1}%",
            h.k,
            100.0 * h.coverage,
            100.0 * h.uniform
        )?;
    }
    if !st.reuse_all.is_empty() {
        outln!()?;
        outln!("reuse distance: tokens since the same stream last routed to the expert at the layer (share of routings)")?;
        let mut head = format!("  {:<7}", "layer");
        for label in stats::reuse_bucket_labels() {
            head += &format!(" {label:>7}");
        }
        head += &format!(" {:>7}", "median");
        outln!("{head}")?;
        let row = |label: String, shares: &[f64], median: Option<f64>| {
            let mut r = format!("  {label:<7}");
            for s in shares {
                r += &format!(" {:>6.1}%", 100.0 * s);
            }
            if let Some(m) = median {
                r += &format!(" {:>7}", m);
            }
            r
        };
        outln!("{}", row("all".into(), &st.reuse_all, None))?;
        let n = st.reuse.len();
        let mut shown: Vec<usize> = vec![0, n / 2, n - 1];
        shown.dedup();
        for l in shown {
            let r = &st.reuse[l];
            outln!("{}", row(format!("{l}"), &r.shares, Some(r.median_tokens)))?;
        }
        if n > 3 {
            outln!("  (every layer in --json)")?;
        }
    }
    outln!()?;
    outln!("union of experts per layer-step against concurrent streams")?;
    outln!(
        "  {:>7} {:>9} {:>17}",
        "streams",
        "experts",
        "of streams x k"
    )?;
    for u in &st.union {
        outln!(
            "  {:>7} {:>9.1} {:>16.1}%",
            u.streams,
            u.unique,
            100.0 * u.share_of_routings
        )?;
    }
    if let Some(lc) = &st.layer_correlation {
        outln!()?;
        outln!(
            "layer-to-layer prediction: {:.1}% of a layer's experts are among the top-{} successors of the previous layer's (popularity alone: {:.1}%)",
            100.0 * lc.predicted,
            g.top_k,
            100.0 * lc.baseline
        )?;
    }
    Ok(())
}
