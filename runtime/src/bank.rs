//! Host banks: every routed expert of every layer, in page-locked host memory.
//!
//! Offload gathers misses from here over PCIe; hybrid's CPU kernels read the same bytes in
//! place. The bank is therefore allocated by the device ([`Device::alloc_host`]: on CUDA
//! `cuMemHostAlloc(PORTABLE | DEVICEMAP)`, cached and not write-combined, so CPU reads run
//! at DRAM speed and the zero-copy gather can map it; on the host-emulated device,
//! page-aligned heap memory).
//!
//! Layout: expert `ExpertId { layer, expert }` starts at `flat(experts) * stride` bytes,
//! where `stride` is the expert's bytes rounded up to [`WEIGHTS_ALIGN`]; inside an expert,
//! `gate` (`intermediate x hidden`), `up` (same) and `down` (`hidden x intermediate`)
//! follow each other in the format's byte layout (`ft_kernels::codec`).
//!
//! Sources:
//! - a seed ([`HostBank::from_seed`]): deterministic weights per (seed, layer, expert),
//!   filled in parallel with rayon;
//! - a safetensors checkpoint ([`HostBank::from_safetensors`]). Accepted tensor names are
//!   `model.layers.{L}.mlp.experts.{E}.{gate,up,down}_proj.weight`, `L` the MoE layer
//!   index from 0 (see [`tensor_name`]); each tensor is either
//!   - `U8`/`I8` holding exactly the matrix's bytes in the format's layout (any shape), or
//!   - `F32`, `BF16` or `F16` of shape `[rows, cols]` (gate/up `[intermediate, hidden]`,
//!     down `[hidden, intermediate]`), which is encoded into the format here.
//!
//!   The file is read tensor by tensor (its header, then each tensor's byte range), so a
//!   large checkpoint is never held in memory twice.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use ft_model::{ExpertFormat, ExpertId, MoeGeometry};
use rayon::prelude::*;
use safetensors::tensor::Metadata;
use safetensors::Dtype;
use serde::{Deserialize, Serialize};

use crate::device::{Device, HostBuffer};
use crate::error::{Result, RuntimeError};
use crate::gpu_experts::WEIGHTS_ALIGN;

/// The three matrices of an expert, in bank order.
pub const MATRICES: [&str; 3] = ["gate", "up", "down"];

/// The safetensors name of matrix `which` (`gate`, `up`, `down`) of expert `expert` of MoE
/// layer `layer`.
pub fn tensor_name(layer: usize, expert: usize, which: &str) -> String {
    format!("model.layers.{layer}.mlp.experts.{expert}.{which}_proj.weight")
}

/// Where a bank's bytes came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum BankSource {
    /// Deterministic weights from a seed.
    Seed {
        /// The seed.
        seed: u64,
    },
    /// A safetensors checkpoint.
    Safetensors {
        /// Its path.
        path: String,
    },
    /// Tensor-parallel slice `gpu` of `gpus` of another bank ([`HostBank::tensor_parallel_slice`]).
    Slice {
        /// Which slice (the GPU that holds it), from 0.
        gpu: usize,
        /// Slices in all (GPUs).
        gpus: usize,
        /// Where the whole bank came from.
        of: Box<BankSource>,
    },
}

/// Shape of a bank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BankLayout {
    /// Expert format.
    pub format: ExpertFormat,
    /// Geometry (its `moe_layers` is the number of layers held).
    pub geometry: MoeGeometry,
    /// Bytes of one expert.
    pub expert_bytes: usize,
    /// Bytes between expert starts (expert bytes rounded up to [`WEIGHTS_ALIGN`]).
    pub stride: usize,
}

impl BankLayout {
    /// The layout of `geometry` in `format` (validated).
    pub fn new(format: ExpertFormat, geometry: &MoeGeometry) -> Result<Self> {
        geometry.validate(format)?;
        let expert_bytes = geometry.expert_bytes(format) as usize;
        Ok(BankLayout {
            format,
            geometry: *geometry,
            expert_bytes,
            stride: expert_bytes.next_multiple_of(WEIGHTS_ALIGN),
        })
    }

