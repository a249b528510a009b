// Small element-wise kernels of the decode step.

// dst[i] += src[i] for i < n (hybrid: add the CPU experts' partial output to the GPU's).
extern "C" __global__ void ft_add_f32(float* dst, const float* src, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (; i < n; i += stride) dst[i] = dst[i] + src[i];
}

// The fixed-order combine of a decode layer, in one launch: for each element e of a block
// of `block` f32 (streams x hidden), v_j = parts[j * block + e], plus m0[j * block + e], then
// m1, m2, m3 (each when not null, in that order), for the k row blocks j; summed by the
// halving tree of the runtime's `fixed_tree_rounds` (while len > 1: h = len / 2;
// v_i += v_(len-h+i) for i < h; len -= h); then act[e] += v_0. The same f32 additions in the
// same order as the add_f32 launches it replaces (one per buffer and per round), so the
// outputs are bit for bit the same.
#define COMBINE_MAX_BLOCKS 64
extern "C" __global__ void ft_combine_fixed(float* act, const float* parts, const float* m0,
                                            const float* m1, const float* m2, const float* m3,
                                            u64 block, int k) {
    u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (; e < block; e += stride) {
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
}

// Keep the stream busy for ns nanoseconds (one thread spinning on the global timer): a
// benchmark queues the work it times behind it, so that the host's enqueue cost is not
// in the timing.
extern "C" __global__ void ft_hold_ns(u64 ns) {
    u64 t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
