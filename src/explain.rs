//! `ft explain`: why the model chooses what it chooses and, where the legacy ratio's verdict
//! differs, which mechanisms it cannot see, in numbers. Same inputs as `ft predict`.

use anyhow::Result;
use std::io::Write;

use ft_model::perf::explain;

use crate::predict::{header, Args};

/// Run `ft explain`.
pub fn run(args: Args) -> Result<()> {
    let plan = args.plan()?;
    let pred = plan.predict()?;
    let e = explain(&pred, plan.params());
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = serde_json::json!({
            "explanation": e,
            "prediction": pred,
            "profile_untrusted": plan.profile_untrusted,
            "warnings": plan.warnings,
        });
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{}", header(&plan, &pred))?;
        writeln!(out)?;
        write!(out, "{}", e.text)?;
    }
    Ok(())
}
