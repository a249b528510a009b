//! Import of routing that engines can emit today: a per-token CSV of layer and expert ids.
//!
//! Engines that log their router's choices (llama.cpp's routing instrumentation, vLLM and
//! SGLang expert-distribution recorders, a forward hook in Transformers) write one row per
//! (token, layer) with the chosen expert ids. This module turns such a CSV into ft's JSON-lines
//! trace (`docs/routing.md`), so `ft routing stats|fit` and every `--routing` argument can use
//! it. The file is read twice (the first pass finds the layers, the largest id and `top_k`),
//! so memory does not grow with its length.
//!
//! Columns (a header row is required, names case-insensitive, other columns ignored):
//! `token` (or `token_idx`, `pos`): the token's position in its request; `layer`: the layer
//! number (renumbered 0..L-1 in increasing order, so a model's leading dense layers need no
//! care); `experts`: the top-k ids, separated by spaces, `;`, `|` or `,` (brackets ignored);
//! `weights` (optional): the router weights in the same order, renormalised to sum to 1;
//! `request` (or `sequence`, `seq`; optional): the request id. The rows of one token (same
//! request and token) are consecutive; every token has every layer once. Requests are
//! concatenated into stream 0, in file order, one step per token.

use std::collections::BTreeSet;
use std::path::Path;

use super::trace::{StreamTag, TraceFormat, TraceWriter};
use super::{StepRouting, TokenRoute};
use crate::error::{ModelError, Result};
use crate::geometry::MoeGeometry;

/// Most distinct layer numbers an imported file may hold (far above any model's MoE layers;
/// bounds the per-token table).
pub const MAX_IMPORT_LAYERS: usize = 1024;

/// Most experts per token (`top_k`) an imported row may list.
pub const MAX_IMPORT_TOP_K: usize = 256;

/// Largest expert id an imported row may hold (ids index per-layer tables of that size).
pub const MAX_IMPORT_EXPERT_ID: u32 = 1 << 20;

/// What an import found and wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportSummary {
    /// The routed geometry (hidden and intermediate 0: unknown).
    pub geometry: MoeGeometry,
    /// Steps (tokens) written.
    pub steps: u64,
    /// Distinct requests seen (consecutive runs of one request id).
    pub requests: u64,
    /// The layer numbers of the file, in the order they were renumbered to 0..L-1.
    pub layer_numbers: Vec<u64>,
}

/// Column positions of the header.
struct Columns {
    token: usize,
    layer: usize,
    experts: usize,
    weights: Option<usize>,
    request: Option<usize>,
}

impl Columns {
    fn find(header: &csv::StringRecord, origin: &str) -> Result<Self> {
        let at = |names: &[&str]| {
            header
                .iter()
                .position(|h| names.iter().any(|n| h.trim().eq_ignore_ascii_case(n)))
        };
        let need = |names: &[&str]| {
            at(names).ok_or_else(|| {
                ModelError::invalid(
                    format!("{origin}:1"),
                    format!(
                        "the header has no '{}' column (columns: {})",
                        names[0],
                        header.iter().collect::<Vec<_>>().join(", ")
                    ),
                )
            })
        };
        Ok(Columns {
            token: need(&["token", "token_idx", "pos"])?,
            layer: need(&["layer"])?,
            experts: need(&["experts"])?,
            weights: at(&["weights"]),
            request: at(&["request", "sequence", "seq"]),
        })
    }
}

/// One parsed row.
struct Row {
    line: u64,
    request: String,
    token: u64,
    layer: u64,
    experts: Vec<u32>,
    weights: Option<Vec<f32>>,
}

fn split_list(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| c.is_whitespace() || matches!(c, ';' | '|' | ',' | '[' | ']'))
        .filter(|t| !t.is_empty())
}

