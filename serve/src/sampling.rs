//! Choosing the next token from a stream's logits: greedy at temperature 0, else seeded
//! sampling with an optional nucleus (`top_p`).
//!
//! Each request owns its random generator, seeded from the request's `seed` (or a seed the
//! server draws), so a request's output depends only on its own logits and seed, never on
//! which other requests share its decode steps. Special tokens other than EOS are never
//! sampled (they are template markers, not text); with `ignore_eos` EOS is not either.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::tokenizer::{is_special, EOS};

/// How a request samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy (argmax).
    pub temperature: f64,
    /// Nucleus: sample among the most likely tokens whose probabilities sum to at least this
    /// (1 keeps every token).
    pub top_p: f64,
    /// Seed of the request's generator.
    pub seed: u64,
    /// Never stop at EOS (generate exactly `max_tokens`; the benchmark protocol's choice).
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            ignore_eos: false,
        }
    }
}

/// A request's sampler: its parameters and its generator.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    /// A sampler seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        Sampler {
            params,
            rng: StdRng::seed_from_u64(params.seed),
        }
    }

    /// Whether `token` may be produced at all.
    fn allowed(&self, token: usize) -> bool {
        let t = token as u32;
        !is_special(t) || (t == EOS && !self.params.ignore_eos)
    }

    /// The next token from `logits` (one per vocabulary entry). Non-finite logits count as
    /// impossible; if nothing is possible, the lowest allowed id is returned.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let candidates: Vec<(usize, f64)> = logits
            .iter()
            .enumerate()
            .filter(|&(i, l)| self.allowed(i) && l.is_finite())
            .map(|(i, &l)| (i, l as f64))
            .collect();
        let fallback = (0..logits.len()).find(|&i| self.allowed(i)).unwrap_or(0) as u32;
        if candidates.is_empty() {
            return fallback;
        }
        if self.params.temperature <= 0.0 {
            // Greedy; ties go to the lowest id.
            let mut best = candidates[0];
            for &c in &candidates[1..] {
                if c.1 > best.1 {
                    best = c;
                }
            }
            return best.0 as u32;
        }
        let t = self.params.temperature;
        let max = candidates
            .iter()
            .map(|c| c.1)
            .fold(f64::NEG_INFINITY, f64::max);
        let mut probs: Vec<(usize, f64)> = candidates
            .iter()
            .map(|&(i, l)| (i, ((l - max) / t).exp()))
            .collect();
        let total: f64 = probs.iter().map(|p| p.1).sum();
        for p in &mut probs {
            p.1 /= total;
        }
        if self.params.top_p < 1.0 {
            // Most likely first; ties by id so the order is deterministic.
            probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut cum = 0.0;
            let mut keep = probs.len();
            for (n, p) in probs.iter().enumerate() {
                cum += p.1;
                if cum >= self.params.top_p {
                    keep = n + 1;
                    break;
                }
            }
            probs.truncate(keep.max(1));
            let total: f64 = probs.iter().map(|p| p.1).sum();
            for p in &mut probs {
                p.1 /= total;
            }
        }
        let u: f64 = self.rng.random();
        let mut cum = 0.0;
        for &(i, p) in &probs {
            cum += p;
            if u < cum {
                return i as u32;
            }
        }
        probs.last().map_or(fallback, |p| p.0 as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{BOS, VOCAB};

    fn logits_with(peaks: &[(usize, f32)]) -> Vec<f32> {
        let mut l = vec![0.0f32; VOCAB];
        for &(i, v) in peaks {
            l[i] = v;
        }
        l
    }

    #[test]
    fn greedy_is_argmax_over_allowed_tokens() {
        let mut s = Sampler::new(SamplingParams::default());
        // BOS is never produced even when it is the largest.
        let l = logits_with(&[(BOS as usize, 9.0), (65, 5.0), (66, 5.0)]);
        assert_eq!(s.sample(&l), 65, "ties go to the lowest id");
        let l = logits_with(&[(EOS as usize, 9.0), (65, 5.0)]);
        assert_eq!(s.sample(&l), EOS);
        let mut s = Sampler::new(SamplingParams {
            ignore_eos: true,
            ..SamplingParams::default()
        });
        assert_eq!(s.sample(&l), 65);
        let l = vec![f32::NAN; VOCAB];
        assert_eq!(s.sample(&l), 0);
    }

    /// Sampled frequencies follow the softmax (the f64 reference) within sampling error, and
    /// the same seed gives the same sequence.
    #[test]
    fn sampling_follows_the_softmax_and_is_seeded() {
        let params = SamplingParams {
            temperature: 0.5,
            seed: 42,
            ..SamplingParams::default()
        };
        let mut l = vec![f32::NEG_INFINITY; VOCAB];
        l[10] = 0.0;
        l[11] = 0.5;
        l[12] = 1.0;
        let z: Vec<f64> = [0.0f64, 0.5, 1.0].iter().map(|x| (x / 0.5).exp()).collect();
        let sum: f64 = z.iter().sum();
        let mut s = Sampler::new(params);
        let n = 20_000;
        let mut counts = [0usize; 3];
        let mut first = Vec::new();
        for i in 0..n {
            let t = s.sample(&l) as usize;
            counts[t - 10] += 1;
            if i < 50 {
                first.push(t);
            }
        }
        for k in 0..3 {
            let p = z[k] / sum;
            let freq = counts[k] as f64 / n as f64;
            let se = (p * (1.0 - p) / n as f64).sqrt();
            assert!((freq - p).abs() < 5.0 * se, "token {k}: {freq} vs {p}");
        }
        let mut again = Sampler::new(params);
        let repeat: Vec<usize> = (0..50).map(|_| again.sample(&l) as usize).collect();
        assert_eq!(first, repeat);
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        let mut l = vec![f32::NEG_INFINITY; VOCAB];
        l[1] = 3.0;
        l[2] = 0.0;
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            seed: 1,
            ignore_eos: false,
        });
        // p(1) = 0.95 > 0.5: only token 1 is in the nucleus.
        assert!((0..200).all(|_| s.sample(&l) == 1));
    }
}
