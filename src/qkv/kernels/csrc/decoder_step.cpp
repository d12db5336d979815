// One decoding step of a pre-norm decoder-only Transformer (GPT-2, LLaMA) for a few rows, in one
// parallel region: the threads stream the weights of every layer back to back and wait for each other
// only where a result is needed whole (5 barriers a layer); a thread done early with its
// rows of a product takes over rows of a slower one (``Share``). A decoder that calls one kernel per weight
// matrix stops and restarts its threads and its memory streams dozens of times a token; in one region the
// products stream back to back (docs/design-notes.md has the measurements).
//
//   ids (B, 1), the new tokens  ->  logits (B, V)      B ≤ a few rows, fp32, CPU
//   weight matrices (the projections, the LM head) float32, bfloat16 or int8 with a scale per output row
//   (W = s ⊙ Q); the token table float32 or bfloat16; the caches float32 or bfloat16; everything else float32.
//   The sums and the activations are float32: each weight widened in registers, each cached k and v rounded
//   to the cache's type as it is written.
//   greedy: up to n such steps, each feeding back its logits' argmax  ->  tokens (B, k)
//
// As Embeddings computes it: x = tok[id] · scale + pos[p] + type, then the embedding's norm, where p
// counts the row's real tokens before this one (static_positions). Per layer, as TransformerBlock
// (norm_first) computes it:
//   h = Norm₁(x);  q, k, v = h Wqᵀ + bq, h Wkᵀ + bk, h Wvᵀ + bv       (the threads share the rows out)
//   [QK-norm: each head of q and of k normed over its D (Qwen3)];  [RoPE q, k (cos, sin scaled as the model's)];  k, v → the cache at ``slot``;  a = softmax(q kᵀ / √D) v over the row's slots ≤ slot
//   [a sliding layer (Mistral): its cache a ring of W < M rows, slot p in row p mod W, so it holds the W slots
//    slot − W < p ≤ slot, the window itself (RingKVCache's static form)]
//   x += a Woᵀ + bo;  h = Norm₂(x);  x += act(h Wupᵀ + b_up) [⊙ gate] Wdownᵀ + b_down
//   [a mixture-of-experts layer (Mixtral, Qwen3-MoE): x += Σ_j w_j W_down[e_j] (silu(W_gate[e_j] h) ⊙ W_up[e_j] h)
//    over the k experts e_j of top-k(softmax(h W_rᵀ)), w_j their probabilities [renormalised], as qkv.nn.moe;
//    [+ σ(h·w_s) ·] S_down (silu(S_gate h) ⊙ S_up h), a shared expert always on (Qwen2-MoE)]
// then Norm_f and the LM head. The reference is the model itself (qkv/decoder_step.py calls this from
// ``generate``; tests/test_decoder_step.py compares logits, caches and tokens with the model's).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <numeric>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <omp.h>
#include <torch/csrc/utils/pybind.h>

#include "activations.h"
#include "dot.h"
#include "routing.h"
#include "share.h"

namespace {

using qkv::Act, qkv::exp_vec, qkv::RELU, qkv::GELU, qkv::GELU_TANH, qkv::SILU, qkv::activate, qkv::activate_rows;
using qkv::Barrier, qkv::Bf16, qkv::Rows, qkv::Share, qkv::shared_rows;

enum Kind { F32 = 0, BF16 = 1, I8 = 2 };  // a weight matrix's or the caches' element type

struct Matrix {  // a weight matrix (rows, K) of any Kind; scale: int8's, one per row (else nullptr)
  const void* w;
  const float* scale;
  Kind kind;
  explicit operator bool() const { return w != nullptr; }
};

enum Norm { LAYERNORM = 0, RMSNORM = 1 };
enum Rope { NO_ROPE = 0, HALF = 1, INTERLEAVED = 2 };

struct Shape {  // B from the caches (B, G, M or W, D), then DecoderState's int[] shape in this order
  int64_t B, C, H, G, D, F, V, norm, act, gated, rope, M;
  int64_t E, K, I, routing, S;  // experts (0: none), experts a token, an expert's width, qkv::Routing's bits, the
};                              // shared expert's width (0: none)
constexpr int64_t SHAPE = 16;  // the ints of DecoderState's shape

struct Embedding {  // nullptr where the model has none
  Matrix tok;  // float32 or bf16
  const float *pos, *type, *norm_w, *norm_b;
  int64_t vocab, positions;  // rows of tok and of pos
};
constexpr int64_t EMBEDDING = 5;  // tensors the embedding hands in, in Embedding's order

struct Projection {  // a weight matrix and its bias
  Matrix w;
  const float* b;
};

struct Layer {  // nullptr where the model has no such weight (no biases, no gate, no QK-norm)
  const float *norm1_w, *norm1_b;
  Projection q, k, v, o;
  const float *norm2_w, *norm2_b;
  Projection up, gate, down;
  const float *q_norm_w, *q_norm_b, *k_norm_w, *k_norm_b;  // QK-norm's, each over one head's D
  const float *router, *e_gate, *e_up, *e_down;  // a mixture of experts': (E, C), (E, I, C) twice, (E, C, I)
  const float *s_gate, *s_up, *s_down, *s_scale;  // its shared expert's: (S, C) twice, (C, S), and w_s (C)
  void *k_cache, *v_cache;  // (B, G, held, D) each, float32 or bf16 (DecoderState's cache kind)
  int64_t held;             // the cache's rows: M, or a sliding layer's ring of W < M (slot p in row p mod W)
  Kind cache;
};
constexpr int64_t PER_LAYER = 30;  // tensors a layer hands in, in Layer's order
constexpr int64_t MATRICES[] = {2, 4, 6, 8, 12, 14, 16};  // a layer's weight matrices (any Kind), by index in it

Kind kind_of(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? BF16 : t.scalar_type() == at::kChar ? I8 : F32;
}

// A vector of floats that starts on a 64-byte cache line, as torch's tensors do: a product's x is read in
// 64-byte pieces, and one that straddles two lines costs two reads.
template <typename T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <typename U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  bool operator==(const LineAligned&) const { return true; }
  bool operator!=(const LineAligned&) const { return false; }
};
using Floats = std::vector<float, LineAligned<float>>;

