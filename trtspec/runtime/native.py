"""A few-row product written for the decode step, built on first use with the machine's C++ compiler: one of the
candidates `choose_kernels` times, never assumed to win.

y[r, n] = sum_k x[r, k] * w[n, k] for a few rows: the weight rows are split between the cores (ATen's parallel_for)
in blocks of 4; a block is read from memory once and, while it sits in L1, multiplied with up to 3 input rows at a
time in registers (12 accumulators: the loads per multiply-add fall with the rows, so a few rows stay bound by
the weights' bytes, not by the core). BLAS libraries run these sizes as one-core GEMVs or as small GEMMs whose cost
grows with the rows. AVX2/FMA where the compiler targets them, plain loops elsewhere. torch's own extension builder compiles it into
its per-machine cache (~/.cache/torch_extensions), so the build is paid once per machine; without a working
compiler the candidate is simply absent.
"""

from __future__ import annotations

import torch
from torch import Tensor

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

constexpr int64_t NB = 4;  // weight rows per block: each is read from memory once, then from L1 for every input row

#if defined(__AVX2__) && defined(__FMA__)
static inline float hsum(__m256 s) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// RR input rows against NB weight rows: RR * NB accumulators (12 at most) + NB weight registers fit AVX2's 16.
template <int RR>
static inline void rows_by_block(const float* w, const float* x, float* y, int64_t K, int64_t N) {
  __m256 acc[RR][NB];
  for (int r = 0; r < RR; ++r)
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = _mm256_loadu_ps(w + j * K + k);
    for (int r = 0; r < RR; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * K + k);
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm256_fmadd_ps(wv[j], xv, acc[r][j]);
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int j = 0; j < NB; ++j) {
      float s = hsum(acc[r][j]);
      for (int64_t t = k; t < K; ++t) s += w[j * K + t] * x[r * K + t];
      y[r * N + j] = s;
    }
}
#endif

template <int RR>
static inline void rows_by_block_plain(const float* w, const float* x, float* y, int64_t K, int64_t N, int64_t nb) {
  for (int r = 0; r < RR; ++r)
    for (int64_t j = 0; j < nb; ++j) {
      float s = 0.f;
      for (int64_t t = 0; t < K; ++t) s += w[j * K + t] * x[r * K + t];
      y[r * N + j] = s;
    }
}

// y[:, n0:n0+nb] for every input row, in groups of up to 3 rows
static void block(const float* W, const float* X, float* Y, int64_t R, int64_t K, int64_t N, int64_t n0, int64_t nb) {
  const float* w = W + n0 * K;
  for (int64_t r = 0; r < R;) {
    const int64_t rr = std::min<int64_t>(3, R - r);
    const float* x = X + r * K;
    float* y = Y + r * N + n0;
#if defined(__AVX2__) && defined(__FMA__)
    if (nb == NB) {
      if (rr == 3) rows_by_block<3>(w, x, y, K, N);
      else if (rr == 2) rows_by_block<2>(w, x, y, K, N);
      else rows_by_block<1>(w, x, y, K, N);
      r += rr;
      continue;
    }
#endif
    if (rr == 3) rows_by_block_plain<3>(w, x, y, K, N, nb);
    else if (rr == 2) rows_by_block_plain<2>(w, x, y, K, N, nb);
    else rows_by_block_plain<1>(w, x, y, K, N, nb);
    r += rr;
  }
}

torch::Tensor few_rows(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "few_rows: x [R, K], w [N, K]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat, "few_rows: float32 only");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t R = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({R, N}, x.options());
  const float* X = x.data_ptr<float>();
  const float* W = w.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  const int64_t blocks = (N + NB - 1) / NB;
  at::parallel_for(0, blocks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * NB;
      block(W, X, Y, R, K, N, n0, std::min<int64_t>(NB, N - n0));
    }
  });
  return y;
}

TORCH_LIBRARY(trtspec, m) { m.def("few_rows(Tensor x, Tensor w) -> Tensor"); }
TORCH_LIBRARY_IMPL(trtspec, CPU, m) { m.impl("few_rows", &few_rows); }
"""

_built: tuple[bool, str] | None = None


def build() -> tuple[bool, str]:
    """(True, "") once torch.ops.trtspec.few_rows exists, or (False, why not). Built at most once per process; torch
    caches the binary per machine. The op is registered in C++ (no Python on the call path: a decode step makes
    over a hundred of these calls) with a shape-only fake, so torch.compile traces it as one opaque call."""
    global _built
    if _built is None:
        try:
            from torch.utils.cpp_extension import load_inline

            load_inline(
                "trtspec_few_rows", cpp_sources=SOURCE, extra_cflags=["-O3", "-march=native", "-fopenmp"],
                extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False,
            )
            torch.library.register_fake("trtspec::few_rows")(lambda x, w: x.new_empty((x.shape[0], w.shape[0])))
            _built = (True, "")
        except Exception as e:  # no compiler, no headers, an unknown -march: the candidate is absent, nothing else
            _built = (False, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}")
    return _built


def few_rows(x: Tensor, w: Tensor) -> Tensor:
    """x [R, K] @ w[N, K].T with the native kernel; `build()` must have succeeded."""
    return torch.ops.trtspec.few_rows(x, w)
