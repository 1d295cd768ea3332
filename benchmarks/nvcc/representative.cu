// A representative unit: templated kernels over bf16/fp8/fp4 types, instantiated several times (like vLLM's).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
template <typename T, int N>
__global__ void scale_rows(const T* in, T* out, const float* scale, int cols) {
  int row = blockIdx.x;
  for (int c = threadIdx.x * N; c < cols; c += blockDim.x * N) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[row * cols + c + i] = T(float(in[row * cols + c + i]) * scale[row]);
  }
}
template __global__ void scale_rows<__nv_bfloat16, 4>(const __nv_bfloat16*, __nv_bfloat16*, const float*, int);
template __global__ void scale_rows<__nv_bfloat16, 8>(const __nv_bfloat16*, __nv_bfloat16*, const float*, int);
template __global__ void scale_rows<__nv_fp8_e4m3, 16>(const __nv_fp8_e4m3*, __nv_fp8_e4m3*, const float*, int);
template __global__ void scale_rows<float, 4>(const float*, float*, const float*, int);
