"""The PyTorch speculative runtime: exactness against transformers, losslessness of sampling, loading errors."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from stagekit import chi2_of_first_two, export_random_eagle, first_draft, rerandomized, small_lm
from trtllm_helpers import trtllm_eagle31_gaps

from trtspec.eagle.runtime import load_eagle3_drafter
from trtspec.errors import ArtifactError, ModelError
from trtspec.runtime import native
from trtspec.runtime.decode import Stats, generate, speculative_decode
from trtspec.runtime.drafters import (
    DraftSpec,
    LMDrafter,
    ModelDrafter,
    NgramDrafter,
    draft_dynamic_tree,
    draft_static_tree,
    load_draft_target,
)
from trtspec.runtime.kernels import (
    CANDIDATES,
    FEW_ROWS,
    MANY_ROWS,
    TIMED_ROWS,
    available_candidates,
    few_rows_linear,
)
from trtspec.runtime.model import (
    COMPILED,
    Linear,
    ModelArgs,
    Transformer,
    compile_steps,
    dequantize,
    load_transformer,
)
from trtspec.runtime.tree import Tree, static_tree, tree_levels

SHAPES = ["chain", "tree", "dynamic_tree"]
NEW = 24


pytestmark = pytest.mark.usefixtures("one_thread")




@pytest.fixture(scope="module")
def hf_target(target_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_greedy(hf_target, prompts):
    out = []
    for p in prompts:
        ids = hf_target.generate(p[None], attention_mask=torch.ones(1, p.numel(), dtype=torch.long), max_new_tokens=NEW, do_sample=False)
        out.append(ids[0, p.numel() :].tolist())
    return out


@pytest.fixture(scope="module")
def random_draft_dir(tmp_path_factory, tiny_model_dir) -> Path:
    return rerandomized(tiny_model_dir, tmp_path_factory.mktemp("rand") / "model", seed=7)




@pytest.fixture(scope="module")
def eagle_export(tmp_path_factory, target_dir):
    """Exported random head + modelopt's own draft tokens for a prompt."""
    out = tmp_path_factory.mktemp("eagle") / "draft"
    return (out, *modelopt_draft(export_random_eagle(target_dir, out)))


def modelopt_draft(model) -> tuple:
    """(prompt, the target's next token, modelopt's 5 draft tokens after it) for a fixed prompt."""
    ids = torch.tensor([[1, 504, 3000, 77, 12, 900, 45, 8]])
    with torch.no_grad():
        base_tok, draft_toks = model.pseudo_speculative_generate(ids, steps=5)
    return ids[0], int(base_tok), draft_toks[0].tolist()


@pytest.fixture(scope="module")
def target(target_dir):
    return load_transformer(target_dir)[0]


