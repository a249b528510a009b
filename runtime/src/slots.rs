//! The GPU expert cache's memory: one device buffer of equal slots shared by all layers.
//!
//! Which expert sits in which slot, and whom an admission evicts, is decided by
//! [`ft_model::cache::ExpertCache`] (the one implementation of policy in `ft`); this module
//! only provides the bytes a [`SlotId`] maps to, sized by a slot count or by GiB, and refuses
//! a size the device cannot hold, saying how many slots would fit.

use ft_model::cache::{CacheSize, SlotId};

use crate::device::{Device, DeviceBuffer};
use crate::error::{Result, RuntimeError};
use crate::gather::CopyRegion;
use crate::gpu_experts::WEIGHTS_ALIGN;

/// Device memory left free beside the slots by default, bytes (1 GiB): the dense weights,
/// KV bytes, activations, kernel scratch and the CUDA context's own needs.
pub const DEFAULT_RESERVE_BYTES: u64 = 1 << 30;

/// The slot memory of the expert cache.
#[derive(Debug)]
pub struct SlotPool {
    buffer: DeviceBuffer,
    expert_bytes: usize,
    stride: usize,
    count: usize,
}

impl SlotPool {
    /// Bytes between slot starts for experts of `expert_bytes` (rounded up to
    /// [`WEIGHTS_ALIGN`]).
    pub fn stride_for(expert_bytes: u64) -> usize {
        (expert_bytes as usize).next_multiple_of(WEIGHTS_ALIGN)
    }

    /// How many slots of `expert_bytes` fit in the device's free memory, keeping
    /// `reserve_bytes` free.
    pub fn max_slots(device: &Device, expert_bytes: u64, reserve_bytes: u64) -> Result<usize> {
        let free = device.free_mem_bytes()?;
        Ok((free.saturating_sub(reserve_bytes) / Self::stride_for(expert_bytes) as u64) as usize)
    }

    /// Allocate `count` slots for experts of `expert_bytes`, refusing (with what fits) when
    /// the device's free memory less `reserve_bytes` cannot hold them.
    pub fn new(
        device: &Device,
        expert_bytes: u64,
        count: usize,
        reserve_bytes: u64,
    ) -> Result<SlotPool> {
        if expert_bytes == 0 {
            return Err(RuntimeError::invalid(
                "slot pool expert_bytes",
                "must be > 0",
            ));
        }
        if count == 0 {
            return Err(RuntimeError::invalid("slot pool size", "0 slots"));
        }
        let stride = Self::stride_for(expert_bytes);
        let bytes = count
            .checked_mul(stride)
            .ok_or_else(|| RuntimeError::invalid("slot pool size", "overflows"))?;
        let free = device.free_mem_bytes()?;
        let usable = free.saturating_sub(reserve_bytes);
        if bytes as u64 > usable {
            let fit = usable / stride as u64;
            return Err(RuntimeError::OutOfMemory {
                what: format!("the expert cache ({count} slots of {expert_bytes} bytes)"),
                requested: bytes as u64,
                available: usable,
                hint: format!(
                    "; {} has {:.2} GiB free, {:.2} GiB kept in reserve: at most {fit} slots \
                     ({:.2} GiB) fit",
                    device.info().name,
                    free as f64 / (1u64 << 30) as f64,
                    reserve_bytes as f64 / (1u64 << 30) as f64,
                    (fit * stride as u64) as f64 / (1u64 << 30) as f64
                ),
            });
        }
        let buffer = device.alloc(bytes, "expert cache slots")?;
        Ok(SlotPool {
            buffer,
            expert_bytes: expert_bytes as usize,
            stride,
            count,
        })
    }

    /// Allocate the slots a [`CacheSize`] (`--cache-slots` / `--cache-gb`) asks for, for a
    /// model of `total_experts` routed experts.
    pub fn with_size(
        device: &Device,
        expert_bytes: u64,
        size: &CacheSize,
        total_experts: u64,
        reserve_bytes: u64,
    ) -> Result<SlotPool> {
        let count = size.slots(Self::stride_for(expert_bytes) as u64, total_experts)?;
        Self::new(device, expert_bytes, count, reserve_bytes)
    }

    /// Number of slots.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes of one expert.
    pub fn expert_bytes(&self) -> usize {
        self.expert_bytes
    }

    /// Bytes between slot starts.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The slot memory (the `weights` buffer of [`crate::Stream::launch_experts`]).
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buffer
    }

    /// Byte offset of a slot in [`SlotPool::buffer`].
    pub fn offset(&self, slot: SlotId) -> Result<usize> {
        if slot.index() >= self.count {
            return Err(RuntimeError::invalid(
                "slot",
                format!("{slot} is not below the pool's {} slots", self.count),
            ));
        }
        Ok(slot.index() * self.stride)
    }

    /// The copy bringing `bytes` from `src_offset` (of a host bank) into `slot`.
    pub fn copy_into(&self, src_offset: usize, slot: SlotId) -> Result<CopyRegion> {
        Ok(CopyRegion {
            src_offset: src_offset as u64,
            dst_offset: self.offset(slot)? as u64,
            bytes: self.expert_bytes as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostDeviceConfig;

    fn dev(bytes: u64) -> Device {
        Device::host(HostDeviceConfig {
            memory_bytes: bytes,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn slots_are_aligned_and_indexed() {
        let d = dev(64 << 20);
        let p = SlotPool::new(&d, 1000, 10, 0).unwrap();
        assert_eq!(p.stride(), 1024);
        assert_eq!(p.offset(SlotId(3)).unwrap(), 3072);
        assert!(p.offset(SlotId(10)).is_err());
        assert_eq!(p.buffer().len(), 10 * 1024);
        let r = p.copy_into(4096, SlotId(2)).unwrap();
        assert_eq!((r.src_offset, r.dst_offset, r.bytes), (4096, 2048, 1000));
    }

    #[test]
    fn a_size_that_does_not_fit_says_what_fits() {
        let d = dev(10 << 20);
        let e = SlotPool::new(&d, 1 << 20, 20, 2 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 8 slots"), "{e}");
        assert_eq!(SlotPool::max_slots(&d, 1 << 20, 2 << 20).unwrap(), 8);
        let by_gib = SlotPool::with_size(&d, 1 << 20, &CacheSize::GiB(0.005), 1000, 0).unwrap();
        assert_eq!(by_gib.count(), 5);
    }
}
