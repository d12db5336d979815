// The rows of one product shared out among the decode step's threads (decoder_step.cpp): each thread its own
// share, and one done early takes rows from the others' (on a shared host one core is often the slower).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include <omp.h>

namespace qkv {

struct Rows {  // this thread's share [begin, end) of n rows
  int64_t begin, end;
};
inline Rows share(int64_t n) {
  const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
  return {n * t / T, n * (t + 1) / T};
}

// The rows [0, N) of one product, shared out. Each thread opens its share and takes rows from its front,
// a few at a time; one that is done early takes rows from the back of the others' shares. Each thread's
// reads stay one stream in order, and none waits long at the next barrier for a slower one (on a shared
// host one core is often slower than the other for a whole token).
struct alignas(64) Share {
  std::atomic<uint64_t> rows{0};  // begin << 32 | end: empty until its thread opens it
};

// Up to a chunk of rows from the front of ``sh`` (or its back), a chunk being an eighth of what is left,
// between ``least`` and ``most`` rows; false once it is empty.
bool take(Share& sh, int64_t least, int64_t most, bool back, Rows& got) {
  uint64_t v = sh.rows.load(std::memory_order_relaxed);
  for (;;) {
    const int64_t b = static_cast<int64_t>(v >> 32), e = static_cast<int64_t>(v & 0xffffffffu);
    if (b >= e) return false;
    const int64_t n = std::min(e - b, std::max(least, std::min(most, (e - b) / 8)));
    got = back ? Rows{e - n, e} : Rows{b, b + n};
    const uint64_t rest = back ? (static_cast<uint64_t>(b) << 32) | static_cast<uint64_t>(e - n)
                               : (static_cast<uint64_t>(b + n) << 32) | static_cast<uint64_t>(e);
    if (sh.rows.compare_exchange_weak(v, rest, std::memory_order_relaxed)) return true;
  }
}

// fn(rows) for chunks of [0, N) shared out through ``split`` (a Share per thread, for this work alone): this
// thread's share from its front, then the others' from their backs, chunks of ``least`` to ``most``.
template <typename Fn>
void shared_rows(int64_t N, Share* split, int64_t least, int64_t most, Fn fn) {
  const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
  const Rows mine = share(N);
  split[t].rows.store((static_cast<uint64_t>(mine.begin) << 32) | static_cast<uint64_t>(mine.end),
                      std::memory_order_relaxed);
  Rows r;
  for (int64_t i = 0; i < T; i++)
    while (take(split[(t + i) % T], least, most, i > 0, r)) fn(r);
}


}  // namespace qkv
