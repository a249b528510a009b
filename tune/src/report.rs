//! The human table of a [`TuneReport`] (its `--json` twin is the report serialized).
//!
//! Why it is here: the table is the report's other form, and it is tested with the report
//! rather than through the binary.

use std::fmt::Write as _;

use ft_model::observe::Measure;
use ft_serve::loadgen::DecodeBasis;

use crate::calib::{BreakEvenSection, INTERVAL_Z};
use crate::setup::cache_text;
use crate::tuning::{Ended, TuneReport};

impl TuneReport {
    /// The human table: every run, every candidate's estimate, the choice, the break-evens.
    pub fn table(&self) -> String {
        let mut s = String::new();
        self.header(&mut s);
        self.runs_table(&mut s);
        self.candidates_table(&mut s);
        self.choice_lines(&mut s);
        self.break_even_lines(&mut s);
        let _ = write!(
            s,
            "tune took {:.1} s of its {:.0} s budget; the runs are in {}",
            self.wall_s,
            self.budget_s,
            self.observations.display()
        );
        s
    }

    fn header(&self, s: &mut String) {
        let t = &self.target;
        let measure = match t.measure {
            Measure::ClientE2e => "client-side end-to-end tok/s",
            Measure::Decode => "decode tok/s",
            Measure::ServerGen => "server generation tok/s",
        };
        let _ = writeln!(
            s,
            "ft tune: engine {} ({}): {} stream(s), prompts ~{} tokens, {} output tokens{}; {} per stream",
            self.engine,
            self.template,
            t.streams,
            t.prompt_tokens,
            t.output_tokens,
            t.cache
                .map(|c| format!(", cache {}", cache_text(&c)))
                .unwrap_or_default(),
            measure
        );
        let _ = writeln!(s, "estimates: {}\n", self.calibrator);
    }

    fn runs_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "{:>4}  {:<16} {:>10} {:>8} {:>7} {:>8} {:>10} {:>13} {:>7}",
            "run",
            "config",
            "cache",
            "ready s",
            "wall s",
            "streams",
            "e2e tok/s",
            "decode tok/s",
            "ttft s"
        );
        let mut per_request = false;
        for run in &self.runs {
            for (i, m) in run.measured.iter().enumerate() {
                let (idx, cfg, cache, ready, wall) = if i == 0 {
                    (
                        run.index.to_string(),
                        run.config.clone(),
                        run.cache.map(|c| cache_text(&c)).unwrap_or("-".into()),
                        format!("{:.1}", run.ready_s),
                        format!("{:.1}", run.wall_s),
                    )
                } else {
                    Default::default()
                };
                let mark = if m.decode_basis == DecodeBasis::PerRequest && m.streams > 1 {
                    per_request = true;
                    "*"
                } else {
                    " "
                };
                let _ = writeln!(
                    s,
                    "{:>4}  {:<16} {:>10} {:>8} {:>7} {:>8} {:>10.2} {:>12.2}{mark} {:>7.3}",
                    idx, cfg, cache, ready, wall, m.streams, m.e2e_tok_s, m.decode_tok_s, m.ttft_s
                );
            }
        }
        s.push_str(
            "decode tok/s at several streams: over the steady window where every stream decodes",
        );
        if per_request {
            s.push_str(
                "; * where that window was too short: the mean of the requests' first-to-last rates",
            );
        }
        s.push('\n');
        if self.prior_runs > 0 {
            let _ = writeln!(
                s,
                "(and {} observation(s) of earlier runs)",
                self.prior_runs
            );
        }
    }

    fn candidates_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\nat {} stream(s), tok/s per stream (95% interval: ± {INTERVAL_Z} se):",
            self.target.streams
        );
        let host_only = self.candidates.iter().any(|c| c.host_only.is_some());
        for c in &self.candidates {
            let h = match c.host_only {
                Some(h) if host_only => format!("  host inputs only {h:.2}"),
                _ => String::new(),
            };
            match (&c.estimate, c.interval) {
                (Some(e), Some((lo, hi))) => {
                    let basis = if e.runs > 0 {
                        format!("{} run(s)", e.runs)
                    } else {
                        "predicted".to_string()
                    };
                    let _ = writeln!(
                        s,
                        "  {:<16} {:>9.2}  [{:.2}, {:.2}]  {basis}{h}",
                        c.config, e.tok_s, lo, hi
                    );
                }
                _ => {
                    let _ = writeln!(s, "  {:<16} {:>9}  (not run){h}", c.config, "?");
                }
            }
        }
    }

    fn choice_lines(&self, s: &mut String) {
        let Some(c) = &self.choice else {
            s.push_str("\nno choice: no configuration was measured within the budget\n");
            return;
        };
        let _ = write!(
            s,
            "\nchoice: {} at {:.2} tok/s per stream [{:.2}, {:.2}]",
            c.config, c.estimate.tok_s, c.interval.0, c.interval.1
        );
        if let Some((name, margin, rel)) = &c.runner_up {
            let _ = write!(
                s,
                ", {:+.2} tok/s ({:+.0}%) over {name}",
                margin,
                rel * 100.0
            );
        }
        s.push('\n');
        let why = &self.standing.why;
        let _ = match self.ended {
            Ended::Settled => writeln!(s, "settled: {why}"),
            Ended::Budget => writeln!(
                s,
                "not settled: {why} (the {:.0} s budget is spent)",
                self.budget_s
            ),
            Ended::MaxRuns => writeln!(
                s,
                "not settled: {why} (after --max-runs {} runs)",
                self.runs.len()
            ),
        };
        let _ = writeln!(s, "engine flags: {}", c.flags.join(" "));
        let _ = writeln!(s, "command: {}", c.command.join(" "));
    }

    fn break_even_lines(&self, s: &mut String) {
        match &self.break_evens {
            BreakEvenSection::NotAvailable { why } => {
                let _ = writeln!(s, "break-evens: not available ({why})");
            }
            BreakEvenSection::Computed {
                of,
                agrees_with_choice,
                break_evens,
            } => {
                let _ = writeln!(
                    s,
                    "break-evens of {of} (the calibrated model's decode step at {} stream(s), among the candidates' strategies{}):",
                    self.target.streams,
                    if *agrees_with_choice {
                        ""
                    } else {
                        "; the runs chose another strategy"
                    }
                );
                s.push_str(&break_evens.text);
            }
        }
    }
}
