//! Model specifications: built-in presets by name, or a TOML file.
//!
//! A [`ModelSpec`] is what every subcommand means by `--model`: the routed-expert geometry,
//! the expert format, and the dense part of each layer (attention, router, shared experts)
//! whose cost grows with context length.

use serde::{Deserialize, Serialize};
use std::path::Path;

use crate::error::{ModelError, Result};
use crate::format::ExpertFormat;
use crate::geometry::MoeGeometry;

/// The non-expert part of each MoE layer, as bytes the GPU reads per decode step.
///
/// Attention and dense layers are memory-bound at decode: their time is these bytes over
/// the GPU's memory bandwidth, plus a launch cost. Context length enters through the KV
/// bytes each stream reads per layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenseSpec {
    /// Bytes of dense weights (attention projections, router, norms, shared experts) read
    /// per layer per step, shared by all streams of the step.
    pub weight_bytes_per_layer: u64,
    /// Bytes of KV cache read per token of context, per layer and per stream.
    pub kv_bytes_per_token: u64,
}

impl DenseSpec {
    /// A documented estimate from the geometry, used where a preset or file gives none:
    /// grouped-query attention with 8 query heads per KV head in bf16 (q and o are
    /// `hidden x hidden`, k and v `hidden/8 x hidden`), a bf16 router, the shared experts in
    /// bf16, and a bf16 KV cache of `2 * hidden / 8` elements per token.
    pub fn estimate(g: &MoeGeometry) -> Self {
        let h = g.hidden as u64;
        let attention = 2 * h * h + 2 * (h / 8) * h;
        let router = g.experts as u64 * h;
        let shared = g.shared_experts as u64 * g.expert_params();
        DenseSpec {
            weight_bytes_per_layer: 2 * (attention + router + shared),
            kv_bytes_per_token: 2 * 2 * (h / 8),
        }
    }
}

/// A model as `ft` sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Name shown in tables and used as part of a profile's key.
    pub name: String,
    /// Format of the routed experts.
    pub format: ExpertFormat,
    /// Routed-expert geometry.
    pub geometry: MoeGeometry,
    /// Dense part of each layer; estimated from the geometry when absent.
    #[serde(default)]
    pub dense: Option<DenseSpec>,
}

/// One row of the built-in preset table: name, hidden, intermediate, experts, top-k,
/// MoE layers, shared experts, format.
type PresetRow = (
    &'static str,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    ExpertFormat,
);

/// Built-in presets. Geometries are the issue's; shared-expert counts follow the public
/// model cards where they have one (Qwen-Next, DeepSeek and GLM families), else 0.
const PRESETS: &[PresetRow] = &[
    // The field report's model: 2.77 MB nvfp4 experts.
    (
        "qwen3.8-flash-next",
        2560,
        640,
        512,
        10,
        48,
        1,
        ExpertFormat::Nvfp4,
    ),
    (
        "qwen3.6-35b-a3b",
        2048,
        512,
        256,
        8,
        40,
        0,
        ExpertFormat::Nvfp4,
    ),
    (
        "deepseek-v4-flash",
        4096,
        2048,
        256,
        6,
        43,
        1,
        ExpertFormat::Nvfp4,
    ),
    (
        "gpt-oss-120b",
        2880,
        2880,
        128,
        4,
        36,
        0,
        ExpertFormat::Mxfp4,
    ),
    (
        "gemma-4-26b-a4b",
        2816,
        704,
        128,
        8,
        30,
        0,
        ExpertFormat::Nvfp4,
    ),
    (
        "minimax-m2.5",
        3072,
        1536,
        256,
        8,
        62,
        0,
        ExpertFormat::Nvfp4,
    ),
    ("glm-4.7", 5120, 1536, 160, 8, 89, 1, ExpertFormat::Nvfp4),
    // The reference engine's nvfp4 tuning geometry (7.97 MB experts); its layer count is
    // not part of the bench, 48 is used so that it can also be run end to end.
    (
        "bench-nvfp4",
        3072,
        1536,
        128,
        8,
        48,
        0,
        ExpertFormat::Nvfp4,
    ),
];

