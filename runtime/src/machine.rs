//! What `ft host init` reads on the machine it runs on: the GPUs (`nvidia-smi`), the GPU's
//! PCIe link (sysfs), the CPU topology, the memory (`dmidecode`, where it may run) and a
//! STREAM read measured here, as [`MachineFacts`] for `ft_model::hosts::init::host_toml`.
//! Whatever cannot be read is `None`; nothing here fails for a missing tool.

use ft_model::hosts::init::{GpuFacts, MachineFacts, MemoryFacts, PcieFacts, StreamFacts};

use crate::error::{Result, RuntimeError};
use crate::probe::CpuTopology;

/// Reads of the STREAM buffer; the median is kept.
const STREAM_REPEATS: usize = 5;

/// Smallest STREAM buffer, MiB (a smaller one would read from cache).
const MIN_STREAM_MIB: usize = 16;

/// PCI vendor id of NVIDIA.
const NVIDIA_VENDOR: &str = "0x10de";

/// Read this machine, measuring STREAM read on a buffer of `stream_mib` MiB (at least 16)
/// with every CPU.
pub fn read_machine(stream_mib: usize) -> Result<MachineFacts> {
    let cpu = CpuTopology::detect();
    let mib = stream_mib.max(MIN_STREAM_MIB);
    let k = ft_kernels::CpuExperts::new(0).map_err(|e| RuntimeError::Kernel(e.to_string()))?;
    let buf = ft_kernels::stream::alloc_touched(k.pool(), mib << 20);
    let r = ft_kernels::stream::stream_read(k.pool(), &buf, STREAM_REPEATS);
    Ok(MachineFacts {
        cpu_model: cpu.model,
        cores: cpu.cores,
        threads: cpu.threads,
        numa_nodes: cpu.numa_nodes,
        gpu: nvidia_smi(),
        pcie: sysfs_pcie(),
        memory: dmidecode_memory(),
        stream: StreamFacts {
            gbs: r.median_gbs(),
            threads: r.threads,
            mib,
        },
    })
}

/// Run a tool and keep its stdout if it ran and succeeded.
fn tool_output(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn nvidia_smi() -> Option<GpuFacts> {
    let text = tool_output(
        "nvidia-smi",
        &[
            "--query-gpu=name,memory.total",
            "--format=csv,noheader,nounits",
        ],
    )?;
    parse_nvidia_smi(&text)
}

/// `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`: one line per
/// GPU; the first one's name and memory, and the count.
fn parse_nvidia_smi(text: &str) -> Option<GpuFacts> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let (name, mem) = lines.first()?.rsplit_once(',')?;
    Some(GpuFacts {
        name: name.trim().to_string(),
        count: lines.len() as u32,
        memory_mib: mem.trim().parse().ok()?,
    })
}

/// The PCIe generation of a link speed in GT/s (`16.0 GT/s PCIe` is 4).
fn pcie_generation(gts: f64) -> Option<u32> {
    Some(match gts as u32 {
        2 => 1,
        5 => 2,
        8 => 3,
        16 => 4,
        32 => 5,
        64 => 6,
        _ => return None,
    })
}

/// The PCIe generation and width of the first NVIDIA display or 3D controller in sysfs:
/// the generation from `max_link_speed` (the device's and slot's best, not the idle
/// downclocked `current_link_speed`), the width from `current_link_width`.
fn sysfs_pcie() -> Option<PcieFacts> {
    let dir = std::fs::read_dir("/sys/bus/pci/devices").ok()?;
    for entry in dir.flatten() {
        let p = entry.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).map(|s| s.trim().to_string());
        let (Ok(vendor), Ok(class)) = (read("vendor"), read("class")) else {
            continue;
        };
        // 0x0300xx VGA, 0x0302xx 3D controller.
        if vendor != NVIDIA_VENDOR || !(class.starts_with("0x0300") || class.starts_with("0x0302"))
        {
            continue;
        }
        let speed = read("max_link_speed").ok()?;
        let lanes: u32 = read("current_link_width").ok()?.parse().ok()?;
        let generation = pcie_generation(speed.split_whitespace().next()?.parse().ok()?)?;
        return Some(PcieFacts {
            generation,
            lanes,
            raw: format!("{speed}, x{lanes}"),
        });
    }
    None
}

/// Populated DIMMs and their configured speed from `dmidecode -t memory` (needs root; `None`
/// where it cannot run).
fn dmidecode_memory() -> Option<MemoryFacts> {
    parse_dmidecode(&tool_output("dmidecode", &["-t", "memory"])?)
}

fn parse_dmidecode(text: &str) -> Option<MemoryFacts> {
    let mut dimms = 0u32;
    let mut mts = 0u32;
    for line in text.lines().map(str::trim) {
        if let Some(size) = line.strip_prefix("Size:") {
            let size = size.trim();
            if !size.starts_with("No Module") && !size.starts_with('0') {
                dimms += 1;
            }
        }
        if let Some(speed) = line
            .strip_prefix("Configured Memory Speed:")
            .or_else(|| line.strip_prefix("Configured Clock Speed:"))
        {
            if let Some(v) = speed.split_whitespace().next().and_then(|v| v.parse().ok()) {
                mts = mts.max(v);
            }
        }
    }
    (dimms > 0 && mts > 0).then_some(MemoryFacts { dimms, mts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_outputs_parse_into_facts() {
        let g = parse_nvidia_smi("NVIDIA H100 80GB HBM3, 81559\nNVIDIA H100 80GB HBM3, 81559\n\n")
            .unwrap();
        assert_eq!(
            (g.name.as_str(), g.count, g.memory_mib),
            ("NVIDIA H100 80GB HBM3", 2, 81559.0)
        );
        assert_eq!(parse_nvidia_smi(""), None);
        assert_eq!(parse_nvidia_smi("no comma here"), None);

        assert_eq!(pcie_generation(16.0), Some(4));
        assert_eq!(pcie_generation(2.5), Some(1));
        assert_eq!(pcie_generation(7.0), None);

        let dmi = "Memory Device\n\tSize: 32 GB\n\tConfigured Memory Speed: 4800 MT/s\n\
                   Memory Device\n\tSize: No Module Installed\n\tConfigured Memory Speed: Unknown\n\
                   Memory Device\n\tSize: 32 GB\n\tConfigured Clock Speed: 4400 MT/s\n";
        assert_eq!(
            parse_dmidecode(dmi),
            Some(MemoryFacts {
                dimms: 2,
                mts: 4800
            })
        );
        assert_eq!(parse_dmidecode("Size: No Module Installed\n"), None);
    }
}
