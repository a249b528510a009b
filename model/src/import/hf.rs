//! A Hugging Face `config.json` as a [`ModelSpec`].
//!
//! The MoE families differ in their key names (`num_experts`, `num_local_experts`,
//! `n_routed_experts`; `moe_intermediate_size` or `intermediate_size`) and in which layers
//! are MoE layers (DeepSeek's and GLM's first `first_k_dense_replace` layers are dense;
//! Qwen's `decoder_sparse_step` and `mlp_only_layers`). [`HfConfig`] reads every spelling;
//! [`import`] turns it into the geometry, the format (from `quantization_config`, else the
//! weights' dtype) and the dense bytes of one MoE layer.

use serde::Deserialize;
use std::path::Path;

use super::MAX_CONFIG_BYTES;
use super::{invalid, stem, ImportKind, ImportOptions, Imported, DENSE_BYTES_PER_WEIGHT};
use crate::error::{ModelError, Result};
use crate::format::{ExpertFormat, GgmlQuant};
use crate::geometry::MoeGeometry;
use crate::preset::{DenseSpec, ModelSpec};

/// The keys of a `config.json` that decide the geometry. Unknown keys are accepted on
/// purpose: this is a foreign file with dozens of keys `ft` has no use for (rope scaling,
/// token ids, ...), unlike `ft`'s own TOML inputs.
#[derive(Debug, Default, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    #[serde(rename = "_name_or_path")]
    name_or_path: Option<String>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    moe_intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    #[serde(alias = "num_local_experts", alias = "n_routed_experts")]
    num_experts: Option<usize>,
    #[serde(alias = "experts_per_token", alias = "moe_topk")]
    num_experts_per_tok: Option<usize>,
    n_shared_experts: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    first_k_dense_replace: Option<usize>,
    moe_layer_freq: Option<usize>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    kv_lora_rank: Option<usize>,
    q_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    full_attention_interval: Option<usize>,
    layer_types: Option<Vec<String>>,
    #[serde(alias = "dtype")]
    torch_dtype: Option<String>,
    quantization_config: Option<serde_json::Value>,
    /// Multimodal wrappers keep the language model's keys here.
    text_config: Option<Box<HfConfig>>,
}

/// Read `path` (at most [`MAX_CONFIG_BYTES`]) and import it.
pub(super) fn import(path: &Path, options: &ImportOptions) -> Result<Imported> {
    use std::io::Read;
    let io = |source| ModelError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(invalid(
            path,
            "size",
            format!("larger than {MAX_CONFIG_BYTES} bytes; not a config.json"),
        ));
    }
    from_str(&text, path, options)
}