def test_logits_and_aux_match_transformers(target_dir, hf_target):
    model, notes = load_transformer(target_dir, aux_layers=(0, 2))
    assert notes == []
    model.setup_cache(32)
    ids = torch.randint(0, 5000, (12,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = hf_target(ids[None], output_hidden_states=True)
        logits, aux = model(ids, torch.arange(12), torch.arange(12), 12, "causal")
        torch.testing.assert_close(logits, ref.logits[0], atol=1e-4, rtol=1e-4)
        # aux = residual stream after layers 0 and 2 (hidden_states[i + 1] in transformers)
        torch.testing.assert_close(aux, torch.cat((ref.hidden_states[1][0], ref.hidden_states[3][0]), -1), atol=1e-5, rtol=1e-5)
        # the same through the cache: 8 tokens, then 4 more with a causal mask over the prefix
        model(ids[:8], torch.arange(8), torch.arange(8), 8, "causal")
        tail, _ = model(ids[8:], torch.arange(8, 12), torch.arange(8, 12), 12, torch.ones(4, 12, dtype=torch.bool).tril(8))
        torch.testing.assert_close(tail, ref.logits[0, 8:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernel", CANDIDATES)
def test_every_kernel_is_linear(kernel):
    """Each few-row kernel the start-up choice may pick equals F.linear for any row count, leading dims and bias
    (a weight whose rows do not split into the blocks falls back); under autograd it is F.linear itself."""
    g = torch.Generator().manual_seed(0)
    # 304 = 8 * 38 splits into every block count, 300 not into 8; 320 = 10 panels of 32 (packed, else native16);
    # 301: a core's last weight row alone (pairs, pairs16)
    for n in (304, 300, 320, 301):
        w, b = torch.randn(n, 64, generator=g), torch.randn(n, generator=g)
        packed = native.pack_panels(w) if kernel == "packed" and n % native.PANEL == 0 and native.wide_loops() else None
        with torch.no_grad():
            for shape in [(1, 64), (1, 1, 64), (1, 3, 64), (4, 64), (5, 64), (2, 3, 64), (7, 64), (8, 64), (0, 64),
                          (17, 64), (2, 9, 64), (MANY_ROWS + 1, 64)]:  # a tree's verification, a prefill's rows
                x = torch.randn(*shape, generator=g)
                for bias in (None, b):
                    y = few_rows_linear(x, w, bias, (kernel,) * len(TIMED_ROWS), packed)
                    assert y.shape == (*shape[:-1], n)
                    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, bias), atol=1e-5, rtol=1e-5)
    if kernel in ("native", "native16", "packed", "pairs", "pairs16"):  # ops torch.compile can trace: their fakes give the shape
        compiled = torch.compile(lambda x: few_rows_linear(x, w, None, (kernel,) * len(TIMED_ROWS), packed), fullgraph=True)
        with torch.no_grad():
            x = torch.randn(3, 64, generator=g)
            torch.testing.assert_close(compiled(x), torch.nn.functional.linear(x, w), atol=1e-5, rtol=1e-5)
    x = torch.randn(1, 64, requires_grad=True)
    few_rows_linear(x, w, None, (kernel,) * len(TIMED_ROWS)).sum().backward()
    torch.testing.assert_close(x.grad, w.sum(0, keepdim=True), atol=1e-4, rtol=1e-5)



def test_two_weight_rows_at_a_time_give_one_rows_floats():
    """Two weight rows at a time (pairs, pairs16) sum each output as one row at a time does in the same lanes (native,
    native16): the same floats, not merely close ones (float32 and bfloat16 weights, a scalar tail, an odd row count)."""
    if not native.vector_loops():
        pytest.skip("the native kernel with vector loops is not built here")
    g = torch.Generator().manual_seed(0)
    for lanes in (8, 16) if native.wide_loops() else (8,):
        for n, k, dtype in [(301, 64, torch.float32), (300, 61, torch.float32), (257, 600, torch.bfloat16)]:
            w = torch.randn(n, k, generator=g).to(dtype)
            for rows in (1, 2, 4, 8, 11):
                x = torch.randn(rows, k, generator=g)
                assert torch.equal(native.few_rows(x, w, lanes, pairs=True), native.few_rows(x, w, lanes))

def test_bfloat16_weights_are_widened_to_the_same_float32_products():
    """A draft's weights stored in bfloat16: the native kernel's product equals F.linear on the widened weights for
    1..MANY_ROWS rows and odd widths; more rows, or autograd, take F.linear on the widened weights."""
    if not native.vector_loops():
        pytest.skip("the native kernel with vector loops is not built here")
    g = torch.Generator().manual_seed(0)
    for k in (64, 61):  # 61: the scalar tail after the vector loop
        w, b = torch.randn(300, k, generator=g).to(torch.bfloat16), torch.randn(300, generator=g)
        with torch.no_grad():
            for shape in [(1, k), (1, 3, k), (4, k), (8, k), (2, 5, k), (0, k), (17, k), (MANY_ROWS + 1, k)]:
                x = torch.randn(*shape, generator=g)
                for bias, kernels in itertools.product((None, b), [(c,) * len(TIMED_ROWS) for c in ("native", "native16", "pairs", "pairs16")]):
                    y = few_rows_linear(x, w, bias, kernels)  # 16: AVX-512's lanes, or 8 where it is absent
                    assert y.dtype == torch.float32 and y.shape == (*shape[:-1], 300)
                    torch.testing.assert_close(y, torch.nn.functional.linear(x, w.float(), bias), atol=1e-5, rtol=1e-5)
    x = torch.randn(2, 61, requires_grad=True)
    few_rows_linear(x, w, None).sum().backward()
    torch.testing.assert_close(x.grad, w.float().sum(0).expand(2, -1), atol=1e-4, rtol=1e-5)


def test_an_unknown_draft_storage_is_refused():
    from trtspec.runtime.kernels import store_bf16

    with pytest.raises(ValueError, match="draft weights 'fp16': expected one of auto, float32, bfloat16"):
        store_bf16(torch.nn.Module(), choice="fp16")


@pytest.mark.parametrize("storage", ["bfloat16", "auto"])
def test_a_draft_stored_in_bfloat16_keeps_greedy_output(eagle_export, target_dir, prompts, hf_greedy, storage):
    """The draft's product weights in bfloat16 change what it guesses, never the output; the target's own weights,
    the lm_head it may share with the draft, stay float32."""
    target = load_transformer(target_dir)[0]
    drafter = load_eagle3_drafter(eagle_export[0], target, weights=storage)
    chosen = drafter.net.kernel_choice["draft_weights"]["weights"]
    if storage == "bfloat16" and native.vector_loops():
        assert chosen == "bfloat16"
    assert {m.weight.dtype for m in drafter.net.modules() if isinstance(m, Linear)} == {getattr(torch, chosen)}
    assert {p.dtype for p in target.parameters()} == {torch.float32}
    for p, ref in zip(prompts, hf_greedy, strict=True):
        assert speculative_decode(target, drafter, p, NEW, DraftSpec(k=3), eos={2}).tokens == ref


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 128), (6, 2, 24)])
def test_native_attention_equals_sdpa(heads, kv_heads, head_dim):
    """The native attention kernel over a KV cache equals torch's SDPA for one row (no mask), a chain's rows (causal
    after the cache) and a tree's (any visible set), at cache lengths that are and are not multiples of its vector
    blocks, in eager and compiled calls (its fake gives the shape); the cache rows past `length` are never read."""
    assert native.attention_usable(torch.float32, torch.device("cpu"), 64)  # this machine and CI build it with AVX2
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = (torch.randn(1, kv_heads, 80, head_dim, generator=g) for _ in range(2))
    for length, rows in [(1, 1), (13, 1), (37, 4), (64, 8), (71, 3)]:
        q = torch.randn(1, heads, rows, head_dim, generator=g)
        chain = torch.ones(rows, length, dtype=torch.bool).tril(length - rows) if rows > 1 else None
        tree = torch.rand(rows, length, generator=g) < 0.6
        tree[:, 0] = True  # every row sees at least the first cached row
        for mask in (chain, tree):
            k, v = k_cache[:, :, :length], v_cache[:, :, :length]
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            ref = ref.transpose(1, 2).reshape(1, rows, -1)
            got = native.attention(q, k_cache, v_cache, length, mask)
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
            k_cache[:, :, length:], v_cache[:, :, length:] = float("nan"), float("nan")  # rows past length: unread
            torch.testing.assert_close(native.attention(q, k_cache, v_cache, length, mask), ref, atol=1e-5, rtol=1e-5)
            k_cache[:, :, length:], v_cache[:, :, length:] = 0, 0
    compiled = torch.compile(native.attention, fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(q, k_cache, v_cache, length, tree), native.attention(q, k_cache, v_cache, length, tree))
    # a hidden row whose score dwarfs the visible ones' (a draft row the verified rows must not see) changes nothing
    q = torch.randn(1, heads, 2, head_dim, generator=g)
    hidden = torch.ones(2, 12, dtype=torch.bool)
    hidden[:, 5] = False
    k_cache[0, :, 5] = 40 * q[0, :: heads // kv_heads, 0] / q[0, :: heads // kv_heads, 0].norm(dim=-1, keepdim=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k_cache[:, :, :12], v_cache[:, :, :12], attn_mask=hidden,
                                                           enable_gqa=True).transpose(1, 2).reshape(1, 2, -1)
    torch.testing.assert_close(native.attention(q, k_cache, v_cache, 12, hidden), ref, atol=1e-5, rtol=1e-5)


