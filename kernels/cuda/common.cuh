// Shared definitions of ft's CUDA kernels (prepended to every kernel source by ft-runtime).
//
// Sources are compiled by NVRTC at first use for the device's compute capability, with
// --fmad=false so that no multiply-add is contracted: the W4A8 expert path mirrors the CPU's
// arithmetic operation by operation.
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// One contiguous copy or read: `bytes` from `src` to `dst` (or just read at `src`).
// `first_block` is the index of the first block of the launch that works on it.
struct Region {
    u64 src;
    u64 dst;
    u64 bytes;
    u64 first_block;
};

// The region a block works on: the last one whose first_block <= blockIdx.x (binary search).
__device__ __forceinline__ int region_of_block(const Region* r, int n, u64 block) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (r[mid].first_block <= block) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// A launch's argument table carried in the kernel's own parameter space: the runtime copies
// a small table (task and pair lists, copy regions) into this parameter, so the launch needs
// no staging copy to device memory before it; `__grid_constant__` lets the kernel take its
// address and read it like any array. A table too large for it is staged in device memory
// and passed as `staged` (non-zero) instead. Its size is the runtime's
// CUDA_PARAM_TABLE_BYTES (a smaller parameter was measured to make no launch cheaper:
// experiments/gpu-backend, "Removed switches").
#define FT_PARAM_TABLE_BYTES 3072
struct __align__(16) ParamTable {
    u8 bytes[FT_PARAM_TABLE_BYTES];
};

// The table of a launch: the staged copy when there is one, else the parameter.
__device__ __forceinline__ const u8* table_base(const ParamTable& t, u64 staged) {
    return staged ? (const u8*)staged : t.bytes;
}

// The fixed-order combine of a decode layer at element e of a block of `block` f32 (streams x
// hidden): v_j = parts[j * block + e], plus m0[j * block + e], then m1, m2, m3 (each when not
// null, in that order), for the k row blocks j; summed by the halving tree of the runtime's
// `fixed_tree_rounds` (while len > 1: h = len / 2; v_i += v_(len-h+i) for i < h; len -= h);
// then act[e] += v_0. One definition for elementwise.cu's ft_combine_fixed and the down
// kernel's folded combine (experts.cu), so both make the same additions in the same order.
#define COMBINE_MAX_BLOCKS 64
__device__ __forceinline__ void combine_fixed_at(float* act, const float* parts,
                                                 const float* m0, const float* m1,
                                                 const float* m2, const float* m3,
                                                 u64 block, int k, u64 e) {
    float v[COMBINE_MAX_BLOCKS];
    for (int j = 0; j < k; j++) {
        const u64 i = (u64)j * block + e;
        float x = parts[i];
        if (m0) x = x + m0[i];
        if (m1) x = x + m1[i];
        if (m2) x = x + m2[i];
        if (m3) x = x + m3[i];
        v[j] = x;
    }
    for (int len = k; len > 1;) {
        int h = len / 2;
        for (int i = 0; i < h; i++) v[i] = v[i] + v[len - h + i];
        len -= h;
    }
    act[e] = act[e] + v[0];
}
