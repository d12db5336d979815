// Σ_k w[k] x[k] in fp32: the dot product qkv's two kernels (matvec.cpp, decoder_step.cpp) spend a decoding
// step in, one weight row against one row of x held in L1; and its transpose, the attention's weighted sum.
//
// A row is streamed from memory, so the loop must keep up with the memory: with one vector sum (what the
// compiler makes of the reference loop) each fused multiply-add waits for the one before it, and the product
// streams well below a plain read; with four independent sums it keeps up (measured side by side,
// interleaved). Where the memory is slow the two are alike: the loop waits for the memory either way.
//
// The four sums are written once over a vector of LANES floats: AVX-512's 16 or AVX2's 8 (with FMA), chosen
// by the flags the file is built with (qkv.kernels.build builds an AVX2 variant with -mno-avx512f for CPUs
// without AVX-512); with neither, the reference loops alone. An AVX-512 build sums float32 rows in AVX2's 8
// lanes all the same (dot_f32x8: they streamed faster so).
//
// w is float32, bfloat16 (Bf16: its 16 bits are a float32's top half, so widening it is a 16-bit shift, exact)
// or int8 (a weight-only quantised row: its sum is multiplied by the row's scale by the caller); x and the sums
// are float32. Fewer bytes a weight, fewer to stream: a bf16 row takes half a float32 row's time, an int8 one a
// quarter, where the memory decides.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define QKV_VECTOR 1
#endif

