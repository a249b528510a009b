//! The dense part of a layer: a memory-bound kernel reading real bytes.
//!
//! Attention and dense weights are memory-bound at decode; this kernel reads a layer's dense
//! weight bytes plus each stream's KV bytes for its context length, so that the share of
//! expert work in a step is realistic.

use ft_model::DenseSpec;

use crate::device::{Device, DeviceBuffer, Stream};
use crate::error::{Result, RuntimeError};

/// Bytes of the dense kernel's output (its fold of the bytes read: 256 u32 words, one per
/// block slot, so the reads cannot be optimised away).
pub const DENSE_OUT_BYTES: usize = 1024;

/// One region the dense kernel reads.
#[derive(Debug, Clone, Copy)]
pub struct DenseRead<'a> {
    /// The buffer.
    pub buffer: &'a DeviceBuffer,
    /// Start, bytes.
    pub offset: usize,
    /// Length, bytes.
    pub bytes: usize,
}

/// Fold bytes into a u64 (wrapping sum of little-endian u64 words, then the tail bytes):
/// the host-emulated dense kernel's reduction, cheap enough to stay memory-bound.
pub fn fold_bytes(bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(8);
    let mut acc = 0u64;
    for c in &mut chunks {
        acc = acc.wrapping_add(u64::from_le_bytes([
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
        ]));
    }
    for &b in chunks.remainder() {
        acc = acc.wrapping_add(b as u64);
    }
    acc
}

/// Device memory standing for the dense part of every layer: distinct dense-weight bytes per
/// layer (so consecutive layers do not hit in L2) and, per layer and stream, a KV region of
/// `max_context` tokens.
#[derive(Debug)]
pub struct DenseBuffers {
    spec: DenseSpec,
    layers: usize,
    streams: usize,
    max_context: usize,
    weights: DeviceBuffer,
    kv: DeviceBuffer,
    out: DeviceBuffer,
}

impl DenseBuffers {
    /// Device bytes [`DenseBuffers::new`] would allocate.
    pub fn bytes_needed(
        spec: &DenseSpec,
        layers: usize,
        streams: usize,
        max_context: usize,
    ) -> u64 {
        layers as u64
            * (spec.weight_bytes_per_layer
                + streams as u64 * max_context as u64 * spec.kv_bytes_per_token)
            + DENSE_OUT_BYTES as u64
    }

    /// Allocate (zeroed) buffers for `layers` layers and `streams` streams of up to
    /// `max_context` tokens.
    pub fn new(
        device: &Device,
        spec: &DenseSpec,
        layers: usize,
        streams: usize,
        max_context: usize,
    ) -> Result<Self> {
        if layers == 0 {
            return Err(RuntimeError::invalid("dense layers", "must be > 0"));
        }
        let w = layers as u64 * spec.weight_bytes_per_layer;
        let kv = layers as u64 * streams as u64 * max_context as u64 * spec.kv_bytes_per_token;
        let weights = device.alloc(w as usize, "dense weights")?;
        let kvb = device.alloc(kv as usize, "KV cache")?;
        let out = device.alloc(DENSE_OUT_BYTES, "dense output")?;
        Ok(DenseBuffers {
            spec: *spec,
            layers,
            streams,
            max_context,
            weights,
            kv: kvb,
            out,
        })
    }

    /// The spec.
    pub fn spec(&self) -> &DenseSpec {
        &self.spec
    }

    /// Bytes one layer's dense kernel reads for these context lengths (one per stream).
    pub fn bytes_read(&self, contexts: &[usize]) -> u64 {
        self.spec.weight_bytes_per_layer
            + contexts
                .iter()
                .map(|&c| c as u64 * self.spec.kv_bytes_per_token)
                .sum::<u64>()
    }

    /// The regions layer `layer` reads for streams at `contexts` tokens.
    pub fn reads(&self, layer: usize, contexts: &[usize]) -> Result<Vec<DenseRead<'_>>> {
        if layer >= self.layers {
            return Err(RuntimeError::invalid(
                "dense layer",
                format!("{layer} is not below {} layers", self.layers),
            ));
        }
        if contexts.len() > self.streams {
            return Err(RuntimeError::invalid(
                "dense contexts",
                format!("{} streams, buffers for {}", contexts.len(), self.streams),
            ));
        }
        let wb = self.spec.weight_bytes_per_layer as usize;
        let mut reads = vec![DenseRead {
            buffer: &self.weights,
            offset: layer * wb,
            bytes: wb,
        }];
        let per_stream = self.max_context * self.spec.kv_bytes_per_token as usize;
        for (s, &c) in contexts.iter().enumerate() {
            if c > self.max_context {
                return Err(RuntimeError::invalid(
                    "dense context",
                    format!("stream {s} at {c} tokens, buffers for {}", self.max_context),
                ));
            }
            reads.push(DenseRead {
                buffer: &self.kv,
                offset: (layer * self.streams + s) * per_stream,
                bytes: c * self.spec.kv_bytes_per_token as usize,
            });
        }
        Ok(reads)
    }

    /// Queue layer `layer`'s dense kernel on `stream`.
    pub fn launch(&self, stream: &Stream, layer: usize, contexts: &[usize]) -> Result<()> {
        let reads = self.reads(layer, contexts)?;
        stream.launch_dense(&reads, &self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostDeviceConfig;

    #[test]
    fn dense_reads_cover_weights_and_each_streams_kv() {
        let d = Device::host(HostDeviceConfig {
            memory_bytes: 64 << 20,
            ..Default::default()
        })
        .unwrap();
        let spec = DenseSpec {
            weight_bytes_per_layer: 1 << 16,
            kv_bytes_per_token: 256,
        };
        let db = DenseBuffers::new(&d, &spec, 3, 2, 100).unwrap();
        let r = db.reads(2, &[10, 100]).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].offset, r[0].bytes), (2 << 16, 1 << 16));
        assert_eq!((r[1].offset, r[1].bytes), (4 * 100 * 256, 10 * 256));
        assert_eq!((r[2].offset, r[2].bytes), (5 * 100 * 256, 100 * 256));
        assert_eq!(db.bytes_read(&[10, 100]), (1 << 16) + 110 * 256);
        assert!(db.reads(3, &[1]).is_err());
        assert!(db.reads(0, &[101]).is_err());
        assert!(db.reads(0, &[1, 1, 1]).is_err());
        // The kernel folds the bytes it reads: fill a known pattern and check the fold.
        let s = d.new_stream("compute").unwrap();
        let pattern: Vec<u8> = (0..(1usize << 16)).map(|i| (i % 251) as u8).collect();
        s.upload(&pattern, &db.weights, 0).unwrap();
        db.launch(&s, 0, &[0, 0]).unwrap();
        let mut out = [0u8; 8];
        s.download(&db.out, 0, &mut out).unwrap();
        assert_eq!(u64::from_le_bytes(out), fold_bytes(&pattern));
        assert_eq!(
            DenseBuffers::bytes_needed(&spec, 3, 2, 100),
            3 * ((1 << 16) + 2 * 100 * 256) + DENSE_OUT_BYTES as u64
        );
    }
}
