//! A GGUF file's header as a [`ModelSpec`].
//!
//! The geometry comes from the expert tensors themselves (`blk.N.ffn_{gate,up,down}_exps`,
//! ggml order `[cols, rows, experts]`), which every converter writes the same way, rather
//! than from per-architecture metadata keys; only top-k (`<arch>.expert_used_count`) and
//! the KV shape are metadata. The tensor types give the format ([`format_of_ggml`]), and
//! the dense bytes of a MoE layer are the sum of its other tensors' sizes, exact in the
//! file's own types.
//!
//! The header is parsed by `ferrox-gguf` ([`ferrox_gguf::GgufFile`]): it memory-maps the
//! file read-only and reads the key-value header and tensor infos, with its counts, string
//! lengths and array nesting bounded by the file's size; tensor data is never touched.

use ferrox_gguf::{GgmlType, GgufFile, GgufValue};
use std::collections::BTreeMap;
use std::path::Path;

use super::{invalid, stem, ImportKind, ImportOptions, Imported, DENSE_BYTES_PER_WEIGHT};
use crate::error::Result;
use crate::format::{ExpertFormat, GgmlQuant};
use crate::geometry::MoeGeometry;
use crate::preset::{DenseSpec, ModelSpec};

/// The format of a ggml tensor type, where `ft` sizes it: `BF16`, `Q4_0` and `MXFP4` are
/// `ft`'s own formats (same bytes per block), the others [`ExpertFormat::Ggml`]; `None` for
/// a type `ft` does not size (`F32`, ggml's 64-weight `NVFP4` blocks, unknown tags).
pub fn format_of_ggml(t: GgmlType) -> Option<ExpertFormat> {
    match t {
        GgmlType::BF16 => Some(ExpertFormat::Bf16),
        GgmlType::Q4_0 => Some(ExpertFormat::Q4_0),
        GgmlType::MXFP4 => Some(ExpertFormat::Mxfp4),
        other => {
            let tag = other.to_tag();
            GgmlQuant::ALL
                .into_iter()
                .find(|q| q.ggml_tag() == tag)
                .map(ExpertFormat::Ggml)
        }
    }
}

/// One MoE layer's expert tensors, by role.
#[derive(Debug, Default)]
struct LayerExperts {
    /// `[hidden, intermediate, experts]` of gate (or of the fused gate-up, `2 x
    /// intermediate` rows), its type and bytes.
    gate: Option<(Vec<u64>, GgmlType, u64)>,
    /// True when gate and up are one fused tensor.
    fused: bool,
    /// Types and bytes of up and down.
    others: Vec<(GgmlType, u64)>,
    /// Bytes of the layer's other tensors (attention, norms, router, shared experts).
    dense_bytes: u64,
    /// True when the layer has a shared expert (`ffn_*_shexp`).
    shared: bool,
}

