//! The requests of a routing trace as `ft routing stats` prints them.

use anyhow::Result;
use std::io::Write;

use ft_model::routing::TraceRequests;

/// A trace's requests: how many, their lengths, and the first few.
pub fn print(r: &TraceRequests) -> Result<()> {
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
