//! Every value the model reads from a host, with its unit and where it came from: what
//! `ft host show` prints, so that a user sees which numbers a host file gave and which were
//! derived (and how) before trusting a prediction made from it.

use serde::Serialize;

use crate::host::{HostSpec, DEFAULT_DRAM_OVER_STREAM};

/// One value of a host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostValue {
    /// Its key in the host file (`pcie.h2d_gbs`).
    pub key: &'static str,
    /// The value in `unit`; `None` where the file left it out and nothing derives it.
    pub value: Option<f64>,
    /// Its unit (`GB/s`, `us`, `GiB`, `count`).
    pub unit: &'static str,
    /// True when the file left it out and it was derived.
    pub derived: bool,
    /// `given`, `not given`, or `derived: how`.
    pub source: String,
}

/// Every value the model reads from `h`, in the file's order, with its source.
pub fn host_values(h: &HostSpec) -> Vec<HostValue> {
    let e = &h.engine;
    let dram_derived = e.dram_gbs.is_none();
    let threads_engine = e.cpu_threads.is_none();
    let rows: Vec<(&'static str, Option<f64>, &'static str, Option<String>)> = vec![
        ("gpu.count", Some(h.gpu.count as f64), "count", None),
        ("gpu.memory_gib", Some(h.gpu.memory_gib), "GiB", None),
        ("gpu.hbm_gbs", Some(h.gpu.hbm_gbs), "GB/s", None),
        ("pcie.h2d_gbs", Some(h.pcie.h2d_gbs), "GB/s", None),
        ("pcie.d2h_gbs", Some(h.pcie.d2h_gbs), "GB/s", None),
        ("pcie.latency_us", Some(h.pcie.latency_us), "us", None),
        ("pcie.gather_gbs", h.pcie.gather_gbs, "GB/s", None),
        ("cpu.cores", Some(h.cpu.cores as f64), "count", None),
        ("cpu.threads", Some(h.cpu.threads as f64), "count", None),
        (
            "cpu.numa_nodes",
            Some(h.cpu.numa_nodes as f64),
            "count",
            None,
        ),
        (
            "cpu.stream_read_gbs",
            Some(h.cpu.stream_read_gbs),
            "GB/s",
            None,
        ),
        ("cpu.moe_gbs", h.cpu.moe_gbs, "GB/s", None),
        (
            "engine.cpu_threads",
            Some(h.cpu_threads() as f64),
            "count",
            threads_engine.then(|| "derived: cpu.cores".to_string()),
        ),
        (
            "engine.dram_gbs",
            Some(h.dram_gbs()),
            "GB/s",
            dram_derived.then(|| {
                format!(
                    "derived: cpu.stream_read_gbs x {DEFAULT_DRAM_OVER_STREAM:.3} (DEFAULT_DRAM_OVER_STREAM)"
                )
            }),
        ),
    ];
    rows.into_iter()
        .map(|(key, value, unit, engine_derived)| {
            let d = h.derived().iter().find(|d| d.key == key);
            let (derived, source) = match (d, engine_derived) {
                (Some(d), _) => (true, format!("derived: {}", d.how)),
                (None, Some(how)) => (true, how),
                (None, None) if value.is_none() => (false, "not given".to_string()),
                (None, None) => (false, "given".to_string()),
            };
            HostValue {
                key,
                value,
                unit,
                derived,
                source,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_derived_and_missing_values_are_told_apart() {
        let h = HostSpec::from_toml_str(
            "name = \"t\"\n[gpu]\nname = \"NVIDIA H100 80GB HBM3\"\n[pcie]\nh2d_gbs = 50.0\n\
             [cpu]\nname = \"c\"\ncores = 8\nstream_read_gbs = 100.0\n",
            "test host",
        )
        .unwrap();
        let v = host_values(&h);
        let get = |k: &str| v.iter().find(|r| r.key == k).unwrap();
        assert_eq!(v.len(), 14);
        assert_eq!(get("pcie.h2d_gbs").value, Some(50.0));
        assert_eq!(get("pcie.h2d_gbs").source, "given");
        assert!(!get("pcie.h2d_gbs").derived);
        // The GPU's memory comes from its name, the link's d2h from h2d.
        assert!(get("gpu.memory_gib").derived);
        assert!(get("pcie.d2h_gbs").source.starts_with("derived: "));
        assert_eq!(get("cpu.moe_gbs").value, None);
        assert_eq!(get("cpu.moe_gbs").source, "not given");
        assert_eq!(get("engine.cpu_threads").source, "derived: cpu.cores");
        assert_eq!(get("engine.cpu_threads").value, Some(8.0));
        let dram = get("engine.dram_gbs");
        assert!(dram.derived && dram.source.contains("DEFAULT_DRAM_OVER_STREAM"));
        assert!((dram.value.unwrap() - 100.0 * DEFAULT_DRAM_OVER_STREAM).abs() < 1e-9);
    }
}