/// Import a `config.json` already read; `path` names it in errors and notes.
pub(super) fn from_str(text: &str, path: &Path, options: &ImportOptions) -> Result<Imported> {
    let top: HfConfig = serde_json::from_str(text).map_err(|e| ModelError::Json {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let mut notes = Vec::new();
    // The language model's keys: the top level, or `text_config` of a multimodal wrapper.
    let (c, prefix) = match &top.text_config {
        Some(t) if top.hidden_size.is_none() => {
            notes.push("read the language model's keys from text_config".to_string());
            (t.as_ref(), "text_config.")
        }
        _ => (&top, ""),
    };
    let need = |key: &str, v: Option<usize>| {
        v.filter(|&v| v > 0)
            .ok_or_else(|| invalid(path, &format!("{prefix}{key}"), "missing or zero"))
    };
    let architecture = c
        .model_type
        .clone()
        .or_else(|| top.model_type.clone())
        .unwrap_or_else(|| "unknown".to_string());
    let hidden = need("hidden_size", c.hidden_size)?;
    let layers = need("num_hidden_layers", c.num_hidden_layers)?;
    let experts = c.num_experts.filter(|&e| e > 0).ok_or_else(|| {
        invalid(
            path,
            &format!("{prefix}num_experts"),
            "missing (also looked for num_local_experts, n_routed_experts): not a \
             mixture-of-experts model",
        )
    })?;
    let top_k = need("num_experts_per_tok", c.num_experts_per_tok)?;
    let intermediate = match c.moe_intermediate_size {
        Some(i) if i > 0 => i,
        _ => need("moe_intermediate_size", c.intermediate_size)?,
    };

    let moe_layers = moe_layer_count(c, layers);
    if moe_layers == 0 {
        return Err(invalid(
            path,
            &format!("{prefix}num_hidden_layers"),
            "no layer is a MoE layer under first_k_dense_replace / decoder_sparse_step / \
             mlp_only_layers",
        ));
    }
    if moe_layers < layers {
        notes.push(format!(
            "{moe_layers} of the {layers} layers are MoE layers; the {} dense layers are not \
             modelled",
            layers - moe_layers
        ));
    }

    // Shared experts: DeepSeek/GLM count them in units of the routed expert; Qwen gives one
    // shared FFN of its own width.
    let (shared_experts, shared_width) =
        match (c.n_shared_experts, c.shared_expert_intermediate_size) {
            (Some(n), _) if n > 0 => (n, n * intermediate),
            (_, Some(w)) if w > 0 => (1, w),
            _ => (0, 0),
        };

    let format = match options.format {
        Some(f) => f,
        None => format_of(&top, path)?,
    };
    let geometry = MoeGeometry {
        hidden,
        intermediate,
        experts,
        top_k,
        moe_layers,
        shared_experts,
    };
    let dense = dense_of(c, &geometry, shared_width, &mut notes);
    let name = top
        .name_or_path
        .as_deref()
        .and_then(|n| n.rsplit('/').next())
        .filter(|n| !n.trim().is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| stem(path));
    Ok(Imported {
        spec: ModelSpec {
            name,
            format,
            geometry,
            dense: Some(dense),
        },
        path: path.display().to_string(),
        kind: ImportKind::HfConfig,
        architecture,
        notes,
    })
}

/// MoE layers among `layers`: DeepSeek/GLM's `first_k_dense_replace` and `moe_layer_freq`,
/// Qwen's `decoder_sparse_step` and `mlp_only_layers` (as their modelling code decides).
fn moe_layer_count(c: &HfConfig, layers: usize) -> usize {
    let first_dense = c.first_k_dense_replace.unwrap_or(0);
    let freq = c.moe_layer_freq.unwrap_or(1).max(1);
    let step = c.decoder_sparse_step.unwrap_or(1).max(1);
    let mlp_only = c.mlp_only_layers.as_deref().unwrap_or(&[]);
    (0..layers)
        .filter(|&i| i >= first_dense && (i - first_dense).is_multiple_of(freq))
        .filter(|&i| (i + 1).is_multiple_of(step) && !mlp_only.contains(&i))
        .count()
}

/// The routed experts' format: `quantization_config` (mxfp4, nvfp4), else the dtype.
fn format_of(c: &HfConfig, path: &Path) -> Result<ExpertFormat> {
    if let Some(q) = &c.quantization_config {
        let text = q.to_string().to_ascii_lowercase();
        if text.contains("mxfp4") {
            return Ok(ExpertFormat::Mxfp4);
        }
        if text.contains("nvfp4") {
            return Ok(ExpertFormat::Nvfp4);
        }
        let method = q
            .get("quant_method")
            .and_then(|m| m.as_str())
            .unwrap_or("unknown");
        return Err(invalid(
            path,
            "quantization_config",
            format!(
                "quant_method '{method}' is not a format ft sizes; give the format the experts \
                 will run in with --format (bf16, q4_k, nvfp4, ...)"
            ),
        ));
    }
    match c.torch_dtype.as_deref().unwrap_or("bfloat16") {
        "bfloat16" => Ok(ExpertFormat::Bf16),
        "float16" => Ok(ExpertFormat::Ggml(GgmlQuant::F16)),
        other => Err(invalid(
            path,
            "torch_dtype",
            format!("'{other}' is not a format ft sizes; give one with --format"),
        )),
    }
}

/// The dense bytes of one MoE layer: attention projections (grouped-query or DeepSeek's
/// multi-head latent attention), the router and the shared experts, in bf16; and the KV
/// bytes per token, averaged over layers (layers of linear or sliding-window attention keep
/// no growing cache).
fn dense_of(
    c: &HfConfig,
    g: &MoeGeometry,
    shared_width: usize,
    notes: &mut Vec<String>,
) -> DenseSpec {
    let h = g.hidden as u64;
    let b = DENSE_BYTES_PER_WEIGHT;
    let router = g.experts as u64 * h;
    let shared = 3 * h * shared_width as u64;
    let Some(heads) = c.num_attention_heads.filter(|&n| n > 0) else {
        notes.push(
            "num_attention_heads is missing: the dense part is DenseSpec::estimate's".to_string(),
        );
        return DenseSpec::estimate(g);
    };
    let heads = heads as u64;
    let (attention, kv_per_token) = match (c.kv_lora_rank, c.qk_rope_head_dim) {
        (Some(kv), Some(rope)) if kv > 0 => {
            let (kv, rope) = (kv as u64, rope as u64);
            let nope = c.qk_nope_head_dim.unwrap_or(128) as u64;
            let v = c.v_head_dim.unwrap_or(128) as u64;
            let q = match c.q_lora_rank {
                Some(r) if r > 0 => h * r as u64 + r as u64 * heads * (nope + rope),
                _ => h * heads * (nope + rope),
            };
            let attention = q + h * (kv + rope) + kv * heads * (nope + v) + heads * v * h;
            (attention, (kv + rope) * b)
        }
        _ => {
            let hd = c.head_dim.unwrap_or(g.hidden / heads as usize).max(1) as u64;
            let kvh = c.num_key_value_heads.unwrap_or(heads as usize) as u64;
            let attention = 2 * h * heads * hd + 2 * h * kvh * hd;
            (attention, 2 * kvh * hd * b)
        }
    };
    // Layers whose KV cache grows with the context.
    let layers = c.num_hidden_layers.unwrap_or(1).max(1) as u64;
    let full = if let Some(types) = &c.layer_types {
        types
            .iter()
            .filter(|t| t.as_str() == "full_attention")
            .count() as u64
    } else if let Some(n) = c.full_attention_interval.filter(|&n| n > 0) {
        layers / n as u64
    } else {
        layers
    };
    let kv = if full < layers {
        notes.push(format!(
            "{full} of {layers} layers keep a KV cache that grows with the context (the others \
             use linear or sliding-window attention): kv_bytes_per_token is their average"
        ));
        kv_per_token * full / layers
    } else {
        kv_per_token
    };
    DenseSpec {
        weight_bytes_per_layer: b * (attention + router + shared),
        kv_bytes_per_token: kv,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(json: &str) -> Result<Imported> {
        from_str(json, Path::new("config.json"), &ImportOptions::default())
    }

    /// Qwen3-30B-A3B's published config (the keys that matter).
    const QWEN3_MOE: &str = r#"{
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "torch_dtype": "bfloat16",
        "rope_scaling": null, "vocab_size": 151936
    }"#;

    #[test]
    fn qwen3_moe() {
        let m = import(QWEN3_MOE).unwrap();
        let g = m.spec.geometry;
        assert_eq!(
            (
                g.hidden,
                g.intermediate,
                g.experts,
                g.top_k,
                g.moe_layers,
                g.shared_experts
            ),
            (2048, 768, 128, 8, 48, 0)
        );
        assert_eq!(m.spec.format, ExpertFormat::Bf16);
        assert_eq!(m.architecture, "qwen3_moe");
        let d = m.spec.dense.unwrap();
        // q and o: 2048 x 4096 each; k and v: 2048 x 512 each; router 128 x 2048; bf16.
        let weights = 2 * 2048 * 4096 + 2 * 2048 * 512 + 128 * 2048;
        assert_eq!(d.weight_bytes_per_layer, 2 * weights);
        assert_eq!(d.kv_bytes_per_token, 2 * 4 * 128 * 2);
        assert!(m.notes.is_empty(), "{:?}", m.notes);
    }

    #[test]
    fn deepseek_v3_counts_its_dense_layers_and_latent_attention() {
        let json = r#"{
            "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "num_hidden_layers": 61, "n_routed_experts": 256,
            "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3,
            "moe_layer_freq": 1, "num_attention_heads": 128, "num_key_value_heads": 128,
            "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "torch_dtype": "bfloat16"
        }"#;
        let m = import(json).unwrap();
        let g = m.spec.geometry;
        assert_eq!(
            (g.experts, g.top_k, g.moe_layers, g.shared_experts),
            (256, 8, 58, 1)
        );
        assert_eq!(m.spec.dense.unwrap().kv_bytes_per_token, (512 + 64) * 2);
        assert!(
            m.notes.iter().any(|n| n.contains("58 of the 61")),
            "{:?}",
            m.notes
        );
        // FP8 checkpoints have no ft format: the error says to pass --format.
        let fp8 = json.replace(
            "\"torch_dtype\"",
            "\"quantization_config\": {\"quant_method\": \"fp8\"}, \"torch_dtype\"",
        );
        let e = import(&fp8).unwrap_err().to_string();
        assert!(
            e.contains("quantization_config") && e.contains("--format"),
            "{e}"
        );
        let q4k = from_str(
            &fp8,
            Path::new("config.json"),
            &ImportOptions {
                format: Some("q4_k".parse().unwrap()),
                name: None,
            },
        )
        .unwrap();
        assert_eq!(q4k.spec.expert_bytes(), 3 * 2048 * 7168 / 256 * 144);
    }

    #[test]
    fn gpt_oss_mixtral_qwen3_next_and_glm() {
        let gpt_oss = r#"{
            "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
            "num_hidden_layers": 36, "num_local_experts": 128, "experts_per_token": 4,
            "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                            "full_attention"],
            "quantization_config": {"quant_method": "mxfp4"}
        }"#;
        let m = import(gpt_oss).unwrap();
        assert_eq!(m.spec.format, ExpertFormat::Mxfp4);
        assert_eq!((m.spec.geometry.experts, m.spec.geometry.top_k), (128, 4));
        // The published gpt-oss-120b preset has the same routed geometry.
        let preset = ModelSpec::preset("gpt-oss-120b").unwrap();
        assert_eq!(m.spec.expert_bytes(), preset.expert_bytes());

        let mixtral = r#"{
            "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_local_experts": 8, "num_experts_per_tok": 2,
            "num_attention_heads": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16"
        }"#;
        let m = import(mixtral).unwrap();
        assert_eq!(
            (m.spec.geometry.intermediate, m.spec.geometry.moe_layers),
            (14336, 32)
        );

        let next = r#"{
            "model_type": "qwen3_next", "hidden_size": 2048, "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512, "num_hidden_layers": 48,
            "num_experts": 512, "num_experts_per_tok": 10, "full_attention_interval": 4,
            "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256
        }"#;
        let m = import(next).unwrap();
        assert_eq!(m.spec.geometry.shared_experts, 1);
        assert_eq!(
            m.spec.dense.unwrap().kv_bytes_per_token,
            2 * 2 * 256 * 2 / 4
        );

        let glm = r#"{
            "model_type": "glm4_moe", "hidden_size": 5120, "moe_intermediate_size": 1536,
            "intermediate_size": 12288, "num_hidden_layers": 92, "n_routed_experts": 160,
            "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3,
            "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128
        }"#;
        let m = import(glm).unwrap();
        // The glm-4.7 preset: 160 experts, top 8, 89 MoE layers, one shared expert.
        let preset = ModelSpec::preset("glm-4.7").unwrap();
        assert_eq!(m.spec.geometry, preset.geometry);
    }

    #[test]
    fn errors_name_the_key() {
        let e = import(r#"{"hidden_size": 4096, "num_hidden_layers": 32}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("num_experts") && e.contains("config.json"),
            "{e}"
        );
        let e = import("{not json").unwrap_err().to_string();
        assert!(e.contains("config.json"), "{e}");
        let e =
            import(&QWEN3_MOE.replace("\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 0"))
                .unwrap_err()
                .to_string();
        assert!(e.contains("num_experts_per_tok"), "{e}");
    }

    #[test]
    fn a_multimodal_wrapper_reads_text_config() {
        let json = format!(r#"{{"model_type": "qwen3_vl_moe", "text_config": {QWEN3_MOE}}}"#);
        let m = import(&json).unwrap();
        assert_eq!(m.spec.geometry.experts, 128);
        assert!(m.notes.iter().any(|n| n.contains("text_config")));
    }
}
