"""How the runtime hands its few-row products (decode: 1 row; verification and drafting: a few) to the BLAS on a
CPU, chosen by timing the candidates on the model's own weights when it is loaded.

A decode step of a small model is memory-bound: every weight is read once per token, so tokens/s can at best be
(memory bandwidth) / (weight bytes). How close a product comes depends on how it reaches the BLAS, and that differs
between CPUs and BLAS builds. MKL, for one, runs a matrix-vector product of a 135M model's sizes on a single core;
viewing the weight as row blocks that one batched product spreads over the cores changes that on some machines and
not on others. Nothing is assumed: `choose_kernels` times every candidate and the fastest is used.

Candidates (all compute x @ W.T; they differ in summation order only, ~1e-6 relative):
  linear       F.linear(x, W)
  weight_left  (W @ x.T).T, one row doubled (a one-column product takes the GEMV path)
  blocks{c}    W viewed as [c, N/c, K], one torch.bmm against x: the c blocks go to separate threads
  native       trtspec's own few-row kernel (runtime/native.py), where the machine's C++ compiler builds it
  native16     the same in AVX-512's 16-float vectors, where the compiler targets AVX-512
  packed       the native kernel over a copy of the weight packed in panels of 32 output rows (AVX-512): one
               sequential stream, the inputs broadcast; the copy is made only where it is chosen (`packed_mb`)
  pairs        native over two weight rows at a time: two streams a core, each line prefetched a pair of rows ahead
  pairs16      the same in native16's 16-float vectors (AVX-512)

A draft's weights may also be stored in bfloat16 for the native kernel (`store_bf16`), where timing says so: what a
draft guesses never changes what the target outputs, so its precision is free to trade for bytes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trtspec.runtime.settings import KERNELS, RuntimeSettings

FEW_ROWS = 8  # row counts timed one by one: decode (1 row), chain verification up to k = 7, the drafts' own passes
MANY_ROWS = 64  # FEW_ROWS + 1 .. MANY_ROWS rows (a draft tree's verification) share one kernel, timed at TREE_ROWS
TREE_ROWS = 16
TIMED_ROWS = (*range(1, FEW_ROWS + 1), TREE_ROWS)  # what `choose_kernels` times; more rows (prefills) take F.linear
CANDIDATES = KERNELS
DEFAULT = ("linear",) * len(TIMED_ROWS)  # the kernel for each of TIMED_ROWS' buckets, until a choice is made

TIMED_MB = 256  # weights timed per candidate and row count (the lm_head always among them): enough to stream from memory


def bucket(rows: int) -> int:
    """Which of TIMED_ROWS' kernels a product of `rows` (1..MANY_ROWS) rows uses."""
    return min(rows, FEW_ROWS + 1) - 1


def row_labels() -> list[str]:
    """The row counts each chosen kernel serves, for reports: 1, 2, ..., 8, 9-64."""
    return [str(r) for r in range(1, FEW_ROWS + 1)] + [f"{FEW_ROWS + 1}-{MANY_ROWS}"]


def chosen_kernel(rows: int, kernels: tuple[str, ...]) -> str:
    """kernels[bucket(rows)], found by comparing `rows` with the last count of each run of equal choices (1..MANY_ROWS
    rows). Under torch.compile a pass then guards on the run its row count falls in, not on the count itself: one
    graph serves every row count that shares a kernel (an index by the count would compile one graph per count)."""
    for i in range(FEW_ROWS):
        if kernels[i] != kernels[i + 1] and rows <= i + 1:
            return kernels[i]
    return kernels[FEW_ROWS]