def test_kernels_are_chosen_at_load(target_dir):
    """Loading times every candidate on the model's own weights and sets the winners on each layer."""
    model = load_transformer(target_dir)[0]
    choice = model.kernel_choice
    assert set(choice["by_rows"]) <= set(CANDIDATES) and len(choice["by_rows"]) == len(TIMED_ROWS)
    assert set(choice["ms_per_pass"]) == {f"{rows}_rows" for rows in TIMED_ROWS}
    assert choice["native_kernel"] == "built"  # this machine and CI have a C++ compiler (inductor needs one too)
    assert choice["native_pass"] and model.native_pass  # the target's passes as one native call each
    here = available_candidates()  # this machine and CI build the native kernel; its 16 lanes where AVX-512 is
    avx512 = "avx512f" in Path("/proc/cpuinfo").read_text()
    assert "native" in here and "pairs" in here and ("native16" in here) == ("packed" in here) == ("pairs16" in here) == avx512
    assert all(set(by) == set(here) and min(by.values()) > 0 for by in choice["ms_per_pass"].values())
    one_row = choice["ms_per_pass"]["1_rows"]  # rounded to 0.01 ms: candidates may tie, the chosen one is among the fastest
    assert choice["one_row"] == choice["by_rows"][0] and one_row[choice["one_row"]] == min(one_row.values())
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert {m.kernels for m in linears} == {tuple(choice["by_rows"])}
    # a packed copy beside each weight whose rows fill panels, only where the packed kernel was chosen
    packed = [m for m in linears if m.packed is not None]
    assert packed == ([m for m in linears if m.weight.shape[0] % native.PANEL == 0] if "packed" in choice["by_rows"] else [])
    assert choice["packed_mb"] == round(sum(m.packed.numel() * 4 for m in packed) / 1e6, 1)
    for m in packed:
        assert torch.equal(m.packed[1, :, 3], m.weight[native.PANEL + 3])  # panel 1, its row 3 = weight row 35


@pytest.mark.parametrize("kernel", available_candidates())
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_native_pass_equals_forward(kernel, family):
    """The target's pass as one native call (Transformer.native_forward) gives forward's logits, aux hidden states
    and KV cache rows: one row (no mask), a chain, trees of 8 and 17 nodes and more rows than the few-row kernels
    take (F.linear), with every product by `kernel` (packed where a weight fills panels: the lm_head of 300 rows does
    not)."""
    qwen3 = family == "qwen3"
    args = ModelArgs(vocab_size=300, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
                     intermediate_size=96, qk_norm=qwen3, attention_bias=qwen3, o_bias=qwen3)
    torch.manual_seed(0)
    model = Transformer(args, aux_layers=(0, 2) if qwen3 else ()).eval().requires_grad_(False)
    for p in model.parameters():
        p.normal_(0, 0.2)
    for m in model.modules():
        if isinstance(m, Linear):
            m.kernels = (kernel,) * len(TIMED_ROWS)
            m.packed = native.pack_panels(m.weight) if kernel == "packed" and m.weight.shape[0] % native.PANEL == 0 else None
    assert model.use_native_pass()
    model.setup_cache(128)
    g = torch.Generator().manual_seed(1)

    def tree(rows: int) -> torch.Tensor:
        mask = torch.rand(rows, 10 + rows, generator=g) < 0.7
        mask[:, :10] = True
        return mask

    many = MANY_ROWS + 1
    with torch.inference_mode():
        model(torch.randint(0, 300, (10,), generator=g), torch.arange(10), torch.arange(10), 10, "causal")
        for rows, mask in [(1, None), (3, torch.ones(3, 13, dtype=torch.bool).tril(10)), (8, tree(8)), (17, tree(17)),
                           (many, torch.ones(many, 10 + many, dtype=torch.bool).tril(10))]:
            tokens, at = torch.randint(0, 300, (rows,), generator=g), 10 + torch.arange(rows)
            before = [(a.k_cache.clone(), a.v_cache.clone()) for a in (b.self_attn for b in model.layers)]
            logits, aux = model.forward(tokens, at, at, 10 + rows, mask, 1)
            after = [(a.k_cache.clone(), a.v_cache.clone()) for a in (b.self_attn for b in model.layers)]
            for b, (k, v) in zip(model.layers, before, strict=True):
                b.self_attn.k_cache.copy_(k), b.self_attn.v_cache.copy_(v)
            got, got_aux = model.step(tokens, at, at, 10 + rows, mask, 1)
            torch.testing.assert_close(got, logits, atol=1e-5, rtol=1e-5)
            assert (got_aux is None) == (aux is None) and (aux is None or torch.allclose(got_aux, aux, atol=1e-5, rtol=1e-5))
            for b, (k, v) in zip(model.layers, after, strict=True):
                torch.testing.assert_close((b.self_attn.k_cache, b.self_attn.v_cache), (k, v), atol=1e-5, rtol=1e-5)
        with pytest.raises(RuntimeError, match="outside the cache"):  # checked, not read past the tables' end
            model.step(torch.tensor([1]), torch.tensor([128]), torch.tensor([20]), 21, None)


def test_native_pass_follows_a_change_of_aux_layers():
    """One target serving drafts that read different layers (bench_drafters.py: EAGLE-3 beside DFlash): the native
    pass hands out the layers set now, not those of its first pass of that many rows."""
    args = ModelArgs(vocab_size=96, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96)
    model = Transformer(args, aux_layers=(0,)).eval().requires_grad_(False)
    assert model.use_native_pass()
    model.setup_cache(32)
    with torch.inference_mode():
        model(torch.arange(5), torch.arange(5), torch.arange(5), 5, "causal")
        widths = []
        for layers in [(0,), (0, 1, 2), (2,)]:
            model.aux_layers = layers
            _, aux = model.step(torch.tensor([7]), torch.tensor([5]), torch.tensor([5]), 6, None)
            _, want = model.forward(torch.tensor([7]), torch.tensor([5]), torch.tensor([5]), 6, None)
            torch.testing.assert_close(aux, want, atol=1e-5, rtol=1e-5)
            widths.append(aux.shape[-1])
    assert widths == [64, 192, 64]


