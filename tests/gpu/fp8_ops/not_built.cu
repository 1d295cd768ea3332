// Kernels that vLLM's SM90 dispatcher names but this FP8 extension does not build (int8 GEMMs):
// a call fails loudly instead of the library failing to load. The FP8 checks never reach them.
#include <torch/headeronly/util/Exception.h>

#include "libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_kernels.hpp"

#if defined ENABLE_SCALED_MM_SM90 && ENABLE_SCALED_MM_SM90
namespace vllm {

void cutlass_scaled_mm_sm90_int8(torch::stable::Tensor& out, torch::stable::Tensor const& a,
                                 torch::stable::Tensor const& b, torch::stable::Tensor const& a_scales,
                                 torch::stable::Tensor const& b_scales,
                                 std::optional<torch::stable::Tensor> const& bias) {
  STD_TORCH_CHECK(false, "int8 cutlass_scaled_mm is not built in the FP8 test extension (tests/gpu/fp8_ops)");
}

void cutlass_scaled_mm_azp_sm90_int8(torch::stable::Tensor& out, torch::stable::Tensor const& a,
                                     torch::stable::Tensor const& b, torch::stable::Tensor const& a_scales,
                                     torch::stable::Tensor const& b_scales,
                                     torch::stable::Tensor const& azp_adj,
                                     std::optional<torch::stable::Tensor> const& azp,
                                     std::optional<torch::stable::Tensor> const& bias) {
  STD_TORCH_CHECK(false, "cutlass_scaled_mm_azp is not built in the FP8 test extension (tests/gpu/fp8_ops)");
}

}  // namespace vllm
#endif