    /// Total bytes of the bank.
    pub fn total_bytes(&self) -> usize {
        self.stride * self.geometry.experts * self.geometry.moe_layers
    }

    /// (rows, cols) of matrix `m` (0 gate, 1 up, 2 down).
    pub fn matrix_shape(&self, m: usize) -> (usize, usize) {
        let g = &self.geometry;
        if m < 2 {
            (g.intermediate, g.hidden)
        } else {
            (g.hidden, g.intermediate)
        }
    }

    /// Byte offset of matrix `m` inside an expert.
    pub fn matrix_offset(&self, m: usize) -> usize {
        let gu = self
            .format
            .matrix_bytes(self.geometry.intermediate, self.geometry.hidden)
            as usize;
        gu * m.min(2)
    }

    /// Byte offset of an expert in the bank; errors name an id out of range.
    pub fn offset(&self, id: ExpertId) -> Result<usize> {
        let g = &self.geometry;
        if id.layer as usize >= g.moe_layers || id.expert as usize >= g.experts {
            return Err(RuntimeError::invalid(
                "expert id",
                format!(
                    "{id} is outside the bank ({} layers x {} experts)",
                    g.moe_layers, g.experts
                ),
            ));
        }
        Ok(id.flat(g.experts) * self.stride)
    }
}

/// All experts of all layers in device-visible host memory.
#[derive(Debug)]
pub struct HostBank {
    buffer: HostBuffer,
    layout: BankLayout,
    source: BankSource,
}

impl HostBank {
    /// Allocate a zeroed bank.
    fn alloc(device: &Device, layout: BankLayout, source: BankSource) -> Result<HostBank> {
        let buffer = device.alloc_host(layout.total_bytes(), "host expert bank")?;
        Ok(HostBank {
            buffer,
            layout,
            source,
        })
    }

    /// A bank of deterministic weights: expert `(layer, expert)` is the same for the same
    /// seed on every machine (see [`fill_expert`]). Filled in parallel.
    pub fn from_seed(
        device: &Device,
        format: ExpertFormat,
        geometry: &MoeGeometry,
        seed: u64,
    ) -> Result<HostBank> {
        let layout = BankLayout::new(format, geometry)?;
        let mut bank = Self::alloc(device, layout, BankSource::Seed { seed })?;
        let experts = geometry.experts;
        let stride = layout.stride;
        let eb = layout.expert_bytes;
        let start = std::time::Instant::now();
        bank.buffer
            .as_mut_slice()
            .par_chunks_mut(stride)
            .enumerate()
            .try_for_each(|(flat, chunk)| {
                let id = ExpertId::new(flat / experts, flat % experts);
                fill_expert(&layout, seed, id, &mut chunk[..eb])
            })?;
        tracing::info!(
            bytes = layout.total_bytes(),
            ms = start.elapsed().as_secs_f64() * 1e3,
            "filled host bank from seed {seed}"
        );
        Ok(bank)
    }

