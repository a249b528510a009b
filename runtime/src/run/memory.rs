//! The memory a run plans against this machine's RAM, checked before any of it is touched:
//! an error names the flag to change (`--layers` with the count that fits).

use ft_model::{GpuLayout, ModelSpec, Strategy, StrategyKind};

use super::error::{Result, RunError};
use crate::device::DeviceKind;
use crate::engine::{EngineConfig, EngineMemory};

/// Share of the available RAM a run may plan to use (the rest is for the OS and the page
/// cache).
const RAM_SHARE: f64 = 0.9;
/// Extra emulated device memory beyond what the engine plans, bytes (allocator rounding).
pub const HOST_DEVICE_SLACK: u64 = 64 << 20;
/// Bytes per GB (1e9).
const GB: f64 = 1e9;

/// Bytes of memory available on this machine (Linux `MemAvailable`), if known.
pub fn available_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Check the run's memory on the GPUs of `layout` against this machine (each GPU's as the
/// engine places it, [`EngineMemory::per_gpu`]; the host-emulated device keeps every GPU's
/// in RAM); errors name the flag to change.
pub fn check_memory(
    model: &ModelSpec,
    full_layers: usize,
    cfg: &EngineConfig,
    layout: &GpuLayout,
    kind: DeviceKind,
    available: u64,
) -> Result<EngineMemory> {
    let mem = EngineMemory::per_gpu(model, cfg, layout);
    let budget = (available as f64 * RAM_SHARE) as u64;
    let gpus = layout.count() as u64;
    let need = match kind {
        DeviceKind::Host => mem.host_bytes() + gpus * mem.device_bytes(),
        DeviceKind::Cuda => mem.host_bytes(),
    };
    if need <= budget {
        return Ok(mem);
    }
    let g = &model.geometry;
    // What one more layer costs on this machine, and what does not depend on layers.
    let one = EngineMemory::per_gpu(&model.with_layers(1), cfg, layout);
    let per_layer = match kind {
        DeviceKind::Host => {
            // The emulated device's slots that grow with the layers: resident's, and layer
            // split's resident layers (one layer's experts each).
            let slots_per_layer = match cfg.strategy.kind() {
                StrategyKind::Resident | StrategyKind::LayerSplit => {
                    EngineMemory::per_gpu(&model.with_layers(1), &resident_cfg(cfg), layout)
                        .slot_bytes
                }
                StrategyKind::Offload
                | StrategyKind::Hybrid
                | StrategyKind::Cpu
                | StrategyKind::LayerSplitCached => 0,
            };
            one.bank_bytes + gpus * (one.dense_bytes + slots_per_layer)
        }
        DeviceKind::Cuda => one.bank_bytes,
    };
    let fixed = need.saturating_sub(per_layer * g.moe_layers as u64);
    let fit = budget.saturating_sub(fixed) / per_layer.max(1);
    let where_ = match kind {
        DeviceKind::Host => "the host-emulated device keeps the bank and the device memory in RAM",
        DeviceKind::Cuda => "the host bank is pinned host memory",
    };
    Err(RunError::input(format!(
        "this run needs {:.1} GB of RAM: the host bank alone is {} layers x {} experts x {:.2} MB = {:.1} GB \
         (cache {:.2} GB, dense and KV {:.2} GB); {where_}, and this machine has {:.1} GB available. \
         Run fewer layers of the same geometry with --layers {} (of {full_layers}){}",
        need as f64 / GB,
        g.moe_layers,
        g.experts,
        model.expert_bytes() as f64 / 1e6,
        mem.bank_bytes as f64 / GB,
        mem.slot_bytes as f64 / GB,
        mem.dense_bytes as f64 / GB,
        available as f64 / GB,
        fit.max(1),
        if fit == 0 {
            ", and a smaller --cache-slots, --streams or --context"
        } else {
            ""
        }
    )))
}

/// `cfg` with every expert resident: what one layer's resident slots take.
fn resident_cfg(cfg: &EngineConfig) -> EngineConfig {
    EngineConfig {
        strategy: Strategy::Resident,
        ..cfg.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_does_not_fit_names_the_layers_that_would() {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let cfg = EngineConfig::default();
        let need = EngineMemory::of(&model, &cfg).host_bytes();
        let one_gpu = GpuLayout::single();
        // Fits with room to spare: the plan comes back.
        let mem = check_memory(&model, 48, &cfg, &one_gpu, DeviceKind::Cuda, need * 2).unwrap();
        assert_eq!(mem.host_bytes(), need);
        // A quarter of what it needs: refused, naming --layers with a count that fits.
        let e = check_memory(&model, 48, &cfg, &one_gpu, DeviceKind::Cuda, need / 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--layers") && e.contains("of 48"), "{e}");
        let n: usize = e
            .split("--layers ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .expect("a layer count");
        let fewer = model.with_layers(n);
        let budget = (need / 4) as f64 * RAM_SHARE;
        assert!((EngineMemory::of(&fewer, &cfg).host_bytes() as f64) <= budget);
    }
}