namespace qkv {

struct Bf16 {  // a bfloat16's bits, as torch stores them (c10::BFloat16's layout)
  uint16_t bits;
};

inline float widen(float v) { return v; }
inline float widen(int8_t v) { return static_cast<float>(v); }
inline float widen(Bf16 v) {  // its 16 bits, then 16 zeros
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The reference: one sum, vectorised by the compiler (which may reorder it: fp32's rounding).
template <typename T>
inline float dot_reference(const T* __restrict w, const float* __restrict x, int64_t K) {
  float a = 0.f;
#pragma omp simd reduction(+ : a)
  for (int64_t k = 0; k < K; k++) a += widen(w[k]) * x[k];
  return a;
}

#if defined(QKV_VECTOR)
inline float vsum8(__m256 v) {  // the two halves added, then the four lanes pairwise, as AVX-512's reduction does
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int64_t LANES = 16;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset1(float v) { return _mm512_set1_ps(v); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vfmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vec v) { return _mm512_reduce_add_ps(v); }
inline Vec vload(const Bf16* p) {  // 16 bf16 -> 16 fp32: each 16 bits shifted into a 32-bit lane's top half
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline Vec vload(const int8_t* p) {  // 16 int8 -> 16 fp32
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
#elif defined(QKV_VECTOR)
using Vec = __m256;
constexpr int64_t LANES = 8;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset1(float v) { return _mm256_set1_ps(v); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vfmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vload(const Bf16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline Vec vload(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
inline float vsum(Vec v) { return vsum8(v); }
#endif

#if defined(QKV_VECTOR)
constexpr int64_t PIECE = 4 * LANES;  // floats the four sums take in one step: 64 on AVX-512, 32 on AVX2

// sums asks the cache for no line ahead of its loads of float32 and bf16 rows, nor of int8 ones on AVX2: the
// hardware's prefetcher alone streams the decode step's matrices faster (a software prefetch a few KB ahead made
// a token's products slower, in the step's own layout of one allocation a matrix, measured side by side on an
// AVX-512 CPU built both ways). AVX-512's int8 rows are the exception: a piece is one 64-byte line, widened in
// four steps, and the loop falls behind the memory unless it asks for the line INT8_AHEAD bytes on (measured
// faster than 1.5, 3 and 4 KB ahead and than none, on 2 MB and 4 KB pages; past w's end: no fault, no effect).
#if defined(__AVX512F__)
constexpr int64_t INT8_AHEAD = 2048;
#else
constexpr int64_t INT8_AHEAD = 0;
#endif

// Four sums of LANES lanes over w · x for k in [0, whole), whole a multiple of PIECE, each taking every
// fourth vector: four chains of multiply-adds, none waiting for another.
struct Sums {
  Vec a0, a1, a2, a3;
  Vec folded() const { return vadd(vadd(a0, a1), vadd(a2, a3)); }
};
template <typename T>
inline Sums sums(const T* __restrict w, const float* __restrict x, int64_t whole) {
  Sums s{vzero(), vzero(), vzero(), vzero()};
  for (int64_t k = 0; k < whole; k += PIECE) {
    if constexpr (sizeof(T) == 1 && INT8_AHEAD > 0)
      _mm_prefetch(reinterpret_cast<const char*>(w + k) + INT8_AHEAD, _MM_HINT_T0);
    s.a0 = vfmadd(vload(w + k), vload(x + k), s.a0);
    s.a1 = vfmadd(vload(w + k + LANES), vload(x + k + LANES), s.a1);
    s.a2 = vfmadd(vload(w + k + 2 * LANES), vload(x + k + 2 * LANES), s.a2);
    s.a3 = vfmadd(vload(w + k + 3 * LANES), vload(x + k + 3 * LANES), s.a3);
  }
  return s;
}
#endif

// Σ_k w[k] x[k] for a float32 row in 256-bit vectors, as the AVX2 build's dot sums it (the same bits): four sums
// of 8 lanes, then the vectors left into the first, then the rest by the reference loop. An AVX-512 build takes
// float32 rows this way: on the AVX-512 AMD EPYC it was measured on, the decode step's float32 products streamed
// faster with 256-bit loads than with 512-bit ones (in one process, builds alternated; the dot16 blocks made no
// difference), as fast as the AVX2 build's. bf16 and int8 rows keep 512-bit vectors (widened from 256 and 128 bits).
#if defined(__AVX512F__)
inline float dot_f32x8(const float* __restrict w, const float* __restrict x, int64_t K) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
  }
  for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
  const float sum = vsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return k == K ? sum : sum + dot_reference(w + k, x + k, K - k);
}
#endif

// sums' four sums, then the vectors left into the first, then the rest (K mod LANES) by the reference
// loop. Without a vector ISA, the reference loop alone.
template <typename T>
inline float dot(const T* __restrict w, const float* __restrict x, int64_t K) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) return dot_f32x8(w, x, K);
#endif
#if defined(QKV_VECTOR)
  int64_t k = K - K % PIECE;
  Sums s = sums(w, x, k);
  for (; k + LANES <= K; k += LANES) s.a0 = vfmadd(vload(w + k), vload(x + k), s.a0);
  const float sum = vsum(s.folded());
  return k == K ? sum : sum + dot_reference(w + k, x + k, K - k);
#else
  return dot_reference(w, x, K);
#endif
}

// y[i] = Σ_k W[i, k] x[k] for the 16 rows of W (16, K), K a multiple of 64, AVX-512 only: each row's four
// sums as in dot, folded into one vector a row, then the 16 vectors reduced together (a transpose: 15 adds
// and 30 shuffles, where 16 reductions one at a time take 64 dependent steps).
#if defined(__AVX512F__)
template <int LO, int HI>  // a's and b's 128-bit quarters picked by LO and by HI, the two picks added
inline __m512 add_quarters(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, LO), _mm512_shuffle_f32x4(a, b, HI));
}
template <int LO, int HI>  // the same with lanes picked within each quarter
inline __m512 add_lanes(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, LO), _mm512_shuffle_ps(a, b, HI));
}

template <typename T>
inline void dot16(const T* __restrict W, const float* __restrict x, int64_t K, float* __restrict y) {
  __m512 v[16];
  for (int r = 0; r < 16; r++) v[r] = sums(W + r * K, x, K).folded();
  for (int r = 0; r < 8; r++) v[r] = add_quarters<0x44, 0xEE>(v[2 * r], v[2 * r + 1]);  // rows 2r, 2r+1: halves
  for (int r = 0; r < 4; r++) v[r] = add_quarters<0x88, 0xDD>(v[2 * r], v[2 * r + 1]);  // rows 4r..4r+3: a quarter each
  for (int r = 0; r < 2; r++) v[r] = add_lanes<0x44, 0xEE>(v[2 * r], v[2 * r + 1]);  // in quarter q: rows q, 4 + q
  const __m512 total = add_lanes<0x88, 0xDD>(v[0], v[1]);
  // lane 4q + i now holds row 4i + q: back in row order
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(y, _mm512_permutexvar_ps(order, total));
}
#endif

// put(n, Σ_k W[n, k] x[k]) for the rows n in [begin, end) of W (·, K) and one x: bf16 and int8 rows 16 at a time
// through dot16 where it runs (AVX-512; measured faster in the decode step than one row at a time), the rest (and
// float32 rows, dot_f32x8's) one at a time through dot.
template <typename T, typename Put>
void dot_rows(const T* W, const float* x, int64_t K, int64_t begin, int64_t end, Put put) {
  int64_t n = begin;
#if defined(__AVX512F__)
  if (K % 64 == 0 && !std::is_same_v<T, float>)  // float32 rows: dot_f32x8, one at a time
    for (alignas(64) float y[16]; n + 16 <= end; n += 16) {
      dot16(W + n * K, x, K, y);
      for (int64_t i = 0; i < 16; i++) put(n + i, y[i]);
    }
#endif
  for (; n < end; n++) put(n, dot(W + n * K, x, K));
}

// out[d] = Σ_j p[j] V[j, d] for V (n, D), row-major: the transpose of dot's product, the attention's
// weighted sum of its values (V float32 or bf16). Terms with p[j] = 0 (the slots a row has no token in) are skipped.
template <typename T>
inline void weighted_sum_reference(const float* __restrict p, const T* __restrict V, int64_t n, int64_t D,
                                   float* __restrict out) {
  for (int64_t d = 0; d < D; d++) out[d] = 0.f;
  for (int64_t j = 0; j < n; j++) {
    if (p[j] == 0.f) continue;
#pragma omp simd
    for (int64_t d = 0; d < D; d++) out[d] += p[j] * widen(V[j * D + d]);
  }
}

// out[d, d + W·LANES) of weighted_sum: W vectors of sums a row j, each row's W·LANES values read together (one
// pass down V, not one a vector: the cache streams the rows in order); each lane's sums as weighted_sum's.
#if defined(QKV_VECTOR)
template <int W, typename T>
inline void weighted_columns(const float* __restrict p, const T* __restrict V, int64_t n, int64_t D, int64_t d,
                             float* __restrict out) {
  Vec even[W], odd[W];
  for (int w = 0; w < W; w++) even[w] = odd[w] = vzero();
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) {
    if (p[j] != 0.f)
      for (int w = 0; w < W; w++) even[w] = vfmadd(vset1(p[j]), vload(V + j * D + d + w * LANES), even[w]);
    if (p[j + 1] != 0.f)
      for (int w = 0; w < W; w++) odd[w] = vfmadd(vset1(p[j + 1]), vload(V + (j + 1) * D + d + w * LANES), odd[w]);
  }
  if (j < n && p[j] != 0.f)
    for (int w = 0; w < W; w++) even[w] = vfmadd(vset1(p[j]), vload(V + j * D + d + w * LANES), even[w]);
  for (int w = 0; w < W; w++) vstore(out + d + w * LANES, vadd(even[w], odd[w]));
}
#endif

// The same with the sums in registers, LANES lanes at a time (D a multiple of LANES): two sets of them, for
// the even and the odd j, so that each multiply-add waits for the one two rows back; four vectors of columns
// at a time (weighted_columns), the rest one at a time.
template <typename T>
inline void weighted_sum(const float* __restrict p, const T* __restrict V, int64_t n, int64_t D,
                         float* __restrict out) {
#if defined(QKV_VECTOR)
  if (D % LANES == 0) {
    int64_t d = 0;
    for (; d + 4 * LANES <= D; d += 4 * LANES) weighted_columns<4>(p, V, n, D, d, out);
    for (; d < D; d += LANES) weighted_columns<1>(p, V, n, D, d, out);
    return;
  }
#endif
  weighted_sum_reference(p, V, n, D, out);
}

}  // namespace qkv
