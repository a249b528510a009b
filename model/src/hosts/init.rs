//! The host file `ft host init` writes: a commented host TOML built from the facts read on
//! the machine ([`MachineFacts`], read by `ft_runtime::machine`), leaving out what
//! [`HostSpec`](crate::host::HostSpec) derives, so the file is a starting point to edit for
//! another machine and says where every number came from.

use std::fmt::Write as _;

use crate::host::gpu_table_entry;

/// What `nvidia-smi` says about the GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuFacts {
    /// The first GPU's name.
    pub name: String,
    /// GPUs listed.
    pub count: u32,
    /// The first GPU's memory, MiB.
    pub memory_mib: f64,
}

/// The first NVIDIA GPU's link in sysfs.
#[derive(Debug, Clone, PartialEq)]
pub struct PcieFacts {
    /// PCIe generation (from the best link speed).
    pub generation: u32,
    /// Lanes.
    pub lanes: u32,
    /// The sysfs values as read (`16.0 GT/s PCIe, x16`).
    pub raw: String,
}

/// Populated DIMMs and their configured speed (`dmidecode -t memory`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryFacts {
    /// Populated DIMMs.
    pub dimms: u32,
    /// Configured speed, MT/s.
    pub mts: u32,
}

/// A STREAM read measured on the machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamFacts {
    /// Median read bandwidth, GB/s (1e9 B/s).
    pub gbs: f64,
    /// Threads that read.
    pub threads: usize,
    /// Buffer size, MiB.
    pub mib: usize,
}

/// Everything `ft host init` reads on the machine; `None` where it could not be read.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineFacts {
    /// CPU model name (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// Physical cores.
    pub cores: u32,
    /// Hardware threads online.
    pub threads: u32,
    /// NUMA nodes.
    pub numa_nodes: u32,
    /// The GPUs (`nvidia-smi`).
    pub gpu: Option<GpuFacts>,
    /// The GPU's link (sysfs).
    pub pcie: Option<PcieFacts>,
    /// The memory (`dmidecode`, needs root).
    pub memory: Option<MemoryFacts>,
    /// STREAM read, measured.
    pub stream: StreamFacts,
}

/// The commented host TOML of the machine `m` describes (it reads back with
/// [`HostSpec::from_toml_str`](crate::host::HostSpec::from_toml_str)). A GPU outside ft's GPU
/// table gets a placeholder `hbm_gbs` to edit, with a warning.
pub fn host_toml(m: &MachineFacts) -> String {
    let mut t = String::new();
    write_host_toml(&mut t, m).expect("writing to a String cannot fail");
    t
}

