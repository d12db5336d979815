// The decode step's activations in fp32, written for the compiler to vectorise (decoder_step.cpp's feed-forward
// and mixture of experts): relu, gelu (erf), gelu_tanh, silu, each a loop over a run of outputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace qkv {

enum Act { RELU = 0, GELU = 1, GELU_TANH = 2, SILU = 3 };

// e^v in fp32, in a form the compiler vectorises (libm's expf is one number at a time): Cephes' expf,
// v = n ln 2 + r with |r| ≤ ln 2 / 2, e^r by a degree-6 polynomial, 2^n by the exponent's bits; ~1 ulp.
inline float exp_vec(float v) {
  v = std::min(std::max(v, -87.3f), 88.3f);  // e^v stays a finite, normal float (2^n with n in [-126, 127])
  const float n = static_cast<float>(static_cast<int32_t>(v * 1.44269504f + (v >= 0.f ? 0.5f : -0.5f)));
  const float r = v - n * 0.693359375f + n * 2.12194440e-4f;  // ln 2 in two parts, exact products
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// erf(v) within 1.5e-7 (Abramowitz & Stegun 7.1.26), vectorisable as exp_vec is.
inline float erf_vec(float v) {
  const float x = std::fabs(v), t = 1.f / (1.f + 0.3275911f * x);
  const float y = 1.f - t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f +
                  t * 1.061405429f)))) * exp_vec(-x * x);
  return v < 0.f ? -y : y;
}

// The activations of qkv.layers: relu, gelu (erf), gelu_tanh (GPT-2's: 0.5 v (1 + tanh u) = v σ(2u)), silu.
inline float activate(float v, int64_t act) {
  switch (act) {
    case RELU: return v > 0.f ? v : 0.f;
    case GELU: return 0.5f * v * (1.f + erf_vec(v * 0.70710678f));
    case GELU_TANH: return v / (1.f + exp_vec(-1.5957691216f * (v + 0.044715f * v * v * v)));
    default: return v / (1.f + exp_vec(-v));  // SILU
  }
}

// y[n] = act(y[n]), or act(gate[n]) · y[n], for n in [begin, end): one activation, vectorised.
template <int64_t A>
inline void activate_rows(float* __restrict y, const float* __restrict gate, int64_t begin, int64_t end) {
  if (gate) {
#pragma omp simd
    for (int64_t n = begin; n < end; n++) y[n] = activate(gate[n], A) * y[n];
  } else {
#pragma omp simd
    for (int64_t n = begin; n < end; n++) y[n] = activate(y[n], A);
  }
}


}  // namespace qkv