    /// A bank read from a safetensors checkpoint (see the module docs for the accepted
    /// names and dtypes). `geometry.moe_layers` layers are read.
    pub fn from_safetensors(
        device: &Device,
        format: ExpertFormat,
        geometry: &MoeGeometry,
        path: &Path,
    ) -> Result<HostBank> {
        let layout = BankLayout::new(format, geometry)?;
        let pname = path.display().to_string();
        let io = |source| RuntimeError::Io {
            path: pname.clone(),
            source,
        };
        let st_err = |message: String| RuntimeError::Safetensors {
            path: pname.clone(),
            message,
        };
        let mut file = File::open(path).map_err(io)?;
        let mut len8 = [0u8; 8];
        file.read_exact(&mut len8).map_err(io)?;
        let header_len = u64::from_le_bytes(len8);
        let file_len = file.metadata().map_err(io)?.len();
        if header_len > file_len.saturating_sub(8) || header_len > (100 << 20) {
            return Err(st_err(format!(
                "header length {header_len} is not plausible"
            )));
        }
        let mut head = vec![0u8; header_len as usize];
        file.read_exact(&mut head).map_err(io)?;
        let tensors = parse_header(&head).map_err(st_err)?;
        let data_start = 8 + header_len;

        let mut bank = Self::alloc(
            device,
            layout,
            BankSource::Safetensors {
                path: pname.clone(),
            },
        )?;
        let g = layout.geometry;
        let mut raw = Vec::new();
        for layer in 0..g.moe_layers {
            for expert in 0..g.experts {
                let base = layout.offset(ExpertId::new(layer, expert))?;
                for (m, which) in MATRICES.iter().enumerate() {
                    let name = tensor_name(layer, expert, which);
                    let info = tensors
                        .info(&name)
                        .ok_or_else(|| st_err(format!("tensor '{name}' is missing")))?;
                    let (rows, cols) = layout.matrix_shape(m);
                    let mbytes = format.matrix_bytes(rows, cols) as usize;
                    let (b, e) = info.data_offsets;
                    if e < b || data_start + e as u64 > file_len {
                        return Err(st_err(format!("tensor '{name}' lies outside the file")));
                    }
                    raw.resize(e - b, 0);
                    file.seek(SeekFrom::Start(data_start + b as u64))
                        .map_err(io)?;
                    file.read_exact(&mut raw).map_err(io)?;
                    let off = base + layout.matrix_offset(m);
                    let dst = &mut bank.buffer.as_mut_slice()[off..off + mbytes];
                    decode_tensor(
                        &name,
                        info.dtype,
                        &info.shape,
                        &raw,
                        format,
                        rows,
                        cols,
                        dst,
                    )
                    .map_err(st_err)?;
                }
            }
        }
        Ok(bank)
    }

    /// The bank's shape.
    pub fn layout(&self) -> &BankLayout {
        &self.layout
    }

    /// Where its bytes came from.
    pub fn source(&self) -> &BankSource {
        &self.source
    }

    /// The whole bank (the source buffer of gathers).
    pub fn buffer(&self) -> &HostBuffer {
        &self.buffer
    }

    /// Byte offset of an expert in [`HostBank::buffer`].
    pub fn offset(&self, id: ExpertId) -> Result<usize> {
        self.layout.offset(id)
    }

    /// Tensor-parallel slice `gpu` of `gpus` of this bank: every expert cut along its
    /// intermediate dimension into `gpus` equal, block-aligned parts ([`slice_geometry`]),
    /// part `gpu` kept: rows `[a, b)` of `gate` and `up`, columns `[a, b)` of `down`, with
    /// `a = gpu * I / gpus`, `b = a + I / gpus`. The slice is a valid expert of
    /// `intermediate = I / gpus` in the same format, so every kernel computes it unchanged,
    /// and summing the `gpus` slices' outputs gives the whole expert's (up to f32 rounding
    /// of the split sum over the intermediate dimension).
    ///
    /// No format needs re-encoding: every format blocks along a row's columns and keeps
    /// per-row scales per row (`ft_kernels::codec`), so a row slice copies whole rows of
    /// every plane and a block-aligned column slice copies whole blocks of every row (an
    /// `int8` row keeps its row scale; an `nvfp4` row its f16 row scale). The slices are
    /// copied once, here, into a bank of their own so that a gather stays one contiguous
    /// copy per expert.
    pub fn tensor_parallel_slice(
        &self,
        device: &Device,
        gpus: usize,
        gpu: usize,
    ) -> Result<HostBank> {
        let whole = self.layout;
        let part_geometry = slice_geometry(whole.format, &whole.geometry, gpus)?;
        if gpu >= gpus {
            return Err(RuntimeError::invalid(
                "tensor-parallel slice",
                format!("slice {gpu} of {gpus} does not exist"),
            ));
        }
        let part = BankLayout::new(whole.format, &part_geometry)?;
        let width = part_geometry.intermediate;
        let (a, b) = (gpu * width, (gpu + 1) * width);
        let kernel = |e: ft_kernels::KernelError| RuntimeError::Kernel(e.to_string());
        let wl = ft_kernels::ExpertLayout::new(whole.format, &whole.geometry).map_err(kernel)?;
        let pl = ft_kernels::ExpertLayout::new(part.format, &part.geometry).map_err(kernel)?;
        let h = whole.geometry.hidden;
        let mut out = Self::alloc(
            device,
            part,
            BankSource::Slice {
                gpu,
                gpus,
                of: Box::new(self.source.clone()),
            },
        )?;
        let src = self.buffer.as_slice();
        out.buffer
            .as_mut_slice()
            .par_chunks_mut(part.stride)
            .enumerate()
            .for_each(|(flat, dst)| {
                let s = &src[flat * whole.stride..flat * whole.stride + whole.expert_bytes];
                let (sg, su, sd) = (
                    &s[wl.range(ft_kernels::Matrix::Gate)],
                    &s[wl.range(ft_kernels::Matrix::Up)],
                    &s[wl.range(ft_kernels::Matrix::Down)],
                );
                let d = &mut dst[..part.expert_bytes];
                let (dg, rest) = d.split_at_mut(pl.up_offset);
                let (du, dd) = rest.split_at_mut(pl.gate_up.bytes);
                slice_matrix(&wl.gate_up, &pl.gate_up, a..b, 0..h, sg, dg);
                slice_matrix(&wl.gate_up, &pl.gate_up, a..b, 0..h, su, du);
                slice_matrix(&wl.down, &pl.down, 0..h, a..b, sd, dd);
            });
        Ok(out)
    }