fn parse_row(rec: &csv::StringRecord, cols: &Columns, origin: &str) -> Result<Row> {
    let line = rec.position().map_or(0, |p| p.line());
    let at = || format!("{origin}:{line}");
    let field = |i: usize, name: &str| {
        rec.get(i)
            .ok_or_else(|| ModelError::invalid(at(), format!("no '{name}' field")))
    };
    let int = |i: usize, name: &str| -> Result<u64> {
        let t = field(i, name)?.trim();
        t.parse::<u64>().map_err(|_| {
            ModelError::invalid(at(), format!("{name} '{t}' is not a non-negative integer"))
        })
    };
    let mut experts = Vec::new();
    for t in split_list(field(cols.experts, "experts")?) {
        if experts.len() == MAX_IMPORT_TOP_K {
            return Err(ModelError::invalid(
                at(),
                format!("more than {MAX_IMPORT_TOP_K} experts in one row"),
            ));
        }
        let e: u32 = t
            .parse()
            .ok()
            .filter(|&e| e <= MAX_IMPORT_EXPERT_ID)
            .ok_or_else(|| {
                ModelError::invalid(
                    at(),
                    format!("expert id '{t}' is not an integer in 0..={MAX_IMPORT_EXPERT_ID}"),
                )
            })?;
        if experts.contains(&e) {
            return Err(ModelError::invalid(
                at(),
                format!("expert id {e} appears twice in one row"),
            ));
        }
        experts.push(e);
    }
    if experts.is_empty() {
        return Err(ModelError::invalid(at(), "no expert ids"));
    }
    let weights = match cols.weights.map(|i| field(i, "weights")).transpose()? {
        Some(text) if !text.trim().is_empty() => {
            let w: Vec<f32> = split_list(text)
                .map(|t| t.parse::<f32>().ok().filter(|w| w.is_finite() && *w >= 0.0))
                .collect::<Option<Vec<f32>>>()
                .ok_or_else(|| {
                    ModelError::invalid(
                        at(),
                        format!("weights '{text}' are not non-negative numbers"),
                    )
                })?;
            let sum: f64 = w.iter().map(|&x| x as f64).sum();
            if w.len() != experts.len() || !(sum.is_finite() && sum > 0.0) {
                return Err(ModelError::invalid(
                    at(),
                    format!(
                        "{} weights (sum {sum}) for {} experts; need one positive-sum weight per expert",
                        w.len(),
                        experts.len()
                    ),
                ));
            }
            Some(w.iter().map(|&x| (x as f64 / sum) as f32).collect())
        }
        _ => None,
    };
    Ok(Row {
        line,
        request: cols
            .request
            .and_then(|i| rec.get(i))
            .unwrap_or("")
            .trim()
            .to_string(),
        token: int(cols.token, "token")?,
        layer: int(cols.layer, "layer")?,
        experts,
        weights,
    })
}

fn open_csv(path: &Path) -> Result<csv::Reader<std::fs::File>> {
    csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_path(path)
        .map_err(|e| ModelError::invalid(path.display().to_string(), e.to_string()))
}

