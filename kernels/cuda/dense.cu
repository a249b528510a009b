// The dense part of a layer: a memory-bound kernel that reads every byte of its regions
// (a layer's dense weights and each stream's KV bytes) and folds them into 256 u32 words,
// so that the reads cannot be elided. Each region is split into chunks of `chunk` bytes,
// one block per chunk.

#define DENSE_OUT_WORDS 256
#define DENSE_UNROLL 4

extern "C" __global__ void ft_dense_read(const __grid_constant__ ParamTable tab, u64 staged,
                                         int n_regions, u64 chunk, u32* out) {
    const Region* regions = (const Region*)table_base(tab, staged);
    int ri = region_of_block(regions, n_regions, blockIdx.x);
    Region r = regions[ri];
    u64 start = (u64)(blockIdx.x - r.first_block) * chunk;
    u32 acc = 0;
    if (start < r.bytes) {
        u64 end = start + chunk < r.bytes ? start + chunk : r.bytes;
        const u8* src = (const u8*)r.src;
        bool aligned = (r.src & 15) == 0;
        u64 vec_end = aligned ? start + ((end - start) & ~(u64)15) : start;
        const uint4* s4 = (const uint4*)(src + start);
        u64 n4 = (vec_end - start) / 16;
        u64 step = (u64)blockDim.x * DENSE_UNROLL;
        for (u64 i = threadIdx.x; i < n4; i += step) {
            uint4 v[DENSE_UNROLL];
#pragma unroll
            for (int u = 0; u < DENSE_UNROLL; u++) {
                u64 j = i + (u64)u * blockDim.x;
                v[u] = j < n4 ? s4[j] : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < DENSE_UNROLL; u++) acc += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
        for (u64 i = vec_end + threadIdx.x; i < end; i += blockDim.x) acc += src[i];
    }
    // Warp reduction, then one atomic per warp.
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(&out[blockIdx.x % DENSE_OUT_WORDS], acc);
}
