"""A minimal Llama-family decoder in plain torch with a static, roll-back-able KV cache (gpt-fast style).

One forward serves prefill, single-token decode and tree verification:

    logits, aux = model(tokens [T], positions [T], slots [T], length, mask [T, length] | None)

`slots` are the cache rows the T new keys/values are written to; attention reads rows [0, length). The cache keeps
no length of its own: the caller's pointer is the truth, so rolling back is just using a smaller length again.
`aux` is the residual stream after the decoder layers listed in `aux_layers` (EAGLE-3's input), concatenated.

The few-row passes (decode, verification) run as one call of runtime/native.py's `decoder_step` where its kernels
are built (`Transformer.native_forward`: the same operations in C++, with nothing between them), else as the
compiled `forward`; prefills always run `forward` eagerly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trtspec.errors import ArtifactError, ModelError
from trtspec.runtime.kernels import FEW_ROWS, MANY_ROWS, Linear, choose_kernels, kernel_for
from trtspec.runtime.native import KERNEL_CODES, attention_usable, decoder_step
from trtspec.runtime.native import attention as native_attention
from trtspec.runtime.settings import DEFAULT as DEFAULT_SETTINGS
from trtspec.runtime.settings import RuntimeSettings


@dataclass
class ModelArgs:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict = field(default_factory=dict)
    max_positions: int = 4096
    tie_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen2; Llama's attention_bias)
    o_bias: bool = False  # o_proj bias (Llama's attention_bias: true, not Qwen2)
    qk_norm: bool = False  # Qwen3

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelArgs:
        if cfg.get("hidden_act", "silu") != "silu":
            raise ModelError(f"activation '{cfg.get('hidden_act')}' is not supported by the runtime (only silu)")
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        heads = cfg["num_attention_heads"]
        arch = (cfg.get("architectures") or [""])[0]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg["intermediate_size"],
            norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0),
            rope_scaling=rope,
            max_positions=cfg.get("max_position_embeddings", 4096),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
            o_bias=bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
        )


def rope_inv_freq(args: ModelArgs) -> tuple[Tensor, float]:
    """(inverse frequencies, cos/sin scale); scaled ropes (llama3, yarn, linear, ...) via transformers' own tables."""
    kind = args.rope_scaling.get("rope_type") or args.rope_scaling.get("type") or "default"
    if kind == "default":
        return 1.0 / (args.rope_theta ** (torch.arange(0, args.head_dim, 2, dtype=torch.float32) / args.head_dim)), 1.0
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if kind not in ROPE_INIT_FUNCTIONS or kind.startswith("dynamic"):
        raise ModelError(f"rope scaling '{kind}' is not supported by the runtime", "supported: default, linear, llama3, yarn, longrope")
    params = {**args.rope_scaling, "rope_type": kind, "rope_theta": args.rope_theta}
    params.pop("type", None)
    cfg = LlamaConfig(
        hidden_size=args.hidden_size, num_attention_heads=args.num_heads, head_dim=args.head_dim,
        max_position_embeddings=args.max_positions, rope_parameters=params,
    )
    inv, scale = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
    return inv.float(), float(scale)


