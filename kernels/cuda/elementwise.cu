// Small element-wise kernels of the decode step.

// dst[i] += src[i] for i < n (hybrid: add the CPU experts' partial output to the GPU's).
extern "C" __global__ void ft_add_f32(float* dst, const float* src, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (; i < n; i += stride) dst[i] = dst[i] + src[i];
}

// The fixed-order combine of a decode layer, in one launch: combine_fixed_at (common.cuh)
// for every element e of a block of `block` f32. The same f32 additions in the same order as
// the add_f32 launches it replaces (one per buffer and per round), so the outputs are bit for
// bit the same.
extern "C" __global__ void ft_combine_fixed(float* act, const float* parts, const float* m0,
                                            const float* m1, const float* m2, const float* m3,
                                            u64 block, int k) {
    u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (; e < block; e += stride) combine_fixed_at(act, parts, m0, m1, m2, m3, block, k, e);
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