    /// One expert's bytes (gate, up, down), for the CPU kernels. Banks are only ever
    /// copied from, never into, by the device, so reading them is always safe.
    pub fn expert(&self, id: ExpertId) -> Result<&[u8]> {
        let o = self.offset(id)?;
        Ok(&self.buffer.as_slice()[o..o + self.layout.expert_bytes])
    }
}

/// The geometry of one tensor-parallel slice of `geometry` over `gpus` GPUs: `intermediate`
/// divided by `gpus`. An error names the geometry when the split is not exact or a slice's
/// width is not a whole number of `format`'s blocks (its `block_len` columns), since a
/// slice boundary inside a block would need re-encoding.
pub fn slice_geometry(
    format: ExpertFormat,
    geometry: &MoeGeometry,
    gpus: usize,
) -> Result<MoeGeometry> {
    let i = geometry.intermediate;
    let block = format.block_len().max(1);
    if gpus == 0 || !i.is_multiple_of(gpus) || !(i / gpus).is_multiple_of(block) {
        return Err(RuntimeError::invalid(
            "--placement tensor-parallel",
            format!(
                "intermediate {i} cannot be split into {gpus} equal slices of whole {} blocks \
                 ({block} columns each); use sharded placement or a GPU count that divides {}",
                format.name(),
                i / block
            ),
        ));
    }
    Ok(MoeGeometry {
        intermediate: i / gpus,
        ..*geometry
    })
}

/// Copy rows `rows` x columns `cols` of matrix `src` (layout `whole`) into `dst` (layout
/// `part`, `rows.len() x cols.len()`), plane by plane (see [`HostBank::tensor_parallel_slice`];
/// `cols` must start and end on block boundaries, which [`slice_geometry`] guarantees).
fn slice_matrix(
    whole: &ft_kernels::codec::MatrixLayout,
    part: &ft_kernels::codec::MatrixLayout,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    src: &[u8],
    dst: &mut [u8],
) {
    let c = whole.cols;
    // Bytes of a column range in one row of a plane of `row_bytes` per row (exact on block
    // boundaries: every format's row bytes are a whole number per block).
    let span = |row_bytes: usize| (cols.start * row_bytes / c, cols.end * row_bytes / c);
    let row_scale_bytes = if whole.row_scales_offset > 0 {
        (whole.bytes - whole.row_scales_offset) / whole.rows
    } else {
        0
    };
    for (i, r) in rows.enumerate() {
        let (v0, v1) = span(whole.values_row_bytes);
        let so = r * whole.values_row_bytes;
        let dof = i * part.values_row_bytes;
        dst[dof..dof + v1 - v0].copy_from_slice(&src[so + v0..so + v1]);
        if whole.block_scales_row_bytes > 0 {
            let (b0, b1) = span(whole.block_scales_row_bytes);
            let so = whole.block_scales_offset + r * whole.block_scales_row_bytes;
            let dof = part.block_scales_offset + i * part.block_scales_row_bytes;
            dst[dof..dof + b1 - b0].copy_from_slice(&src[so + b0..so + b1]);
        }
        if row_scale_bytes > 0 {
            let so = whole.row_scales_offset + r * row_scale_bytes;
            let dof = part.row_scales_offset + i * row_scale_bytes;
            dst[dof..dof + row_scale_bytes].copy_from_slice(&src[so..so + row_scale_bytes]);
        }
    }
}