const float* weight(const at::Tensor& t) { return t.numel() ? t.data_ptr<float>() : nullptr; }
Matrix matrix(const at::Tensor& t, const at::Tensor& scale) {
  return {t.numel() ? t.data_ptr() : nullptr, scale.numel() ? scale.data_ptr<float>() : nullptr, kind_of(t)};
}

struct Size {  // a weight's number of elements; one not required may be absent (empty)
  int64_t n;
  bool required;
};

// Each weight's size, in the order handed in, from the shape (vocab, positions: rows of the embedding's tables).
// A layer's feed-forward is dense or a mixture of experts: check_layers checks that it has one of the two whole.
std::vector<Size> weight_sizes(const Shape& s, int64_t layers, int64_t vocab, int64_t positions) {
  const int64_t C = s.C, Q = s.H * s.D, KV = s.G * s.D, F = s.F, EI = s.E * s.I;
  std::vector<Size> n{{vocab * C, true}, {positions * C, false}, {C, false}, {C, false}, {C, false}};
  for (int64_t i = 0; i < layers; i++)
    n.insert(n.end(), {{C, true}, {C, false}, {Q * C, true}, {Q, false}, {KV * C, true}, {KV, false},
                       {KV * C, true}, {KV, false}, {C * Q, true}, {C, false}, {C, true}, {C, false},
                       {F * C, false}, {F, false}, {F * C, false}, {F, false}, {C * F, false}, {C, false},
                       {s.D, false}, {s.D, false}, {s.D, false}, {s.D, false}, {s.E * C, false}, {EI * C, false},
                       {EI * C, false}, {C * EI, false}, {s.S * C, false}, {s.S * C, false}, {C * s.S, false},
                       {C, false}});
  n.insert(n.end(), {{C, false}, {C, false}, {s.V * C, true}});
  return n;
}

// Whether weight i is a weight matrix (a projection or the LM head), which may be float32, bf16 or int8.
bool is_matrix(int64_t i, int64_t layers) {
  const int64_t last = EMBEDDING + layers * PER_LAYER;
  if (i == last + 2) return true;
  if (i < EMBEDDING || i >= last) return false;
  return std::count(std::begin(MATRICES), std::end(MATRICES), (i - EMBEDDING) % PER_LAYER) > 0;
}

// Whether weight t (index i) has a type it may have: float32; bf16 for a weight matrix or the token table; int8
// for a weight matrix (rows, K) with ``scale`` float32 (rows,); a scale nowhere else.
bool typed(const at::Tensor& t, const at::Tensor& scale, int64_t i, int64_t layers) {
  const auto type = t.scalar_type();
  if (type == at::kChar)
    return is_matrix(i, layers) && t.dim() == 2 && scale.scalar_type() == at::kFloat && scale.is_cpu() &&
           scale.is_contiguous() && scale.numel() == t.size(0);
  return !scale.numel() && (type == at::kFloat || (type == at::kBFloat16 && (i == 0 || is_matrix(i, layers))));
}

// Checks what a DecoderState is made of, naming what it expected: nothing is read out of bounds later.
void check_state(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& scales,
                 const std::vector<at::Tensor>& caches, const at::Tensor& rope, const Shape& s) {
  const int64_t layers = static_cast<int64_t>(caches.size()) / 2, count = EMBEDDING + layers * PER_LAYER + 3;
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == count && caches.size() % 2 == 0 &&
                  scales.size() == weights.size(),
              "qkv::DecoderState: expected ", count, " weights and as many scales for ", layers, " layers (a k and a ",
              "v cache each), got ", weights.size(), ", ", scales.size(), " and ", caches.size(), " caches");
  const auto sizes = weight_sizes(s, layers, weights[0].numel() / s.C, weights[1].numel() / s.C);
  for (size_t i = 0; i < weights.size(); i++) {
    const at::Tensor& t = weights[i];
    const bool ok = t.numel() ? t.numel() == sizes[i].n && typed(t, scales[i], i, layers) && t.is_cpu() &&
                                    t.is_contiguous()
                              : !sizes[i].required && !scales[i].numel();
    TORCH_CHECK(ok && (i || t.dim() == 2), "qkv::DecoderState: weight ", i, " must be a contiguous float32 CPU ",
                "tensor (a weight matrix also bfloat16, or int8 with a float32 scale a row; the token table also ",
                "bfloat16) of ", sizes[i].n, " elements", sizes[i].required ? "" : " (or none)", ", got ",
                t.scalar_type(), " ", t.sizes(), scales[i].numel() ? " with a scale" : "");
  }
  for (int64_t i = 0; i < layers; i++) {  // dense (up, down) or experts (router, gate, up, down), not both
    const at::Tensor* t = weights.data() + EMBEDDING + i * PER_LAYER;
    const bool dense = t[12].numel() && t[16].numel(), experts = t[22].numel() && t[23].numel() && t[24].numel() &&
                                                                  t[25].numel() && s.E;
    const int shared = (t[26].numel() > 0) + (t[27].numel() > 0) + (t[28].numel() > 0);
    TORCH_CHECK(dense != experts && !(experts && std::any_of(t + 12, t + 18, [](auto& w) { return w.numel(); })) &&
                    (shared == 0 || (shared == 3 && experts)) && (shared || !t[29].numel()),
                "qkv::DecoderState: layer ", i, " must hand in a dense feed-forward (up, down) or a mixture of ",
                "experts (router, gate, up, down [, a shared expert's gate, up, down [, its scale]]), one whole");
  }
  for (size_t i = 0; i < caches.size(); i++) {
    const at::Tensor &t = caches[i], &pair = caches[i ^ 1];  // a layer's k and v hold as many rows
    const auto type = caches[0].scalar_type();
    TORCH_CHECK((type == at::kFloat || type == at::kBFloat16) && t.scalar_type() == type && t.is_contiguous() &&
                    t.dim() == 4 && t.size(0) == s.B &&
                    t.size(1) == s.G && 1 <= t.size(2) && t.size(2) <= s.M && t.size(3) == s.D &&
                    t.sizes() == pair.sizes(),
                "qkv::DecoderState: each cache must be contiguous float32 or bfloat16, all alike (", s.B, ", ", s.G,
                ", rows, ", s.D,
                "), 1 <= rows <= ", s.M, ", a layer's k and v alike, got ", t.scalar_type(), " ", t.sizes(),
                " beside ", pair.sizes());
  }
  TORCH_CHECK(!s.rope || (rope.scalar_type() == at::kFloat && rope.is_contiguous() &&
                          rope.sizes() == at::IntArrayRef({2, s.M, s.D / 2})),
              "qkv::DecoderState: rope must be contiguous float32 cos and sin (2, ", s.M, ", ", s.D / 2, "), got ",
              rope.sizes());
}