def product(x: Tensor, weight: Tensor, kernel: str) -> Tensor:
    """x [rows, K] @ weight[N, K].T -> [rows, N] with the named kernel ("packed": weight is the packed copy,
    [N / 32, K, 32], `native.pack_panels`)."""
    if kernel == "packed":  # a candidate only where the native kernel is built
        from trtspec.runtime.native import build, few_rows_packed

        build()
        return few_rows_packed(x, weight)
    if kernel in ("native", "native16", "pairs", "pairs16"):
        from trtspec.runtime.native import build, few_rows

        if build()[0]:  # built once per process (and kept): afterwards this is a lookup
            return few_rows(x, weight, 16 if kernel.endswith("16") else 8, pairs=kernel.startswith("pairs"))
    if kernel == "weight_left":
        cols = torch.cat((x, x)) if x.shape[0] == 1 else x
        return (weight @ cols.T).T[: x.shape[0]].contiguous()
    if kernel.startswith("blocks") and weight.shape[0] % int(kernel[6:]) == 0:
        c, (n, k) = int(kernel[6:]), weight.shape
        y = torch.bmm(weight.view(c, n // c, k), x.T.unsqueeze(0).expand(c, k, x.shape[0]))  # [c, N/c, rows]
        return y.reshape(n, x.shape[0]).T.contiguous()
    return F.linear(x, weight)


def bf16_kernel(kernel: str) -> str:
    """The kernel for bfloat16-stored weights where `kernel` was chosen for float32 ones: only the native kernels
    widen them, in 16 lanes where that (or the packed kernel, AVX-512 too) was chosen, two rows at a time likewise."""
    return kernel if kernel.startswith("pairs") else "native16" if kernel in ("native16", "packed") else "native"


def kernel_for(rows: int, weight: Tensor, kernels: tuple[str, ...], packed: Tensor | None) -> tuple[str, Tensor]:
    """(kernel, the tensor it reads) for a product of `rows` (1..MANY_ROWS) float32 rows with a layer's weight: the
    kernel chosen for that many rows (`chosen_kernel`), the native one for bfloat16-stored weights, "native16" where
    "packed" was chosen but the layer has no packed copy."""
    chosen = chosen_kernel(rows, kernels)
    kernel = bf16_kernel(chosen) if weight.dtype == torch.bfloat16 else chosen
    if kernel == "packed" and packed is None:
        kernel = "native16"
    return kernel, packed if kernel == "packed" else weight


def few_rows_linear(x: Tensor, weight: Tensor, bias: Tensor | None, kernels: tuple[str, ...] = DEFAULT,
                    packed: Tensor | None = None) -> Tensor:
    """F.linear, except that 1..MANY_ROWS float32 rows on a CPU without autograd use the kernel chosen for that many
    rows (`kernel_for`; under torch.compile a graph per run of row counts that share a kernel). `packed`: the weight's
    packed copy, for the "packed" kernel (without one, a layer runs "native16" in its place)."""
    if torch.compiler.is_exporting():  # a graph for another runtime (ONNX) holds the plain product
        return F.linear(x, weight, bias)
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if not 0 < rows <= MANY_ROWS or x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled():
        return F.linear(x, weight.to(x.dtype), bias)  # (a no-op but for bfloat16-stored weights: `store_bf16`)
    kernel, operand = kernel_for(rows, weight, kernels, packed)
    y = product(x.reshape(rows, -1), operand, kernel)
    y = y.view(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


class Linear(nn.Linear):
    """nn.Linear whose decode/verification products use the kernels `choose_kernels` picked for this machine (the
    runtime's networks, runtime/model.py and eagle/runtime.py, build their layers from it)."""

    kernels: tuple[str, ...] = DEFAULT
    packed: Tensor | None = None  # the weight packed in panels, where `choose_kernels` chose "packed"

    def forward(self, x: Tensor) -> Tensor:
        return few_rows_linear(x, self.weight, self.bias, self.kernels, self.packed)


STORAGES = ("auto", "float32", "bfloat16")  # how a draft's product weights may be stored (`store_bf16`)


def store_bf16(model: nn.Module, extra: Sequence[Linear] = (), choice: str = "auto") -> dict:
    """Store the runtime Linear weights of a draft network (and `extra` layers it calls) in bfloat16 where that is
    faster, for the native kernel to widen to float32 as it streams them: half the bytes for the same float32
    products of bfloat16-rounded weights. For a draft only: its weights set what it guesses, never what the target
    outputs, and a draft exported in bfloat16 keeps exactly its numbers.

    choice: "auto" times both storages (`time_storages`) and keeps the faster; "bfloat16" or "float32" forces one.
    The native kernel must be built with its vector loops; without it the weights stay float32.
    -> {"weights": the storage, "ms_per_pass": {storage: ms over 1..FEW_ROWS rows}, when timed}
    """
    from trtspec.runtime.native import vector_loops

    if choice not in STORAGES:
        raise ValueError(f"draft weights '{choice}': expected one of {', '.join(STORAGES)}")
    layers = [m for m in model.modules() if isinstance(m, Linear)] + list(extra)
    if choice == "float32" or not layers or layers[0].weight.dtype != torch.float32 or layers[0].weight.device.type != "cpu":
        return {"weights": "float32"}
    if not vector_loops():
        return {"weights": "float32", "note": "no native kernel with vector loops: float32 weights"}
    bf16 = [m.weight.to(torch.bfloat16) for m in layers]
    ms = time_storages(layers, bf16) if choice == "auto" else {}
    if ms:
        choice = min(ms, key=ms.get)
    if choice == "bfloat16":
        for m, w in zip(layers, bf16, strict=True):
            m.weight = nn.Parameter(w, requires_grad=False)
            m.packed = None  # a float32 copy the bfloat16 weight no longer reads
    return {"weights": choice, **({"ms_per_pass": ms} if ms else {})}


def time_storages(layers: list[Linear], bf16: list[Tensor], repeats: int = 2) -> dict[str, float]:
    """ms for every product of `layers` at each of 1..FEW_ROWS rows: float32 weights with the layers' chosen kernels
    against their bfloat16 copies with the native kernel. Rounds interleave the two and the best is kept, as in
    `choose_kernels`."""
    gen = torch.Generator().manual_seed(0)
    inputs = {r: [torch.randn(r, m.weight.shape[1], generator=gen) for m in layers] for r in range(1, FEW_ROWS + 1)}
    best = {"float32": float("inf"), "bfloat16": float("inf")}
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first round touches the inputs and the copies
            t = {"float32": 0.0, "bfloat16": 0.0}
            for r, xs in inputs.items():
                t0 = time.perf_counter()
                for m, x in zip(layers, xs, strict=True):
                    few_rows_linear(x, m.weight, None, m.kernels, m.packed)
                t1 = time.perf_counter()
                for m, w, x in zip(layers, bf16, xs, strict=True):
                    product(x, w, bf16_kernel(m.kernels[r - 1]))
                t["float32"] += t1 - t0
                t["bfloat16"] += time.perf_counter() - t1
            best = {k: min(best[k], t[k] * 1e3) for k in best}
    return {k: round(v, 2) for k, v in best.items()}


def _time_pass(weights: list[Tensor], inputs: list[Tensor], kernel: str, packed: list[Tensor | None]) -> float:
    t0 = time.perf_counter()
    for w, wp, x in zip(weights, packed, inputs, strict=True):
        if kernel == "packed":
            few_rows_linear(x, w, None, ("packed",) * len(TIMED_ROWS), wp)
        else:
            product(x, w, kernel)
    return time.perf_counter() - t0


def packable(w: Tensor) -> bool:
    from trtspec.runtime.native import PANEL

    return w.dim() == 2 and w.shape[0] % PANEL == 0


def available_memory_mb() -> float | None:
    """The memory the system could still hand out (MemAvailable in /proc/meminfo), or None where unknown."""
    from pathlib import Path

    try:
        line = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemAvailable:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration, ValueError, IndexError):
        return None


PACKED_SHARE = 0.5  # the packed kernel is a candidate only while its copies would take at most this share of free memory


def packed_fits(weights: list[Tensor]) -> tuple[bool, str]:
    """Whether packed copies of the packable `weights` fit in memory (`PACKED_SHARE` of what is available): a copy
    of a large model's weights could otherwise push the machine into swap or the OOM killer -> (fits, why not)."""
    mb = sum(w.numel() * w.element_size() for w in {id(w): w for w in weights if packable(w)}.values()) / 2**20
    free = available_memory_mb()
    if free is None or mb <= PACKED_SHARE * free:
        return True, ""
    return False, f"its copy of the weights ({mb:.0f} MiB) would take more than {PACKED_SHARE:.0%} of the {free:.0f} MiB of memory available"


def timed_weights(weights: list[Tensor]) -> list[Tensor]:
    """The weights `choose_kernels` times: in model order up to TIMED_MB, plus the last (the lm_head)."""
    out, mb = [], 0.0
    for w in weights[:-1]:
        if mb >= TIMED_MB:
            break
        out.append(w)
        mb += w.numel() * w.element_size() / 1e6
    return out + weights[-1:]


def available_candidates(allowed: Sequence[str] = CANDIDATES) -> tuple[str, ...]:
    """The CANDIDATES of `allowed` this machine can run: the native kernel and its two-row form where it was built,
    their 16-lane forms and the packed kernel where AVX-512 is."""
    from trtspec.runtime.native import build, wide_loops

    absent = set() if build()[0] else {"native", "native16", "packed", "pairs", "pairs16"}
    if not absent and not wide_loops():
        absent |= {"native16", "packed", "pairs16"}
    return tuple(c for c in CANDIDATES if c not in absent and (c in allowed or c == "linear"))


def choose_kernels(model: nn.Module, repeats: int = 2, settings: RuntimeSettings | None = None) -> dict:
    """Time every candidate the settings allow for each of TIMED_ROWS over `model`'s runtime Linear weights
    (`timed_weights`), and set the fastest for each row count on every layer. Returns what was measured and chosen:
    `by_rows`, the kernel for 1, 2, ..., FEW_ROWS rows and last the one for FEW_ROWS + 1 .. MANY_ROWS (timed at
    TREE_ROWS; F.linear untimed where settings.tree_kernel is off).

    Rounds are interleaved (each round runs every candidate once) and the best is kept, so noise on a busy machine
    hits all candidates alike. Off a CPU, or for weights that are not float32, F.linear is kept.
    """
    from trtspec.runtime.native import build, pack_panels

    layers = [m for m in model.modules() if isinstance(m, Linear)]
    weights = [m.weight for m in layers]
    if not weights or weights[0].device.type != "cpu" or weights[0].dtype != torch.float32:
        return {"by_rows": list(DEFAULT), "one_row": "linear", "note": "not a float32 CPU model: F.linear"}
    native, why_not = build()
    settings = settings or RuntimeSettings()
    candidates = available_candidates(settings.kernels)
    fits, no_packing = packed_fits(weights) if "packed" in candidates else (True, "")
    if not fits:
        candidates = tuple(c for c in candidates if c != "packed")
    timed = timed_weights(weights)
    # the timed weights' packed copies, kept for their layers if "packed" is chosen (by tensor: a weight may be shared)
    copies = {id(w): pack_panels(w) for w in timed if "packed" in candidates and packable(w)}
    packed = [copies.get(id(w)) for w in timed]
    gen = torch.Generator().manual_seed(0)
    ms: dict[int, dict[str, float]] = {}
    with torch.inference_mode():
        for rows in TIMED_ROWS if settings.tree_kernel else TIMED_ROWS[:-1]:
            inputs = [torch.randn(rows, w.shape[1], generator=gen) for w in timed]
            _time_pass(timed, inputs, "linear", packed)  # first touch of the inputs
            best = dict.fromkeys(candidates, float("inf"))
            for _ in range(repeats):
                for c in candidates:
                    best[c] = min(best[c], _time_pass(timed, inputs, c, packed) * 1e3)
            ms[rows] = best
    by_rows = tuple(min(candidates, key=ms[rows].get) for rows in ms) + (() if settings.tree_kernel else ("linear",))
    for m in layers:
        m.kernels = by_rows
        m.packed = None
        if "packed" in by_rows and packable(m.weight):
            m.packed = copies[id(m.weight)] if id(m.weight) in copies else pack_panels(m.weight)
    del copies, packed
    packed_mb = sum(m.packed.numel() * 4 for m in layers if m.packed is not None) / 1e6
    timed_mb = sum(w.numel() * w.element_size() for w in timed) / 1e6
    return {
        "by_rows": list(by_rows), "one_row": by_rows[0], "weight_mb": round(weight_mb(model), 1), "timed_mb": round(timed_mb, 1),
        "ms_per_pass": {f"{rows}_rows": {c: round(t, 2) for c, t in by.items()} for rows, by in ms.items()},
        "gb_per_s_one_row": round(timed_mb / ms[1][by_rows[0]], 2),
        "packed_mb": round(packed_mb, 1),  # memory the packed copies take beside the weights (0: none chosen)
        "native_kernel": "built" if native else f"not available ({why_not})",
        **({"packed_left_out": no_packing} if no_packing else {}),
    }


def cpu_description() -> dict:
    """The CPU the runtime measures on: model name, logical cores, threads torch uses, the vector extensions
    that change which kernels win (AVX2, AVX-512, AMX)."""
    import os
    import platform
    from pathlib import Path

    name, flags = platform.processor() or platform.machine(), []
    try:
        info = Path("/proc/cpuinfo").read_text()
        name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), name)
        words = set(next((ln.split(":", 1)[1] for ln in info.splitlines() if ln.startswith("flags")), "").split())
        flags = sorted(f for f in words if f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile"))
    except OSError:
        pass
    return {"model": name, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "flags": flags}


def weight_mb(net: nn.Module) -> float:
    """Megabytes of a network's runtime Linear weights: what one pass of it reads."""
    return sum(m.weight.numel() * m.weight.element_size() for m in net.modules() if isinstance(m, Linear)) / 1e6
