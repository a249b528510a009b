// Small element-wise kernels of the decode step.

// dst[i] += src[i] for i < n (hybrid: add the CPU experts' partial output to the GPU's).
extern "C" __global__ void ft_add_f32(float* dst, const float* src, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (; i < n; i += stride) dst[i] = dst[i] + src[i];
}