def test_compact_cache_moves_the_accepted_path_natively_as_in_torch():
    """A tree step's accepted path (node ids) moved next to the prefix: the native move of every layer's rows (the
    target's pass native) leaves the caches as the torch loop does; rows out of order are refused."""
    from trtspec.runtime.decode import compact_cache

    args = ModelArgs(vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96)
    model = Transformer(args).eval().requires_grad_(False)
    assert model.use_native_pass()
    model.setup_cache(32)
    for layer in model.layers:
        layer.self_attn.k_cache.normal_(), layer.self_attn.v_cache.normal_()
    before = [(a.k_cache.clone(), a.v_cache.clone()) for a in (b.self_attn for b in model.layers)]
    compact_cache(model, 10, [0, 2, 5, 6])
    native_moved = [(a.k_cache.clone(), a.v_cache.clone()) for a in (b.self_attn for b in model.layers)]
    for b, (k, v) in zip(model.layers, before, strict=True):
        b.self_attn.k_cache.copy_(k), b.self_attn.v_cache.copy_(v)
    model.native_pass = False
    compact_cache(model, 10, [0, 2, 5, 6])
    for b, (k, v), (nk, nv) in zip(model.layers, before, native_moved, strict=True):
        assert torch.equal(b.self_attn.k_cache, nk) and torch.equal(b.self_attn.v_cache, nv)
        assert torch.equal(nk[:, :, 11:14], k[:, :, [12, 15, 16]]) and torch.equal(nv[:, :, 11:14], v[:, :, [12, 15, 16]])
        assert torch.equal(nk[:, :, 14:], k[:, :, 14:]) and torch.equal(nk[:, :, :11], k[:, :, :11])
    with pytest.raises(RuntimeError, match="out of order"):
        native.move_rows([model.layers[0].self_attn.k_cache], torch.tensor([12, 11]), 10)


def test_products_cost_reads_the_timing_of_the_kernels_chosen():
    """A verify pass's products over n rows against one row's, from the load-time timing: the chosen kernel's time at
    n rows up to FEW_ROWS, then the line through the 9-64 bucket's kernel at FEW_ROWS and TREE_ROWS rows."""
    from trtspec.measure import products_cost
    from trtspec.runtime.kernels import TREE_ROWS

    ms = {f"{r}_rows": {"a": 10.0 + r, "b": 20.0 + 2 * r} for r in TIMED_ROWS}
    choice = {"by_rows": ["a"] * FEW_ROWS + ["b"], "ms_per_pass": ms}
    assert products_cost(choice, 1) == 1.0 and products_cost(choice, 4) == pytest.approx(14 / 11)
    assert products_cost(choice, FEW_ROWS + 1) == pytest.approx((20 + 2 * (FEW_ROWS + 1)) / 11)  # b's line
    assert products_cost(choice, TREE_ROWS * 2) == pytest.approx((20 + 4 * TREE_ROWS) / 11)
    assert products_cost(choice, MANY_ROWS + 1) is None and products_cost({"by_rows": ["linear"] * 9}, 4) is None


def test_packed_copies_must_fit_in_memory(monkeypatch):
    """The packed kernel copies the weights: where that copy would take more than half the free memory (a large model)
    it is left out of the choice, and the choice says why."""
    from trtspec.report import packed_copy
    from trtspec.runtime import kernels

    weights = [torch.randn(64, 32), torch.randn(30, 32)]  # 8 KiB packable; 30 rows are no panels
    monkeypatch.setattr(kernels, "available_memory_mb", lambda: 1.0)
    assert kernels.packed_fits(weights) == (True, "")
    monkeypatch.setattr(kernels, "available_memory_mb", lambda: 0.01)
    fits, why = kernels.packed_fits(weights)
    assert not fits and "0 MiB" in why
    args = ModelArgs(vocab_size=96, hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96)
    model = Transformer(args).eval().requires_grad_(False)
    choice = kernels.choose_kernels(model)
    assert "packed" not in choice["ms_per_pass"]["1_rows"] and choice["packed_mb"] == 0
    assert all(m.packed is None for m in model.modules() if isinstance(m, Linear))
    if "packed" in available_candidates():  # AVX-512: it would have been timed
        assert choice["packed_left_out"] == why and "was left out" in packed_copy(choice)


def test_generate_without_draft_equals_hf(target, prompts, hf_greedy):
    for p, ref in zip(prompts, hf_greedy, strict=True):
        assert generate(target, p, NEW, eos={2}).tokens == ref


@pytest.mark.parametrize("shape", SHAPES)
def test_perfect_draft_keeps_greedy_output_and_accepts_everything(target_dir, target, prompts, hf_greedy, shape):
    drafter = LMDrafter(load_transformer(target_dir)[0])  # the target drafting for itself
    spec = DraftSpec(shape=shape, k=3, topk=2, total=8)
    for p, ref in zip(prompts, hf_greedy, strict=True):
        g = speculative_decode(target, drafter, p, NEW, spec, eos={2})
        assert g.tokens == ref
        if shape != "dynamic_tree":  # a dynamic tree may not keep its deepest nodes
            assert g.stats.accepted == [3] * g.stats.steps
        assert g.stats.acceptance_length() > 2.0


@pytest.mark.parametrize("shape", SHAPES)
def test_random_draft_keeps_greedy_output(random_draft_dir, target_dir, target, prompts, hf_greedy, shape):
    drafter = load_draft_target(random_draft_dir, target_dir)
    spec = DraftSpec(shape=shape, k=4, topk=3, total=10)
    for p, ref in zip(prompts, hf_greedy, strict=True):
        g = speculative_decode(target, drafter, p, NEW, spec, eos={2})
        assert g.tokens == ref
        assert g.stats.acceptance_length() < 1.3, g.stats  # nearly nothing accepted