Shape make_shape(const std::vector<at::Tensor>& caches, const std::vector<int64_t>& shape) {
  TORCH_CHECK(shape.size() == SHAPE, "qkv::DecoderState: shape must hold ", SHAPE, " ints, got ", shape.size());
  TORCH_CHECK(!caches.empty() && caches[0].dim() == 4, "qkv::DecoderState: expected each layer's k and v caches "
              "(B, G, M, D), got ", caches.size(), " tensors");
  const Shape s{caches[0].size(0), shape[0], shape[1], shape[2], shape[3], shape[4], shape[5], shape[6], shape[7],
                shape[8], shape[9], shape[10], shape[11], shape[12], shape[13], shape[14], shape[15]};
  TORCH_CHECK(s.E == 0 || (1 <= s.K && s.K <= s.E && s.I > 0 && s.S >= 0), "qkv::DecoderState: experts (E, k, I, "
              "S) must have 1 <= k <= E, I > 0 and S >= 0, got (", s.E, ", ", s.K, ", ", s.I, ", ", s.S, ")");
  TORCH_CHECK(s.C > 0 && s.H > 0 && s.G > 0 && s.H % s.G == 0 && s.D > 0 && s.D % 2 == 0 && s.F > 0 && s.V > 0 &&
                  s.M > 0,
              "qkv::DecoderState: shape (C, H, G, D, F, V, M) must be positive, G dividing H and D even, got (", s.C,
              ", ", s.H, ", ", s.G, ", ", s.D, ", ", s.F, ", ", s.V, ", ", s.M, ")");
  return s;
}

// scales as handed in, or (none handed in) an empty one for each weight.
std::vector<at::Tensor> scales_for(std::vector<at::Tensor> scales, size_t weights) {
  return scales.empty() ? std::vector<at::Tensor>(weights, at::empty({0}, at::kFloat)) : scales;
}

// 2 MB pages under the weights a token streams. On 4 KB pages its reads take a page walk every 4 KB, on 2 MB pages
// once in 512 times. Linux backs memory by 2 MB pages where it was asked before the memory is touched (THP
// "madvise", its default; torch's allocator asks only under THP_MEM_ALLOC_ENABLE=1, and a model's weights were
// touched when they were loaded). So the memory is moved, not asked for in place: one mapping for all the
// storages, 2 MB-aligned, asked for (madvise(MADV_HUGEPAGE)) while untouched, each storage copied in and its
// data pointer swapped (StorageImpl::set_data_ptr): every tensor that shares a storage (a view, a tied weight, an
// int8 tensor's data) reads the same values at the new address, and the old memory goes back where nothing else
// holds it, one storage after the other. The mapping goes back when the last storage in it is freed. The copy
// takes about as long as the weights' bytes take to be written, unless Linux must first compact memory to find
// free 2 MB pages (THP's defrag setting "madvise": the fault waits for it), which on a host whose memory other
// jobs keep churning can take seconds, once.
#if defined(__linux__) && defined(MADV_HUGEPAGE)
struct HugeMapping {
  void* start;
  size_t bytes;
  ~HugeMapping() { munmap(start, bytes); }
};

void release_huge(void* held) { delete static_cast<std::shared_ptr<HugeMapping>*>(held); }

constexpr size_t HUGE_PAGE = size_t{2} << 20, STORAGE_ALIGN = 4096;  // a storage keeps its offset in its 4 KB page

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// ``bytes`` (a multiple of 2 MB) of fresh anonymous memory starting on a 2 MB boundary, asked to be backed by 2 MB
// pages; nullptr where Linux refuses the mapping or the advice (a kernel without THP).
void* huge_mapping(size_t bytes) {
  void* raw = mmap(nullptr, bytes + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto begin = reinterpret_cast<uintptr_t>(raw), start = round_up(begin, HUGE_PAGE);
  if (start > begin) munmap(raw, start - begin);  // the mapping's head and tail past the 2 MB-aligned piece
  munmap(reinterpret_cast<void*>(start + bytes), begin + HUGE_PAGE - start);
  void* out = reinterpret_cast<void*>(start);
  if (madvise(out, bytes, MADV_HUGEPAGE) != 0) {
    munmap(out, bytes);
    return nullptr;
  }
  return out;
}

// Moves the CPU storages under ``tensors`` (each once, those of at least ``min_bytes`` and not moved before) into
// one mapping asked to be backed by 2 MB pages, same values -> the bytes moved, or -1 where Linux gave no such
// mapping (nothing moved).
int64_t onto_huge_pages(const std::vector<at::Tensor>& tensors, int64_t min_bytes) {
  std::vector<c10::StorageImpl*> storages;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage() || !t.is_cpu()) continue;
    c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    if (static_cast<int64_t>(s->nbytes()) < std::max<int64_t>(min_bytes, 1) || !s->data() ||
        s->data_ptr().get_deleter() == &release_huge || std::count(storages.begin(), storages.end(), s))
      continue;
    storages.push_back(s);
  }
  size_t total = 0;
  for (const c10::StorageImpl* s : storages) total += round_up(s->nbytes(), STORAGE_ALIGN);
  if (!total) return 0;
  const size_t bytes = round_up(total, HUGE_PAGE);
  void* start = huge_mapping(bytes);
  if (!start) return -1;
  const std::shared_ptr<HugeMapping> mapping(new HugeMapping{start, bytes});  // no temporary to unmap it
  char* to = static_cast<char*>(start);
  for (c10::StorageImpl* s : storages) {
    std::memcpy(to, s->data(), s->nbytes());
    s->set_data_ptr(at::DataPtr(to, new std::shared_ptr<HugeMapping>(mapping), &release_huge, at::Device(at::kCPU)));
    to += round_up(s->nbytes(), STORAGE_ALIGN);
  }
  return static_cast<int64_t>(total);
}
#else
int64_t onto_huge_pages(const std::vector<at::Tensor>&, int64_t) { return -1; }  // no transparent huge pages
#endif