/// Parse the header of `path` and import it.
pub(super) fn import(path: &Path, options: &ImportOptions) -> Result<Imported> {
    let file = GgufFile::open(path).map_err(|e| invalid(path, "header", e.to_string()))?;
    let meta = &file.metadata;
    let arch = meta
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .unwrap_or("unknown")
        .to_string();
    let key = |k: &str| format!("{arch}.{k}");
    let meta_u64 = |k: &str| meta.get(&key(k)).and_then(GgufValue::as_u64);

    let mut layers: BTreeMap<u64, LayerExperts> = BTreeMap::new();
    for t in &file.tensors {
        let Some(rest) = t.name.strip_prefix("blk.") else {
            continue;
        };
        let Some((n, role)) = rest.split_once('.') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else {
            continue;
        };
        let bytes = t.byte_len().map(|b| b as u64);
        let layer = layers.entry(n).or_default();
        let role = role.trim_end_matches(".weight");
        match role {
            "ffn_gate_exps" | "ffn_gate_up_exps" => {
                let bytes = bytes.ok_or_else(|| unsized_tensor(path, &t.name, t.dtype))?;
                layer.gate = Some((t.shape.clone(), t.dtype, bytes));
                layer.fused = role == "ffn_gate_up_exps";
            }
            "ffn_up_exps" | "ffn_down_exps" => {
                let bytes = bytes.ok_or_else(|| unsized_tensor(path, &t.name, t.dtype))?;
                layer.others.push((t.dtype, bytes));
            }
            _ => {
                if role.ends_with("_shexp") {
                    layer.shared = true;
                }
                layer.dense_bytes += bytes.unwrap_or(0);
            }
        }
    }
    let moe: Vec<(u64, &LayerExperts)> = layers
        .iter()
        .filter(|(_, l)| l.gate.is_some())
        .map(|(n, l)| (*n, l))
        .collect();
    let Some((first_n, first)) = moe.first() else {
        return Err(invalid(
            path,
            "tensors",
            "no blk.N.ffn_gate_exps (or ffn_gate_up_exps) tensor: not a mixture-of-experts model",
        ));
    };
    let (shape, _, _) = first.gate.as_ref().expect("filtered on gate");
    let [hidden, rows, experts] = shape[..] else {
        return Err(invalid(
            path,
            &format!("blk.{first_n}.ffn_gate_exps"),
            format!("shape {shape:?} is not [hidden, intermediate, experts]"),
        ));
    };
    let intermediate = if first.fused { rows / 2 } else { rows };
    let mut notes = Vec::new();
    for (n, l) in &moe {
        let (s, _, _) = l.gate.as_ref().expect("filtered on gate");
        if s != shape {
            return Err(invalid(
                path,
                &format!("blk.{n}.ffn_gate_exps"),
                format!("shape {s:?} differs from blk.{first_n}'s {shape:?}"),
            ));
        }
    }

    // The format: the type holding most expert bytes; a mix is reported with its real mean.
    let mut by_type: BTreeMap<u32, (GgmlType, u64)> = BTreeMap::new();
    for (_, l) in &moe {
        let (_, t, b) = l.gate.as_ref().expect("filtered on gate");
        for (t, b) in std::iter::once((*t, *b)).chain(l.others.iter().copied()) {
            by_type.entry(t.to_tag()).or_insert((t, 0)).1 += b;
        }
    }
    let total_bytes: u64 = by_type.values().map(|(_, b)| b).sum();
    let (main_type, _) = by_type
        .values()
        .max_by_key(|(_, b)| *b)
        .copied()
        .expect("at least one expert tensor");
    let file_format = format_of_ggml(main_type).ok_or_else(|| {
        invalid(
            path,
            &format!("blk.{first_n}.ffn_gate_exps"),
            format!("tensor type {main_type:?} is not a format ft sizes"),
        )
    })?;
    let format = options.format.unwrap_or(file_format);
    let usize_of = |v: u64, what: &str| {
        usize::try_from(v).map_err(|_| invalid(path, what, format!("{v} does not fit")))
    };
    let geometry = MoeGeometry {
        hidden: usize_of(hidden, "hidden")?,
        intermediate: usize_of(intermediate, "intermediate")?,
        experts: usize_of(experts, "experts")?,
        top_k: usize_of(
            meta_u64("expert_used_count").ok_or_else(|| {
                invalid(path, &key("expert_used_count"), "missing: the routed top-k")
            })?,
            "expert_used_count",
        )?,
        moe_layers: moe.len(),
        shared_experts: match meta_u64("expert_shared_count") {
            Some(n) => usize_of(n, "expert_shared_count")?,
            None => usize::from(first.shared),
        },
    };
    if by_type.len() > 1 {
        let mix: Vec<String> = by_type
            .values()
            .map(|(t, b)| format!("{t:?} {:.1}%", 100.0 * *b as f64 / total_bytes as f64))
            .collect();
        let real = total_bytes as f64 / (geometry.experts as f64 * moe.len() as f64);
        let modelled = geometry.expert_bytes(file_format) as f64;
        notes.push(format!(
            "the expert tensors mix types ({}): modelled as {file_format}, {:.3} MB per \
             expert against the file's mean of {:.3} MB ({:+.1}%)",
            mix.join(", "),
            modelled / 1e6,
            real / 1e6,
            100.0 * (modelled / real - 1.0)
        ));
    }
    if options.format.is_some() && format != file_format {
        notes.push(format!(
            "format {format} given; the file's experts are {file_format}"
        ));
    }

    let dense_bytes = moe.iter().map(|(_, l)| l.dense_bytes).sum::<u64>() / moe.len() as u64;
    let kv = kv_bytes_per_token(&arch, meta, &geometry, &mut notes);
    if moe.len() < layers.len() {
        notes.push(format!(
            "{} of the {} blocks are MoE layers; the {} dense blocks are not modelled",
            moe.len(),
            layers.len(),
            layers.len() - moe.len()
        ));
    }
    let name = meta
        .get("general.name")
        .and_then(GgufValue::as_str)
        .filter(|n| !n.trim().is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| stem(path));
    Ok(Imported {
        spec: ModelSpec {
            name,
            format,
            geometry,
            dense: Some(DenseSpec {
                weight_bytes_per_layer: dense_bytes,
                kv_bytes_per_token: kv,
            }),
        },
        path: path.display().to_string(),
        kind: ImportKind::Gguf,
        architecture: arch,
        notes,
    })
}