@pytest.mark.parametrize("shape", SHAPES)
def test_eagle3_draft_keeps_greedy_output(eagle_export, target_dir, prompts, hf_greedy, shape):
    target = load_transformer(target_dir)[0]
    drafter = load_eagle3_drafter(eagle_export[0], target)
    assert target.aux_layers == (0, 1)
    for p, ref in zip(prompts, hf_greedy, strict=True):
        assert speculative_decode(target, drafter, p, NEW, DraftSpec(shape=shape, k=3, topk=3, total=8), eos={2}).tokens == ref


@pytest.mark.parametrize("shape", ["dynamic_tree", "tree"])
def test_eagle3_tree_in_one_pass_is_the_level_by_level_tree(eagle_export, target_dir, prompts, shape):
    """Eagle3Draft.dynamic_tree and .static_tree (one pass a step: the pending rows, then every level) propose the
    tree that draft_dynamic_tree and draft_static_tree grow one expansion at a time: the same tokens, parents (and
    scores), after one pending row (a generation's first draft) and after several (a step that accepted drafts)."""
    from trtspec.runtime.decode import prefill

    target = load_transformer(target_dir)[0]
    drafter = load_eagle3_drafter(eagle_export[0], target)
    spec = DraftSpec(shape=shape, k=4, topk=3, total=10)
    with torch.inference_mode():
        prompt = prompts[0]
        target.setup_cache(64)
        _, aux = prefill(target, prompt)
        drafter.setup(64)
        for accepted in ([], [5, 9, 11]):
            root, trees = accepted[-1] if accepted else 7, []
            for one_pass in (True, False):
                drafter.start(prompt, 7, aux)
                if accepted:
                    drafter.draft(7, spec)
                    drafter.accepted(torch.tensor(accepted), aux[-len(accepted):].clone())
                if one_pass:
                    trees.append(drafter.draft(root, spec)[0])
                    continue
                drafter._catch_up(*drafter.pending)
                drafter.pending = None
                trees.append(draft_dynamic_tree(drafter, root, spec.k, spec.topk, spec.total) if shape == "dynamic_tree"
                             else draft_static_tree(drafter, root, spec.tree_choices()))
            one, by_level = trees
            assert len(one) == spec.total + 1 and max(one.depth) > 2
            assert (one.tokens, one.parents, one.depth) == (by_level.tokens, by_level.parents, by_level.depth)
            assert one.scores == pytest.approx(by_level.scores, abs=1e-5)


def test_tree_levels_number_nodes_level_by_level():
    """Rank paths -> per depth (parent's index one level up, rank); paths without their parent are refused."""
    assert tree_levels([(0,), (1,), (0, 0), (1, 0), (0, 1), (0, 0, 0)]) == (((0, 0), (0, 1)), ((0, 0), (1, 0), (0, 1)), ((0, 0),))
    assert tree_levels(static_tree(2, 4, 3))[0] == ((0, 0), (0, 1))
    with pytest.raises(ValueError, match="no parent path"):
        tree_levels([(0,), (1, 0)])
    with pytest.raises(ValueError, match="skip a depth"):
        tree_levels([(0,), (0, 0, 0)])


def test_compiled_runtime_keeps_greedy_output(eagle_export, target_dir, prompts, hf_greedy, monkeypatch, tmp_path):
    """torch.compile'd decode/verify/draft passes (what validate times): the same greedy tokens as HF generate for
    plain decoding, chains and both trees; graphs really are compiled, and a failed compile falls back to eager."""
    from torch._dynamo.utils import counters

    target = load_transformer(target_dir)[0]
    target.use_native_pass(False)  # the compiled forward: where the native pass cannot run (or settings.native_pass is off)
    drafter = load_eagle3_drafter(eagle_export[0], target)
    specs = [DraftSpec(shape=s, k=3, topk=3, total=8) for s in SHAPES]
    torch._dynamo.reset()  # graphs compiled by an earlier test (same code, same shapes) would be reused silently
    before = counters["stats"]["unique_graphs"]
    runs = lambda: [  # noqa: E731
        [generate(target, p, NEW, eos={2}).tokens for p in prompts],
        *[[speculative_decode(target, drafter, p, NEW, s, eos={2}).tokens for p in prompts] for s in specs],
    ]
    assert compile_steps([target, drafter.net], runs)[1] == COMPILED
    assert target.compiled is not None and counters["stats"]["unique_graphs"] > before
    for outputs in runs():
        assert outputs == hf_greedy

    def broken():
        raise RuntimeError("no C++ compiler")

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users-own-cache"))  # not trtspec's: left alone
    (tmp_path / "users-own-cache").mkdir()
    assert "no C++ compiler" in compile_steps([target, drafter.net], broken)[1]
    assert target.compiled is None and drafter.net.compiled is None
    assert (tmp_path / "users-own-cache").is_dir()
    assert [generate(target, p, NEW, eos={2}).tokens for p in prompts] == hf_greedy


def set_kernels(net, by_rows: tuple[str, ...]) -> None:
    """Every runtime Linear of `net` runs `by_rows` (the kernel for 1, ..., FEW_ROWS rows, then for more), as if
    `choose_kernels` had picked them."""
    for m in net.modules():
        if isinstance(m, Linear):
            m.kernels = by_rows


def test_a_compiled_pass_holds_a_graph_per_run_of_row_counts_sharing_a_kernel(target_dir, monkeypatch):
    """Verifying 1..9 rows where 1-3 rows take one product kernel and 4-9 another: the compiled pass holds a graph for
    one row, one for 2-3 and one for 4-9 (and one more where dynamo specialises the first count it meets with a mask),
    not one per count: on an empty inductor cache each graph is seconds of C++. Dynamo's graphs are counted with its
    eager backend (no inductor); the kernels chosen per count are checked in test_chosen_kernel_is_the_bucket_s."""
    from torch._dynamo.utils import counters

    from trtspec.runtime.decode import warm_up_row_counts

    inductor_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: inductor_compile(fn, **{**kw, "backend": "eager"}))
    target = load_transformer(target_dir)[0]
    target.use_native_pass(False)  # the compiled forward
    set_kernels(target, ("linear",) * 3 + ("weight_left",) * (FEW_ROWS - 2))
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    spec = DraftSpec(k=FEW_ROWS)
    assert spec.max_nodes() == FEW_ROWS + 1
    assert compile_steps([target], lambda: warm_up_row_counts(target, None, spec))[1] == COMPILED
    assert 3 <= counters["stats"]["unique_graphs"] - before <= 4