// What one generate call decodes with, handed over once rather than at every step: the weights (the
// embedding's EMBEDDING, PER_LAYER a layer, then Norm_f's two and the LM head) and an int8 matrix's scales
// (an empty tensor for every other weight), each layer's k and v caches, RoPE's cos and sin at every slot, the
// shape and two numbers. Checked here, once; ``step`` (below) decodes one token a row.
struct DecoderState {
  std::vector<at::Tensor> weights, scales, caches;
  at::Tensor rope;
  Shape s;
  float eps, scale;
  Kind cache;  // the caches' element type
  DecoderState(std::vector<at::Tensor> w, std::vector<at::Tensor> c, at::Tensor cos_sin, std::vector<int64_t> shape,
               double norm_eps, double embed_scale, std::vector<at::Tensor> q)
      : weights(std::move(w)), scales(scales_for(std::move(q), weights.size())), caches(std::move(c)),
        rope(std::move(cos_sin)), s(make_shape(caches, shape)), eps(static_cast<float>(norm_eps)),
        scale(static_cast<float>(embed_scale)), cache(kind_of(caches[0])) {
    check_state(weights, scales, caches, rope, s);
  }
  at::Tensor step(const at::Tensor& ids, const at::Tensor& slots, const at::Tensor& input_pos) const;
  at::Tensor greedy(const at::Tensor& ids, const at::Tensor& slots, int64_t slot, int64_t n, int64_t eos,
                    const at::Tensor& finished) const;

 private:
  void decode(const int64_t* ids, const bool* on, int64_t slot, float* logits) const;
};

// h = Norm(x) over n numbers: LayerNorm (biased variance) or RMSNorm, then × w (+ b).
void normalise_row(const float* x, const float* w, const float* b, float* h, int64_t n, int64_t norm, float eps) {
  float mean = 0.f, square = 0.f;
#pragma omp simd reduction(+ : mean)
  for (int64_t c = 0; c < n; c++) mean += x[c];
  mean = norm == LAYERNORM ? mean / n : 0.f;
#pragma omp simd reduction(+ : square)
  for (int64_t c = 0; c < n; c++) square += (x[c] - mean) * (x[c] - mean);
  const float scale = 1.f / std::sqrt(square / n + eps);
  for (int64_t c = 0; c < n; c++) h[c] = (x[c] - mean) * scale * w[c] + (b ? b[c] : 0.f);
}

// h[m] = Norm(x[m]) for the B rows, C wide.
void normalise(const float* x, const float* w, const float* b, float* h, const Shape& s, float eps) {
  for (int64_t m = 0; m < s.B; m++) normalise_row(x + m * s.C, w, b, h + m * s.C, s.C, s.norm, eps);
}

// out(m, n, [q[n] ·] Σ_k W[n, k] x[m, k] + b[n]) for the rows r of W (N, K) of element type T, q int8's scales.
template <typename T, typename Out>
void product_rows(const T* W, const float* q, const float* b, const float* x, int64_t B, int64_t K, Rows r,
                  const Out& out) {
  const auto put = [&](int64_t m, int64_t n, float a) { out(m, n, (q ? a * q[n] : a) + (b ? b[n] : 0.f)); };
  if (B == 1)
    qkv::dot_rows(W, x, K, r.begin, r.end, [&](int64_t n, float a) { put(0, n, a); });
  else  // each row of W from memory once, for the later rows of x from L1
    for (int64_t n = r.begin; n < r.end; n++)
      for (int64_t m = 0; m < B; m++) put(m, n, qkv::dot(W + n * K, x + m * K, K));
}

// out(m, n, W x[m] + b) for the rows r of W (N, K), whatever its Kind.
template <typename Out>
void rows_of(const Matrix& W, const float* b, const float* x, int64_t B, int64_t K, Rows r, const Out& out) {
  switch (W.kind) {
    case BF16: product_rows(static_cast<const Bf16*>(W.w), W.scale, b, x, B, K, r, out); break;
    case I8: product_rows(static_cast<const int8_t*>(W.w), W.scale, b, x, B, K, r, out); break;
    default: product_rows(static_cast<const float*>(W.w), W.scale, b, x, B, K, r, out);
  }
}

// fn(rows) for the rows of a product with rows of W (·, K), shared out through ``split`` in chunks of 8-128 KB of W.
template <typename Fn>
void chunks(const Matrix& W, int64_t N, int64_t K, Share* split, Fn fn) {
  constexpr int64_t BYTES[] = {4, 2, 1};  // by Kind
  const int64_t row_bytes = K * BYTES[W.kind];
  const int64_t least = std::max<int64_t>(1, (8 << 10) / row_bytes), most = std::max<int64_t>(1, (128 << 10) / row_bytes);
  shared_rows(N, split, least, most, fn);
}

// out(m, n, W x[m] + b) for every row n of W (N, K), each read once, shared out through ``split`` (then
// out.done(chunk, B)): stores, adds or activates.
template <typename Out>
void product(const Matrix& W, const float* b, const float* x, int64_t B, int64_t N, int64_t K, Share* split, Out out) {
  chunks(W, N, K, split, [&](Rows r) {
    rows_of(W, b, x, B, K, r, out);
    out.done(r, B);
  });
}

// RoPE on one head's D numbers at one position (cos, sin: D/2 each), out of place.
void rotate(const float* x, const float* cos, const float* sin, float* out, const Shape& s) {
  const int64_t half = s.D / 2;
  for (int64_t i = 0; i < half; i++) {
    const int64_t a = s.rope == INTERLEAVED ? 2 * i : i, b = s.rope == INTERLEAVED ? 2 * i + 1 : i + half;
    out[a] = x[a] * cos[i] - x[b] * sin[i];
    out[b] = x[a] * sin[i] + x[b] * cos[i];
  }
}

// One head of q or k as attention takes it: [QK-norm (w, b: the model's norm over its D) into ``normed``, then]
// [RoPE at this slot into ``out``] -> where it now is (x itself when neither applies).
const float* prepare_head(const float* x, const float* w, const float* b, const float* cos, const float* sin,
                          float* normed, float* out, const Shape& s, float eps) {
  if (w) {
    normalise_row(x, w, b, normed, s.D, s.norm, eps);
    x = normed;
  }
  if (!s.rope) return x;
  rotate(x, cos, sin, out, s);
  return out;
}