/// Deterministic weights of one expert: `ft_kernels::fill_expert_from_seed` (random valid
/// codes and scales, weight standard deviation near `1 / sqrt(cols)`), the same bytes for
/// the same (seed, layer, expert) on every machine.
pub fn fill_expert(layout: &BankLayout, seed: u64, id: ExpertId, out: &mut [u8]) -> Result<()> {
    ft_kernels::fill_expert_from_seed(
        layout.format,
        &layout.geometry,
        seed,
        id.layer as usize,
        id.expert as usize,
        out,
    )
    .map_err(|e| RuntimeError::Kernel(e.to_string()))
}

/// Parse a safetensors JSON header with the `safetensors` crate's own types (tensor name ->
/// dtype, shape and byte range; `__metadata__` kept apart). The tensors are then read one by
/// one from their byte ranges, so the file is never held whole.
fn parse_header(head: &[u8]) -> std::result::Result<Metadata, String> {
    serde_json::from_slice(head).map_err(|e| format!("bad header: {e}"))
}

/// Turn one checkpoint tensor into a matrix of `format` in `dst`.
#[allow(clippy::too_many_arguments)]
fn decode_tensor(
    name: &str,
    dtype: Dtype,
    shape: &[usize],
    raw: &[u8],
    format: ExpertFormat,
    rows: usize,
    cols: usize,
    dst: &mut [u8],
) -> std::result::Result<(), String> {
    let floats: Vec<f32> = match dtype {
        Dtype::U8 | Dtype::I8 => {
            if raw.len() != dst.len() {
                return Err(format!(
                    "'{name}' holds {} bytes; a {rows}x{cols} {format} matrix has {}",
                    raw.len(),
                    dst.len()
                ));
            }
            dst.copy_from_slice(raw);
            return Ok(());
        }
        Dtype::F32 => raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => raw
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => raw
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => {
            return Err(format!(
                "'{name}' has dtype {other:?}; accepted: U8/I8 (encoded bytes), F32, BF16, F16"
            ))
        }
    };
    if floats.len() != rows * cols || shape != [rows, cols] {
        return Err(format!(
            "'{name}' has shape {shape:?}, expected [{rows}, {cols}]"
        ));
    }
    ft_kernels::codec::encode_into(format, rows, cols, &floats, dst)
        .map_err(|e| format!("encoding '{name}': {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostDeviceConfig;

    fn geo() -> MoeGeometry {
        MoeGeometry {
            hidden: 64,
            intermediate: 32,
            experts: 3,
            top_k: 2,
            moe_layers: 2,
            shared_experts: 0,
        }
    }

    fn dev() -> Device {
        Device::host(HostDeviceConfig {
            memory_bytes: 64 << 20,
            ..Default::default()
        })
        .unwrap()
    }

    /// Naive reference: decode the whole expert to f32 and cut the sub-matrices there.
    #[test]
    fn tensor_parallel_slices_decode_to_the_whole_expert_s_sub_matrices() {
        use ft_kernels::codec::decode;
        let d = dev();
        let g = MoeGeometry {
            intermediate: 192,
            ..geo()
        };
        for f in ExpertFormat::ALL {
            let whole = HostBank::from_seed(&d, f, &g, 11).unwrap();
            for gpus in [2usize, 3] {
                if slice_geometry(f, &g, gpus).is_err() {
                    continue; // 192 / 3 = 64 is fine for every format; 96 too.
                }
                for gpu in 0..gpus {
                    let part = whole.tensor_parallel_slice(&d, gpus, gpu).unwrap();
                    let w = part.layout().geometry.intermediate;
                    assert_eq!(w, 192 / gpus);
                    let (h, i) = (g.hidden, g.intermediate);
                    let id = ExpertId::new(1, 2);
                    let we = whole.expert(id).unwrap();
                    let pe = part.expert(id).unwrap();
                    let gu = f.matrix_bytes(i, h) as usize;
                    let pgu = f.matrix_bytes(w, h) as usize;
                    for m in 0..2 {
                        let full = decode(f, i, h, &we[m * gu..(m + 1) * gu]).unwrap();
                        let got = decode(f, w, h, &pe[m * pgu..(m + 1) * pgu]).unwrap();
                        let want = &full[gpu * w * h..(gpu + 1) * w * h];
                        assert_eq!(got, want, "{f} gate/up {m} slice {gpu}/{gpus}");
                    }
                    let full = decode(f, h, i, &we[2 * gu..]).unwrap();
                    let got = decode(f, h, w, &pe[2 * pgu..]).unwrap();
                    for r in 0..h {
                        let want = &full[r * i + gpu * w..r * i + (gpu + 1) * w];
                        assert_eq!(&got[r * w..(r + 1) * w], want, "{f} down row {r}");
                    }
                }
            }
        }
        let e = slice_geometry(ExpertFormat::Q4_0, &g, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tensor-parallel") && e.contains("192"), "{e}");
        assert!(slice_geometry(ExpertFormat::Bf16, &g, 5).is_err());
    }

    #[test]
    fn seeded_banks_are_deterministic_and_distinct_per_expert() {
        let d = dev();
        let a = HostBank::from_seed(&d, ExpertFormat::Nvfp4, &geo(), 7).unwrap();
        let b = HostBank::from_seed(&d, ExpertFormat::Nvfp4, &geo(), 7).unwrap();
        let c = HostBank::from_seed(&d, ExpertFormat::Nvfp4, &geo(), 8).unwrap();
        let id = ExpertId::new(1, 2);
        assert_eq!(a.expert(id).unwrap(), b.expert(id).unwrap());
        assert_ne!(a.expert(id).unwrap(), c.expert(id).unwrap());
        assert_ne!(
            a.expert(id).unwrap(),
            a.expert(ExpertId::new(1, 1)).unwrap()
        );
        assert_eq!(
            a.expert(id).unwrap().len(),
            geo().expert_bytes(ExpertFormat::Nvfp4) as usize
        );
        assert_eq!(a.offset(id).unwrap() % WEIGHTS_ALIGN, 0);
        assert!(a.expert(ExpertId::new(2, 0)).is_err());
        // The bytes decode to values in the generator's range.
        let l = a.layout();
        let e = a.expert(id).unwrap();
        let (r, cc) = l.matrix_shape(2);
        let m = &e[l.matrix_offset(2)
            ..l.matrix_offset(2) + ExpertFormat::Nvfp4.matrix_bytes(r, cc) as usize];
        let v = ft_kernels::codec::decode(ExpertFormat::Nvfp4, r, cc, m).unwrap();
        let rms = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
        let sigma = 1.0 / (cc as f32).sqrt();
        assert!(v.iter().all(|x| x.is_finite()));
        assert!(
            rms > 0.5 * sigma && rms < 2.0 * sigma,
            "rms {rms} vs {sigma}"
        );
    }

    fn write_checkpoint(
        path: &Path,
        g: &MoeGeometry,
        format: ExpertFormat,
        encoded_layer0: bool,
    ) -> Vec<Vec<f32>> {
        use safetensors::tensor::TensorView;

        let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut floats = Vec::new();
        let layout = BankLayout::new(format, g).unwrap();
        for layer in 0..g.moe_layers {
            for expert in 0..g.experts {
                for (m, which) in MATRICES.iter().enumerate() {
                    let (rows, cols) = layout.matrix_shape(m);
                    let v: Vec<f32> = (0..rows * cols)
                        .map(|i| ((i * 7 + layer * 13 + expert * 5 + m) % 17) as f32 / 17.0 - 0.5)
                        .collect();
                    let name = tensor_name(layer, expert, which);
                    if layer == 0 && encoded_layer0 {
                        let bytes = ft_kernels::codec::encode(format, rows, cols, &v).unwrap();
                        let n = bytes.len();
                        owned.push((name, Dtype::U8, vec![n], bytes));
                    } else if expert % 2 == 0 {
                        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                        owned.push((name, Dtype::F32, vec![rows, cols], bytes));
                    } else {
                        let bytes: Vec<u8> = v
                            .iter()
                            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                            .collect();
                        owned.push((name, Dtype::BF16, vec![rows, cols], bytes));
                    }
                    floats.push(v);
                }
            }
        }
        let views: Vec<(String, TensorView<'_>)> = owned
            .iter()
            .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, &None, path).unwrap();
        floats
    }

    #[test]
    fn safetensors_checkpoints_load_encoded_and_float_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("experts.safetensors");
        let g = geo();
        let f = ExpertFormat::Q4_0;
        let floats = write_checkpoint(&path, &g, f, true);
        let bank = HostBank::from_safetensors(&dev(), f, &g, &path).unwrap();
        let l = *bank.layout();
        let mut i = 0;
        for layer in 0..g.moe_layers {
            for expert in 0..g.experts {
                let e = bank.expert(ExpertId::new(layer, expert)).unwrap();
                for m in 0..3 {
                    let (rows, cols) = l.matrix_shape(m);
                    let src = if expert % 2 == 1 && layer > 0 {
                        // stored as bf16: the bank encodes the bf16-rounded values
                        floats[i]
                            .iter()
                            .map(|x| half::bf16::from_f32(*x).to_f32())
                            .collect()
                    } else {
                        floats[i].clone()
                    };
                    let want = ft_kernels::codec::encode(f, rows, cols, &src).unwrap();
                    let off = l.matrix_offset(m);
                    assert_eq!(
                        &e[off..off + want.len()],
                        &want[..],
                        "L{layer}E{expert} m{m}"
                    );
                    i += 1;
                }
            }
        }
    }

    /// The header as read here (its bytes only) holds what the crate's own reader of the
    /// whole file finds: every tensor's dtype, shape and byte range.
    #[test]
    fn the_header_read_alone_matches_the_crates_whole_file_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("experts.safetensors");
        let g = geo();
        write_checkpoint(&path, &g, ExpertFormat::Int8, true);
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mine = parse_header(&bytes[8..8 + n]).unwrap();
        let (n2, whole) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(n, n2);
        let (a, b) = (mine.tensors(), whole.tensors());
        assert_eq!(a.len(), b.len());
        assert!(!a.is_empty());
        for (name, info) in &b {
            let m = a[name];
            assert_eq!(
                (m.dtype, &m.shape, m.data_offsets),
                (info.dtype, &info.shape, info.data_offsets),
                "{name}"
            );
        }
        assert!(parse_header(b"{not json").is_err());
    }

    #[test]
    fn safetensors_errors_name_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        let g = geo();
        write_checkpoint(&path, &g, ExpertFormat::Int8, false);
        // One layer more than the file holds.
        let e = HostBank::from_safetensors(&dev(), ExpertFormat::Int8, &g.with_layers(3), &path)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("model.layers.2.mlp.experts.0.gate_proj.weight"),
            "{e}"
        );
        // Wrong shape for the geometry.
        let mut g2 = g;
        g2.hidden = 128;
        let e = HostBank::from_safetensors(&dev(), ExpertFormat::Int8, &g2, &path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("shape"), "{e}");
        let e =
            HostBank::from_safetensors(&dev(), ExpertFormat::Int8, &g, &dir.path().join("none"))
                .unwrap_err()
                .to_string();
        assert!(e.contains("none"), "{e}");
    }
}
