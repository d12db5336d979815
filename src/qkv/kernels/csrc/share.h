// The rows of one product shared out among the decode step's threads (decoder_step.cpp): each thread its own
// share, and one done early takes rows from the others' (on a shared host one core is often the slower); and
// the barrier they wait for each other at.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <omp.h>

namespace qkv {

struct Rows {  // a run [begin, end) of a product's rows
  int64_t begin, end;
};

// The rows [0, N) of one product, shared out. Each thread takes rows from the front of its share, a few at a
// time; one that is done early takes rows from the back of the others' shares. Each thread's reads stay one
// stream in order, and none waits long at the next barrier for a slower one (on a shared host one core is often
// slower than the other for a whole token). A share is opened by whichever thread takes from it first: a thread
// the system has descheduled before it reached this product leaves all its rows to the others.
struct alignas(64) Share {
  static constexpr uint64_t UNOPENED = uint64_t{1} << 32;  // begin 1, end 0: no share left is ever that
  std::atomic<uint64_t> rows{UNOPENED};                     // begin << 32 | end of the rows left
};

// Up to a chunk of rows from the front of ``sh`` (or its back), a chunk being an eighth of what is left,
// between ``least`` and ``most`` rows; ``whole``: its rows before any was taken. False once it is empty.
inline bool take(Share& sh, Rows whole, int64_t least, int64_t most, bool back, Rows& got) {
  uint64_t v = sh.rows.load(std::memory_order_relaxed);
  for (;;) {
    const int64_t b = v == Share::UNOPENED ? whole.begin : static_cast<int64_t>(v >> 32);
    const int64_t e = v == Share::UNOPENED ? whole.end : static_cast<int64_t>(v & 0xffffffffu);
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
  Rows r;
  for (int64_t i = 0; i < T; i++) {
    const int64_t owner = (t + i) % T;
    while (take(split[owner], {N * owner / T, N * (owner + 1) / T}, least, most, i > 0, r)) fn(r);
  }
}

inline void relax() {  // a spinning thread's pause
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// The decode step's barrier: a thread that arrives spins a little (the others are a few rows behind), then
// sleeps until the last one arrives. OpenMP's own barrier spins for milliseconds first (GCC's libgomp, unless
// OMP_WAIT_POLICY=passive): on a host whose cores are shared with other work, the thread that spins takes the
// core the one it waits for needs, and the step slows several times over.
struct alignas(64) Barrier {
  static constexpr auto SPIN = std::chrono::microseconds(50);
  std::atomic<uint32_t> arrived{0}, generation{0};

  void wait() {
    const uint32_t T = static_cast<uint32_t>(omp_get_num_threads());
    const uint32_t gen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == T) {  // the last: opens the next round
      arrived.store(0, std::memory_order_relaxed);
      generation.store(gen + 1, std::memory_order_release);
      generation.notify_all();
      return;
    }
    const auto until = std::chrono::steady_clock::now() + SPIN;
    for (int i = 1; generation.load(std::memory_order_acquire) == gen; i++) {
      if (i % 64 || std::chrono::steady_clock::now() < until) {
        relax();
        continue;
      }
      generation.wait(gen, std::memory_order_acquire);
    }
  }
};

// How many threads a token runs on: the count whose tokens took least, found by trying a neighbour (one fewer,
// one more) now and then. Each thread streams its own rows, so where the cores are free all of them go faster;
// where other work holds a core, a thread it deschedules stalls the others at every barrier, and fewer threads
// go faster. Every count gives the same answer: a row's sums do not depend on which thread computes it.
class Pace {
 public:
  int threads(int most) {  // for the next token, at most ``most``
    const std::lock_guard<std::mutex> hold(lock);
    if (static_cast<int>(seconds.size()) != most + 1) {
      seconds.assign(most + 1, 0.);
      now = most;
    }
    if (++tokens < next_try || most == 1) return now;
    const bool fewer = (++tries % 2 && now > 1) || now == most;  // alternately one fewer and one more
    return fewer ? now - 1 : now + 1;
  }
  void record(int n, double took) {  // the token just run on n threads took ``took`` seconds
    const std::lock_guard<std::mutex> hold(lock);
    if (n >= static_cast<int>(seconds.size())) return;  // a count asked for before another thread changed most
    if (n == now) {
      seconds[n] = seconds[n] > 0 ? 0.5 * (seconds[n] + took) : took;
      for (int m : {now - 1, now + 1})  // a neighbour faster when last tried (the host was busier): back to it
        if (m >= 1 && m < static_cast<int>(seconds.size()) && seconds[m] > 0 && seconds[m] < seconds[now]) now = m;
      return;
    }
    seconds[n] = took;
    const bool faster = took < seconds[now];
    now = faster ? n : now;
    interval = faster ? 8 : std::min(2 * interval, 128);  // a try that lost waits longer before the next
    next_try = tokens + interval;
  }

 private:
  std::mutex lock;
  std::vector<double> seconds;  // [n]: a token's time on n threads, the latest (0: not tried)
  int now = 0, tokens = 0, next_try = 4, interval = 8, tries = 0;
};

}  // namespace qkv