// One head: softmax(q·k_j / √D) over the cache rows j that hold a slot ≤ slot of the row's tokens (``on``),
// Σ p_j v_j -> out (D,). ``held``: the cache's rows, M, or a ring's W, whose row j holds the latest slot
// p ≤ slot with p ≡ j (mod W): with r = slot mod W, p = slot − r + j for j ≤ r, slot − r − W + j after it
// (in a cache of M rows, r = slot and p = j).
template <typename C>
void attend_head(const float* __restrict q, const C* __restrict keys, const C* __restrict values,
                 const bool* on, int64_t slot, int64_t held, float* __restrict scores, float* __restrict out,
                 const Shape& s) {
  const float scale = 1.f / std::sqrt(static_cast<float>(s.D));
  const int64_t n = std::min(held, slot + 1), newest = slot % held, base = slot - newest;  // n: rows written
  const bool* row_on = on + base;  // row_on[j] (j ≤ newest), row_on[j − held] (j > newest): its slot's flag
  float top = -std::numeric_limits<float>::infinity(), total = 0.f;
  for (int64_t j = 0; j < n; j++) {
    scores[j] = qkv::dot(keys + j * s.D, q, s.D) * scale;
    top = row_on[j > newest ? j - held : j] ? std::max(top, scores[j]) : top;
  }
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < n; j++) {  // the weights p_j, 0 on the slots the row has no token in
    scores[j] = row_on[j > newest ? j - held : j] ? exp_vec(scores[j] - top) : 0.f;
    total += scores[j];
  }
  qkv::weighted_sum(scores, values, n, s.D, out);
  for (int64_t d = 0; d < s.D; d++) out[d] /= total;
}

// out[i] = x[i] for n numbers, rounded to out's type (bf16: to nearest even, as torch rounds).
void store(const float* x, float* out, int64_t n) { std::copy(x, x + n, out); }
void store(const float* x, Bf16* out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i].bits = c10::BFloat16(x[i]).x;
}

// Row m, key/value head g: [norm and rotate and] write its key and value at ``slot`` into the caches (of
// element type C), then attend for its H/G query heads (each [normed and rotated] first). scratch: 3D + M floats.
template <typename C>
void attend_group(const Layer& L, const float* q, const float* k, const float* v, const bool* slots, int64_t slot,
                  const float* cos, const float* sin, float* a, float* scratch, int64_t m, int64_t g,
                  const Shape& s, float eps) {
  const int64_t offset = ((m * s.G + g) * L.held) * s.D, row = slot % L.held;  // a ring's row, or the slot
  C *keys = static_cast<C*>(L.k_cache) + offset, *values = static_cast<C*>(L.v_cache) + offset;
  float *q_ready = scratch, *normed = scratch + s.D, *k_ready = scratch + 2 * s.D, *scores = scratch + 3 * s.D;
  store(prepare_head(k + (m * s.G + g) * s.D, L.k_norm_w, L.k_norm_b, cos, sin, normed, k_ready, s, eps),
        keys + row * s.D, s.D);
  store(v + (m * s.G + g) * s.D, values + row * s.D, s.D);
  for (int64_t h = g * (s.H / s.G); h < (g + 1) * (s.H / s.G); h++) {
    const float* q_h = prepare_head(q + (m * s.H + h) * s.D, L.q_norm_w, L.q_norm_b, cos, sin, normed, q_ready, s, eps);
    attend_head(q_h, keys, values, slots + m * s.M, slot, L.held, scores, a + (m * s.H + h) * s.D, s);
  }
}

constexpr int64_t SPLITS = 7;  // a layer's work shared out: products q, k, v, o, [gate and] up, down, then its heads
constexpr int64_t HEADS = 6;   // the split of a layer's (row, key/value head) pairs for attention

struct Buffers {  // shared by the threads, except h, scratch and the routing (one each)
  Floats x, q, k, v, a, up, gate, inner;  // inner (B·k·I + B·S): a mixture of experts', then its shared expert's

  std::unique_ptr<Share[]> shares;  // (layers · SPLITS + 1, threads): each split, then the LM head's
  int64_t threads;
  Barrier barrier;
  Buffers(const Shape& s, int64_t layers, int64_t T)
      : x(s.B * s.C), q(s.B * s.H * s.D), k(s.B * s.G * s.D), v(s.B * s.G * s.D), a(s.B * s.H * s.D),
        up(s.B * s.F), gate(s.gated ? s.B * s.F : 0), inner(s.B * (s.K * s.I + s.S)),
        shares(new Share[(layers * SPLITS + 1) * T]), threads(T) {}
  Share* split(int64_t layer, int64_t work) { return shares.get() + (layer * SPLITS + work) * threads; }
};

// Stores y[m, n] = a in a (rows, N) buffer, or adds it (the residual stream); ``done`` is called with each
// chunk of rows once they are all out.
struct Store {
  float* y;
  int64_t N;
  void operator()(int64_t m, int64_t n, float a) const { y[m * N + n] = a; }
  void done(Rows, int64_t) const {}
};
struct Add {
  float* y;
  int64_t N;
  void operator()(int64_t m, int64_t n, float a) const { y[m * N + n] += a; }
  void done(Rows, int64_t) const {}
};

// The feed-forward's inner value: y = act(a), or act(gate) ⊙ a where there is a gate. The products are stored
// as they come and activated a chunk at a time, vectorised: one output at a time inside the product, the
// activation's scalar arithmetic would slow the up product's stream below the down product's.
struct Activate {
  float* y;
  const float* gate;
  int64_t N, act;
  void operator()(int64_t m, int64_t n, float a) const { y[m * N + n] = a; }
  void done(Rows r, int64_t B) const {
    for (int64_t m = 0; m < B; m++) {
      float* ym = y + m * N;
      const float* gm = gate ? gate + m * N : nullptr;
      switch (act) {
        case RELU: activate_rows<RELU>(ym, gm, r.begin, r.end); break;
        case GELU: activate_rows<GELU>(ym, gm, r.begin, r.end); break;
        case GELU_TANH: activate_rows<GELU_TANH>(ym, gm, r.begin, r.end); break;
        default: activate_rows<SILU>(ym, gm, r.begin, r.end);
      }
    }
  }
};

