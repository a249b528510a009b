// Zero-copy gather: blocks read mapped, page-locked host memory directly over the link
// (16-byte loads, many in flight) and write it into device cache slots.
//
// The regions come in the launch's table (common.cuh). Each region is split into chunks of GATHER_CHUNK bytes, one block per chunk; blockDim.x
// threads each move GATHER_UNROLL uint4 per iteration so that enough loads are outstanding
// to cover the link's latency.

#define GATHER_UNROLL 4

extern "C" __global__ void ft_gather_zero_copy(const __grid_constant__ ParamTable tab, u64 staged,
                                               int n_regions, u64 chunk) {
    const Region* regions = (const Region*)table_base(tab, staged);
    int ri = region_of_block(regions, n_regions, blockIdx.x);
    Region r = regions[ri];
    u64 start = (u64)(blockIdx.x - r.first_block) * chunk;
    if (start >= r.bytes) return;
    u64 end = start + chunk < r.bytes ? start + chunk : r.bytes;
    const u8* src = (const u8*)r.src;
    u8* dst = (u8*)r.dst;
    // Vector part: both addresses 16-byte aligned (bank experts and slots are 256-aligned).
    bool aligned = ((r.src | r.dst) & 15) == 0;
    u64 vec_end = aligned ? start + ((end - start) & ~(u64)15) : start;
    const uint4* s4 = (const uint4*)(src + start);
    uint4* d4 = (uint4*)(dst + start);
    u64 n4 = (vec_end - start) / 16;
    u64 step = (u64)blockDim.x * GATHER_UNROLL;
    for (u64 i = threadIdx.x; i < n4; i += step) {
        uint4 v[GATHER_UNROLL];
#pragma unroll
        for (int u = 0; u < GATHER_UNROLL; u++) {
            u64 j = i + (u64)u * blockDim.x;
            if (j < n4) v[u] = s4[j];
        }
#pragma unroll
        for (int u = 0; u < GATHER_UNROLL; u++) {
            u64 j = i + (u64)u * blockDim.x;
            if (j < n4) d4[j] = v[u];
        }
    }
    for (u64 i = vec_end + threadIdx.x; i < end; i += blockDim.x) dst[i] = src[i];
}
