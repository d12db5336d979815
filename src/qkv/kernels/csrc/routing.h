// A token's experts and their weights from its router logits, as qkv.nn.moe.Router computes them: what the decode
// step (decoder_step.cpp) runs for each row of a mixture-of-experts layer, every thread alike.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

namespace qkv {

enum Routing { NORM_TOPK = 1, TOP_K_FIRST = 2 };  // bits: renormalise the k weights; softmax over the k logits alone

// experts (k), weights (k) from logits (E): the k largest (topk's choice of the softmax's, which orders them as the
// logits), their softmax probabilities [÷ their sum + 1e-20]; with TOP_K_FIRST the softmax over the k logits
// alone. Sorted by expert: the order the reference adds them in. order: E ints of scratch.
inline void route(const float* logits, int64_t E, int64_t k, int64_t routing, int64_t* order, int64_t* experts,
                  float* weights) {
  std::iota(order, order + E, 0);
  std::partial_sort(order, order + k, order + E,
                    [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::sort(order, order + k);
  const float top = *std::max_element(logits, logits + E);
  float total = 0.f, sum = 0.f;
  for (int64_t e = 0; e < E; e++) total += std::exp(logits[e] - top);
  if (routing & TOP_K_FIRST)
    for (int64_t j = 0; j < k; j++) sum += std::exp(logits[order[j]] - top);
  for (int64_t j = 0; j < k; j++) {
    experts[j] = order[j];
    weights[j] = std::exp(logits[order[j]] - top) / (routing & TOP_K_FIRST ? sum : total);
  }
  if (routing == NORM_TOPK) {  // the probabilities ÷ their sum
    for (int64_t j = 0; j < k; j++) sum += weights[j];
    for (int64_t j = 0; j < k; j++) weights[j] /= sum + 1e-20f;
  }
}

}  // namespace qkv