// The gated feed-forward's inner value, in one pass: each chunk of rows its gate rows, then its up rows (the
// gate's values this thread's own), then out.done: no barrier between the gate and the up rows it gates.
template <typename Out>
void gated_product(const Projection& gate, const Projection& up, const float* x, int64_t B, int64_t N, int64_t K,
                   float* gated, Share* split, Out out) {
  const Store g{gated, N};
  chunks(up.w, N, K, split, [&](Rows r) {
    rows_of(gate.w, gate.b, x, B, K, r, g);
    rows_of(up.w, up.b, x, B, K, r, out);
    out.done(r, B);
  });
}

struct Routed {  // a row's k experts (ascending) and their weights: each thread's own copy, computed alike
  std::vector<int64_t> experts;
  std::vector<float> weights, shared;  // (B·k), and each row's shared expert's weight σ(h·w_s), or 1 (B)
  std::vector<int64_t> order;  // scratch: the E experts by logit
  Floats logits, gate, sums;    // scratch: a row's router logits (E), a run of an expert's gate products (I or
                                // S), of a row's outputs (C)
};

// x += the mixture of experts of h (this thread's Norm₂(x)): the router's product and each row's routing (every
// thread alike, whole: its E rows cost less than a barrier), the chosen experts' gate and up rows (inner =
// silu(g) ⊙ u) and the shared expert's, then their down rows, summed per row as the reference adds them.
void experts_layer(const Layer& L, int64_t i, Buffers& buf, const float* h, Routed& r, const Shape& s) {
  for (int64_t m = 0; m < s.B; m++) {
    qkv::dot_rows(L.router, h + m * s.C, s.C, 0, s.E, [&](int64_t e, float v) { r.logits[e] = v; });
    qkv::route(r.logits.data(), s.E, s.K, s.routing, r.order.data(), r.experts.data() + m * s.K,
               r.weights.data() + m * s.K);
    r.shared[m] = L.s_scale ? 1.f / (1.f + std::exp(-qkv::dot(L.s_scale, h + m * s.C, s.C))) : 1.f;
  }
  // inner's blocks: assignment b < B·k (I rows of its expert), then row b − B·k's shared expert (S rows)
  const int64_t IC = s.I * s.C, BK = s.B * s.K, blocks = BK + (L.s_gate ? s.B : 0);
  const auto start = [&](int64_t b) { return b < BK ? b * s.I : BK * s.I + (b - BK) * s.S; };
  const int64_t rows = std::max<int64_t>(1, (8 << 10) / (4 * s.C));
  shared_rows(start(blocks), buf.split(i, 4), rows, 16 * rows, [&](Rows n) {  // rows of inner
    int64_t b = n.begin < BK * s.I ? n.begin / s.I : BK + (n.begin - BK * s.I) / s.S;
    for (int64_t at = n.begin; at < n.end; at = start(++b)) {  // the run within block b
      const bool routed = b < BK;
      const int64_t first = at - start(b), last = std::min(routed ? s.I : s.S, first + n.end - at);
      const float* x = h + (routed ? b / s.K : b - BK) * s.C;
      const float* gate = routed ? L.e_gate + r.experts[b] * IC : L.s_gate;
      const float* up = routed ? L.e_up + r.experts[b] * IC : L.s_up;
      float* inner = buf.inner.data() + start(b);
      qkv::dot_rows(gate, x, s.C, first, last, [&](int64_t row, float v) { r.gate[row] = v; });
      qkv::dot_rows(up, x, s.C, first, last, [&](int64_t row, float v) { inner[row] = v; });
      activate_rows<SILU>(inner, r.gate.data(), first, last);  // silu(g) ⊙ u
    }
  });
  buf.barrier.wait();
  shared_rows(s.C, buf.split(i, 5), rows, 16 * rows, [&](Rows n) {  // each expert's down rows, one after another
    for (int64_t m = 0; m < s.B; m++) {
      std::fill(r.sums.begin() + n.begin, r.sums.begin() + n.end, 0.f);
      for (int64_t a = m * s.K; a < (m + 1) * s.K; a++)
        qkv::dot_rows(L.e_down + r.experts[a] * s.C * s.I, buf.inner.data() + a * s.I, s.I, n.begin, n.end,
                      [&](int64_t c, float v) { r.sums[c] += r.weights[a] * v; });
      if (L.s_down)  // routed + σ(h·w_s) · shared, as qkv.nn.moe adds them
        qkv::dot_rows(L.s_down, buf.inner.data() + start(BK + m), s.S, n.begin, n.end,
                      [&](int64_t c, float v) { r.sums[c] += r.shared[m] * v; });
      for (int64_t c = n.begin; c < n.end; c++) buf.x[m * s.C + c] += r.sums[c];
    }
  });
  buf.barrier.wait();
}

// Layer i, inside the parallel region; h, scratch and r are this thread's.
void layer(const Layer& L, int64_t i, Buffers& buf, float* h, float* scratch, Routed& r, const bool* slots,
           int64_t slot, const float* cos, const float* sin, const Shape& s, float eps) {
  const int64_t kv = s.G * s.D, width = s.H * s.D;
  normalise(buf.x.data(), L.norm1_w, L.norm1_b, h, s, eps);  // every thread, whole: no barrier
  product(L.q.w, L.q.b, h, s.B, width, s.C, buf.split(i, 0), Store{buf.q.data(), width});
  product(L.k.w, L.k.b, h, s.B, kv, s.C, buf.split(i, 1), Store{buf.k.data(), kv});
  product(L.v.w, L.v.b, h, s.B, kv, s.C, buf.split(i, 2), Store{buf.v.data(), kv});
  buf.barrier.wait();
  shared_rows(s.B * s.G, buf.split(i, HEADS), 1, 1, [&](Rows r) {  // a thread done early takes the other's heads
    (L.cache == BF16 ? attend_group<Bf16> : attend_group<float>)(L, buf.q.data(), buf.k.data(), buf.v.data(), slots,
                                                                  slot, cos, sin, buf.a.data(), scratch, r.begin / s.G,
                                                                  r.begin % s.G, s, eps);
  });
  buf.barrier.wait();
  product(L.o.w, L.o.b, buf.a.data(), s.B, s.C, width, buf.split(i, 3), Add{buf.x.data(), s.C});  // x += attention
  buf.barrier.wait();
  normalise(buf.x.data(), L.norm2_w, L.norm2_b, h, s, eps);
  if (L.router) return experts_layer(L, i, buf, h, r, s);
  const Activate inner{buf.up.data(), L.gate.w ? buf.gate.data() : nullptr, s.F, s.act};
  if (L.gate.w)
    gated_product(L.gate, L.up, h, s.B, s.F, s.C, buf.gate.data(), buf.split(i, 4), inner);
  else
    product(L.up.w, L.up.b, h, s.B, s.F, s.C, buf.split(i, 4), inner);
  buf.barrier.wait();
  product(L.down.w, L.down.b, buf.up.data(), s.B, s.C, s.F, buf.split(i, 5), Add{buf.x.data(), s.C});  // x += FFN
  buf.barrier.wait();
}

