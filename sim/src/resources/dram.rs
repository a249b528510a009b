//! Host DRAM, shared by the CPU expert kernels and the DMA engine that serves gathers.
//!
//! Both read the experts' weights from host memory. Alone, each reaches its isolated
//! bandwidth (the link's gather bandwidth, the CPU kernel's MoE bandwidth); while both are
//! active each gets its contended bandwidth, as the perf cost terms give them (measured on
//! the gen-3 host: 13.09 -> 8.41 GB/s gather, 29.97 -> 21.89 GB/s CPU). The DRAM model
//! only answers "what rate does each side get now"; the decode process re-rates the
//! running jobs when the answer changes.
//!
//! With several GPUs each GPU's lane has its own `Dram` view of the one host DRAM: its own
//! DMA (its link) and CPU share, and the summed demand of the other lanes' active readers
//! ([`Dram::set_others`]). Each side's rate then comes from ft-model's
//! [`dram_shares`](ft_model::perf::PerfParams::dram_shares) of the summed demands (as the
//! analytic model's [`overlapped_gpus`](ft_model::perf::PerfParams::overlapped_gpus)
//! shares them), split over the side's readers in proportion to their demands. With no
//! other lane active (one GPU) the rates are the fixed ones of [`DramParams`], unchanged.

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

/// The shared DRAM of several lanes: its bandwidth and DMA weight (as in
/// [`ft_model::perf::PerfParams`]) and what the other lanes ask for now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedDram {
    /// `dram_gbs` of the perf parameters, GB/s.
    pub dram_gbs: f64,
    /// `dma_dram_weight`, dimensionless.
    pub dma_weight: f64,
    /// Summed isolated demand of the other lanes' active CPU shares, GB/s.
    pub others_cpu_gbs: f64,
    /// Summed isolated demand of the other lanes' active links, GB/s.
    pub others_dma_gbs: f64,
}

/// Which readers are active now.
#[derive(Debug, Clone, Copy)]
pub struct Dram {
    params: DramParams,
    dma: bool,
    cpu: bool,
    shared: Option<SharedDram>,
}

impl Dram {
    /// DRAM with no reader active.
    pub fn new(params: DramParams) -> Self {
        Dram {
            params,
            dma: false,
            cpu: false,
            shared: None,
        }
    }

    /// One lane's view of DRAM shared with other lanes (see the module docs).
    pub fn shared(params: DramParams, dram_gbs: f64, dma_weight: f64) -> Self {
        Dram {
            shared: Some(SharedDram {
                dram_gbs,
                dma_weight,
                others_cpu_gbs: 0.0,
                others_dma_gbs: 0.0,
            }),
            ..Dram::new(params)
        }
    }

    /// This lane's isolated demand of `user` while active, GB/s.
    pub fn demand_gbs(&self, user: DramUser) -> f64 {
        match user {
            DramUser::Dma => self.params.dma_isolated_gbs,
            DramUser::Cpu => self.params.cpu_isolated_gbs,
        }
    }

    /// Set what the other lanes ask for now (a no-op for unshared DRAM).
    pub fn set_others(&mut self, cpu_gbs: f64, dma_gbs: f64) {
        if let Some(s) = self.shared.as_mut() {
            s.others_cpu_gbs = cpu_gbs;
            s.others_dma_gbs = dma_gbs;
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
        if let Some(s) = self.shared {
            if s.others_cpu_gbs > 0.0 || s.others_dma_gbs > 0.0 {
                let own = |u: DramUser, active: bool| {
                    if active || u == user {
                        self.demand_gbs(u)
                    } else {
                        0.0
                    }
                };
                let c = s.others_cpu_gbs + own(DramUser::Cpu, self.cpu);
                let d = s.others_dma_gbs + own(DramUser::Dma, self.dma);
                let (cs, ds) = ft_model::perf::cost::dram_shares_of(s.dram_gbs, s.dma_weight, c, d);
                return match user {
                    DramUser::Cpu => cs * (self.demand_gbs(user) / c),
                    DramUser::Dma => ds * (self.demand_gbs(user) / d),
                };
            }
        }
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
    fn shared_dram_splits_the_summed_demand() {
        let p = DramParams {
            dma_isolated_gbs: 24.0,
            dma_contended_gbs: 20.0,
            cpu_isolated_gbs: 30.0,
            cpu_contended_gbs: 25.0,
        };
        let mut d = Dram::shared(p, 60.0, 1.0);
        // Nobody else: the fixed single-lane rates.
        d.set_active(DramUser::Dma, true);
        assert_eq!(d.rate_gbs(DramUser::Dma), 24.0);
        // Another lane's link and CPU share read too: 30 + 30 CPU and 24 + 24 DMA ask for
        // 108 of 60 GB/s; proportional sharing gives each reader 60/108 of its demand.
        d.set_others(30.0, 24.0);
        d.set_active(DramUser::Cpu, true);
        let k = 60.0 / 108.0;
        assert!((d.rate_gbs(DramUser::Dma) - 24.0 * k).abs() < 1e-9);
        assert!((d.rate_gbs(DramUser::Cpu) - 30.0 * k).abs() < 1e-9);
        // Only DMA everywhere: no contention (as on one GPU).
        d.set_active(DramUser::Cpu, false);
        d.set_others(0.0, 24.0);
        assert_eq!(d.rate_gbs(DramUser::Dma), 24.0);
    }

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
