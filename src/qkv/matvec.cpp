// y = x Wᵀ + b for a few rows of x, in one pass over W: the product that decoding at batch 1
// (or a beam of a few) spends its time in, written to stream W at the rate the memory allows.
//
//   x (M, K) fp32, W (N, K) fp32, b (N,) fp32 or none  ->  y (M, N)        M small (1 to a beam)
//
// Each thread (at::parallel_for, torch's own) takes a run of W's rows and reads them in order, one
// stream, as a plain sum does (measured: reading 4 rows side by side streams at 0.8 of that). Row n,
// K floats, is read from memory once: for the second and later rows of x it is still in the L1 cache.
// The reference is F.linear; qkv/matvec.py builds this file at first use and tests/test_matvec.py
// checks it against the reference.
#include <algorithm>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/accumulate.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace {

// Σ_k w[k] x[k], vectorised (the compiler may reorder the sum: the tests allow float32's rounding).
float dot(const float* __restrict w, const float* __restrict x, int64_t K) {
  float a = 0.f;
#pragma omp simd reduction(+ : a)
  for (int64_t k = 0; k < K; k++) a += w[k] * x[k];
  return a;
}

at::Tensor matvec(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(weight.dim() == 2, "qkv::matvec: weight must be (N, K), got ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "qkv::matvec: x must be (..., ", K, ") for a weight of ",
              weight.sizes(), ", got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "qkv::matvec: expected float32 x and weight, got ", x.scalar_type(), " and ", weight.scalar_type());
  TORCH_CHECK(x.is_cpu() && weight.is_cpu() && x.is_contiguous() && weight.is_contiguous(),
              "qkv::matvec: expected contiguous CPU tensors");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias)
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_cpu() && bias->is_contiguous() &&
                    bias->dim() == 1 && bias->size(0) == N,
                "qkv::matvec: bias must be contiguous float32 (", N, ",), got ", bias->scalar_type(), " ",
                bias->sizes());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  at::Tensor y = at::empty(shape, x.options());
  const int64_t M = c10::multiply_integers(x.sizes().begin(), x.sizes().end() - 1);  // rows of x
  const float *W = weight.data_ptr<float>(), *X = x.data_ptr<float>(), *B = has_bias ? bias->data_ptr<float>() : nullptr;
  float* Y = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(K, 1));  // ≥ 128 KB of W a thread
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; n++)
      for (int64_t m = 0; m < M; m++) Y[m * N + n] = dot(W + n * K, X + m * K, K) + (B ? B[n] : 0.f);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(qkv, m) {
  m.def("matvec(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.impl("matvec", c10::DispatchKey::CPU, &matvec);
}
