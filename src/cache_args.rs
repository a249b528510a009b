//! The expert cache's options on the command line, one definition for every command that
//! builds a cache (`predict`, `simulate`, `run`, `probe`, `serve` flatten [`CacheArgs`]), so
//! the cache a prediction assumes, a simulation times and an engine runs is chosen the same
//! way. The options themselves, their defaults and their checks are the library's
//! ([`CacheOptions`]); the size stays with each command's own flags (`--cache-slots`,
//! `--cache-gb`, `--miss-rate`), which `--cache-slots-per-layer` replaces.

use anyhow::{bail, Context, Result};
use ft_model::cache::{CacheOptions, CachePolicy, CacheTopology};
use ft_model::plan::AdmissionPolicy;

/// The cache flags every command that builds an expert cache takes.
#[derive(Debug, Clone, clap::Args)]
pub struct CacheArgs {
    /// Cache replacement policy: lru, lfu or static-hot.
    #[arg(long, alias = "policy", default_value = "lru", value_name = "POLICY")]
    pub cache_policy: String,
    /// How layers share the cache's slots: global (one pool, FreeToken's; the default) or
    /// per-layer (equal partitions, llama.cpp's `--moe-expert-cache N`; a size is rounded
    /// down to a multiple of the layers; the default with --cache-slots-per-layer).
    #[arg(long, value_name = "TOPOLOGY")]
    pub cache_topology: Option<String>,
    /// Slots of each layer's partition: the cache is N x the MoE layers, per layer unless
    /// --cache-topology says global (then one pool of that size). Replaces the size flags.
    #[arg(long, value_name = "N")]
    pub cache_slots_per_layer: Option<usize>,
    /// Which misses hybrid fetches into the cache: tokens (most tokens first), recent (most
    /// recently requested first) or order (by expert id); `,cached-history` makes the
    /// misses computed on the CPU no part of the request history.
    #[arg(long, default_value = "tokens", value_name = "ORDER[,cached-history]")]
    pub admission: String,
}

impl Default for CacheArgs {
    fn default() -> Self {
        CacheArgs {
            cache_policy: "lru".into(),
            cache_topology: None,
            cache_slots_per_layer: None,
            admission: "tokens".into(),
        }
    }
}

impl CacheArgs {
    /// The options these flags ask for. `size_flag` names the size flag the command was
    /// also given, if any: it and `--cache-slots-per-layer` cannot both set the size.
    pub fn options(&self, size_flag: Option<&str>) -> Result<CacheOptions> {
        let policy: CachePolicy = self.cache_policy.parse().context("--cache-policy")?;
        let topology: CacheTopology = match (&self.cache_topology, self.cache_slots_per_layer) {
            (Some(t), _) => t.parse().context("--cache-topology")?,
            (None, Some(_)) => CacheTopology::PerLayer,
            (None, None) => CacheTopology::Global,
        };
        let admission: AdmissionPolicy = self.admission.parse().context("--admission")?;
        if let (Some(n), Some(flag)) = (self.cache_slots_per_layer, size_flag) {
            bail!("--cache-slots-per-layer {n} and {flag} both size the cache: give one");
        }
        let options = CacheOptions {
            policy,
            topology,
            slots_per_layer: self.cache_slots_per_layer,
            admission,
        };
        if self.cache_slots_per_layer.is_some() {
            // Refuse 0 (and an overflow) before any work.
            options.fit_slots(1, 1)?;
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ft_model::plan::AdmissionOrder;

    #[test]
    fn flags_become_the_options_and_bad_ones_name_their_flag() {
        let o = CacheArgs::default().options(None).unwrap();
        assert_eq!(o, CacheOptions::default());
        let args = CacheArgs {
            cache_policy: "lfu".into(),
            cache_topology: None,
            cache_slots_per_layer: Some(8),
            admission: "recent,cached-history".into(),
        };
        let o = args.options(None).unwrap();
        assert_eq!(o.policy, CachePolicy::Lfu { decay_every: 0 });
        assert_eq!(o.topology, CacheTopology::PerLayer);
        assert_eq!(o.fit_slots(1000, 4).unwrap(), 32);
        assert_eq!(o.admission.order, AdmissionOrder::Recent);
        assert!(!o.admission.cpu_history);
        let e = format!("{:#}", args.options(Some("--cache-gb")).unwrap_err());
        assert!(
            e.contains("--cache-slots-per-layer") && e.contains("--cache-gb"),
            "{e}"
        );
        let global = CacheArgs {
            cache_topology: Some("global".into()),
            ..args.clone()
        };
        assert_eq!(
            global.options(None).unwrap().topology,
            CacheTopology::Global
        );
        for (field, bad, flag) in [
            (0, "mru", "--cache-policy"),
            (1, "ring", "--cache-topology"),
            (2, "weights", "--admission"),
        ] {
            let mut a = CacheArgs {
                cache_topology: Some("global".into()),
                ..CacheArgs::default()
            };
            let t = a.cache_topology.as_mut().unwrap();
            *[&mut a.cache_policy, t, &mut a.admission][field] = bad.into();
            let e = format!("{:#}", a.options(None).unwrap_err());
            assert!(e.contains(flag) && e.contains(bad), "{e}");
        }
        let zero = CacheArgs {
            cache_slots_per_layer: Some(0),
            ..CacheArgs::default()
        };
        let e = format!("{:#}", zero.options(None).unwrap_err());
        assert!(e.contains("--cache-slots-per-layer"), "{e}");
    }
}
