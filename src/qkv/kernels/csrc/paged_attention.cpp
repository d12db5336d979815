// Paged decode attention: one query per row and head over the row's key/value blocks where they lie in the pools
// (vLLM's paged decode kernel), without gathering them into a copy first.
//
//   s_j = q · k_j · scale + bias[b, j]      j over the row's S = n · K positions, block table[b, j / K]
//   out = Σ_j softmax(s)_j v_j               sums and softmax in fp32; keys and values fp32 or bf16
//
// q (B, H, D) fp32, pools (N, G, K, D), table (B, n) int64, bias (B or 1, S) fp32 (−inf: masked) -> (B, H, D) fp32;
// the H / G query heads of key head g read its keys once. A row with no allowed key gets zeros.
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "dot.h"

namespace qkv {
namespace {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

struct Paged {
  int64_t B, H, D, G, K, n, h, bias_rows;
};

// Scores of the h query heads q (h, D) over the row's keys -> scores (h, S); −inf where the bias masks.
template <typename T>
void scores(const Paged& p, const float* q, const T* keys, const int64_t* row_table, const float* bias, float scale,
            float* out) {
  const int64_t S = p.n * p.K;
  for (int64_t j = 0; j < S; ++j) {
    const T* k = keys + (row_table[j / p.K] * p.G * p.K + j % p.K) * p.D;  // block, then offset (head g's pool)
    for (int64_t i = 0; i < p.h; ++i)
      out[i * S + j] = bias[j] == NEG_INF ? NEG_INF : dot(k, q + i * p.D, p.D) * scale + bias[j];
  }
}

// Each of the h rows of scores (h, S) becomes its softmax's weights in place; false for a row with no allowed key.
inline bool softmax_row(float* s, int64_t S) {
  float top = NEG_INF;
  for (int64_t j = 0; j < S; ++j) top = std::max(top, s[j]);
  if (top == NEG_INF) return false;
  float total = 0.f;
  for (int64_t j = 0; j < S; ++j) total += (s[j] = std::exp(s[j] - top));
  for (int64_t j = 0; j < S; ++j) s[j] /= total;
  return true;
}

// out (h, D) = weights (h, S) · the row's values.
template <typename T>
void weighted(const Paged& p, const float* w, const T* values, const int64_t* row_table, float* out) {
  const int64_t S = p.n * p.K;
  std::fill(out, out + p.h * p.D, 0.f);
  for (int64_t j = 0; j < S; ++j) {
    const T* v = values + (row_table[j / p.K] * p.G * p.K + j % p.K) * p.D;
    for (int64_t i = 0; i < p.h; ++i) {
      const float wj = w[i * S + j];
      if (wj == 0.f) continue;
      for (int64_t d = 0; d < p.D; ++d) out[i * p.D + d] += wj * widen(v[d]);
    }
  }
}

template <typename T>
void paged_rows(const Paged& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& table, const at::Tensor& bias, float scale, at::Tensor& out) {
  const float* qd = q.data_ptr<float>();
  const T* kd = reinterpret_cast<const T*>(k.data_ptr());
  const T* vd = reinterpret_cast<const T*>(v.data_ptr());
  const int64_t* td = table.data_ptr<int64_t>();
  const float* bd = bias.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const int64_t S = p.n * p.K;
  at::parallel_for(0, p.B * p.G, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> s(p.h * S);
    for (int64_t bg = lo; bg < hi; ++bg) {
      const int64_t b = bg / p.G, g = bg % p.G;
      const int64_t* row_table = td + b * p.n;
      const float* row_bias = bd + (p.bias_rows == 1 ? 0 : b) * S;
      const float* qg = qd + (b * p.H + g * p.h) * p.D;  // the h query heads of key head g
      float* og = od + (b * p.H + g * p.h) * p.D;
      scores(p, qg, kd + g * p.K * p.D, row_table, row_bias, scale, s.data());
      bool live = false;
      for (int64_t i = 0; i < p.h; ++i) live = softmax_row(s.data() + i * S, S) || live;
      if (live) weighted(p, s.data(), vd + g * p.K * p.D, row_table, og);
      else std::fill(og, og + p.h * p.D, 0.f);
    }
  });
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& table, const at::Tensor& bias, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(), "q must be (B, H, D) fp32, contiguous");
  TORCH_CHECK(k.dim() == 4 && k.sizes() == v.sizes() && k.scalar_type() == v.scalar_type() && k.is_contiguous() &&
                  v.is_contiguous(), "the pools must be (N, G, K, D), alike and contiguous");
  TORCH_CHECK(k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16, "the pools must be fp32 or bf16");
  TORCH_CHECK(table.dim() == 2 && table.scalar_type() == at::kLong && table.is_contiguous() && table.size(0) == q.size(0),
              "table must be (B, n) int64, contiguous, one row per query row");
  const Paged p{q.size(0), q.size(1), q.size(2), k.size(1), k.size(2), table.size(1), q.size(1) / k.size(1),
                bias.size(0)};
  TORCH_CHECK(k.size(3) == p.D && p.H % p.G == 0, "the pools' head width must be q's and G must divide H");
  TORCH_CHECK(bias.dim() == 2 && bias.scalar_type() == at::kFloat && bias.is_contiguous() &&
                  (p.bias_rows == 1 || p.bias_rows == p.B) && bias.size(1) == p.n * p.K,
              "bias must be (B or 1, n · K) fp32, contiguous");
  at::Tensor out = at::empty({p.B, p.H, p.D}, q.options());
  if (k.scalar_type() == at::kFloat) paged_rows<float>(p, q, k, v, table, bias, static_cast<float>(scale), out);
  else paged_rows<Bf16>(p, q, k, v, table, bias, static_cast<float>(scale), out);
  return out;
}

}  // namespace
}  // namespace qkv

TORCH_LIBRARY_FRAGMENT(qkv, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k, Tensor v, Tensor table, Tensor bias, float scale) -> Tensor");
  m.impl("paged_decode_attention", c10::DispatchKey::CPU, &qkv::paged_decode_attention);
}
