// y = x Wᵀ + b for a few rows of x, in one pass over W: the product that decoding at batch 1
// (or a beam of a few) spends its time in, written to stream W at the rate the memory allows.
//
//   x (M, K), W (N, K), b (N,) or none  ->  y (M, N)      M small (1 to a beam); fp32 or bf16, summed in fp32
//
// Each thread (at::parallel_for, torch's own) takes a run of W's rows and reads them in order, one
// stream, as a plain sum does (reading 4 rows side by side streams slower). Row n,
// K numbers, is read from memory once: for the second and later rows of x it is still in the L1 cache.
// bf16 weights are half the bytes, so half the time: each is widened to fp32 (exactly) in registers,
// the sums are fp32's and each output is rounded to bf16 once, as F.linear (oneDNN) does.
// The reference is F.linear; qkv/kernels/build.py builds this file at first use and tests/test_matvec.py
// checks it against the reference.
#include <algorithm>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include "dot.h"

namespace {

inline float widen(float v) { return v; }
inline float widen(c10::BFloat16 v) { return static_cast<float>(v); }  // its 16 bits, then 16 zeros

// Σ_k w[k] x[k] in fp32: qkv::dot (dot.h) for fp32; bf16 widened to fp32 in the compiler's vectorised loop.
inline float dot(const float* w, const float* x, int64_t K) { return qkv::dot(w, x, K); }
inline float dot(const c10::BFloat16* __restrict w, const c10::BFloat16* __restrict x, int64_t K) {
  float a = 0.f;
#pragma omp simd reduction(+ : a)
  for (int64_t k = 0; k < K; k++) a += widen(w[k]) * widen(x[k]);
  return a;
}

// y[m, n] = Σ_k x[m, k] W[n, k] + b[n] for M rows of x, each thread a run of W's rows.
template <typename T>
void products(const T* W, const T* X, const T* B, T* Y, int64_t M, int64_t N, int64_t K) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(K, 1));  // ≥ 32 K weights a thread
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>)
      if (M == 1)
        return qkv::dot_rows(W, X, K, begin, end, [&](int64_t n, float a) { Y[n] = a + (B ? B[n] : 0.f); });
    for (int64_t n = begin; n < end; n++)
      for (int64_t m = 0; m < M; m++)
        Y[m * N + n] = static_cast<T>(dot(W + n * K, X + m * K, K) + (B ? widen(B[n]) : 0.f));
  });
}

at::Tensor matvec(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(weight.dim() == 2, "qkv::matvec: weight must be (N, K), got ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "qkv::matvec: x must be (..., ", K, ") for a weight of ",
              weight.sizes(), ", got ", x.sizes());
  const auto dtype = weight.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && x.scalar_type() == dtype,
              "qkv::matvec: expected float32 or bfloat16 x and weight of one dtype, got ", x.scalar_type(),
              " and ", dtype);
  TORCH_CHECK(x.is_cpu() && weight.is_cpu() && x.is_contiguous() && weight.is_contiguous(),
              "qkv::matvec: expected contiguous CPU tensors");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias)
    TORCH_CHECK(bias->scalar_type() == dtype && bias->is_cpu() && bias->is_contiguous() && bias->dim() == 1 &&
                    bias->size(0) == N,
                "qkv::matvec: bias must be contiguous ", dtype, " (", N, ",), got ", bias->scalar_type(), " ",
                bias->sizes());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  at::Tensor y = at::empty(shape, x.options());
  const int64_t M = c10::multiply_integers(x.sizes().begin(), x.sizes().end() - 1);  // rows of x
  if (dtype == at::kFloat)
    products(weight.data_ptr<float>(), x.data_ptr<float>(), has_bias ? bias->data_ptr<float>() : nullptr,
             y.data_ptr<float>(), M, N, K);
  else
    products(weight.data_ptr<c10::BFloat16>(), x.data_ptr<c10::BFloat16>(),
             has_bias ? bias->data_ptr<c10::BFloat16>() : nullptr, y.data_ptr<c10::BFloat16>(), M, N, K);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(qkv, m) {
  m.def("matvec(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.impl("matvec", c10::DispatchKey::CPU, &matvec);
}