def rope_tables(args: ModelArgs, length: int) -> tuple[Tensor, Tensor]:
    inv, scale = rope_inv_freq(args)
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scale, emb.sin() * scale


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, heads, T, D]; cos/sin [T, D] or [B, 1, T, D] (HF's rotate_half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def one_token_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Attention of one new token over every cached row: q [1, H, 1, D], k/v [1, KV, L, D] -> [1, H, 1, D].

    softmax(q k^T / sqrt(D)) v written as products and sums, which inductor fuses into its own loops over the cache
    (query head h reads KV head h // (H / KV)). In a compiled decode step this beats the CPU's flash-attention kernel,
    whose blocking and threading cost more than the sums themselves at one query row (scripts/bench_attention.py;
    docs/results.md)."""
    (_, H, _, D), KV = q.shape, k.shape[1]
    q = q.view(KV, H // KV, 1, D)
    scores = (q * k[0][:, None]).sum(-1) * D**-0.5  # [KV, H/KV, L]
    return (scores.softmax(-1)[..., None] * v[0][:, None]).sum(-2).view(1, H, 1, D)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


class Stepper(nn.Module):
    """A network whose few-token passes (decode, verification, drafting) `compile_steps` can compile: `forward` and
    the other methods named in PASSES, each called through `run_pass`."""

    PASSES: tuple[str, ...] = ("forward",)
    compiled: dict[str, Callable] | None = None  # pass name -> its compiled function, after `compile_steps`
    settings: RuntimeSettings = DEFAULT_SETTINGS  # how the loader was told to run it (runtime/settings.py)
    kernel_choice: dict | None = None  # what `choose_kernels` measured on this machine when the network was loaded

    max_len = 0  # positions the KV cache and rope tables hold

    def activation_like(self) -> Tensor:
        """A parameter of the dtype and device activations and caches use: a norm's (product weights may be stored
        narrower, `kernels.store_bf16`)."""
        return next(p for name, p in self.named_parameters() if name.endswith("norm"))

    def setup_cache(self, max_len: int) -> None:
        """(Re)allocate every layer's KV cache and the rope tables for max_len positions."""
        p = self.activation_like()
        for layer in self.layers:
            layer.self_attn.setup_cache(max_len, p.dtype, p.device, self.settings.native_attention)
        cos, sin = rope_tables(self.args, max_len)
        self.cos, self.sin = cos.to(p), sin.to(p)
        self.max_len = max_len

    def step(self, *args):
        """forward(*args), compiled after `compile_steps`; a prefill (mask "causal", the last argument) stays eager."""
        return self.run_pass("forward", *args)

    def run_pass(self, name: str, *args):
        """The pass `name`(*args), compiled after `compile_steps` unless the last argument is "causal" (a prefill)."""
        if self.compiled is not None and not isinstance(args[-1], str):
            return self.compiled[name](*args)
        return getattr(self, name)(*args)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, in_features: int | None = None):
        super().__init__()
        d, hd = in_features or args.hidden_size, args.head_dim
        self.qkv_proj = Linear(d, (args.num_heads + 2 * args.num_kv_heads) * hd, bias=args.attention_bias)  # fused
        self.o_proj = Linear(args.num_heads * hd, args.hidden_size, bias=args.o_bias)
        if args.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(hd))
            self.k_norm = nn.Parameter(torch.ones(hd))
        self.args = args
        self.k_cache: Tensor | None = None
        self.v_cache: Tensor | None = None
        self.native = False  # attention over the cache by the native kernel (set with the cache)

    def setup_cache(self, max_len: int, dtype: torch.dtype, device: torch.device, native: bool = True) -> None:
        """native: passes over the cache (decode, verification, drafting) attend with runtime/native.py's kernel
        where it is usable (float32 on a CPU with its vector loops built); False keeps torch's attention."""
        shape = (1, self.args.num_kv_heads, max_len, self.args.head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.native = native and attention_usable(dtype, device, self.args.head_dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, slots: Tensor | None, length: int, mask: Tensor | None) -> Tensor:
        """x [B, T, in]; cos/sin broadcast against [B, heads, T, D]. With `slots`, k/v go into the KV cache at those
        rows and attention reads its first `length` rows (B = 1); without, attention stays within x (mask "causal")."""
        (B, T), a = x.shape[:2], self.args
        q, k, v = self.qkv_proj(x).view(B, T, -1, a.head_dim).transpose(1, 2).split(
            (a.num_heads, a.num_kv_heads, a.num_kv_heads), dim=1
        )
        if a.qk_norm:
            q, k = rms_norm(q, self.q_norm, a.norm_eps), rms_norm(k, self.k_norm, a.norm_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # mask None: every cached row is visible (single-token decode); "causal": prefill of an empty cache
        causal = isinstance(mask, str)
        if slots is not None:
            self.k_cache.index_copy_(2, slots, k)
            self.v_cache.index_copy_(2, slots, v)
            if self.native and not causal and not torch.compiler.is_exporting():  # decode, verification, drafting
                return self.o_proj(native_attention(q, self.k_cache, self.v_cache, length, mask).view(B, T, -1))
            k, v = self.k_cache[:, :, :length], self.v_cache[:, :, :length]
        if T == 1 and mask is None and torch.compiler.is_compiling():  # a decode step (eager: the flash kernel)
            y = one_token_attention(q, k, v)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else mask, is_causal=causal, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_up_proj = Linear(args.hidden_size, 2 * args.intermediate_size, bias=False)  # fused
        self.down_proj = Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, args: ModelArgs, attn_in: int | None = None):
        super().__init__()
        self.self_attn = Attention(args, attn_in)
        self.mlp = MLP(args)
        self.input_layernorm = nn.Parameter(torch.ones(args.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.ones(args.hidden_size))
        self.eps = args.norm_eps

    def forward(self, x: Tensor, cos, sin, slots, length, mask, attn_input: Tensor | None = None) -> Tensor:
        h = rms_norm(x, self.input_layernorm, self.eps) if attn_input is None else attn_input
        x = x + self.self_attn(h, cos, sin, slots, length, mask)
        return x + self.mlp(rms_norm(x, self.post_attention_layernorm, self.eps))


class Transformer(Stepper):
    """A Llama-family causal LM (Llama, Mistral, Qwen2, Qwen3 dense) with a static KV cache."""

    native_pass = False  # whether `step` runs as native.decoder_step (`use_native_pass`)
    path = "native"  # the runtime path serving the target (trtspec.targets; HFTarget's is "hf")

    def __init__(self, args: ModelArgs, aux_layers: tuple[int, ...] = ()):
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.num_layers))
        self.norm = nn.Parameter(torch.ones(args.hidden_size))
        self.lm_head = Linear(args.hidden_size, args.vocab_size, bias=False)
        self.aux_layers = tuple(aux_layers)

    def forward(
        self, tokens: Tensor, positions: Tensor, slots: Tensor, length: int, mask, logits_from: int = 0
    ) -> tuple[Tensor, Tensor | None]:
        """tokens/positions/slots [T] -> (logits [T - logits_from, V], aux [T, A] or None)."""
        x = self.embed_tokens(tokens)[None]
        cos, sin = self.cos[positions], self.sin[positions]
        aux = []
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, slots, length, mask)
            if i in self.aux_layers:
                aux.append(x)
        x = rms_norm(x[:, logits_from:], self.norm, self.args.norm_eps)
        return self.lm_head(x)[0], torch.cat(aux, dim=-1)[0] if aux else None

    def use_native_pass(self, on: bool = True) -> bool:
        """Run `step` (decode, verification) as one call of runtime/native.py's decoder_step from now on, where it
        can: the operations of `forward` with no Python, dynamo guard or dispatcher between them (settings.native_pass
        and native_attention on, float32 weights and activations on a CPU, the native attention usable) -> whether
        it does. Off, `step` runs the compiled `forward`."""
        p = self.activation_like()
        linears = [m for m in self.modules() if isinstance(m, Linear)]
        self.native_pass = (on and self.settings.uses_native_pass and attention_usable(p.dtype, p.device, self.args.head_dim)
                            and all(m.weight.dtype == torch.float32 for m in linears))
        self._native_args: dict[tuple, tuple] = {}
        return self.native_pass

    def setup_cache(self, max_len: int) -> None:
        super().setup_cache(max_len)
        self._native_args = {}  # they hold the caches and rope tables

    def run_pass(self, name: str, *args):
        if self.native_pass and name == "forward" and not isinstance(args[-1], str):
            return self.native_forward(*args)
        return super().run_pass(name, *args)

    def native_forward(self, tokens: Tensor, positions: Tensor, slots: Tensor, length: int, mask: Tensor | None,
                       logits_from: int = 0) -> tuple[Tensor, Tensor | None]:
        """`forward` over a few new rows (tokens/positions/slots [T], the cache holding `length` rows after them)
        by native.decoder_step, with each product's kernel chosen for T rows."""
        key = (tokens.numel(), self.aux_layers)  # a caller may change aux_layers between passes (one per draft)
        if key not in self._native_args:
            self._native_args[key] = self.native_arguments(*key)
        embed, cos, sin, weights, codes, biases, norms, caches, dims, aux = self._native_args[key]
        logits, aux_out = decoder_step(tokens, positions, slots, length, mask, embed, cos, sin, weights, codes, biases,
                                       norms, caches, dims, aux, logits_from, self.args.norm_eps)
        return logits, aux_out if self.aux_layers else None

    @staticmethod
    def add_product(rows: int, m: Linear, weights: list[Tensor], codes: list[int]) -> None:
        """Append what decoder_step needs for `m`'s product over `rows` rows: the tensor its kernel reads, the kernel's code."""
        kernel, operand = kernel_for(rows, m.weight, m.kernels, m.packed) if rows <= MANY_ROWS else ("linear", m.weight)
        weights.append(operand)
        codes.append(KERNEL_CODES[kernel])

    def native_arguments(self, rows: int, aux_layers: tuple[int, ...]) -> tuple:
        """decoder_step's arguments that do not change between passes of `rows` rows handing out the outputs of
        `aux_layers` (see its C++ for their order)."""
        weights, codes, biases, norms, caches = [], [], [], [], []
        for layer in self.layers:
            a = layer.self_attn
            for m in (a.qkv_proj, a.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
                self.add_product(rows, m, weights, codes)
            biases += [a.qkv_proj.bias, a.o_proj.bias]
            norms += [layer.input_layernorm, layer.post_attention_layernorm, *((a.q_norm, a.k_norm) if self.args.qk_norm else ())]
            caches += [a.k_cache, a.v_cache]
        self.add_product(rows, self.lm_head, weights, codes)
        norms.append(self.norm)
        dims = [self.args.num_heads, self.args.num_kv_heads, self.args.head_dim, int(self.args.qk_norm)]
        return self.embed_tokens.weight, self.cos, self.sin, weights, codes, biases, norms, caches, dims, list(aux_layers)


COMPILED = ("draft passes, and the target's where it has no native pass, compiled with torch.compile (inductor); "
            "prefills eager")


def compile_cache_dir() -> Path:
    """Where inductor keeps compiled graphs between runs: $TORCHINDUCTOR_CACHE_DIR when the user set it, else one
    folder per torch version under the user's cache (~/.cache/trtspec), so the C++ compilation of the decode passes
    is paid once per machine, not once per run, and survives a cleared /tmp."""
    import os

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # inductor writes its /tmp default into the variable the first time anything asks for its cache (importing
    # transformers' tokenizers does): that value is inductor's, not the user's
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env and os.path.abspath(env) != os.path.abspath(default_cache_dir()):
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "trtspec" / f"inductor-torch{torch.__version__}"


def compile_steps(models: list[Stepper], warm_up: Callable[[], object]) -> tuple[float, str]:
    """torch.compile the networks' few-token passes (inductor: each network's PASSES), then call `warm_up` to compile
    them.

    Decoding a small model on a CPU spends a good part of each step outside the weight products: per layer two
    norms, two ropes, attention, two cache writes, ~30 small ops. Inductor fuses them into a few C++ loops (the
    products stay the BLAS calls `choose_kernels` picked). Shapes stay dynamic (cache length, tokens per pass): a
    network compiles one graph for 1 token and one for several, on first use, so `warm_up` should run the
    generations that will be timed. Prefills stay eager. Outputs differ from eager ones in the last bits (fused sums
    in another order): greedy equality with HF is measured on the compiled runtime, by validate and the tests.

    Compiled graphs are cached in `compile_cache_dir()`. A run killed mid-compilation can leave a broken entry
    there; when compiling fails with trtspec's own cache folder, the folder is emptied and compiling tried once more.
    Returns (seconds spent, what happened): `COMPILED`, or why it fell back to eager (e.g. no C++ compiler).
    """
    import os
    import shutil

    t0 = time.perf_counter()
    cache = compile_cache_dir()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    ours = cache.parent.name == "trtspec"
    # a graph per run of row counts that share a product kernel (kernels.chosen_kernel), and more where a pass's
    # shapes differ: dynamo's default limit of 8 graphs a function would send the next one to eager silently
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * FEW_ROWS)
    for attempt in (1, 2):
        for m in models:
            m.compiled = {name: torch.compile(getattr(m, name), dynamic=True) for name in m.PASSES}
        try:
            warm_up()
            return round(time.perf_counter() - t0, 1), COMPILED
        except Exception as e:  # inductor's failures have no common base class; the eager runtime is always there
            for m in models:
                m.compiled = None
            torch._dynamo.reset()
            if attempt == 1 and ours and cache.is_dir():
                shutil.rmtree(cache, ignore_errors=True)
                continue
            first = (str(e).strip().splitlines() or [""])[0][:200]
            return round(time.perf_counter() - t0, 1), f"torch.compile failed ({type(e).__name__}: {first}); eager runtime"
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------- loading


