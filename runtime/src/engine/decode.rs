//! A decode run: warm-up steps, then measured steps, with their inputs, contexts, records,
//! spans and outputs.
//!
//! The routing of a run is drawn up front ([`draw_routing`]) so that the same steps can be
//! replayed on another engine (offload against hybrid, fresh against warmed) with identical
//! routing and inputs. A run's measured steps are one *request*: step `i`'s input for stream
//! `s` is [`token_input`]`(seed, s, i)`; warm-up steps are another request (their inputs are
//! salted with [`INPUT_SALT_WARMUP`]), so a fresh engine and a warmed one see the same
//! request.

use ft_model::geometry::MoeGeometry;
use ft_model::routing::{RoutingSource, StepRouting, StreamTag, TraceWriter};
use std::path::Path;

use super::{Engine, GpuCounts, GpuStep, StepInput};
use crate::error::Result;
use crate::instrument::{RunSummary, Span, StepRecord};
use crate::numerics::StepOutputs;

/// Mixed into the input seed for warm-up steps (a different request from the measured one).
pub const INPUT_SALT_WARMUP: u64 = 0x5741_524D_5550; // "WARMUP"

/// splitmix64 (a well-mixed 64-bit hash) for the inputs.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The input vector of stream `stream` at step `step` of a request: `hidden` values drawn
/// uniformly from `seed`, scaled to a root mean square of 1 (the scale of a normalised
/// token embedding). The same arguments give the same vector everywhere.
pub fn token_input(seed: u64, stream: usize, step: u64, hidden: usize) -> Vec<f32> {
    let mut state = splitmix64(seed ^ splitmix64(stream as u64 ^ splitmix64(step)));
    let mut v: Vec<f32> = (0..hidden)
        .map(|_| {
            state = splitmix64(state);
            // 24 random bits to [-1, 1).
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    let rms = (v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / hidden.max(1) as f64).sqrt();
    if rms > 0.0 {
        let inv = (1.0 / rms) as f32;
        v.iter_mut().for_each(|x| *x *= inv);
    }
    v
}

/// Draw `steps` steps of `streams` streams from a routing source.
pub fn draw_routing(
    source: &mut dyn RoutingSource,
    streams: usize,
    steps: usize,
) -> Result<Vec<StepRouting>> {
    (0..steps)
        .map(|_| source.next_step(streams).map_err(Into::into))
        .collect()
}

/// The request each of `streams` streams serves at step `index` of a run of `warmup` warm-up
/// steps, as [`decode`] defines them: stream `s` serves request `s{s}-warmup` over the warm-up
/// steps and `s{s}-measured` over the measured ones (their inputs are
/// [`token_input`]`(seed ^ `[`INPUT_SALT_WARMUP`]`, s, i)` and `token_input(seed, s, i)`),
/// and the token is `i`, the step's position within its request. The prompt's tokens are not
/// steps of the run, so the first decoded token is token 0.
pub fn request_tags(index: usize, warmup: usize, streams: usize) -> Vec<StreamTag> {
    let (phase, i) = if index < warmup {
        ("warmup", index)
    } else {
        ("measured", index - warmup)
    };
    (0..streams)
        .map(|s| StreamTag {
            request: Some(format!("s{s}-{phase}")),
            token: Some(i as u64),
        })
        .collect()
}

/// Write a run's routing (its warm-up steps, then its measured ones, as [`draw_routing`]
/// drew them) to a trace file (the form follows the extension), each stream's records tagged
/// with the request it serves ([`request_tags`]; JSON lines keep the tags, the binary form
/// does not). What `ft run --record` writes.
pub fn record_routing(
    path: &Path,
    geometry: &MoeGeometry,
    steps: &[StepRouting],
    warmup: usize,
) -> Result<()> {
    let mut writer = TraceWriter::create(path, geometry)?;
    for (index, step) in steps.iter().enumerate() {
        writer.write_step_tagged(step, &request_tags(index, warmup, step.streams()))?;
    }
    writer.finish()?;
    Ok(())
}

/// How [`decode`] runs.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeOptions {
    /// Context length of every stream at the first step, tokens; it grows by one per step.
    pub context: usize,
    /// Seed of the inputs ([`token_input`]).
    pub input_seed: u64,
    /// Keep every step's spans (for a Chrome trace).
    pub keep_spans: bool,
    /// Keep the measured steps' outputs (for numerics).
    pub keep_outputs: bool,
    /// Read the expert kernels' block timelines of the last measured step
    /// ([`crate::Device::take_block_stamps`]: a CUDA device whose paths have them on,
    /// `FT_CUDA_STAMPS`), the records of earlier steps discarded.
    pub block_stamps: bool,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            context: 1024,
            input_seed: 0,
            keep_spans: false,
            keep_outputs: true,
            block_stamps: false,
        }
    }
}

/// What a decode run produced.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// Every step, warm-up first.
    pub records: Vec<StepRecord>,
    /// Every step's spans, when kept.
    pub spans: Vec<Span>,
    /// The measured steps' outputs, when kept.
    pub outputs: Vec<StepOutputs>,
    /// The measured steps summarised.
    pub summary: RunSummary,
    /// The last measured step's block timelines, where asked ([`DecodeOptions::block_stamps`]).
    pub stamps: Option<crate::block_stamps::BlockStamps>,
    /// Every step's per-GPU work, warm-up first (one entry per GPU).
    pub gpus: Vec<Vec<GpuStep>>,
    /// Every step's peer-combine time, us (0 on one GPU), warm-up first.
    pub combine_us: Vec<f64>,
}