/// KV bytes per token per layer: DeepSeek's latent cache (`kv_lora_rank` plus the rope
/// part) or `head_count_kv x (key_length + value_length)`, in f16; estimated from the
/// geometry (with a note) where the keys are missing.
fn kv_bytes_per_token(
    arch: &str,
    meta: &std::collections::HashMap<String, GgufValue>,
    g: &MoeGeometry,
    notes: &mut Vec<String>,
) -> u64 {
    let get = |k: &str| {
        meta.get(&format!("{arch}.{k}")).and_then(|v| match v {
            // Per-layer arrays (some architectures): the largest entry.
            GgufValue::Array(a) => a.iter().filter_map(GgufValue::as_u64).max(),
            v => v.as_u64(),
        })
    };
    let b = DENSE_BYTES_PER_WEIGHT;
    if let (Some(kv), Some(rope)) = (get("attention.kv_lora_rank"), get("rope.dimension_count")) {
        return (kv + rope) * b;
    }
    let heads = get("attention.head_count");
    let kv_heads = get("attention.head_count_kv").or(heads);
    match kv_heads {
        Some(kvh) if kvh > 0 => {
            let head_dim = heads
                .filter(|&h| h > 0)
                .map(|h| g.hidden as u64 / h)
                .unwrap_or(128);
            let k = get("attention.key_length").unwrap_or(head_dim);
            let v = get("attention.value_length").unwrap_or(head_dim);
            kvh * (k + v) * b
        }
        _ => {
            notes.push(
                "the attention keys are missing: kv_bytes_per_token is DenseSpec::estimate's"
                    .to_string(),
            );
            DenseSpec::estimate(g).kv_bytes_per_token
        }
    }
}

fn unsized_tensor(path: &Path, tensor: &str, t: GgmlType) -> crate::error::ModelError {
    invalid(
        path,
        tensor,
        format!("tensor type {t:?} has no known block size"),
    )
}

/// Writing GGUF headers for tests (this module's and the CLI tests'), so that one writer
/// serves both. Not part of the API.
#[doc(hidden)]
pub mod test_support {
    use ferrox_gguf::writer::{encode_header, TensorPlan};
    use ferrox_gguf::{GgmlType, GgufValue};
    use std::collections::BTreeMap;
    use std::path::Path;

