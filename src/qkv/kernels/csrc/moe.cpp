// A mixture of SwiGLU experts for a few tokens, each expert's weights read once where they lie: what decoding an
// MoE model at batch 1 spends its feed-forward in (qkv.nn.moe's grouped_dispatch is the reference).
//
//   x (N, C), experts (N, k) int64, weights (N, k) fp32, W_gate W_up (E, I, C), W_down (E, C, I)  ->  y (N, C)
//   y[t] = Σ_j weights[t, j] · W_down[e] (silu(W_gate[e] x[t]) ⊙ W_up[e] x[t]),  e = experts[t, j]
//
// The N·k assignments are grouped by expert (ascending, as the reference adds them), then two passes, each one
// at::parallel_for over rows of weights: the gate and up rows of every chosen expert (h = silu(g) ⊙ u for each
// assignment of that expert), then the down rows, each output column summing its expert's assignments. Without
// it, a token costs three products, a gather and an add per chosen expert, each one a pass of the threads; on a
// shared host each pass may wait for a descheduled thread.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "dot.h"

namespace {

struct Group {  // one chosen expert and its assignments [first, last) in ``order``
  int64_t expert, first, last;
};

// The assignments sorted by expert (stable), grouped: one Group per distinct expert, ascending.
std::vector<Group> group(const int64_t* experts, int64_t A, std::vector<int64_t>& order) {
  order.resize(A);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return experts[a] < experts[b]; });
  std::vector<Group> groups;
  for (int64_t i = 0; i < A; i++)
    if (groups.empty() || experts[order[i]] != groups.back().expert)
      groups.push_back({experts[order[i]], i, i + 1});
    else
      groups.back().last = i + 1;
  return groups;
}

void check(const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weights, const at::Tensor& gate,
           const at::Tensor& up, const at::Tensor& down) {
  TORCH_CHECK(gate.dim() == 3 && up.sizes() == gate.sizes() && down.dim() == 3 && down.size(0) == gate.size(0) &&
                  down.size(1) == gate.size(2) && down.size(2) == gate.size(1),
              "qkv::moe_swiglu: expected gate and up (E, I, C), down (E, C, I), got ", gate.sizes(), ", ",
              up.sizes(), ", ", down.sizes());
  TORCH_CHECK(x.dim() == 2 && x.size(1) == gate.size(2), "qkv::moe_swiglu: x must be (N, ", gate.size(2), "), got ",
              x.sizes());
  TORCH_CHECK(experts.scalar_type() == at::kLong && experts.dim() == 2 && experts.size(0) == x.size(0) &&
                  weights.scalar_type() == at::kFloat && weights.sizes() == experts.sizes(),
              "qkv::moe_swiglu: expected experts int64 and weights float32, both (", x.size(0), ", k), got ",
              experts.scalar_type(), " ", experts.sizes(), " and ", weights.scalar_type(), " ", weights.sizes());
  for (const at::Tensor* t : {&x, &experts, &weights, &gate, &up, &down})
    TORCH_CHECK(t->is_cpu() && t->is_contiguous(), "qkv::moe_swiglu: expected contiguous CPU tensors");
  for (const at::Tensor* t : {&x, &gate, &up, &down})
    TORCH_CHECK(t->scalar_type() == at::kFloat, "qkv::moe_swiglu: expected float32 x and weights, got ",
                t->scalar_type());
  const int64_t* e = experts.data_ptr<int64_t>();
  const int64_t E = gate.size(0);
  for (int64_t a = 0; a < experts.numel(); a++)
    TORCH_CHECK(0 <= e[a] && e[a] < E, "qkv::moe_swiglu: experts must lie in [0, ", E, "), got ", e[a]);
}

at::Tensor moe_swiglu(const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weights,
                      const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down) {
  check(x, experts, weights, gate, up, down);
  const int64_t N = x.size(0), k = experts.size(1), I = gate.size(1), C = gate.size(2);
  const int64_t* chosen = experts.data_ptr<int64_t>();
  const float *X = x.data_ptr<float>(), *P = weights.data_ptr<float>();
  const float *Wg = gate.data_ptr<float>(), *Wu = up.data_ptr<float>(), *Wd = down.data_ptr<float>();
  std::vector<int64_t> order;
  const std::vector<Group> groups = group(chosen, N * k, order);
  const int64_t U = static_cast<int64_t>(groups.size());
  std::vector<float> h(N * k * I);  // (N·k, I): row a is assignment order[a]'s inner value
  at::parallel_for(0, U * I, std::max<int64_t>(1, 16384 / C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; r++) {  // row i of expert groups[u]'s gate and up
      const Group& g = groups[r / I];
      const int64_t i = r % I, row = (g.expert * I + i) * C;
      for (int64_t a = g.first; a < g.last; a++) {
        const float* xt = X + (order[a] / k) * C;
        const float gv = qkv::dot(Wg + row, xt, C), uv = qkv::dot(Wu + row, xt, C);
        h[a * I + i] = gv / (1.f + std::exp(-gv)) * uv;  // silu(g) · u
      }
    }
  });
  at::Tensor y = at::zeros({N, C}, x.options());
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, C, std::max<int64_t>(1, 16384 / (I * U)), [&](int64_t begin, int64_t end) {
    for (const Group& g : groups)  // experts in ascending order, as the reference adds them
      for (int64_t c = begin; c < end; c++) {
        const float* row = Wd + (g.expert * C + c) * I;
        for (int64_t a = g.first; a < g.last; a++)
          Y[(order[a] / k) * C + c] += P[order[a]] * qkv::dot(row, h.data() + a * I, I);
      }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(qkv, m) {
  m.def("moe_swiglu(Tensor x, Tensor experts, Tensor weights, Tensor gate, Tensor up, Tensor down) -> Tensor");
  m.impl("moe_swiglu", c10::DispatchKey::CPU, &moe_swiglu);
}