impl Decoded {
    /// Per GPU, the measured steps' counts summed.
    pub fn gpu_counts(&self) -> Vec<GpuCounts> {
        let n = self.gpus.first().map_or(0, Vec::len);
        let mut out = vec![GpuCounts::default(); n];
        for (r, g) in self.records.iter().zip(&self.gpus) {
            if r.warmup {
                continue;
            }
            for (o, s) in out.iter_mut().zip(g) {
                o.add(&s.counts);
            }
        }
        out
    }

    /// Per GPU, the measured steps' host time of its CPU shares, us per step.
    pub fn gpu_cpu_us_per_step(&self) -> Vec<f64> {
        let n = self.gpus.first().map_or(0, Vec::len);
        let mut out = vec![0.0; n];
        let mut steps = 0usize;
        for (r, g) in self.records.iter().zip(&self.gpus) {
            if r.warmup {
                continue;
            }
            steps += 1;
            for (o, s) in out.iter_mut().zip(g) {
                *o += s.cpu_us;
            }
        }
        out.iter_mut().for_each(|o| *o /= steps.max(1) as f64);
        out
    }

    /// The measured steps' mean peer-combine time per step, us.
    pub fn combine_us_per_step(&self) -> f64 {
        let measured: Vec<f64> = self
            .records
            .iter()
            .zip(&self.combine_us)
            .filter(|(r, _)| !r.warmup)
            .map(|(_, &c)| c)
            .collect();
        measured.iter().sum::<f64>() / measured.len().max(1) as f64
    }
}

/// Run `warmup` steps, then `measured` steps, on `engine`. `progress` is called after each
/// step with (steps done, steps in all).
pub fn decode(
    engine: &mut Engine,
    warmup: &[StepRouting],
    measured: &[StepRouting],
    options: &DecodeOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Decoded> {
    let hidden = engine.model().geometry.hidden;
    let total = warmup.len() + measured.len();
    let mut records = Vec::with_capacity(total);
    let mut spans = Vec::new();
    let mut outputs = Vec::new();
    let mut stamps = None;
    let mut gpus = Vec::with_capacity(total);
    let mut combine_us = Vec::with_capacity(total);
    let phases = [
        (warmup, true, options.input_seed ^ INPUT_SALT_WARMUP),
        (measured, false, options.input_seed),
    ];
    let mut done = 0;
    for (steps, is_warmup, seed) in phases {
        for (i, routing) in steps.iter().enumerate() {
            let b = routing.streams();
            let contexts = vec![options.context + done; b];
            let inputs: Vec<Vec<f32>> = (0..b)
                .map(|s| token_input(seed, s, i as u64, hidden))
                .collect();
            let stamped = options.block_stamps && !is_warmup && i + 1 == steps.len();
            if stamped {
                // Only this step's blocks: the buffer holds a few tens of thousands.
                engine.device().take_block_stamps()?;
            }
            let r = engine.step(&StepInput {
                routing,
                contexts: &contexts,
                inputs: &inputs,
                warmup: is_warmup,
            })?;
            if stamped {
                stamps = Some(engine.device().take_block_stamps()?);
            }
            records.push(r.record);
            gpus.push(r.gpus);
            combine_us.push(r.combine_us);
            if options.keep_spans {
                spans.extend(r.spans);
            }
            if options.keep_outputs && !is_warmup {
                outputs.push(r.outputs);
            }
            done += 1;
            progress(done, total);
        }
    }
    let summary = RunSummary::of(&records);
    Ok(Decoded {
        records,
        spans,
        outputs,
        summary,
        stamps,
        gpus,
        combine_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_deterministic_and_unit_rms() {
        let a = token_input(3, 1, 7, 256);
        assert_eq!(a, token_input(3, 1, 7, 256));
        assert_ne!(a, token_input(3, 2, 7, 256));
        assert_ne!(a, token_input(3, 1, 8, 256));
        assert_ne!(a, token_input(INPUT_SALT_WARMUP ^ 3, 1, 7, 256));
        let rms = (a.iter().map(|x| x * x).sum::<f32>() / 256.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-5, "{rms}");
        assert!(a.iter().all(|x| x.is_finite() && x.abs() < 2.0));
    }

    #[test]
    fn a_recorded_run_carries_each_streams_requests() {
        use ft_model::routing::{trace_requests, RoutingProcess, SyntheticRouting, TraceReader};
        let g = MoeGeometry {
            hidden: 64,
            intermediate: 32,
            experts: 16,
            top_k: 2,
            moe_layers: 3,
            shared_experts: 0,
        };
        let mut src = SyntheticRouting::new(&RoutingProcess::default(), g).unwrap();
        let steps = draw_routing(&mut src, 2, 5).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.jsonl");
        record_routing(&path, &g, &steps, 2).unwrap();
        // The routing replays unchanged, each step tagged as decode serves it.
        let mut r = TraceReader::open(&path, &g).unwrap();
        for (i, step) in steps.iter().enumerate() {
            let (read, tags) = r.read_step_tagged().unwrap().unwrap();
            assert_eq!(&read, step);
            assert_eq!(tags, request_tags(i, 2, 2));
        }
        assert!(r.read_step_tagged().unwrap().is_none());
        let q = trace_requests(&path).unwrap();
        assert_eq!((q.requests, q.tagged, q.token_gaps), (4, 10, 0));
        let listed: Vec<_> = q
            .listed
            .iter()
            .map(|r| {
                (
                    r.stream,
                    r.request.as_str(),
                    r.tokens,
                    r.first_token,
                    r.last_token,
                )
            })
            .collect();
        // Requests end in step order; within a step, stream by stream.
        assert_eq!(
            listed,
            [
                (0, "s0-warmup", 2, Some(0), Some(1)),
                (1, "s1-warmup", 2, Some(0), Some(1)),
                (0, "s0-measured", 3, Some(0), Some(2)),
                (1, "s1-measured", 3, Some(0), Some(2)),
            ]
        );
    }
}
