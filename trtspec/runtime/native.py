"""A few-row product written for the decode step, built on first use with the machine's C++ compiler: one of the
candidates `choose_kernels` times, never assumed to win.

y[r, n] = sum_k x[r, k] * w[n, k] for up to 8 rows: the weight rows are split between the cores (ATen's
parallel_for) and each is read once and used for every input row while it sits in L1. BLAS libraries run these
sizes as one-core GEMVs or as small GEMMs whose cost grows with the rows; here 2-5 rows cost little more than one.
AVX2/FMA where the compiler targets them, plain loops elsewhere. torch's own extension builder compiles it into
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

static inline float dot(const float* w, const float* x, int64_t K) {
  int64_t k = 0;
  float acc = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (; k + 32 <= K; k += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
  }
  for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  acc = _mm_cvtss_f32(h);
#endif
  for (; k < K; ++k) acc += w[k] * x[k];
  return acc;
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
    for (int64_t n = begin; n < end; ++n)
      for (int64_t r = 0; r < R; ++r) Y[r * N + n] = dot(W + n * K, X + r * K, K);
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