    /// Write a GGUF file of `meta` and `tensors` (name, ggml shape, type) to `path`: the
    /// header by ferrox-gguf's writer, then the file extended sparsely to its full length
    /// (each tensor's data 32-byte aligned) without writing any tensor data.
    pub fn write_header(
        path: &Path,
        meta: &[(&str, GgufValue)],
        tensors: Vec<(String, Vec<u64>, GgmlType)>,
    ) -> std::io::Result<()> {
        let meta: BTreeMap<String, GgufValue> = meta
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let plan: Vec<TensorPlan> = tensors
            .into_iter()
            .map(|(name, shape, dtype)| {
                let (b, l) = dtype.block_layout();
                let n: u64 = shape.iter().product();
                TensorPlan {
                    name,
                    shape,
                    dtype,
                    byte_len: (n as usize / l) * b,
                }
            })
            .collect();
        let data: usize = plan.iter().map(|t| t.byte_len.div_ceil(32) * 32).sum();
        let header = encode_header(&meta, &plan).map_err(std::io::Error::other)?;
        std::fs::write(path, &header)?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .set_len((header.len().div_ceil(32) * 32 + data) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ggml type `ft` sizes has ggml's block layout as `ferrox-gguf` tabulates it (a
    /// second, independent spelling of ggml's table).
    #[test]
    fn block_sizes_agree_with_ferrox_gguf() {
        let types = [
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q2K,
            GgmlType::Q3K,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
            GgmlType::IQ1S,
            GgmlType::IQ1M,
            GgmlType::IQ2XXS,
            GgmlType::IQ2XS,
            GgmlType::IQ2S,
            GgmlType::IQ3XXS,
            GgmlType::IQ3S,
            GgmlType::IQ4NL,
            GgmlType::IQ4XS,
            GgmlType::TQ1_0,
            GgmlType::TQ2_0,
            GgmlType::MXFP4,
        ];
        let mut seen = std::collections::HashSet::new();
        for t in types {
            let f = format_of_ggml(t).unwrap_or_else(|| panic!("{t:?} is not sized"));
            seen.insert(f);
            let (bytes, len) = t.block_layout();
            // One row of 1024 weights.
            assert_eq!(
                f.matrix_bytes(1, 1024),
                (1024 / len * bytes) as u64,
                "{t:?} as {f}"
            );
        }
        assert_eq!(seen.len(), GgmlQuant::ALL.len() + 3);
        assert_eq!(format_of_ggml(GgmlType::F32), None);
        assert_eq!(format_of_ggml(GgmlType::NVFP4), None);
    }

    /// Write a header (no tensor data: the file is extended sparsely to its full length).
    fn write(
        path: &Path,
        meta: Vec<(&str, GgufValue)>,
        tensors: Vec<(String, Vec<u64>, GgmlType)>,
    ) {
        test_support::write_header(path, &meta, tensors).unwrap();
    }

    fn moe_tensors(layers: u64, dense: u64, down: GgmlType) -> Vec<(String, Vec<u64>, GgmlType)> {
        let (h, i, e) = (512u64, 256u64, 16u64);
        let mut t = Vec::new();
        for n in 0..dense + layers {
            t.push((format!("blk.{n}.attn_q.weight"), vec![h, h], GgmlType::Q8_0));
            t.push((format!("blk.{n}.attn_norm.weight"), vec![h], GgmlType::F32));
            if n < dense {
                t.push((
                    format!("blk.{n}.ffn_up.weight"),
                    vec![h, 4 * h],
                    GgmlType::Q8_0,
                ));
                continue;
            }
            t.push((
                format!("blk.{n}.ffn_gate_inp.weight"),
                vec![h, e],
                GgmlType::F32,
            ));
            t.push((
                format!("blk.{n}.ffn_gate_exps.weight"),
                vec![h, i, e],
                GgmlType::Q4K,
            ));
            t.push((
                format!("blk.{n}.ffn_up_exps.weight"),
                vec![h, i, e],
                GgmlType::Q4K,
            ));
            t.push((format!("blk.{n}.ffn_down_exps.weight"), vec![i, h, e], down));
            t.push((
                format!("blk.{n}.ffn_up_shexp.weight"),
                vec![h, i],
                GgmlType::Q8_0,
            ));
        }
        t.push(("token_embd.weight".into(), vec![h, 1000], GgmlType::Q8_0));
        t
    }

    fn meta() -> Vec<(&'static str, GgufValue)> {
        vec![
            ("general.architecture", GgufValue::String("qwen3moe".into())),
            ("general.name", GgufValue::String("tiny-moe".into())),
            ("qwen3moe.expert_used_count", GgufValue::U32(4)),
            ("qwen3moe.attention.head_count", GgufValue::U32(8)),
            ("qwen3moe.attention.head_count_kv", GgufValue::U32(2)),
        ]
    }

    #[test]
    fn a_header_gives_geometry_format_and_dense_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write(&path, meta(), moe_tensors(3, 1, GgmlType::Q4K));
        let m = import(&path, &ImportOptions::default()).unwrap();
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
            (512, 256, 16, 4, 3, 1)
        );
        assert_eq!(m.spec.name, "tiny-moe");
        assert_eq!(m.spec.format, ExpertFormat::Ggml(GgmlQuant::Q4_K));
        // gate and up: 256 rows of 2 super-blocks; down: 512 rows of 1; 144 bytes each.
        assert_eq!(m.spec.expert_bytes(), (2 * 256 * 2 + 512) * 144);
        let d = m.spec.dense.unwrap();
        // attn_q (512 x 512 in q8_0), the norm (512 f32), the router (16 x 512 f32) and the
        // shared up (256 x 512 in q8_0).
        assert_eq!(
            d.weight_bytes_per_layer,
            512 * 512 / 32 * 34 + 512 * 4 + 16 * 512 * 4 + 256 * 512 / 32 * 34
        );
        // 2 KV heads of 512 / 8 = 64, keys and values, f16.
        assert_eq!(d.kv_bytes_per_token, 2 * (64 + 64) * 2);
        assert!(
            m.notes.iter().any(|n| n.contains("3 of the 4 blocks")),
            "{:?}",
            m.notes
        );
        // The TOML it writes is a model file.
        let back = ModelSpec::from_toml_str(&m.to_commented_toml(), "back").unwrap();
        assert_eq!(back, m.spec);
    }

