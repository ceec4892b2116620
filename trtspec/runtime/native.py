"""The runtime's own CPU kernels for the decode step, built on first use with the machine's C++ compiler.

A few-row product, one of the candidates `choose_kernels` times, never assumed to win:
y[r, n] = sum_k x[r, k] * w[n, k] for a few rows: the weight rows are split between the cores (ATen's
parallel_for); each weight row is streamed once and every 8 floats of it are multiplied into up to 8 input rows'
accumulators in registers, so the loads per multiply-add fall with the rows and a few rows cost little more than
the weight's bytes. BLAS libraries run these sizes as one-core GEMVs or as small GEMMs whose cost grows with the
rows. The weights may also be bfloat16 (a draft's, `kernels.store_bf16`): widened to float32 as they stream, they
cost half the bytes for float32 arithmetic.

Attention over the KV cache for the few new rows of a decode, verification or draft pass: one task per (query head,
row), its scores four cached rows at a time, an AVX2 exp, and the weighted sum of value rows in eight accumulators.
torch's attention spends most of its time at these sizes on blocking, threading and loop overhead (the flash kernel)
or on loops inductor does not vectorise across the cache (its fused sums); scripts/bench_attention.py compares them.

Where the compiler targets AVX-512 the product also comes in 16-float vectors (`few_rows16`, the candidate
"native16"): half the instructions per weight byte, which matters where a few rows' multiply-adds, not the bytes,
bound the product; whether it wins is timed per machine like every candidate. Both also come with their weight rows
two at a time ("pairs", "pairs16"): two streams a core, each cache line asked for where the next pair reads it, for a
core whose one stream leaves memory bandwidth unused, so that a few rows cost what one does.

A whole few-row pass of a Llama-family decoder, `decoder_step`: the decode or verification pass of runtime/model.py's
Transformer in one call, its products by the kernels chosen for each, attention by the kernel above, norms, rope,
cache writes and SiLU as plain loops. Compiled from Python (torch.compile) the same pass costs ~250 operations'
dispatch, a Python wrapper and dynamo's guards every call: a fifth of a decode step on a small model.

AVX2/FMA where the compiler targets them, plain loops elsewhere (there `attention_usable` says no and torch's attention
stays). torch's own extension builder compiles the source into its per-machine cache (~/.cache/torch_extensions), so
the build is paid once per machine; without a working compiler both are simply absent.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <limits>
#include <algorithm>
#include <type_traits>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline float hsum(__m256 s) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}
#endif

// Weights come as float32 or bfloat16 (a draft's, stored at half the bytes: a bfloat16 is the top half of a float32,
// so widening it is exact and the products are float32 products of the same numbers).
static inline float to_float(float w) { return w; }
static inline float to_float(at::BFloat16 w) { return static_cast<float>(w); }
#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
static inline __m256 load8(const at::BFloat16* w) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

#if defined(__AVX512F__)
// AVX-512's 16 floats a vector: half the instructions per weight byte. Their own candidates ("native16", "pairs16"):
// whether they beat 8 lanes depends on the CPU (AMD's Zen 4 splits a 512-bit operation in two, Intel's server cores
// do not), so `choose_kernels` times them like the others.
static inline __m512 load16(const float* w) { return _mm512_loadu_ps(w); }
static inline __m512 load16(const at::BFloat16* w) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

// The vector of LANES floats the product kernels run on: AVX2's 8, AVX-512's 16
#if defined(__AVX2__) && defined(__FMA__)
template <int LANES> struct Vec {
  using T = __m256;
  static T zero() { return _mm256_setzero_ps(); }
  template <typename WT> static T load(const WT* p) { return load8(p); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(T v) { return hsum(v); }
};
#if defined(__AVX512F__)
template <> struct Vec<16> {
  using T = __m512;
  static T zero() { return _mm512_setzero_ps(); }
  template <typename WT> static T load(const WT* p) { return load16(p); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(T v) { return _mm512_reduce_add_ps(v); }
};
#endif
#endif

// One weight row against RR input rows ("native", "native16"): each LANES weights are loaded once and multiplied
// into RR accumulators (8 at most, with the weight and an input register within AVX2's 16); plain loops without AVX2.
template <int LANES, int RR, typename WT>
static inline void row_by_rows(const WT* w, const float* x, float* y, int64_t K, int64_t N) {
  int64_t k = 0;
  float s[RR] = {};
#if defined(__AVX2__) && defined(__FMA__)
  using V = Vec<LANES>;
  constexpr int64_t per_line = 64 / sizeof(WT);
  typename V::T acc[RR];
  for (int r = 0; r < RR; ++r) acc[r] = V::zero();
  for (; k + LANES <= K; k += LANES) {
    // ask for the weight's cache line 1 KB ahead, once a line: the loads of the next rows overlap the arithmetic
    // of this one, so a few rows cost what one costs (the hardware prefetcher alone left ~25% between 1 and 4 rows)
    if ((k & (per_line - 1)) == 0) _mm_prefetch(reinterpret_cast<const char*>(w + k) + 1024, _MM_HINT_T0);
    const typename V::T wv = V::load(w + k);
    for (int r = 0; r < RR; ++r) acc[r] = V::fma(wv, V::load(x + r * K + k), acc[r]);
  }
  for (int r = 0; r < RR; ++r) s[r] = V::sum(acc[r]);
#endif
  for (int r = 0; r < RR; ++r) {
    for (int64_t t = k; t < K; ++t) s[r] += to_float(w[t]) * x[r * K + t];
    y[r * N] = s[r];
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// Two weight rows at once against RR input rows ("pairs", "pairs16"): two streams for the memory system where
// row_by_rows has one, each input vector loaded once for both, and each cache line asked for where the next pair
// will read it (a distance that grows with the row, not a fixed 1 KB). Where one stream a core leaves bandwidth
// unused, a few rows cost what one row costs. Each output sums in the one-row kernel's order of the same lanes:
// "pairs16" gives native16's floats, "pairs" native's.
template <int LANES, int RR, typename WT>
static inline void two_rows_by_rows(const WT* w, const float* x, float* y, int64_t K, int64_t N) {
  using V = Vec<LANES>;
  constexpr int64_t per_line = 64 / sizeof(WT);
  const WT* w2 = w + K;
  const int64_t ahead = 2 * K * sizeof(WT);  // bytes: the same place in the next pair of rows
  typename V::T a[RR], b[RR];
  for (int r = 0; r < RR; ++r) { a[r] = V::zero(); b[r] = a[r]; }
  int64_t k = 0;
  for (; k + LANES <= K; k += LANES) {
    if ((k & (per_line - 1)) == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(w + k) + ahead, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w2 + k) + ahead, _MM_HINT_T0);
    }
    const typename V::T v = V::load(w + k), v2 = V::load(w2 + k);
    for (int r = 0; r < RR; ++r) {
      const typename V::T xv = V::load(x + r * K + k);
      a[r] = V::fma(v, xv, a[r]);
      b[r] = V::fma(v2, xv, b[r]);
    }
  }
  for (int r = 0; r < RR; ++r) {
    float s = V::sum(a[r]), s2 = V::sum(b[r]);
    for (int64_t t = k; t < K; ++t) {
      s += to_float(w[t]) * x[r * K + t];
      s2 += to_float(w2[t]) * x[r * K + t];
    }
    y[r * N] = s;
    y[r * N + 1] = s2;
  }
}
#endif


// f(r, RR) for the input rows r .. r + RR - 1, 8 at a time (RR a compile-time count: the accumulators' array size)
template <typename F>
static inline void in_groups_of_8(int64_t R, F&& f) {
  for (int64_t r = 0; r < R; r += 8) {
    switch (std::min<int64_t>(8, R - r)) {
      case 8: f(r, std::integral_constant<int, 8>{}); break;
      case 7: f(r, std::integral_constant<int, 7>{}); break;
      case 6: f(r, std::integral_constant<int, 6>{}); break;
      case 5: f(r, std::integral_constant<int, 5>{}); break;
      case 4: f(r, std::integral_constant<int, 4>{}); break;
      case 3: f(r, std::integral_constant<int, 3>{}); break;
      case 2: f(r, std::integral_constant<int, 2>{}); break;
      default: f(r, std::integral_constant<int, 1>{});
    }
  }
}

// LANES where the compiler targets AVX-512, else AVX2's 8 (without AVX2 the loops are plain and read no vectors)
template <int LANES> constexpr int lanes_here() {
#if defined(__AVX512F__)
  return LANES;
#else
  return 8;
#endif
}

// y[:, n] for every input row, 8 rows at a time (row_by_rows)
template <int LANES, typename WT>
static void one_weight_row(const WT* w, const float* X, float* Y, int64_t R, int64_t K, int64_t N) {
  in_groups_of_8(R, [&](int64_t r, auto rr) {
    row_by_rows<lanes_here<LANES>(), decltype(rr)::value>(w, X + r * K, Y + r * N, K, N);
  });
}

// y[:, n] and y[:, n + 1] for every input row (two_rows_by_rows), 8 rows at a time; without AVX2 the plain one-row loops
template <int LANES, typename WT>
static void two_weight_rows(const WT* w, const float* X, float* Y, int64_t R, int64_t K, int64_t N) {
  constexpr int lanes = lanes_here<LANES>();
#if defined(__AVX2__) && defined(__FMA__)
  in_groups_of_8(R, [&](int64_t r, auto rr) { two_rows_by_rows<lanes, decltype(rr)::value>(w, X + r * K, Y + r * N, K, N); });
#else
  one_weight_row<lanes>(w, X, Y, R, K, N);
  one_weight_row<lanes>(w + K, X, Y + 1, R, K, N);
#endif
}

// PAIRS: the weight rows two at a time (a core's odd last row alone)
template <int LANES, bool PAIRS = false, typename WT>
static void all_weight_rows(const WT* W, const float* X, float* Y, int64_t R, int64_t K, int64_t N) {
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    int64_t n = begin;
    if constexpr (PAIRS)
      for (; n + 2 <= end; n += 2) two_weight_rows<LANES>(W + n * K, X, Y + n, R, K, N);
    for (; n < end; ++n) one_weight_row<LANES>(W + n * K, X, Y + n, R, K, N);
  });
}

template <int LANES, bool PAIRS = false>
static torch::Tensor product(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "few_rows: x [R, K], w [N, K]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat, "few_rows: float32 inputs only");
  TORCH_CHECK(w.scalar_type() == torch::kFloat || w.scalar_type() == torch::kBFloat16, "few_rows: float32 or bfloat16 weights");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t R = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({R, N}, x.options());
  if (w.scalar_type() == torch::kFloat)
    all_weight_rows<LANES, PAIRS>(w.data_ptr<float>(), x.data_ptr<float>(), y.data_ptr<float>(), R, K, N);
  else
    all_weight_rows<LANES, PAIRS>(w.data_ptr<at::BFloat16>(), x.data_ptr<float>(), y.data_ptr<float>(), R, K, N);
  return y;
}

// The weight packed in panels of 32 output rows, each panel stored k-major ([N / 32, K, 32], `pack_panels`): the
// product streams one panel after another, sequentially, and for every k multiplies its 32 weights (two vectors)
// by each input row's x[r, k] broadcast, into 2 x RR accumulators that are the outputs themselves. Against the
// row-major kernels: the loads per multiply-add fall from (1 + RR) / RR to (2 + RR) / (2 RR), the input rows are
// read as scalars (no vector reload per weight vector), one stream for the prefetcher, no horizontal sums. Sums run
// in k order (another rounding than the 16-lane partial sums, as every candidate's differs).
constexpr int64_t PANEL = 32;
#if defined(__AVX512F__)
template <int RR>
static inline void panel_rows(const float* w, const float* x, float* y, int64_t K, int64_t N) {
  __m512 a[RR], b[RR];
  for (int r = 0; r < RR; ++r) { a[r] = _mm512_setzero_ps(); b[r] = _mm512_setzero_ps(); }
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = w + k * PANEL;  // 128 bytes: two cache lines, each asked for 1 KB ahead
    _mm_prefetch(reinterpret_cast<const char*>(wk) + 1024, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wk) + 1088, _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(wk), w1 = _mm512_loadu_ps(wk + 16);
    for (int r = 0; r < RR; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * K + k]);
      a[r] = _mm512_fmadd_ps(w0, xb, a[r]);
      b[r] = _mm512_fmadd_ps(w1, xb, b[r]);
    }
  }
  for (int r = 0; r < RR; ++r) { _mm512_storeu_ps(y + r * N, a[r]); _mm512_storeu_ps(y + r * N + 16, b[r]); }
}

// One input row: two accumulators would wait on each other's multiply-add latency, so even and odd k sum apart
template <>
inline void panel_rows<1>(const float* w, const float* x, float* y, int64_t K, int64_t N) {
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  int64_t k = 0;
  for (; k + 2 <= K; k += 2) {
    const float* wk = w + k * PANEL;
    for (int line = 0; line < 4; ++line) _mm_prefetch(reinterpret_cast<const char*>(wk) + 1024 + 64 * line, _MM_HINT_T0);
    const __m512 x0 = _mm512_set1_ps(x[k]), x1 = _mm512_set1_ps(x[k + 1]);
    a = _mm512_fmadd_ps(_mm512_loadu_ps(wk), x0, a);
    b = _mm512_fmadd_ps(_mm512_loadu_ps(wk + 16), x0, b);
    c = _mm512_fmadd_ps(_mm512_loadu_ps(wk + 32), x1, c);
    d = _mm512_fmadd_ps(_mm512_loadu_ps(wk + 48), x1, d);
  }
  for (; k < K; ++k) {
    const __m512 x0 = _mm512_set1_ps(x[k]);
    a = _mm512_fmadd_ps(_mm512_loadu_ps(w + k * PANEL), x0, a);
    b = _mm512_fmadd_ps(_mm512_loadu_ps(w + k * PANEL + 16), x0, b);
  }
  _mm512_storeu_ps(y, _mm512_add_ps(a, c));
  _mm512_storeu_ps(y + 16, _mm512_add_ps(b, d));
}
#else
template <int RR>
static inline void panel_rows(const float* w, const float* x, float* y, int64_t K, int64_t N) {
  for (int r = 0; r < RR; ++r)
    for (int64_t c = 0; c < PANEL; ++c) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += w[k * PANEL + c] * x[r * K + k];
      y[r * N + c] = s;
    }
}
#endif

// x [R, K] @ W.T with W packed as [N / 32, K, 32] -> [R, N]; the panels are split between the cores
torch::Tensor few_rows_packed(torch::Tensor x, torch::Tensor wp) {
  TORCH_CHECK(x.dim() == 2 && wp.dim() == 3 && wp.size(2) == PANEL && x.size(1) == wp.size(1),
              "few_rows_packed: x [R, K], w [N / 32, K, 32]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && wp.scalar_type() == torch::kFloat, "few_rows_packed: float32 only");
  x = x.contiguous();
  wp = wp.contiguous();
  const int64_t R = x.size(0), K = x.size(1), N = wp.size(0) * PANEL;
  auto y = torch::empty({R, N}, x.options());
  const float *W = wp.data_ptr<float>(), *X = x.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, wp.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      in_groups_of_8(R, [&](int64_t r, auto rr) {
        panel_rows<decltype(rr)::value>(W + p * K * PANEL, X + r * K, Y + r * N + p * PANEL, K, N);
      });
    }
  });
  return y;
}

torch::Tensor few_rows(torch::Tensor x, torch::Tensor w) { return product<8>(x, w); }
// 16 lanes where the compiler targets AVX-512; elsewhere the 8-lane product (and `wide_lanes` says 0)
torch::Tensor few_rows16(torch::Tensor x, torch::Tensor w) { return product<16>(x, w); }
// the same two weight rows at a time (two_rows_by_rows)
torch::Tensor few_rows_pairs(torch::Tensor x, torch::Tensor w) { return product<8, true>(x, w); }
torch::Tensor few_rows_pairs16(torch::Tensor x, torch::Tensor w) { return product<16, true>(x, w); }

#if defined(__AVX2__) && defined(__FMA__)
// exp(x) for 8 floats (Cephes' expf: range reduction by ln 2, degree-5 polynomial; ~1e-7 relative), x <= 88.3
static inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-88.3762626647949f));
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

// scores[l] = q . k_l for l < L (4 cached rows at a time: independent chains)
static void dot_rows(const float* q, const float* k, float* s, int64_t L, int64_t D) {
  int64_t l = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (D % 8 == 0) {
    for (; l + 4 <= L; l += 4) {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      const float* k0 = k + l * D;
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + D + d), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * D + d), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * D + d), a3);
      }
      s[l] = hsum(a0); s[l + 1] = hsum(a1); s[l + 2] = hsum(a2); s[l + 3] = hsum(a3);
    }
  }
#endif
  for (; l < L; ++l) {
    float x = 0.f;
    for (int64_t d = 0; d < D; ++d) x += q[d] * k[l * D + d];
    s[l] = x;
  }
}

// s[l] <- exp(s[l] - max over the visible rows), 0 where masked out; returns their sum
static float exp_rows(float* s, const bool* visible, int64_t L) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  float mx = -inf;
  for (int64_t l = 0; l < L; ++l) {
    if (visible && !visible[l]) s[l] = -inf;  // before the sum: a hidden row's score may dwarf every visible one
    else mx = std::max(mx, s[l]);
  }
  int64_t l = 0;
  float sum = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  for (; l + 8 <= L; l += 8) {
    __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + l), m));
    _mm256_storeu_ps(s + l, p);
    acc = _mm256_add_ps(acc, p);
  }
  sum = hsum(acc);
#endif
  for (; l < L; ++l) { s[l] = std::exp(s[l] - mx); sum += s[l]; }
  if (visible) {  // exp8 clamps -inf to exp(-88.4): tiny, but not the 0 a hidden row must weigh
    for (int64_t j = 0; j < L; ++j) if (!visible[j]) { sum -= s[j]; s[j] = 0.f; }
  }
  return sum;
}

// o = sum_l p[l] v_l / sum (8 accumulators of 8 floats over 64 columns at a time)
static void weighted_rows(const float* p, const float* v, float* o, int64_t L, int64_t D, float inv) {
  int64_t d0 = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; d0 + 64 <= D; d0 += 64) {
    __m256 a[8];
    for (int b = 0; b < 8; ++b) a[b] = _mm256_setzero_ps();
    for (int64_t l = 0; l < L; ++l) {
      const __m256 pv = _mm256_set1_ps(p[l]);
      const float* vr = v + l * D + d0;
      for (int b = 0; b < 8; ++b) a[b] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vr + 8 * b), a[b]);
    }
    const __m256 s = _mm256_set1_ps(inv);
    for (int b = 0; b < 8; ++b) _mm256_storeu_ps(o + d0 + 8 * b, _mm256_mul_ps(a[b], s));
  }
#endif
  for (int64_t d = d0; d < D; ++d) {
    float x = 0.f;
    for (int64_t l = 0; l < L; ++l) x += p[l] * v[l * D + d];
    o[d] = x * inv;
  }
}

// Attention of T new rows (already in the KV caches) over the caches' first `length` rows: q [1, H, T, D], caches
// [1, KV, max_len, D] (query head h reads KV head h / (H / KV)), mask [T, length] bool (true = visible) or none
// (every row visible) -> [1, T, H * D], softmax(q k^T / sqrt(D)) v. One task per (query head, row).
torch::Tensor few_rows_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, int64_t length,
                                 std::optional<torch::Tensor> mask) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && q.size(0) == 1, "few_rows_attention: shapes");
  TORCH_CHECK(q.scalar_type() == torch::kFloat && k.scalar_type() == torch::kFloat && v.scalar_type() == torch::kFloat,
              "few_rows_attention: float32 only");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous() && length <= k.size(2), "few_rows_attention: whole caches");
  q = q.contiguous();
  const int64_t H = q.size(1), T = q.size(2), D = q.size(3), KV = k.size(1), M = k.size(2), G = H / KV;
  torch::Tensor vis = mask.has_value() ? mask->to(torch::kBool).contiguous() : torch::Tensor();
  TORCH_CHECK(!mask.has_value() || (vis.size(0) == T && vis.size(1) == length), "few_rows_attention: mask [T, length]");
  auto out = torch::empty({1, T, H * D}, q.options());
  const float *Q = q.data_ptr<float>(), *K = k.data_ptr<float>(), *V = v.data_ptr<float>();
  const bool* MS = mask.has_value() ? vis.data_ptr<bool>() : nullptr;
  float* O = out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, H * T, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(length);
    std::vector<float> qs(D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i / T, t = i % T, kv = h / G;
      for (int64_t d = 0; d < D; ++d) qs[d] = Q[(h * T + t) * D + d] * scale;
      dot_rows(qs.data(), K + kv * M * D, s.data(), length, D);
      const float sum = exp_rows(s.data(), MS ? MS + t * length : nullptr, length);
      weighted_rows(s.data(), V + kv * M * D, O + (t * H + h) * D, length, D, 1.0f / sum);
    }
  });
  return out;
}

// ---- one pass of a Llama-family decoder over a few new rows, in one call ------------------------------------------
// A decode or verification pass of the target as the network's Python code does it (runtime/model.py: Transformer,
// Block, Attention, MLP), with no Python, dynamo guard or dispatcher between its ~250 operations: the weight
// products by the kernel chosen for each (codes as in `product_by`), attention by few_rows_attention, and the small
// row-wise operations (norms, rope, cache writes, residuals, SiLU) as plain loops over the few rows.

// y = x @ w.T by the kernel named by `code` (runtime/native.py KERNEL_CODES, the candidates of kernels.product)
static torch::Tensor product_by(const torch::Tensor& x, const torch::Tensor& w, int64_t code) {
  switch (code) {
    case 1: {  // weight_left: one row doubled (a one-column product takes the GEMV path)
      auto cols = x.size(0) == 1 ? at::cat({x, x}) : x;
      return at::mm(w, cols.t()).t().slice(0, 0, x.size(0)).contiguous();
    }
    case 2: case 3: case 4: {  // blocks2/4/8: W as [c, N / c, K], one batched product
      const int64_t c = int64_t(1) << (code - 1), n = w.size(0), k = w.size(1);
      if (n % c) return at::linear(x, w);
      auto y = at::bmm(w.view({c, n / c, k}), x.t().unsqueeze(0).expand({c, k, x.size(0)}));
      return y.reshape({n, x.size(0)}).t().contiguous();
    }
    case 5: return product<8>(x, w);
    case 6: return product<16>(x, w);
    case 7: return few_rows_packed(x, w);
    case 8: return product<16, true>(x, w);
    case 9: return product<8, true>(x, w);
    default: return at::linear(x, w);
  }
}

// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, row by row (F.rms_norm)
static void rms_norm_rows(const float* x, const float* w, float* y, int64_t T, int64_t d, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * d;
    float* yr = y + t * d;
    float ss = 0.f;
    for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * r * w[i];
  }
}

// x <- x * cos + rotate_half(x) * sin for one head's D values (HF's convention: rotate_half = [-x2, x1])
static void rope_head(float* x, const float* cos, const float* sin, int64_t D) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float a = x[i], b = x[i + h];
    x[i] = a * cos[i] - b * sin[i];
    x[i + h] = b * cos[i + h] + a * sin[i + h];
  }
}

static torch::Tensor with_bias(torch::Tensor y, const std::optional<torch::Tensor>& b) {
  return b.has_value() ? y.add_(*b) : y;
}

// tokens, positions, slots [T] (int64); mask [T, length] bool or none (every cached row visible); per layer l:
// weights[4l..4l+3] = qkv, o, gate_up, down (each as its kernel code reads it: packed panels for code 7), biases[2l..]
// = qkv's, o's (or none), norms[2l..] = input, post-attention (then q_norm, k_norm per layer where dims[3]), caches
// [2l..] = k, v [1, KV, max_len, D]; weights[4L] = lm_head, norms[last] = the final norm; dims = H, KV, D, qk_norm
// -> [logits [T - logits_from, V], aux [T, A] (the outputs of aux_layers, concatenated; [T, 0] without)]
std::vector<torch::Tensor> decoder_step(torch::Tensor tokens, torch::Tensor positions, torch::Tensor slots, int64_t length,
                                        std::optional<torch::Tensor> mask, torch::Tensor embed, torch::Tensor cos,
                                        torch::Tensor sin, std::vector<torch::Tensor> weights, std::vector<int64_t> codes,
                                        std::vector<std::optional<torch::Tensor>> biases, std::vector<torch::Tensor> norms,
                                        std::vector<torch::Tensor> caches, std::vector<int64_t> dims,
                                        std::vector<int64_t> aux_layers, int64_t logits_from, double eps_) {
  const int64_t H = dims[0], KV = dims[1], D = dims[2], L = static_cast<int64_t>(caches.size()) / 2;
  const bool qk_norm = dims[3] != 0;
  const int64_t T = tokens.numel(), d = embed.size(1), M = caches[0].size(2), QKV = (H + 2 * KV) * D;
  const float eps = static_cast<float>(eps_);
  TORCH_CHECK(embed.scalar_type() == torch::kFloat && cos.is_contiguous() && sin.is_contiguous(), "decoder_step: float32");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 4 * L + 1 && codes.size() == weights.size(), "decoder_step: weights");
  tokens = tokens.contiguous();
  positions = positions.contiguous();
  slots = slots.contiguous();
  const int64_t *tok = tokens.data_ptr<int64_t>(), *pos = positions.data_ptr<int64_t>(), *slot = slots.data_ptr<int64_t>();
  const auto f32 = embed.options();
  auto x = at::index_select(embed, 0, tokens).contiguous();  // [T, d], the residual stream
  auto h = torch::empty({T, d}, f32);
  auto q = torch::empty({1, H, T, D}, f32);
  float *X = x.data_ptr<float>(), *Hn = h.data_ptr<float>(), *Q = q.data_ptr<float>();
  const float *C = cos.data_ptr<float>(), *S = sin.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(slot[t] >= 0 && slot[t] < M && pos[t] >= 0 && pos[t] < cos.size(0), "decoder_step: a slot or position outside the cache");
  std::vector<torch::Tensor> aux;
  int64_t norm_at = 0;
  for (int64_t l = 0; l < L; ++l) {
    const float* in_norm = norms[norm_at].data_ptr<float>();
    const float* post_norm = norms[norm_at + 1].data_ptr<float>();
    const float* qn = qk_norm ? norms[norm_at + 2].data_ptr<float>() : nullptr;
    const float* kn = qk_norm ? norms[norm_at + 3].data_ptr<float>() : nullptr;
    norm_at += qk_norm ? 4 : 2;
    rms_norm_rows(X, in_norm, Hn, T, d, eps);
    auto qkv = with_bias(product_by(h, weights[4 * l], codes[4 * l]), biases[2 * l]).contiguous();
    float* P = qkv.data_ptr<float>();
    float *Kc = caches[2 * l].data_ptr<float>(), *Vc = caches[2 * l + 1].data_ptr<float>();
    for (int64_t t = 0; t < T; ++t) {
      const float *ct = C + pos[t] * D, *st = S + pos[t] * D;
      for (int64_t hh = 0; hh < H + KV; ++hh) {  // query heads, then key heads: (norm,) rope
        float* v = P + t * QKV + hh * D;
        if (qk_norm) rms_norm_rows(v, hh < H ? qn : kn, v, 1, D, eps);
        rope_head(v, ct, st, D);
        if (hh < H) std::copy(v, v + D, Q + (hh * T + t) * D);
        else std::copy(v, v + D, Kc + ((hh - H) * M + slot[t]) * D);
      }
      for (int64_t kv = 0; kv < KV; ++kv) {
        const float* v = P + t * QKV + (H + KV + kv) * D;
        std::copy(v, v + D, Vc + (kv * M + slot[t]) * D);
      }
    }
    auto att = few_rows_attention(q, caches[2 * l], caches[2 * l + 1], length, mask).view({T, H * D});
    x.add_(with_bias(product_by(att, weights[4 * l + 1], codes[4 * l + 1]), biases[2 * l + 1]));
    rms_norm_rows(X, post_norm, Hn, T, d, eps);
    auto gu = product_by(h, weights[4 * l + 2], codes[4 * l + 2]).contiguous();
    const int64_t I = gu.size(1) / 2;
    auto act = torch::empty({T, I}, f32);
    float *G = gu.data_ptr<float>(), *A = act.data_ptr<float>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < I; ++i) {
        const float g = G[t * 2 * I + i];
        A[t * I + i] = g / (1.0f + std::exp(-g)) * G[t * 2 * I + I + i];
      }
    x.add_(product_by(act, weights[4 * l + 3], codes[4 * l + 3]));
    if (std::find(aux_layers.begin(), aux_layers.end(), l) != aux_layers.end()) aux.push_back(x.clone());
  }
  auto last = x.slice(0, logits_from).contiguous();
  auto out = torch::empty_like(last);
  rms_norm_rows(last.data_ptr<float>(), norms[norm_at].data_ptr<float>(), out.data_ptr<float>(), last.size(0), d, eps);
  auto logits = product_by(out, weights[4 * L], codes[4 * L]);
  return {logits, aux.empty() ? torch::empty({T, 0}, f32) : at::cat(aux, 1)};
}

// Rows src[i] of every cache [1, KV, M, D] copied to row dst + i: a tree step's accepted path moved next to the
// prefix. src ascends with src[i] >= dst + i (a path's node ids do), so no row is written before it is read.
void move_rows(std::vector<torch::Tensor> caches, torch::Tensor src, int64_t dst) {
  src = src.contiguous();
  const int64_t* s = src.data_ptr<int64_t>();
  const int64_t n = src.numel();
  for (auto& c : caches) {
    TORCH_CHECK(c.scalar_type() == torch::kFloat && c.is_contiguous() && c.dim() == 4, "move_rows: float32 caches");
    const int64_t KV = c.size(1), M = c.size(2), D = c.size(3);
    float* p = c.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
      TORCH_CHECK(s[i] >= dst + i && s[i] < M && (i == 0 || s[i] > s[i - 1]), "move_rows: rows outside the cache or out of order");
    for (int64_t kv = 0; kv < KV; ++kv)
      for (int64_t i = 0; i < n; ++i)
        if (s[i] != dst + i) std::copy(p + (kv * M + s[i]) * D, p + (kv * M + s[i] + 1) * D, p + (kv * M + dst + i) * D);
  }
}

// 8 where the loops above run on AVX2 vectors, 1 where they are plain C++ (slower than torch's own attention)
int64_t vector_width() {
#if defined(__AVX2__) && defined(__FMA__)
  return 8;
#else
  return 1;
#endif
}

// 16 where few_rows16 runs on AVX-512 vectors, 0 where it is the 8-lane product
int64_t wide_lanes() {
#if defined(__AVX512F__)
  return 16;
#else
  return 0;
#endif
}

TORCH_LIBRARY(trtspec, m) {
  m.def("few_rows(Tensor x, Tensor w) -> Tensor");
  m.def("few_rows16(Tensor x, Tensor w) -> Tensor");
  m.def("few_rows_pairs(Tensor x, Tensor w) -> Tensor");
  m.def("few_rows_pairs16(Tensor x, Tensor w) -> Tensor");
  m.def("few_rows_packed(Tensor x, Tensor wp) -> Tensor");
  m.def("wide_lanes() -> int");
  m.def("attention(Tensor q, Tensor k, Tensor v, SymInt length, Tensor? mask) -> Tensor");
  m.def("vector_width() -> int");
  m.def("decoder_step(Tensor tokens, Tensor positions, Tensor slots, int length, Tensor? mask, Tensor embed, "
        "Tensor cos, Tensor sin, Tensor[] weights, int[] codes, Tensor?[] biases, Tensor[] norms, Tensor[] caches, "
        "int[] dims, int[] aux_layers, int logits_from, float eps) -> Tensor[]");
  m.def("move_rows(Tensor(a!)[] caches, Tensor src, int dst) -> ()");
}
TORCH_LIBRARY_IMPL(trtspec, CPU, m) {
  m.impl("few_rows", &few_rows);
  m.impl("few_rows16", &few_rows16);
  m.impl("few_rows_pairs", &few_rows_pairs);
  m.impl("few_rows_pairs16", &few_rows_pairs16);
  m.impl("few_rows_packed", &few_rows_packed);
  m.impl("attention", &few_rows_attention);
  m.impl("decoder_step", &decoder_step);
  m.impl("move_rows", &move_rows);
}
TORCH_LIBRARY_IMPL(trtspec, CompositeExplicitAutograd, m) {
  m.impl("vector_width", &vector_width);
  m.impl("wide_lanes", &wide_lanes);
}
"""