def test_chosen_kernel_is_the_bucket_s():
    """kernels.chosen_kernel (comparisons at the runs' ends, for torch.compile) picks kernels[bucket(rows)] for every
    pattern of two kernels over the buckets and every row count 1..MANY_ROWS."""
    from trtspec.runtime.kernels import bucket, chosen_kernel

    for by_rows in itertools.product(("linear", "native"), repeat=len(TIMED_ROWS)):
        assert [chosen_kernel(r, by_rows) for r in range(1, MANY_ROWS + 1)] == [by_rows[bucket(r)] for r in range(1, MANY_ROWS + 1)]


@pytest.mark.full
def test_compiled_passes_hold_a_graph_for_every_row_count(target_dir, monkeypatch):
    """Where the chosen product kernel changes at every row count, a compiled pass holds one graph per count:
    verifying 1..9 rows (a DSpark block of 8) must stay within dynamo's recompile limit, past which a pass silently
    runs eager inside timed runs (here made an error, so that compile_steps reports it)."""
    from trtspec.runtime.decode import warm_up_row_counts

    monkeypatch.setattr(torch._dynamo.config, "fail_on_recompile_limit_hit", True)
    target = load_transformer(target_dir)[0]
    target.use_native_pass(False)  # the compiled forward
    set_kernels(target, tuple(("linear", "weight_left")[r % 2] for r in range(len(TIMED_ROWS))))
    torch._dynamo.reset()
    spec = DraftSpec(k=FEW_ROWS)
    assert spec.max_nodes() > FEW_ROWS
    assert compile_steps([target], lambda: warm_up_row_counts(target, None, spec))[1] == COMPILED


@pytest.mark.parametrize(("family", "shape"), [("eagle3", "chain"), ("dflash", "chain"), ("eagle3", "dynamic_tree")])
@pytest.mark.full
def test_generations_after_the_warm_up_compile_nothing(eagle_export, target_dir, prompts, family, shape, monkeypatch,
                                                       tmp_path):
    """validate compiles every pass for every row count before timing (measure.warm_up); a generation after it
    must not compile again (a graph takes seconds on a small CPU, which then land inside a timed run). Suffix drafts
    in front of the model drafter, here made to propose 11 steps out of 12, leave the verified rows of those steps
    waiting for the model drafter's next pass: more rows than the warm-up ran. A dynamic tree's draft is one pass
    of its own, its verification up to `total` + 1 rows."""
    from stagekit import export_random_dflash

    from trtspec.dflash.runtime import load_dflash_drafter
    from trtspec.measure import warm_up
    from trtspec.runtime.suffix import SuffixDrafter, SuffixThenModelDrafter

    target = load_transformer(target_dir)[0]
    if family == "eagle3":
        model = load_eagle3_drafter(eagle_export[0], target)
    else:
        export_random_dflash(target_dir, tmp_path / "dflash")
        model = load_dflash_drafter(tmp_path / "dflash", target)
    spec = DraftSpec(shape, k=3, topk=3, total=8, suffix_len=3)
    drafter = SuffixThenModelDrafter(model, SuffixDrafter())
    steps = itertools.count()
    monkeypatch.setattr(drafter.suffix, "proposal", lambda k: (1, [0, 0][:k]) if next(steps) % 12 else (0, []))
    waiting = []  # verified rows waiting for each model draft
    draft = model.draft

    def counting_draft(root, s, *args, **kwargs):
        rows = model.pending[1] if isinstance(model.pending, tuple) else model.pending
        waiting.append(0 if rows is None else rows.shape[0])
        return draft(root, s, *args, **kwargs)

    monkeypatch.setattr(model, "draft", counting_draft)
    want = [generate(target, p, NEW, eos={2}).tokens for p in prompts]
    torch._dynamo.reset()
    # validate's warm-up: every row count, then a generation without draft
    assert warm_up(target, [(model, spec)], lambda: generate(target, prompts[0], 4))[1] == COMPILED
    assert target.compiled is not None and model.net.compiled is not None
    with torch._dynamo.config.patch(error_on_recompile=True):
        for p, w in zip(prompts, want, strict=True):
            assert speculative_decode(target, drafter, p, NEW, spec, eos={2}).tokens == w
            assert speculative_decode(target, model, p, NEW, spec, eos={2}).tokens == w
    assert max(waiting) > spec.max_nodes(), waiting  # the case above did occur


def test_a_broken_compile_cache_is_emptied_and_compiling_retried(target_dir, monkeypatch, tmp_path):
    """A run killed mid-compilation can leave an entry that fails to load: trtspec's own cache folder is emptied
    and compiling tried once more, instead of falling back to the slow eager runtime on every later run."""
    cache = tmp_path / "trtspec" / "inductor-torch-test"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "half-written.so").write_bytes(b"")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    calls = []

    def fails_once():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("half-written.so: file too short")

    target = load_transformer(target_dir)[0]
    assert compile_steps([target], fails_once)[1] == COMPILED
    assert len(calls) == 2 and not (cache / "fxgraph" / "half-written.so").exists()


def test_compile_cache_is_per_machine(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    from trtspec.runtime.model import compile_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ours = tmp_path / "trtspec" / f"inductor-torch{torch.__version__}"
    assert compile_cache_dir() == ours
    cache_dir()  # inductor asked first (as importing a tokenizer does): it sets the variable to its /tmp default
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == os.path.abspath(default_cache_dir()) and compile_cache_dir() == ours
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))  # the user's own choice is kept
    assert compile_cache_dir() == tmp_path / "users"