/// Import a per-token CSV (`input`) into a JSON-lines trace (`output`). `experts` overrides
/// the experts per layer (default: the largest id + 1).
pub fn import_csv(input: &Path, output: &Path, experts: Option<usize>) -> Result<ImportSummary> {
    let origin = input.display().to_string();
    let csv_err = |e: csv::Error| ModelError::invalid(&origin, e.to_string());
    // Pass 1: layers, largest id, top_k.
    let mut reader = open_csv(input)?;
    let cols = Columns::find(reader.headers().map_err(csv_err)?, &origin)?;
    let mut layers = BTreeSet::new();
    let mut max_id = 0u32;
    let mut top_k = None;
    for rec in reader.records() {
        let row = parse_row(&rec.map_err(csv_err)?, &cols, &origin)?;
        if layers.insert(row.layer) && layers.len() > MAX_IMPORT_LAYERS {
            return Err(ModelError::invalid(
                format!("{origin}:{}", row.line),
                format!("more than {MAX_IMPORT_LAYERS} distinct layer numbers"),
            ));
        }
        max_id = max_id.max(row.experts.iter().copied().max().unwrap_or(0));
        match top_k {
            None => top_k = Some(row.experts.len()),
            Some(k) if k != row.experts.len() => {
                return Err(ModelError::invalid(
                    format!("{origin}:{}", row.line),
                    format!(
                        "{} experts in this row, {k} in the first: top_k must be the same \
                         everywhere",
                        row.experts.len()
                    ),
                ))
            }
            _ => {}
        }
    }
    let Some(top_k) = top_k else {
        return Err(ModelError::invalid(&origin, "no rows after the header"));
    };
    let n_experts = match experts {
        Some(n) if n <= max_id as usize => {
            return Err(ModelError::invalid(
                "--experts",
                format!("{n} experts, but {origin} holds expert id {max_id}"),
            ))
        }
        Some(n) => n,
        None => max_id as usize + 1,
    };
    if top_k > n_experts {
        return Err(ModelError::invalid(
            &origin,
            format!("top_k = {top_k} is more than the {n_experts} experts"),
        ));
    }
    let layer_numbers: Vec<u64> = layers.into_iter().collect();
    let geometry = MoeGeometry {
        hidden: 0,
        intermediate: 0,
        experts: n_experts,
        top_k,
        moe_layers: layer_numbers.len(),
        shared_experts: 0,
    };
    // Pass 2: one step per token.
    let format = TraceFormat::from_path(output)?;
    let file = std::fs::File::create(output).map_err(|source| ModelError::Io {
        path: output.display().to_string(),
        source,
    })?;
    let mut writer = TraceWriter::with_source(
        Box::new(file),
        &output.display().to_string(),
        format,
        &geometry,
        &format!("imported by ft from {}", input.display()),
    )?;
    let mut reader = open_csv(input)?;
    let mut pending: Option<(String, u64, u64)> = None; // request, token, first line
    let mut slots: Vec<Option<TokenRoute>> = vec![None; geometry.moe_layers];
    let (mut steps, mut requests) = (0u64, 0u64);
    let mut last_request: Option<String> = None;
    let flush = |pending: &(String, u64, u64),
                 slots: &mut Vec<Option<TokenRoute>>,
                 writer: &mut TraceWriter,
                 steps: &mut u64|
     -> Result<()> {
        let (request, token, line) = pending;
        let mut layers = Vec::with_capacity(slots.len());
        for (l, slot) in slots.iter_mut().enumerate() {
            let Some(route) = slot.take() else {
                return Err(ModelError::invalid(
                    format!("{origin}:{line}"),
                    format!(
                        "token {token} (starting at this line) has no row for layer {}",
                        layer_numbers[l]
                    ),
                ));
            };
            layers.push(vec![route]);
        }
        let step = StepRouting {
            step: *steps,
            layers,
        };
        let tag = StreamTag {
            request: (!request.is_empty()).then(|| request.clone()),
            token: Some(*token),
        };
        writer.write_step_tagged(&step, &[tag])?;
        *steps += 1;
        Ok(())
    };
    for rec in reader.records() {
        let row = parse_row(&rec.map_err(csv_err)?, &cols, &origin)?;
        let same = pending
            .as_ref()
            .is_some_and(|(r, t, _)| *r == row.request && *t == row.token);
        if !same {
            if let Some(p) = pending.take() {
                flush(&p, &mut slots, &mut writer, &mut steps)?;
            }
            if last_request.as_deref() != Some(row.request.as_str()) {
                requests += 1;
                last_request = Some(row.request.clone());
            }
            pending = Some((row.request.clone(), row.token, row.line));
        }
        let l = layer_numbers
            .binary_search(&row.layer)
            .expect("every layer was seen in the first pass");
        if slots[l].is_some() {
            return Err(ModelError::invalid(
                format!("{origin}:{}", row.line),
                format!(
                    "layer {} appears twice for token {} (a token's rows must be consecutive)",
                    row.layer, row.token
                ),
            ));
        }
        let k = row.experts.len();
        slots[l] = Some(TokenRoute {
            weights: row.weights.unwrap_or_else(|| vec![1.0 / k as f32; k]),
            experts: row.experts,
        });
    }
    if let Some(p) = pending.take() {
        flush(&p, &mut slots, &mut writer, &mut steps)?;
    }
    writer.finish()?;
    Ok(ImportSummary {
        geometry,
        steps,
        requests,
        layer_numbers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{RoutingSource, TraceReader};

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_per_token_csv_becomes_a_trace() {
        let dir = tempfile::tempdir().unwrap();
        // Layers numbered 1 and 3 (a leading dense layer), two requests, weights on one row.
        let csv = "request,token,layer,experts,weights\n\
                   a,0,1,\"[3, 17]\",\"0.6 0.2\"\n\
                   a,0,3,5;6,\n\
                   a,1,3,6|7,\n\
                   a,1,1,3 4,\n\
                   b,0,1,0 1,\n\
                   b,0,3,2 3,\n";
        let input = write(dir.path(), "r.csv", csv);
        let out = dir.path().join("r.jsonl");
        let s = import_csv(&input, &out, None).unwrap();
        assert_eq!(s.steps, 3);
        assert_eq!(s.requests, 2);
        assert_eq!(s.layer_numbers, vec![1, 3]);
        assert_eq!(
            (s.geometry.experts, s.geometry.top_k, s.geometry.moe_layers),
            (18, 2, 2)
        );
        // Any model of the routed geometry reads it (no hidden/intermediate in the header).
        let g = MoeGeometry {
            hidden: 4096,
            intermediate: 1024,
            ..s.geometry
        };
        let mut r = TraceReader::open(&out, &g).unwrap();
        let first = r.next_step(1).unwrap();
        assert_eq!(first.layers[0][0].experts, vec![3, 17]);
        assert!((first.layers[0][0].weights[0] - 0.75).abs() < 1e-6);
        assert_eq!(first.layers[1][0].weights, vec![0.5, 0.5]);
        let second = r.next_step(1).unwrap();
        assert_eq!(second.layers[0][0].experts, vec![3, 4]);
        assert_eq!(second.layers[1][0].experts, vec![6, 7]);
        r.next_step(1).unwrap();
        assert!(r.next_step(1).is_err());
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.contains(r#""request":"b","token":0"#), "{text}");
        // --experts widens the layer; too small is refused.
        let wide = import_csv(&input, &out, Some(64)).unwrap();
        assert_eq!(wide.geometry.experts, 64);
        let e = import_csv(&input, &out, Some(10)).unwrap_err().to_string();
        assert!(e.contains("--experts") && e.contains("17"), "{e}");
    }

    #[test]
    fn bad_rows_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.jsonl");
        let cases = [
            ("token,layer\n0,0\n", "no 'experts' column"),
            ("token,layer,experts\n", "no rows"),
            ("token,layer,experts\n0,0,1 2\n0,1,1 2 3\n", "r.csv:3"),
            ("token,layer,experts\n0,0,1 1\n", "appears twice in one row"),
            ("token,layer,experts\n0,0,1 x\n", "expert id 'x'"),
            ("token,layer,experts\n0,0,1 99999999\n", "not an integer in"),
            ("token,layer,experts\n-1,0,1 2\n", "token '-1'"),
            (
                "token,layer,experts\n0,0,1 2\n0,1,1 2\n1,0,1 2\n",
                "no row for layer 1",
            ),
            (
                "token,layer,experts\n0,0,1 2\n0,0,3 4\n",
                "layer 0 appears twice",
            ),
            ("token,layer,experts,weights\n0,0,1 2,0.5\n", "1 weights"),
            ("token,layer,experts,weights\n0,0,1 2,0 0\n", "positive-sum"),
            (
                "token,layer,experts,weights\n0,0,1 2,-1 2\n",
                "non-negative",
            ),
        ];
        for (text, want) in cases {
            let input = write(dir.path(), "r.csv", text);
            let e = import_csv(&input, &out, None).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        let input = write(dir.path(), "r.csv", "token,layer,experts\n0,0,1 2\n");
        let e = import_csv(&input, &dir.path().join("o.txt"), None).unwrap_err();
        assert!(e.to_string().contains(".jsonl"), "{e}");
    }
}
