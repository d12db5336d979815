// Σ_k w[k] x[k] in fp32: the dot product qkv's two kernels (matvec.cpp, decoder_step.cpp) spend a decoding
// step in, one weight row against one row of x held in L1.
//
// A row is streamed from memory, so the loop must keep up with the memory: with one vector sum (what the
// compiler makes of the reference loop) each fused multiply-add waits for the one before it, and on 2 Zen 5
// cores the product streamed at 0.67-0.79 of a plain read while the host's memory ran at 100-120 GB/s;
// with four independent sums, at 0.88-0.93 (measured side by side, interleaved). Where the memory is
// slower (45-75 GB/s) the two are alike: the loop waits for the memory either way.
#pragma once

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace qkv {

// The reference: one sum, vectorised by the compiler (which may reorder it: fp32's rounding).
inline float dot_reference(const float* __restrict w, const float* __restrict x, int64_t K) {
  float a = 0.f;
#pragma omp simd reduction(+ : a)
  for (int64_t k = 0; k < K; k++) a += w[k] * x[k];
  return a;
}

// Four sums of 16 lanes, each taking every fourth 64-byte piece of the row, then the rest (K mod 64) by
// the reference loop. Where the CPU has no AVX-512, the reference loop alone.
inline float dot(const float* __restrict w, const float* __restrict x, int64_t K) {
#if defined(__AVX512F__)
  const int64_t whole = K - K % 64;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t k = 0; k < whole; k += 64) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 32), _mm512_loadu_ps(x + k + 32), a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 48), _mm512_loadu_ps(x + k + 48), a3);
  }
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  return whole == K ? sum : sum + dot_reference(w + whole, x + whole, K - whole);
#else
  return dot_reference(w, x, K);
#endif
}

}  // namespace qkv