fn write_host_toml(w: &mut String, m: &MachineFacts) -> std::fmt::Result {
    writeln!(
        w,
        "# Host file written by `ft host init` for the machine it ran on. Edit it for another"
    )?;
    writeln!(
        w,
        "# machine: docs/host-file.md lists every key, its unit and its default. Keys left out"
    )?;
    writeln!(
        w,
        "# (or commented out) are derived when the file is read; `ft host show FILE` prints"
    )?;
    writeln!(
        w,
        "# every value and says which were derived, and how. `ft probe` measures the rest."
    )?;
    writeln!(
        w,
        "description = \"written by ft host init: {}\"",
        match &m.gpu {
            Some(g) => format!("{} x {} + {}", g.count, g.name, m.cpu_model),
            None => format!(
                "no NVIDIA GPU found, the field report's RTX 4090 assumed + {}",
                m.cpu_model
            ),
        }
        .replace('"', "'")
    )?;
    writeln!(w)?;
    writeln!(w, "[gpu]")?;
    match &m.gpu {
        Some(g) => {
            writeln!(w, "name = \"{}\"  # nvidia-smi", g.name.replace('"', "'"))?;
            writeln!(w, "count = {}  # GPUs nvidia-smi lists", g.count)?;
            writeln!(
                w,
                "memory_gib = {:.1}  # nvidia-smi: {} MiB",
                g.memory_mib / 1024.0,
                g.memory_mib
            )?;
            match gpu_table_entry(&g.name) {
                Some(row) => writeln!(
                    w,
                    "# hbm_gbs = {}  # derived from the name ({}'s published memory bandwidth)",
                    row.hbm_gbs, row.name
                )?,
                None => {
                    tracing::warn!(
                        "{} is not in ft's GPU table: hbm_gbs is a placeholder to edit",
                        g.name
                    );
                    writeln!(
                        w,
                        "hbm_gbs = 1000.0  # PLACEHOLDER: {} is not in ft's GPU table; edit from its spec sheet",
                        g.name
                    )?
                }
            }
        }
        None => {
            writeln!(
                w,
                "# No NVIDIA GPU was found here (nvidia-smi did not run): the field report's"
            )?;
            writeln!(
                w,
                "# RTX 4090 on PCIe 4.0 x16 stands in. Edit [gpu] and [pcie] for your GPU."
            )?;
            writeln!(w, "name = \"NVIDIA GeForce RTX 4090\"")?;
            writeln!(w, "count = 1")?;
            writeln!(
                w,
                "# memory_gib and hbm_gbs: derived from the name (ft's GPU table)"
            )?;
        }
    }
    writeln!(w)?;
    writeln!(w, "[pcie]")?;
    match (&m.gpu, &m.pcie) {
        (Some(_), Some(p)) => {
            writeln!(
                w,
                "generation = {}  # sysfs max_link_speed and current_link_width: {}",
                p.generation, p.raw
            )?;
            writeln!(w, "lanes = {}", p.lanes)?;
        }
        (Some(_), None) => {
            writeln!(
                w,
                "# The GPU's link was not readable in sysfs: PCIe 4.0 x16 assumed; edit."
            )?;
            writeln!(w, "generation = 4")?;
            writeln!(w, "lanes = 16")?;
        }
        (None, _) => {
            writeln!(w, "generation = 4")?;
            writeln!(w, "lanes = 16")?;
        }
    }
    writeln!(
        w,
        "# h2d_gbs = ...    # derived: lanes x lane rate x 0.85; `ft probe` measures it"
    )?;
    writeln!(w, "# d2h_gbs = ...    # derived: h2d_gbs")?;
    writeln!(w, "# latency_us = 2.0 # derived: an estimate")?;
    writeln!(w)?;
    writeln!(w, "[cpu]")?;
    writeln!(
        w,
        "name = \"{}\"  # /proc/cpuinfo",
        m.cpu_model.replace('"', "'")
    )?;
    writeln!(w, "cores = {}  # distinct (socket, core) pairs", m.cores)?;
    writeln!(
        w,
        "threads = {}  # hardware threads online",
        m.threads.max(m.cores)
    )?;
    writeln!(
        w,
        "numa_nodes = {}  # /sys/devices/system/node",
        m.numa_nodes
    )?;
    match m.memory {
        Some(MemoryFacts { dimms, mts }) => {
            writeln!(w, "memory_channels = {dimms}  # populated DIMMs (dmidecode); two DIMMs per channel count once: edit")?;
            writeln!(
                w,
                "memory_mts = {mts}  # dmidecode: configured memory speed"
            )?;
        }
        None => {
            writeln!(w, "# memory_channels = ?  # not readable here (`sudo dmidecode -t memory`): populated channels")?;
            writeln!(w, "# memory_mts = ?       # and their MT/s (DDR5-4800 is 4800); plausibility checks use them")?;
        }
    }
    writeln!(
        w,
        "stream_read_gbs = {:.1}  # measured by ft host init: {} threads reading {} MiB, median of 5",
        m.stream.gbs, m.stream.threads, m.stream.mib
    )?;
    writeln!(
        w,
        "# moe_gbs = ...  # the CPU-MoE GB/s your engine's bench reports, at engine.tuning_model"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostSpec;

    fn facts() -> MachineFacts {
        MachineFacts {
            cpu_model: "Test \"CPU\" 8-core".into(),
            cores: 8,
            threads: 16,
            numa_nodes: 1,
            gpu: None,
            pcie: None,
            memory: None,
            stream: StreamFacts {
                gbs: 61.25,
                threads: 16,
                mib: 256,
            },
        }
    }

    /// Every shape of what a machine shows reads back as a host, with the facts it gave.
    #[test]
    fn the_file_reads_back_with_the_facts_it_was_given() {
        let bare = host_toml(&facts());
        let h = HostSpec::from_toml_str(&bare, "bare").unwrap();
        assert_eq!(h.gpu.name, "NVIDIA GeForce RTX 4090");
        assert_eq!((h.cpu.cores, h.cpu.threads), (8, 16));
        assert!((h.cpu.stream_read_gbs - 61.2).abs() < 0.11, "{bare}");
        assert!(bare.contains("no NVIDIA GPU found") && bare.contains("'CPU'"));
        assert!(bare.contains("# memory_channels = ?"));

        let mut m = facts();
        m.gpu = Some(GpuFacts {
            name: "NVIDIA H100 80GB HBM3".into(),
            count: 2,
            memory_mib: 81559.0,
        });
        m.pcie = Some(PcieFacts {
            generation: 5,
            lanes: 16,
            raw: "32.0 GT/s PCIe, x16".into(),
        });
        m.memory = Some(MemoryFacts {
            dimms: 16,
            mts: 4800,
        });
        let full = host_toml(&m);
        let h = HostSpec::from_toml_str(&full, "full").unwrap();
        assert_eq!(h.gpu.count, 2);
        assert!((h.gpu.memory_gib - 79.6).abs() < 0.06, "{full}");
        assert!(full.contains("# hbm_gbs = ") && full.contains("generation = 5"));
        assert!(full.contains("memory_mts = 4800"));

        // A GPU outside the table: a placeholder bandwidth, still a valid file.
        m.gpu.as_mut().unwrap().name = "Some Future GPU".into();
        m.pcie = None;
        let odd = host_toml(&m);
        assert!(odd.contains("PLACEHOLDER") && odd.contains("PCIe 4.0 x16 assumed"));
        HostSpec::from_toml_str(&odd, "odd").unwrap();
    }
}