    #[test]
    fn a_mixed_quantisation_is_reported_with_its_real_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mix.gguf");
        write(&path, meta(), moe_tensors(2, 0, GgmlType::Q6K));
        let m = import(&path, &ImportOptions::default()).unwrap();
        assert_eq!(m.spec.format, ExpertFormat::Ggml(GgmlQuant::Q4_K));
        let note = m
            .notes
            .iter()
            .find(|n| n.contains("mix"))
            .expect("a mix note");
        // Real mean: gate + up in q4_k, down in q6_k.
        let real = (2 * 256 * 2 * 144 + 512 * 210) as f64;
        let modelled = ((2 * 256 * 2 + 512) * 144) as f64;
        let pct = format!("{:+.1}%", 100.0 * (modelled / real - 1.0));
        assert!(
            note.contains(&pct) && note.contains("Q6K"),
            "{note} lacks {pct}"
        );
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dense.gguf");
        let dense: Vec<_> = moe_tensors(0, 2, GgmlType::Q4K);
        write(&path, meta(), dense);
        let e = import(&path, &ImportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dense.gguf") && e.contains("ffn_gate_exps"),
            "{e}"
        );

        let path = dir.path().join("notopk.gguf");
        write(
            &path,
            meta()[..2].to_vec(),
            moe_tensors(1, 0, GgmlType::Q4K),
        );
        let e = import(&path, &ImportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("qwen3moe.expert_used_count"), "{e}");

        // A truncated header.
        let path = dir.path().join("cut.gguf");
        write(&path, meta(), moe_tensors(1, 0, GgmlType::Q4K));
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..40]).unwrap();
        let e = import(&path, &ImportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("cut.gguf"), "{e}");
    }
}