def test_suffix_index_finds_the_longest_earlier_match():
    from trtspec.runtime.suffix import SuffixIndex

    index = SuffixIndex(max_depth=8)
    index.extend([1, 2, 3, 4, 9, 1, 2, 3])
    n, end = index.match()
    assert (n, end) == (3, 2) and index.continuation(end, 4) == [4, 9, 1, 2]
    index.extend([7])
    assert index.match() == (0, -1)  # 7 never occurred before
    index.extend([1, 2])
    assert index.match() == (2, 6) and index.continuation(6, 2) == [3, 7]  # the latest earlier "1 2" ends at 6


@pytest.mark.parametrize("how", ["alone", "in front", "beside"])
def test_suffix_drafts_keep_greedy_output(eagle_export, target_dir, prompts, hf_greedy, how):
    """Suffix drafting alone, in front of EAGLE-3 and beside it as a second branch (chains of up to 6 suffix
    tokens, EAGLE-3 chains of 3)."""
    from trtspec.runtime.decode import warm_up_row_counts
    from trtspec.runtime.suffix import SuffixBranchDrafter, SuffixDrafter, SuffixThenModelDrafter

    target = load_transformer(target_dir)[0]
    eagle = load_eagle3_drafter(eagle_export[0], target)
    drafter = {"alone": SuffixDrafter(), "in front": SuffixThenModelDrafter(eagle, SuffixDrafter(min_match=2)),
               "beside": SuffixBranchDrafter(eagle, SuffixDrafter(min_match=1))}[how]
    spec = DraftSpec(shape="chain_suffix" if how == "beside" else "chain", k=3, suffix_len=6)
    warm_up_row_counts(target, eagle, spec)  # scratch passes over every row count: nothing of them may leak into outputs
    for p, ref in zip(prompts, hf_greedy, strict=True):
        # the prompt twice: the second copy's suffix matches the first, so suffix drafts are proposed and judged
        doubled = torch.cat((p, p))
        want = generate(target, doubled, NEW, eos={2}).tokens
        g = speculative_decode(target, drafter, doubled, NEW, spec, eos={2})
        assert g.tokens == want and max(g.stats.drafted) >= 1
        assert speculative_decode(target, drafter, p, NEW, spec, eos={2}).tokens == ref
    if how == "beside":
        assert drafter.branch_steps > 0 and max(g.stats.drafted) <= 6  # trees with a branch were verified


def test_a_suffix_branch_beside_the_head_shares_a_common_start_and_adds_the_rest():
    """The branch joins the model's chain where both begin alike and leaves it where they part; a match of n tokens
    drafts n tokens (SuffixDrafter's rule)."""
    from trtspec.runtime.suffix import SuffixBranchDrafter, SuffixDrafter, SuffixIndex

    class Chain:  # a model drafter that always guesses 5, 6, 7
        name = "model"

        def draft(self, root, spec, temperature=0.0, generator=None):
            assert spec.shape == "chain"
            tree = Tree.root(root)
            for j, t in enumerate([5, 6, 7][: spec.k]):
                tree.add(t, j)
            return tree, None

    suffix = SuffixDrafter(min_match=1)
    drafter = SuffixBranchDrafter(Chain(), suffix)
    suffix.index.extend([1, 2, 5, 9, 8, 4, 1, 2])  # "1 2" occurred before, followed by 5 9
    tree, q = drafter.draft(2, DraftSpec(shape="chain_suffix", k=3))
    assert tree.tokens == [2, 5, 6, 7, 9] and tree.parents == [-1, 0, 1, 2, 1] and q is None and drafter.branch_steps == 1
    suffix.index = SuffixIndex(8)
    suffix.index.extend([3, 5, 6, 4, 3])  # "3" was followed by 5, the chain's own first guess: nothing added
    assert drafter.draft(3, DraftSpec(shape="chain_suffix", k=3))[0].tokens == [3, 5, 6, 7] and drafter.branch_steps == 1
    assert DraftSpec(shape="chain_suffix", k=3).max_nodes() == 7
    assert DraftSpec(shape="chain_suffix", k=3, suffix_len=8).max_nodes() == 12
    with pytest.raises(ModelError, match="greedy"):
        drafter.draft(3, DraftSpec(shape="chain_suffix", k=3), temperature=0.7)
    with pytest.raises(ValueError, match="chain_suffix"):
        drafter.draft(3, DraftSpec(k=3))


def test_ngram_draft_keeps_greedy_output(target, prompts, hf_greedy):
    for p, ref in zip(prompts, hf_greedy, strict=True):
        assert speculative_decode(target, NgramDrafter(), p, NEW, DraftSpec(k=4), eos={2}).tokens == ref


@pytest.mark.parametrize("variant", ["plain", "attention-bias", "eagle3.1"])
def test_eagle3_draft_matches_modelopt(eagle_export, target_dir, tmp_path, variant):
    """Same tokens as modelopt's pseudo_speculative_generate (no cache, whole sequence recomputed each step); with
    attention_bias (q/k/v and o_proj biases, as convert gives a head initialised from a Qwen2 target) too, and for
    EAGLE-3.1 (fc_norm, norm_output: trained through trtspec.eagle.head.add_eagle31, exported, read by the runtime)."""
    convert = {"attention-bias": {"overrides": {"attention_bias": True}}, "eagle3.1": {"fc_norm": True, "norm_output": True}}
    if variant in convert:
        eagle_export = (tmp_path / "draft", *modelopt_draft(export_random_eagle(target_dir, tmp_path / "draft", **convert[variant])))
    draft_dir, ids, base_tok, want = eagle_export
    if variant == "eagle3.1":  # the same checkpoint TensorRT-LLM's EAGLE-3 loader reads (tests/contracts)
        assert json.loads((draft_dir / "config.json").read_text()).get("norm_output") is True
        assert trtllm_eagle31_gaps(draft_dir) == []
    target = load_transformer(target_dir)[0]
    drafter = load_eagle3_drafter(draft_dir, target)
    assert first_draft(target, drafter, ids, base_tok, len(want)) == want
    assert len(set(want)) > 1  # a head that repeats one token would prove little


def test_draft_target_refuses_another_tokenizer(tmp_path, tiny_model_dir):
    from trtspec.models import load_tokenizer

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    tok = load_tokenizer(tiny_model_dir)
    tok.add_tokens(["<not-in-the-target>"])
    tok.save_pretrained(other)
    with pytest.raises(ModelError, match="different tokenizer"):
        load_draft_target(other, tiny_model_dir)


