// Σ_k w[k] x[k] in fp32: the dot product qkv's two kernels (matvec.cpp, decoder_step.cpp) spend a decoding
// step in, one weight row against one row of x held in L1; and its transpose, the attention's weighted sum.
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

// Four sums of 16 lanes, each taking every fourth 64-byte piece of the row, then the 16-float pieces left
// into the first, then the rest (K mod 16) by the reference loop. Without AVX-512, the reference loop alone.
inline float dot(const float* __restrict w, const float* __restrict x, int64_t K) {
#if defined(__AVX512F__)
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 32), _mm512_loadu_ps(x + k + 32), a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 48), _mm512_loadu_ps(x + k + 48), a3);
  }
  for (; k + 16 <= K; k += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  return k == K ? sum : sum + dot_reference(w + k, x + k, K - k);
#else
  return dot_reference(w, x, K);
#endif
}

// y[i] = Σ_k W[i, k] x[k] for the 16 rows of W (16, K), K a multiple of 64, AVX-512 only: each row's four
// sums as in dot, folded into one vector a row, then the 16 vectors reduced together (a transpose: 15 adds
// and 30 shuffles, where 16 reductions one at a time take 64 dependent steps).
#if defined(__AVX512F__)
inline void dot16(const float* __restrict W, const float* __restrict x, int64_t K, float* __restrict y) {
  __m512 v[16];
  for (int r = 0; r < 16; r++) {
    const float* w = W + r * K;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < K; k += 64) {
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 32), _mm512_loadu_ps(x + k + 32), a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 48), _mm512_loadu_ps(x + k + 48), a3);
    }
    v[r] = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
  }
  for (int r = 0; r < 8; r++)  // rows 2r, 2r+1: their 256-bit halves summed, side by side
    v[r] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * r], v[2 * r + 1], 0x44), _mm512_shuffle_f32x4(v[2 * r], v[2 * r + 1], 0xEE));
  for (int r = 0; r < 4; r++)  // rows 4r..4r+3: four sums of 4 lanes each, one a 128-bit quarter
    v[r] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * r], v[2 * r + 1], 0x88), _mm512_shuffle_f32x4(v[2 * r], v[2 * r + 1], 0xDD));
  for (int r = 0; r < 2; r++)  // within each quarter q: rows q and 4 + q (or 8 + q, 12 + q), two lanes each
    v[r] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * r], v[2 * r + 1], 0x44), _mm512_shuffle_ps(v[2 * r], v[2 * r + 1], 0xEE));
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
  // lane 4q + i now holds row 4i + q: back in row order
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(y, _mm512_permutexvar_ps(order, sums));
}
#endif

// put(n, Σ_k W[n, k] x[k]) for the rows n in [begin, end) of W (·, K) and one x: 16 rows at a time through
// dot16 where it runs (measured in the decode step: 0.87-0.96 of the time a token of one row at a time), the
// rest one at a time through dot.
template <typename Put>
void dot_rows(const float* W, const float* x, int64_t K, int64_t begin, int64_t end, Put put) {
  int64_t n = begin;
#if defined(__AVX512F__)
  if (K % 64 == 0)
    for (alignas(64) float y[16]; n + 16 <= end; n += 16) {
      dot16(W + n * K, x, K, y);
      for (int64_t i = 0; i < 16; i++) put(n + i, y[i]);
    }
#endif
  for (; n < end; n++) put(n, dot(W + n * K, x, K));
}

// out[d] = Σ_j p[j] V[j, d] for V (n, D), row-major: the transpose of dot's product, the attention's
// weighted sum of its values. Terms with p[j] = 0 (the slots a row has no token in) are skipped.
inline void weighted_sum_reference(const float* __restrict p, const float* __restrict V, int64_t n, int64_t D,
                                   float* __restrict out) {
  for (int64_t d = 0; d < D; d++) out[d] = 0.f;
  for (int64_t j = 0; j < n; j++) {
    if (p[j] == 0.f) continue;
#pragma omp simd
    for (int64_t d = 0; d < D; d++) out[d] += p[j] * V[j * D + d];
  }
}

// The same with the sums in registers, 16 lanes at a time (D a multiple of 16 on AVX-512): two sets of
// them, for the even and the odd j, so that each multiply-add waits for the one two rows back.
inline void weighted_sum(const float* __restrict p, const float* __restrict V, int64_t n, int64_t D,
                         float* __restrict out) {
#if defined(__AVX512F__)
  if (D % 16 == 0) {
    for (int64_t d = 0; d < D; d += 16) {
      __m512 even = _mm512_setzero_ps(), odd = even;
      int64_t j = 0;
      for (; j + 2 <= n; j += 2) {
        if (p[j] != 0.f) even = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_loadu_ps(V + j * D + d), even);
        if (p[j + 1] != 0.f) odd = _mm512_fmadd_ps(_mm512_set1_ps(p[j + 1]), _mm512_loadu_ps(V + (j + 1) * D + d), odd);
      }
      if (j < n && p[j] != 0.f) even = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_loadu_ps(V + j * D + d), even);
      _mm512_storeu_ps(out + d, _mm512_add_ps(even, odd));
    }
    return;
  }
#endif
  weighted_sum_reference(p, V, n, D, out);
}

}  // namespace qkv
