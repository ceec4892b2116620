"""A few-row product written for the decode step, built on first use with the machine's C++ compiler: one of the
candidates `choose_kernels` times, never assumed to win.

y[r, n] = sum_k x[r, k] * w[n, k] for a few rows: the weight rows are split between the cores (ATen's
parallel_for); each weight row is streamed once and every 8 floats of it are multiplied into up to 8 input rows'
accumulators in registers, so the loads per multiply-add fall with the rows and a few rows cost little more than
the weight's bytes. BLAS libraries run these sizes as one-core GEMVs or as small GEMMs whose cost grows with the
rows. AVX2/FMA where the compiler targets them, plain loops elsewhere. torch's own extension builder compiles it
into its per-machine cache (~/.cache/torch_extensions), so the build is paid once per machine; without a working
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

static inline float hsum(__m256 s) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}
#endif

// One weight row against RR input rows: each 8 floats of the weight are loaded once and multiplied into RR
// accumulators (8 at most, with the weight and an input register within AVX2's 16).
template <int RR>
static inline void row_by_rows(const float* w, const float* x, float* y, int64_t K, int64_t N) {
  int64_t k = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc[RR];
  for (int r = 0; r < RR; ++r) acc[r] = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) {
    // ask for the weight's cache line 1 KB ahead, once a line: the loads of the next rows overlap the arithmetic
    // of this one, so a few rows cost what one costs (the hardware prefetcher alone left ~25% between 1 and 4 rows)
    if ((k & 15) == 0) _mm_prefetch(reinterpret_cast<const char*>(w + k + 256), _MM_HINT_T0);
    const __m256 wv = _mm256_loadu_ps(w + k);
    for (int r = 0; r < RR; ++r) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * K + k), acc[r]);
  }
#endif
  for (int r = 0; r < RR; ++r) {
#if defined(__AVX2__) && defined(__FMA__)
    float s = hsum(acc[r]);
#else
    float s = 0.f;
#endif
    for (int64_t t = k; t < K; ++t) s += w[t] * x[r * K + t];
    y[r * N] = s;
  }
}

// y[:, n] for every input row, 8 rows at a time
static void one_weight_row(const float* w, const float* X, float* Y, int64_t R, int64_t K, int64_t N) {
  for (int64_t r = 0; r < R;) {
    const int64_t rr = std::min<int64_t>(8, R - r);
    const float* x = X + r * K;
    float* y = Y + r * N;
    switch (rr) {
      case 8: row_by_rows<8>(w, x, y, K, N); break;
      case 7: row_by_rows<7>(w, x, y, K, N); break;
      case 6: row_by_rows<6>(w, x, y, K, N); break;
      case 5: row_by_rows<5>(w, x, y, K, N); break;
      case 4: row_by_rows<4>(w, x, y, K, N); break;
      case 3: row_by_rows<3>(w, x, y, K, N); break;
      case 2: row_by_rows<2>(w, x, y, K, N); break;
      default: row_by_rows<1>(w, x, y, K, N);
    }
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
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) one_weight_row(W + n * K, X, Y + n, R, K, N);
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