impl ModelSpec {
    /// Names of the built-in presets.
    pub fn preset_names() -> Vec<&'static str> {
        PRESETS.iter().map(|p| p.0).collect()
    }

    /// A built-in preset by name.
    pub fn preset(name: &str) -> Result<Self> {
        let row = PRESETS
            .iter()
            .find(|p| p.0 == name)
            .ok_or_else(|| ModelError::UnknownName {
                kind: "model preset",
                name: name.to_string(),
                known: Self::preset_names().join(", "),
            })?;
        let (name, hidden, intermediate, experts, top_k, moe_layers, shared_experts, format) = *row;
        let spec = ModelSpec {
            name: name.to_string(),
            format,
            geometry: MoeGeometry {
                hidden,
                intermediate,
                experts,
                top_k,
                moe_layers,
                shared_experts,
            },
            dense: None,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Parse a TOML document; unknown keys are refused. `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self> {
        crate::error::parse_toml(text, origin, Self::validate)
    }

    /// Load a model from a TOML file.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = crate::error::read_text(path)?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// A preset name, or else a path: a model TOML file, or a file [`crate::import`] reads
    /// (a Hugging Face `config.json` or its directory, a `.gguf` file).
    pub fn resolve(name_or_path: &str) -> Result<Self> {
        let path = Path::new(name_or_path);
        if crate::import::is_importable(path) {
            let options = crate::import::ImportOptions::default();
            return Ok(crate::import::import_path(path, &options)?.spec);
        }
        if name_or_path.ends_with(".toml") || path.exists() {
            Self::from_toml_file(path)
        } else {
            Self::preset(name_or_path)
        }
    }

    /// Validate the geometry against the format.
    pub fn validate(&self) -> Result<()> {
        use crate::limits::{self, check};
        if self.name.trim().is_empty() {
            return Err(ModelError::invalid("name", "must not be empty"));
        }
        self.geometry.validate(self.format)?;
        if let Some(d) = &self.dense {
            check(
                "dense.weight_bytes_per_layer",
                d.weight_bytes_per_layer,
                limits::MAX_DENSE_BYTES_PER_LAYER,
                "ft_model::limits::MAX_DENSE_BYTES_PER_LAYER",
            )?;
            check(
                "dense.kv_bytes_per_token",
                d.kv_bytes_per_token,
                limits::MAX_KV_BYTES_PER_TOKEN,
                "ft_model::limits::MAX_KV_BYTES_PER_TOKEN",
            )?;
        }
        Ok(())
    }

    /// Bytes of one routed expert.
    pub fn expert_bytes(&self) -> u64 {
        self.geometry.expert_bytes(self.format)
    }

    /// The dense part, given or estimated.
    pub fn dense(&self) -> DenseSpec {
        self.dense
            .unwrap_or_else(|| DenseSpec::estimate(&self.geometry))
    }

    /// The same model with fewer MoE layers.
    pub fn with_layers(&self, layers: usize) -> Self {
        ModelSpec {
            geometry: self.geometry.with_layers(layers),
            ..self.clone()
        }
    }

    /// The same model with its first `layers` MoE layers (what `--layers N` runs): an error
    /// naming `--layers` unless `layers` is 1 to the model's count.
    pub fn first_layers(&self, layers: usize) -> Result<Self> {
        let all = self.geometry.moe_layers;
        if layers == 0 || layers > all {
            return Err(ModelError::invalid(
                format!("--layers {layers}"),
                format!("{} has 1 to {all} MoE layers", self.name),
            ));
        }
        Ok(self.with_layers(layers))
    }

    /// The same model in another expert format.
    pub fn with_format(&self, format: ExpertFormat) -> Self {
        ModelSpec {
            format,
            ..self.clone()
        }
    }

    /// Render as TOML (the form [`ModelSpec::from_toml_str`] reads).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a ModelSpec always serializes")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn first_layers_keeps_the_geometry_and_refuses_counts_it_lacks() {
        let m = super::ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let two = m.first_layers(2).unwrap();
        assert_eq!(two.geometry.moe_layers, 2);
        assert_eq!(two.geometry.hidden, m.geometry.hidden);
        assert_eq!(m.first_layers(48).unwrap().geometry, m.geometry);
        for bad in [0, 49] {
            let e = m.first_layers(bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!("--layers {bad}")) && e.contains("1 to 48"),
                "{e}"
            );
        }
    }

    use super::*;

    /// Pins the exact bytes per expert of every preset in every format.
    #[test]
    fn every_preset_byte_size_is_pinned() {
        let expected: &[(&str, [u64; 5])] = &[
            // bf16, int8, q4_0, nvfp4, mxfp4 (computed independently from the layouts)
            (
                "qwen3.8-flash-next",
                [9830400, 4930560, 2764800, 2772480, 2611200],
            ),
            (
                "qwen3.6-35b-a3b",
                [6291456, 3158016, 1769472, 1775616, 1671168],
            ),
            (
                "deepseek-v4-flash",
                [50331648, 25198592, 14155776, 14172160, 13369344],
            ),
            (
                "gpt-oss-120b",
                [49766400, 24917760, 13996800, 14014080, 13219200],
            ),
            (
                "gemma-4-26b-a4b",
                [11894784, 5964288, 3345408, 3353856, 3159552],
            ),
            (
                "minimax-m2.5",
                [28311552, 14180352, 7962624, 7974912, 7520256],
            ),
            (
                "glm-4.7",
                [47185920, 23625728, 13271040, 13287424, 12533760],
            ),
            (
                "bench-nvfp4",
                [28311552, 14180352, 7962624, 7974912, 7520256],
            ),
        ];
        assert_eq!(expected.len(), ModelSpec::preset_names().len());
        for (name, sizes) in expected {
            let spec = ModelSpec::preset(name).unwrap();
            for (format, bytes) in ExpertFormat::ALL.into_iter().zip(sizes) {
                spec.geometry.validate(format).unwrap();
                assert_eq!(
                    spec.geometry.expert_bytes(format),
                    *bytes,
                    "{name} in {format}"
                );
            }
        }
        // The two numbers the issue names.
        assert_eq!(
            ModelSpec::preset("qwen3.8-flash-next")
                .unwrap()
                .expert_bytes(),
            2_772_480
        );
        assert_eq!(
            ModelSpec::preset("bench-nvfp4").unwrap().expert_bytes(),
            7_974_912
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Field values from the edges inward: zero, small, around the limits, the largest
        /// integers TOML holds, negatives.
        fn field() -> impl Strategy<Value = i128> {
            prop_oneof![
                0i128..=4,
                1i128..=100_000,
                Just(crate::limits::MAX_WIDTH as i128),
                Just(crate::limits::MAX_WIDTH as i128 + 32),
                Just(i64::MAX as i128),
                Just(u32::MAX as i128 + 1),
                -5i128..0,
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Any text: a model or an error that names the origin, never a panic.
            #[test]
            fn any_text_gives_a_model_or_a_named_error(text in "\\PC{0,200}") {
                match ModelSpec::from_toml_str(&text, "fuzz.toml") {
                    Ok(m) => prop_assert!(m.validate().is_ok()),
                    Err(e) => prop_assert!(e.to_string().contains("fuzz.toml"), "{}", e),
                }
            }

            /// Any geometry numbers: a model whose byte counts are exact (checked, not
            /// saturated) and within the limits, or an error naming a key.
            #[test]
            fn any_geometry_is_valid_with_exact_bytes_or_refused(
                hidden in field(), intermediate in field(), experts in field(),
                top_k in field(), layers in field(), shared in field(),
                format in prop::sample::select(ExpertFormat::ALL.to_vec()),
                kv in field(), dense in field(),
            ) {
                let text = format!(
                    "name = \"p\"\nformat = \"{format}\"\n[geometry]\nhidden = {hidden}\n\
                     intermediate = {intermediate}\nexperts = {experts}\ntop_k = {top_k}\n\
                     moe_layers = {layers}\nshared_experts = {shared}\n[dense]\n\
                     weight_bytes_per_layer = {dense}\nkv_bytes_per_token = {kv}\n"
                );
                match ModelSpec::from_toml_str(&text, "geo.toml") {
                    Ok(m) => {
                        let g = m.geometry;
                        prop_assert!(g.experts <= crate::limits::MAX_EXPERTS);
                        prop_assert!(g.total_experts() <= crate::limits::MAX_TOTAL_EXPERTS);
                        let total = m.geometry.checked_total_expert_bytes(m.format);
                        prop_assert!(total.is_ok());
                        prop_assert!(total.unwrap() < u64::MAX);
                        prop_assert!(m.expert_bytes() > 0);
                    }
                    Err(e) => prop_assert!(e.to_string().contains("geo.toml"), "{}", e),
                }
            }

            /// A preset's own TOML with bytes replaced: never a panic.
            #[test]
            fn mutated_preset_toml_never_panics(
                preset in prop::sample::select(ModelSpec::preset_names()),
                edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            ) {
                let mut bytes = ModelSpec::preset(preset).unwrap().to_toml().into_bytes();
                for (at, b) in edits {
                    let i = at.index(bytes.len());
                    bytes[i] = b;
                }
                let text = String::from_utf8_lossy(&bytes);
                if let Ok(m) = ModelSpec::from_toml_str(&text, "mut.toml") {
                    prop_assert!(m.validate().is_ok());
                }
            }
        }
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let e = ModelSpec::preset("llama").unwrap_err().to_string();
        assert!(
            e.contains("llama") && e.contains("qwen3.8-flash-next"),
            "{e}"
        );
    }

    #[test]
    fn toml_round_trip_and_unknown_keys() {
        let spec = ModelSpec::preset("gpt-oss-120b").unwrap();
        let text = spec.to_toml();
        assert_eq!(ModelSpec::from_toml_str(&text, "x.toml").unwrap(), spec);

        let bad = text.replace("hidden = 2880", "hidden = 2880\nhiden = 3");
        let e = ModelSpec::from_toml_str(&bad, "bad.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.toml") && e.contains("hiden"), "{e}");

        let odd = text.replace("hidden = 2880", "hidden = 2881");
        let e = ModelSpec::from_toml_str(&odd, "odd.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("geometry.hidden"), "{e}");
    }

    #[test]
    fn resolve_reads_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.toml");
        let mut spec = ModelSpec::preset("qwen3.6-35b-a3b").unwrap();
        spec.name = "custom".into();
        spec.dense = Some(DenseSpec {
            weight_bytes_per_layer: 1 << 20,
            kv_bytes_per_token: 512,
        });
        std::fs::write(&path, spec.to_toml()).unwrap();
        let back = ModelSpec::resolve(path.to_str().unwrap()).unwrap();
        assert_eq!(back, spec);
        assert!(ModelSpec::resolve("/nonexistent/m.toml").is_err());
    }
}