_built: tuple[bool, str] | None = None
_width: int | None = None  # the built kernels' vector width (8: AVX2 loops, 1: plain C++)


def cpu_key() -> str:
    """A short key of the CPU the kernels are compiled for (`-march=native`): its model name and instruction-set
    flags. torch's extension cache keys a build by its sources and flags, not by the CPU, so a cache shared by two
    CPU generations (one home directory, two machines) would load an AVX-512 build on a CPU without it (SIGILL,
    which no `except` catches); the key in the build's name keeps one build per kind of CPU."""
    import hashlib
    import platform

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = [platform.processor(), platform.machine()]
    wanted = [ln for ln in lines if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    first = list(dict.fromkeys(wanted))  # every core says the same: once each
    return hashlib.sha1("\n".join(first).encode()).hexdigest()[:12]


def build() -> tuple[bool, str]:
    """(True, "") once torch.ops.trtspec.few_rows exists, or (False, why not). Built at most once per process; torch
    caches the binary per kind of CPU (`cpu_key`). The op is registered in C++ (no Python on the call path: a decode step makes
    over a hundred of these calls) with a shape-only fake, so torch.compile traces it as one opaque call."""
    global _built
    if _built is None:
        try:
            from torch.utils.cpp_extension import load_inline

            load_inline(
                f"trtspec_few_rows_{cpu_key()}", cpp_sources=SOURCE, extra_cflags=["-O3", "-march=native", "-fopenmp"],
                extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False,
            )
            for op in ("trtspec::few_rows", "trtspec::few_rows16", "trtspec::few_rows_pairs", "trtspec::few_rows_pairs16"):
                torch.library.register_fake(op)(lambda x, w: x.new_empty((x.shape[0], w.shape[0])))
            torch.library.register_fake("trtspec::few_rows_packed")(
                lambda x, wp: x.new_empty((x.shape[0], wp.shape[0] * wp.shape[2])))
            torch.library.register_fake("trtspec::attention")(
                lambda q, k, v, length, mask: q.new_empty((1, q.shape[2], q.shape[1] * q.shape[3])))
            _built = (True, "")
        except Exception as e:  # no compiler, no headers, an unknown -march: the candidate is absent, nothing else
            _built = (False, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}")
    return _built


def attention_usable(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """Whether `attention` can serve a network of this dtype, device and head size: float32 on a CPU, the kernel built
    with its vector loops (its plain C++ loops would be slower than torch's attention), head_dim a multiple of 8.
    Asked once, eagerly, when a network allocates its KV cache (never inside a compiled pass)."""
    if dtype != torch.float32 or torch.device(device).type != "cpu" or head_dim % 8:
        return False
    return vector_loops()


def attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, length: int, mask: Tensor | None) -> Tensor:
    """Attention of q's T rows over the caches' first `length` rows with the native kernel: q [1, H, T, D] (after
    rope), caches [1, KV, max_len, D] holding those rows already, mask [T, length] bool (true = visible) or None
    (all visible) -> [1, T, H * D]."""
    return torch.ops.trtspec.attention(q, k_cache, v_cache, length, mask)


def vector_loops() -> bool:
    """Whether the kernels are built and run their AVX2 vector loops (the op `vector_width` says 8, not the plain
    C++ loops' 1): what the native attention and a draft's bfloat16 weights need to pay."""
    global _width
    if not build()[0]:
        return False
    if _width is None:
        _width = int(torch.ops.trtspec.vector_width())
    return _width == 8


def few_rows(x: Tensor, w: Tensor, lanes: int = 8, pairs: bool = False) -> Tensor:
    """x [R, K] (float32) @ w[N, K].T (float32 or bfloat16) with the native kernel in vectors of `lanes` floats (8, or
    16 where `wide_loops()`), its weight rows two at a time where `pairs`; `build()` must have succeeded."""
    if pairs:
        return torch.ops.trtspec.few_rows_pairs16(x, w) if lanes == 16 else torch.ops.trtspec.few_rows_pairs(x, w)
    return torch.ops.trtspec.few_rows16(x, w) if lanes == 16 else torch.ops.trtspec.few_rows(x, w)


PANEL = 32  # output rows per panel of a packed weight (the kernel's PANEL)


def pack_panels(w: Tensor) -> Tensor:
    """w [N, K] -> [N / 32, K, 32]: the layout `few_rows_packed` streams (N a multiple of 32)."""
    return w.view(w.shape[0] // PANEL, PANEL, w.shape[1]).transpose(1, 2).contiguous()


def few_rows_packed(x: Tensor, wp: Tensor) -> Tensor:
    """x [R, K] (float32) @ W.T for a weight packed by `pack_panels`; `build()` must have succeeded."""
    return torch.ops.trtspec.few_rows_packed(x, wp)


def wide_loops() -> bool:
    """Whether the product also runs on AVX-512's 16 floats a vector (the compiler targets it on this machine)."""
    return vector_loops() and int(torch.ops.trtspec.wide_lanes()) == 16


# the product kernels by the codes decoder_step's product_by reads (kernels.CANDIDATES)
KERNEL_CODES = {"linear": 0, "weight_left": 1, "blocks2": 2, "blocks4": 3, "blocks8": 4, "native": 5, "native16": 6, "packed": 7,
                "pairs16": 8, "pairs": 9}


def move_rows(caches: list[Tensor], src: Tensor, dst: int) -> None:
    """Copy rows `src` (ascending, src[i] >= dst + i) of every KV cache [1, KV, M, D] to rows dst, dst + 1, ... in
    one native call; `build()` must have succeeded."""
    torch.ops.trtspec.move_rows(caches, src, dst)


def decoder_step(*args) -> list[Tensor]:
    """One few-row pass of a Llama-family decoder in one native call (the C++ `decoder_step` above says the
    arguments; runtime/model.py's Transformer.native_forward assembles them); `build()` must have succeeded."""
    return torch.ops.trtspec.decoder_step(*args)