Layer unpack(const std::vector<at::Tensor>& w, const std::vector<at::Tensor>& scales, int64_t i, const at::Tensor& k,
             const at::Tensor& v) {
  const at::Tensor *t = w.data() + EMBEDDING + i * PER_LAYER, *q = scales.data() + EMBEDDING + i * PER_LAYER;
  const auto projection = [&](int64_t j) { return Projection{matrix(t[j], q[j]), weight(t[j + 1])}; };
  return {weight(t[0]),  weight(t[1]),  projection(2),  projection(4),  projection(6),  projection(8),
          weight(t[10]), weight(t[11]), projection(12), projection(14), projection(16), weight(t[18]),
          weight(t[19]), weight(t[20]), weight(t[21]), weight(t[22]), weight(t[23]), weight(t[24]),
          weight(t[25]), weight(t[26]), weight(t[27]), weight(t[28]), weight(t[29]), k.data_ptr(),
          v.data_ptr(),  k.size(2),     kind_of(k)};
}

Embedding unpack_embedding(const std::vector<at::Tensor>& w, const std::vector<at::Tensor>& scales, const Shape& s) {
  return {matrix(w[0], scales[0]), weight(w[1]), weight(w[2]), weight(w[3]), weight(w[4]), w[0].numel() / s.C,
          w[1].numel() / s.C};
}

// The token table's element i (float32 or bf16).
float element(const Matrix& t, int64_t i) {
  return t.kind == BF16 ? qkv::widen(static_cast<const Bf16*>(t.w)[i]) : static_cast<const float*>(t.w)[i];
}

// Checks a call's tokens and slots against the state: ids (B, 1) int64 in the vocabulary, slots (B, M)
// bool, and the slots [first, first + n) it decodes into inside [0, M).
void check_call(const at::Tensor& ids, const at::Tensor& slots, int64_t first, int64_t n, const Embedding& e,
                const Shape& s) {
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.is_cpu() && ids.is_contiguous() &&
                  ids.sizes() == at::IntArrayRef({s.B, 1}),
              "qkv::decoder_step: ids must be contiguous int64 (", s.B, ", 1), one new token a row, got ",
              ids.scalar_type(), " ", ids.sizes());
  TORCH_CHECK(slots.scalar_type() == at::kBool && slots.is_contiguous() && slots.sizes() == at::IntArrayRef({s.B, s.M}),
              "qkv::decoder_step: slots must be contiguous bool (", s.B, ", ", s.M, "), got ", slots.scalar_type(),
              " ", slots.sizes());
  TORCH_CHECK(0 <= first && n >= 1 && first + n <= s.M, "qkv::decoder_step: the slot must lie in [0, ", s.M, "), got ",
              first, n > 1 ? " and the " + std::to_string(n - 1) + " after it" : "");
  for (int64_t m = 0; m < s.B; m++) {
    const int64_t id = ids.data_ptr<int64_t>()[m];
    TORCH_CHECK(0 <= id && id < e.vocab, "qkv::decoder_step: token ids must lie in [0, ", e.vocab, "), got ", id);
  }
}

// Each row's position at ``slot``: its real tokens before the new one, as static_positions counts them.
std::vector<int64_t> positions_at(const bool* on, int64_t slot, const Embedding& e, const Shape& s) {
  std::vector<int64_t> positions(s.B);
  for (int64_t m = 0; m < s.B; m++) {
    positions[m] = std::max<int64_t>(std::count(on + m * s.M, on + m * s.M + slot + 1, true) - 1, 0);
    TORCH_CHECK(!e.pos || positions[m] < e.positions, "qkv::decoder_step: position ", positions[m],
                " is past the position table's ", e.positions, " rows");
  }
  return positions;
}

// x[m] = tok[ids[m]] · scale + pos[positions[m]] + type, then the embedding's norm: Embeddings.forward.
void embed(const Embedding& e, const int64_t* ids, const std::vector<int64_t>& positions, float* x, const Shape& s,
           float scale, float eps) {
  for (int64_t m = 0; m < s.B; m++) {
    const float* pos = e.pos ? e.pos + positions[m] * s.C : nullptr;
    float* xm = x + m * s.C;
    for (int64_t c = 0; c < s.C; c++) {
      const float tok = element(e.tok, ids[m] * s.C + c);
      float v = scale == 1.f ? tok : tok * scale;
      if (pos) v += pos[c];
      xm[c] = e.type ? v + e.type[c] : v;
    }
  }
  if (e.norm_w) {
    Floats raw(x, x + s.B * s.C);
    normalise(raw.data(), e.norm_w, e.norm_b, x, s, eps);
  }
}

