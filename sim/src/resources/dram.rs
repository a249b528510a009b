//! Host DRAM, shared by the CPU expert kernels and the DMA engine that serves gathers.
//!
//! Both read the experts' weights from host memory. Alone, each reaches its isolated
//! bandwidth (the link's gather bandwidth, the CPU kernel's MoE bandwidth); while both are
//! active each gets its contended bandwidth, as the perf cost terms give them (measured on
//! the gen-3 host: 13.09 -> 8.41 GB/s gather, 29.97 -> 21.89 GB/s CPU). The DRAM model
//! only answers "what rate does each side get now"; the decode process re-rates the
//! running jobs when the answer changes.

/// Who reads host DRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DramUser {
    /// The DMA engine serving host-to-device copies.
    Dma,
    /// The CPU expert kernels.
    Cpu,
}

/// Bandwidths of the two readers, alone and together, in GB/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DramParams {
    /// Gather bandwidth with the CPU idle, GB/s.
    pub dma_isolated_gbs: f64,
    /// Gather bandwidth while the CPU kernels run, GB/s.
    pub dma_contended_gbs: f64,
    /// CPU expert bandwidth with no DMA running, GB/s.
    pub cpu_isolated_gbs: f64,
    /// CPU expert bandwidth while a gather runs, GB/s.
    pub cpu_contended_gbs: f64,
}

/// Which readers are active now.
#[derive(Debug, Clone, Copy)]
pub struct Dram {
    params: DramParams,
    dma: bool,
    cpu: bool,
}

impl Dram {
    /// DRAM with no reader active.
    pub fn new(params: DramParams) -> Self {
        Dram {
            params,
            dma: false,
            cpu: false,
        }
    }

    /// The bandwidths.
    pub fn params(&self) -> &DramParams {
        &self.params
    }

    /// Mark `user` active or idle; returns true when the other user's rate changed.
    pub fn set_active(&mut self, user: DramUser, active: bool) -> bool {
        let (me, other) = match user {
            DramUser::Dma => (&mut self.dma, self.cpu),
            DramUser::Cpu => (&mut self.cpu, self.dma),
        };
        let changed = *me != active;
        *me = active;
        changed && other
    }

    /// True while `user` is active.
    pub fn is_active(&self, user: DramUser) -> bool {
        match user {
            DramUser::Dma => self.dma,
            DramUser::Cpu => self.cpu,
        }
    }

    /// The bandwidth `user` gets now (assuming it is active), GB/s.
    pub fn rate_gbs(&self, user: DramUser) -> f64 {
        match user {
            DramUser::Dma if self.cpu => self.params.dma_contended_gbs,
            DramUser::Dma => self.params.dma_isolated_gbs,
            DramUser::Cpu if self.dma => self.params.cpu_contended_gbs,
            DramUser::Cpu => self.params.cpu_isolated_gbs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_side_slows_only_while_the_other_runs() {
        let mut d = Dram::new(DramParams {
            dma_isolated_gbs: 13.09,
            dma_contended_gbs: 8.41,
            cpu_isolated_gbs: 29.97,
            cpu_contended_gbs: 21.89,
        });
        assert_eq!(d.rate_gbs(DramUser::Dma), 13.09);
        assert!(
            !d.set_active(DramUser::Dma, true),
            "CPU idle: nothing to re-rate"
        );
        assert_eq!(d.rate_gbs(DramUser::Cpu), 21.89);
        assert!(
            d.set_active(DramUser::Cpu, true),
            "DMA active: it must be re-rated"
        );
        assert_eq!(d.rate_gbs(DramUser::Dma), 8.41);
        assert!(!d.set_active(DramUser::Cpu, true), "no change");
        assert!(d.set_active(DramUser::Dma, false));
        assert_eq!(d.rate_gbs(DramUser::Cpu), 29.97);
        assert!(d.is_active(DramUser::Cpu) && !d.is_active(DramUser::Dma));
    }
}