def read_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ArtifactError(f"'{folder}' has no config.json", "is it a Hugging Face model folder?")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactError(f"'{path}' is not valid JSON ({e})") from None


def read_safetensors(folder: Path) -> dict[str, Tensor]:
    """All tensors of an HF folder (single file or sharded with an index)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ArtifactError(f"'{folder}' has no .safetensors weights", "re-run the stage that wrote it")
    state: dict[str, Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise ArtifactError(f"'{f}' is not a readable safetensors file ({e})") from None
    return state


def dequantize(state: dict[str, Tensor], dtype: torch.dtype) -> tuple[dict[str, Tensor], list[str]]:
    """Undo modelopt's weight quantization: W = W_q * weight_scale, pre_quant_scale folded into W's columns.

    Activation and KV-cache quantization are not simulated (input_scale/k_scale/v_scale are dropped).
    Returns the float state dict and notes on what was done.
    """
    out, notes = {}, set()
    for k, v in state.items():
        base = k.rsplit(".", 1)[0]
        if k.endswith((".input_scale", ".k_scale", ".v_scale", ".output_scale", ".weight_scale", ".pre_quant_scale", ".weight_scale_2")):
            notes.add(k.rsplit(".", 1)[1])
            continue
        if k.endswith(".weight") and f"{base}.weight_scale" in state:
            if v.dtype in (torch.uint8, torch.int32) or f"{base}.weight_scale_2" in state:
                raise ArtifactError(f"'{k}' is packed ({v.dtype}); the runtime dequantizes fp8/int8 weights only")
            scale = state[f"{base}.weight_scale"].float()
            w = v.float()
            if scale.dim() == 1 and scale.numel() == w.shape[0]:
                scale = scale[:, None]
            w = w * scale
            if f"{base}.pre_quant_scale" in state:  # y = W (x * s) = (W * s) x
                w = w * state[f"{base}.pre_quant_scale"].float()[None, :]
            v = w
        out[k] = v.to(dtype) if v.is_floating_point() else v
    return out, sorted(notes)


def _strip(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k.removeprefix(prefix): v for k, v in state.items()}


def fuse_projections(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """q/k/v -> one qkv_proj and gate/up -> one gate_up_proj per layer: 4 weight reads a layer instead of 7, which
    streams faster on a CPU (fewer, larger products per step)."""
    out = dict(state)
    for key in [k for k in state if k.endswith("self_attn.q_proj.weight")]:
        pre = key.removesuffix("q_proj.weight")
        for kind in ("weight", "bias"):
            if f"{pre}q_proj.{kind}" in state:
                out[f"{pre}qkv_proj.{kind}"] = torch.cat([out.pop(f"{pre}{n}_proj.{kind}") for n in "qkv"])
    for key in [k for k in state if k.endswith("mlp.gate_proj.weight")]:
        pre = key.removesuffix("gate_proj.weight")
        out[f"{pre}gate_up_proj.weight"] = torch.cat((out.pop(f"{pre}gate_proj.weight"), out.pop(f"{pre}up_proj.weight")))
    return out


def hf_to_runtime_keys(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """HF Llama (and EAGLE-3 draft) names -> this module's names (norm weights are plain parameters here,
    projections fused)."""
    out = {}
    for k, v in _strip(state, "model.").items():
        k = k.replace("input_layernorm.weight", "input_layernorm").replace("post_attention_layernorm.weight", "post_attention_layernorm")
        k = k.replace("self_attn.q_norm.weight", "self_attn.q_norm").replace("self_attn.k_norm.weight", "self_attn.k_norm")
        out[{"norm.weight": "norm", "layers.0.hidden_norm.weight": "hidden_norm"}.get(k, k)] = v  # the latter: EAGLE-3 drafts
    return fuse_projections(out)


def load_transformer(folder: Path, dtype: torch.dtype = torch.float32, aux_layers=(), device: str = "cpu",
                     settings: RuntimeSettings = DEFAULT_SETTINGS) -> tuple[Transformer, list[str]]:
    """Load an HF folder of a family the native runtime serves (trtspec.targets: runtime "native") into the runtime
    model, run as `settings` say. Returns (model, dequantization notes)."""
    from trtspec.targets import FAMILIES, read_family

    cfg = read_config(folder)
    if read_family(folder).runtime != "native":
        native = ", ".join(f.name for f in FAMILIES if f.runtime == "native")
        raise ModelError(f"'{folder}': model_type '{cfg.get('model_type')}' is not served by the native runtime",
                         f"native: {native}; other families run through runtime.hf_target.load_hf_target")
    args = ModelArgs.from_hf(cfg)
    bad = [i for i in aux_layers if not 0 <= i < args.num_layers]
    if bad:
        raise ArtifactError(f"aux hidden state layers {bad} do not exist in a {args.num_layers}-layer target")
    state, notes = dequantize(read_safetensors(folder), dtype)
    state = hf_to_runtime_keys(state)
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    with torch.device("meta"):
        model = Transformer(args, aux_layers)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise ArtifactError(f"weights in '{folder}' do not fit its config.json: {str(e)[:300]}") from None
    model = model.to(device).eval().requires_grad_(False)
    model.settings = settings
    model.kernel_choice = choose_kernels(model, settings=settings)
    model.kernel_choice["native_pass"] = model.use_native_pass()
    return model, notes