// One token a row, ids (B,), into cache ``slot`` under slots (B, M) -> logits (B, V).
void DecoderState::decode(const int64_t* ids, const bool* on, int64_t slot, float* logits) const {
  const Embedding e = unpack_embedding(weights, scales, s);
  const int64_t layers = static_cast<int64_t>(caches.size()) / 2, last = EMBEDDING + layers * PER_LAYER;
  static qkv::Pace pace;  // the process's: how many threads its next token runs on (the host's load outlives a call)
  const int threads = pace.threads(at::in_parallel_region() ? 1 : at::get_num_threads());
  const auto start = std::chrono::steady_clock::now();
  Buffers buf(s, layers, threads);
  embed(e, ids, positions_at(on, slot, e, s), buf.x.data(), s, scale, eps);
  const float* cos = s.rope ? rope.data_ptr<float>() + slot * (s.D / 2) : nullptr;
  const float* sin = s.rope ? cos + s.M * (s.D / 2) : nullptr;
#pragma omp parallel num_threads(threads)
  {
    Floats h(s.B * s.C), scratch(3 * s.D + s.M);
    Routed r{std::vector<int64_t>(s.B * s.K), std::vector<float>(s.B * s.K), std::vector<float>(s.B),
             std::vector<int64_t>(s.E), Floats(s.E), Floats(std::max(s.I, s.S)), Floats(s.E ? s.C : 0)};
    for (int64_t i = 0; i < layers; i++)
      layer(unpack(weights, scales, i, caches[2 * i], caches[2 * i + 1]), i, buf, h.data(), scratch.data(), r, on, slot,
            cos, sin, s, eps);
    if (weights[last].numel())
      normalise(buf.x.data(), weight(weights[last]), weight(weights[last + 1]), h.data(), s, eps);
    else
      std::copy(buf.x.begin(), buf.x.end(), h.begin());
    product(matrix(weights[last + 2], scales[last + 2]), nullptr, h.data(), s.B, s.V, s.C, buf.split(layers, 0),
            Store{logits, s.V});
  }
  pace.record(threads, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// ids (B, 1) into cache slot input_pos (1,), slots (B, M) True on real tokens -> logits (B, V).
at::Tensor DecoderState::step(const at::Tensor& ids, const at::Tensor& slots, const at::Tensor& input_pos) const {
  TORCH_CHECK(input_pos.scalar_type() == at::kLong && input_pos.numel() == 1, "qkv::decoder_step: input_pos must "
              "hold one int64 slot, got ", input_pos.scalar_type(), " ", input_pos.sizes());
  const int64_t slot = input_pos.data_ptr<int64_t>()[0];
  check_call(ids, slots, slot, 1, unpack_embedding(weights, scales, s), s);
  at::Tensor logits = at::empty({s.B, s.V}, at::TensorOptions().dtype(at::kFloat));
  decode(ids.data_ptr<int64_t>(), slots.data_ptr<bool>(), slot, logits.data_ptr<float>());
  return logits;
}

// The first index of each row's largest logit, as torch.argmax picks it (a NaN counts as the largest).
int64_t argmax(const float* row, int64_t V) {
  int64_t best = 0;
  for (int64_t v = 1; v < V; v++)
    if (row[v] > row[best] || (std::isnan(row[v]) && !std::isnan(row[best]))) best = v;
  return best;
}

// Up to n greedy tokens a row after ids (B, 1), whose token sits at ``slot``: each step marks its slot, decodes
// and takes the argmax, as generate's loop does; with eos ≥ 0 a row that emits it emits it from then on
// (``finished`` (B,) bool, updated), and the call stops once every row has. -> (B, k) int64, k ≤ n.
at::Tensor DecoderState::greedy(const at::Tensor& ids, const at::Tensor& slots, int64_t slot, int64_t n, int64_t eos,
                                const at::Tensor& finished) const {
  const Embedding e = unpack_embedding(weights, scales, s);
  check_call(ids, slots, slot, n, e, s);
  TORCH_CHECK(finished.scalar_type() == at::kBool && finished.is_contiguous() && finished.numel() == s.B,
              "qkv::decoder_step: finished must be contiguous bool (", s.B, ",), got ", finished.scalar_type(), " ",
              finished.sizes());
  TORCH_CHECK(s.V <= e.vocab && eos < e.vocab, "qkv::decoder_step: greedy tokens go back in as ids: the LM head's ",
              s.V, " rows and eos ", eos, " must lie in the embedding's ", e.vocab);
  at::Tensor tokens = at::empty({s.B, n}, ids.options());
  std::vector<int64_t> current(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + s.B);
  Floats logits(s.B * s.V);
  bool* on = slots.data_ptr<bool>();
  bool* done = finished.data_ptr<bool>();
  int64_t k = 0;
  while (k < n && (eos < 0 || !std::all_of(done, done + s.B, [](bool d) { return d; }))) {
    for (int64_t m = 0; m < s.B; m++) on[m * s.M + slot + k] = true;
    decode(current.data(), on, slot + k, logits.data());
    for (int64_t m = 0; m < s.B; m++) {
      int64_t next = argmax(logits.data() + m * s.V, s.V);
      if (eos >= 0) {
        next = done[m] ? eos : next;
        done[m] = done[m] || next == eos;
      }
      tokens.data_ptr<int64_t>()[m * n + k] = current[m] = next;
    }
    k++;
  }
  return tokens.narrow(1, 0, k);
}

}  // namespace

// A pybind11 class, not a torch.ops op and custom class: called after a token's weights have streamed
// through the caches, a torch.ops op's dispatch of a custom class costs several times a pybind11 method's.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<DecoderState>(m, "DecoderState")
      .def(pybind11::init<std::vector<at::Tensor>, std::vector<at::Tensor>, at::Tensor, std::vector<int64_t>, double,
                          double, std::vector<at::Tensor>>(),
           pybind11::arg("weights"), pybind11::arg("caches"), pybind11::arg("rope"), pybind11::arg("shape"),
           pybind11::arg("eps"), pybind11::arg("scale"), pybind11::arg("scales") = std::vector<at::Tensor>())
      .def("step", &DecoderState::step, pybind11::arg("ids"), pybind11::arg("slots"), pybind11::arg("input_pos"),
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("greedy", &DecoderState::greedy, pybind11::arg("ids"), pybind11::arg("slots"), pybind11::arg("slot"),
           pybind11::arg("n"), pybind11::arg("eos"), pybind11::arg("finished"),
           pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("onto_huge_pages", &onto_huge_pages, pybind11::arg("tensors"), pybind11::arg("min_bytes") = 0,
        "The CPU storages under tensors (those of at least min_bytes, not moved before) moved, same values, into one "
        "mapping asked to be backed by 2 MB pages -> the bytes moved, or -1 where Linux gave none (nothing moved)");
}