def test_eagle3_draft_for_another_model_is_refused(eagle_export, tmp_path, tiny_model_dir, target_dir):
    from stagekit import tiny_llama

    wide = load_transformer(tiny_llama(tmp_path / "wide", vocab_from=tiny_model_dir, layers=2, hidden=32))[0]
    with pytest.raises(ArtifactError, match="hidden size"):
        load_eagle3_drafter(eagle_export[0], wide)
    broken = tmp_path / "broken"
    shutil.copytree(eagle_export[0], broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ArtifactError, match="no .safetensors"):
        load_eagle3_drafter(broken, load_transformer(target_dir)[0])
    cfg = json.loads((eagle_export[0] / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 9]
    shutil.copytree(eagle_export[0], tmp_path / "deep")
    (tmp_path / "deep" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ArtifactError, match="layers"):
        load_eagle3_drafter(tmp_path / "deep", load_transformer(target_dir)[0])


# ---------------------------------------------------------------------------------------------- sampling


def _chi2_of_joint(monkeypatch_swap: bool, monkeypatch, suffix: bool = False) -> tuple[float, int]:
    """Chi-square of the first two speculated tokens against the target's exact joint distribution (drafted by a
    small LM, or with `suffix` by suffix matches of a prompt that repeats itself)."""
    import trtspec.runtime.decode as gen
    from trtspec.runtime.suffix import SuffixDrafter

    if monkeypatch_swap:
        monkeypatch.setattr(gen, "accept_probs", lambda p, q: (q / p).clamp(max=1.0))
    target, draft = small_lm(0, 6.0), small_lm(1, 6.0)
    prompt, first = ([3, 1, 4, 1, 5, 3, 1], 4) if suffix else ([3, 1, 4, 1, 5], 2)
    return chi2_of_first_two(target, SuffixDrafter() if suffix else LMDrafter(draft), prompt, first)


def test_speculative_sampling_matches_the_target_distribution(monkeypatch):
    chi2, bins = _chi2_of_joint(False, monkeypatch)
    # chi-square with `bins` degrees of freedom: mean = bins, sd = sqrt(2 bins); 4 sd is ~never crossed by chance
    assert chi2 < bins + 4 * (2 * bins) ** 0.5, chi2


def test_sampling_test_detects_swapped_acceptance(monkeypatch):
    """The same check fails when the acceptance ratio is q/p instead of p/q: the test above has teeth."""
    chi2, bins = _chi2_of_joint(True, monkeypatch)
    assert chi2 > bins + 4 * (2 * bins) ** 0.5, chi2


@pytest.mark.parametrize("swap", [False, True])
def test_suffix_sampling_matches_the_target_distribution(monkeypatch, swap):
    """A deterministic suffix draft (one-hot q) stays lossless at temperature 1; accepting it always (the swapped
    ratio) is caught."""
    chi2, bins = _chi2_of_joint(swap, monkeypatch, suffix=True)
    assert (chi2 < bins + 4 * (2 * bins) ** 0.5) != swap, chi2


# ---------------------------------------------------------------------------------------------- pieces


def test_tree_masks_and_static_shape():
    t = Tree.root(10)
    a = t.add(11, 0)
    t.add(12, 0)
    c = t.add(13, a)
    m = t.ancestor_mask()
    assert m[c].tolist() == [True, True, False, True]
    assert not t.is_chain()
    paths = static_tree(topk=3, total=9, max_depth=3)
    assert len(paths) == 9 and (0,) in paths
    assert all(p[:-1] in paths or len(p) == 1 for p in paths)  # closed under ancestors


def test_stats():
    s = Stats(accepted=[0, 3, 1, 3], drafted=[3, 3, 3, 3])
    assert s.acceptance_length() == 2.75
    assert s.histogram(3) == [1, 1, 0, 2]
    assert s.per_position(3) == [0.75, 0.5, 0.5]


def test_dequantize_fp8_weights():
    w = torch.randn(4, 8)
    scale = w.abs().max() / 448
    state = {"l.weight": (w / scale).to(torch.float8_e4m3fn), "l.weight_scale": scale, "l.input_scale": torch.tensor(1.0)}
    out, notes = dequantize(state, torch.float32)
    assert set(out) == {"l.weight"} and "input_scale" in notes
    torch.testing.assert_close(out["l.weight"], w, atol=0.08 * w.abs().max(), rtol=0.1)


@pytest.mark.parametrize("cached", [1, 7, 300])
def test_one_token_attention_is_sdpa(cached):
    """The decode step's fused attention (compiled, grouped query heads) computes what torch's SDPA does."""
    from trtspec.runtime.model import one_token_attention

    q, k, v = torch.randn(1, 9, 1, 64), torch.randn(1, 3, cached, 64), torch.randn(1, 3, cached, 64)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(one_token_attention(q, k, v), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.compile(one_token_attention, dynamic=True)(q, k, v), want, atol=1e-5, rtol=1e-5)


def test_native_builds_are_keyed_by_the_cpu(monkeypatch):
    """A build for one CPU is never loaded on another (-march=native: AVX-512 code on a CPU without it is a SIGILL)."""
    from trtspec.runtime import native

    assert len(native.cpu_key()) == 12
    keys = []
    for flags in ("fpu sse avx2", "fpu sse avx2 avx512f", "fpu sse avx2"):
        monkeypatch.setattr(native.Path, "read_text", lambda self, *a, f=flags, **k: f"model name\t: X\nflags\t\t: {f}\n" * 2)
        keys.append(native.cpu_key())
    assert keys[0] != keys[1] and keys[0] == keys[2]


def test_a_compressed_draft_vocabulary_says_which_target_tokens_it_can_draft():
    compressed = ModelDrafter(torch.tensor([5, 7, 9]), 12)
    assert [compressed.drafts_token(t) for t in (5, 6, 7, 9, 10)] == [True, False, True, True, False]
    assert ModelDrafter(None, 12).drafts_token(11)  # the target's own vocabulary: every token
