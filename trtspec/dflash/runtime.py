"""The DFlash block draft as exported in bundle/draft (DFlashDraftModel, Model Optimizer's export; vLLM's
qwen3_dflash and TensorRT-LLM's DFlashForCausalLM load the same files), drafting a whole block in one pass.

    ctx_t  = hidden_norm(fc(cat(target layer outputs at t)))     for every verified position t (cached as k/v)
    block  = embed([root, mask x k])                             at positions L..L+k (L verified positions)
    layer: q = q_norm(q_proj(norm(x))); k, v = cat(k_norm(k_proj(ctx)), k_norm(k_proj(norm(x)))), v likewise;
           every block query sees every ctx row and the whole block; x += o_proj(attn); x += mlp(norm(x))
    logits = target lm_head(norm(x[1:k+1]))                       # guesses for tokens L+1..L+k

Only the context rows live in the KV cache (one row per verified token, each layer's k/v of ctx_t); the block's
own keys and values are recomputed each step and forgotten, as the block is.

A chain of k < block_size - 1 guesses runs a block of k + 1 rows, not the trained block_size, because every engine
does: vLLM 0.32 (`v1/spec_decode/dflash.py`: num_query_per_req = 1 + num_speculative_tokens), SGLang (DFLASH's
block is --speculative-num-draft-tokens, a different trained block_size only warned about) and TensorRT-LLM
(`_torch/speculative/dflash.py` `_draft_block_width`: max_draft_len + 1). The block's rows attend to each other, so
the shorter block guesses differently; drafting as the engines do keeps the runtime's acceptance theirs.

A DSpark draft (dflash_config.projector_type "dspark", Model Optimizer's DSparkExporter) runs the same pass and
runs its whole block (the engines serve a DSpark draft only at k = block_size) and reads rows 0..k-1 (row j guesses
token L+j+1, up to block_size guesses), then its Markov head, one row after another:

    g_j = argmax(logits_j + markov_w2(W1[g_{j-1}]))              # g_-1 = root; gated/rnn heads also read row j
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trtspec.dflash.dspark import MARKOV_KEYS, NESTED_MARKOV
from trtspec.errors import ArtifactError, ModelError
from trtspec.runtime.drafters import DraftSpec, softmax_t
from trtspec.runtime.model import (
    MLP,
    Linear,
    ModelArgs,
    Stepper,
    apply_rope,
    fuse_projections,
    read_config,
    read_safetensors,
    rms_norm,
    rope_tables,
)
from trtspec.runtime.settings import DEFAULT as DEFAULT_SETTINGS
from trtspec.runtime.settings import RuntimeSettings
from trtspec.runtime.tree import Tree


@dataclass
class DFlashInfo:
    target_layers: tuple[int, ...]
    block_size: int
    mask_token_id: int
    causal: bool
    projector: str = "dflash"  # or "dspark": rows 0..block_size-1 guess, with a Markov head

    @property
    def guesses(self) -> int:
        return self.block_size if self.projector == "dspark" else self.block_size - 1


class DFlashLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        hd = args.head_dim
        self.qkv_proj = Linear(args.hidden_size, (args.num_heads + 2 * args.num_kv_heads) * hd, bias=args.attention_bias)
        self.o_proj = Linear(args.num_heads * hd, args.hidden_size, bias=args.attention_bias)
        self.q_norm = nn.Parameter(torch.ones(hd))
        self.k_norm = nn.Parameter(torch.ones(hd))
        self.mlp = MLP(args)
        self.input_layernorm = nn.Parameter(torch.ones(args.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.ones(args.hidden_size))
        self.args = args
        self.k_cache: Tensor | None = None
        self.v_cache: Tensor | None = None

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [T, in] -> q [H, T, D], k/v [KV, T, D], normed and rotated."""
        a = self.args
        q, k, v = self.qkv_proj(x).view(x.shape[0], -1, a.head_dim).transpose(0, 1).split(
            (a.num_heads, a.num_kv_heads, a.num_kv_heads), dim=0)
        q, k = rms_norm(q, self.q_norm, a.norm_eps), rms_norm(k, self.k_norm, a.norm_eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def add_context(self, ctx: Tensor, cos: Tensor, sin: Tensor, slots: Tensor) -> None:
        """Write the keys/values of verified positions (ctx [T, H], not normed: modelopt's KV injection)."""
        _, k, v = self.qkv(ctx, cos, sin)
        self.k_cache.index_copy_(1, slots, k)
        self.v_cache.index_copy_(1, slots, v)

    def attend(self, h: Tensor, cos: Tensor, sin: Tensor, length: int, mask: Tensor | None) -> Tensor:
        """The block's normed rows h [B, H] attend to `length` cached context rows and to the whole block."""
        q, k, v = self.qkv(h, cos, sin)
        k = torch.cat((self.k_cache[:, :length], k), dim=1)
        v = torch.cat((self.v_cache[:, :length], v), dim=1)
        y = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, enable_gqa=True)[0]
        return self.o_proj(y.transpose(0, 1).reshape(h.shape[0], -1))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, length: int, mask: Tensor | None) -> Tensor:
        """x [B, H] (the block) attends to `length` cached context rows and to the whole block."""
        x = x + self.attend(rms_norm(x, self.input_layernorm, self.args.norm_eps), cos, sin, length, mask)
        return x + self.mlp(rms_norm(x, self.post_attention_layernorm, self.args.norm_eps))


class DFlashDraft(Stepper):
    def __init__(self, args: ModelArgs, num_target_layers: int, causal: bool, first_row: int = 1,
                 layer: Callable[[ModelArgs], DFlashLayer] = DFlashLayer):
        super().__init__()
        self.first_row = first_row  # the block row guessing token L+1: 1 (DFlash), 0 (DSpark)
        H = args.hidden_size
        self.args = args
        self.fc = Linear(num_target_layers * H, H, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(H))
        self.layers = nn.ModuleList(layer(args) for _ in range(args.num_layers))
        self.norm = nn.Parameter(torch.ones(H))
        self.causal = causal
        self.lm_head: Linear | None = None  # set by the loader: the target's weight, or its bfloat16 copy (store_bf16)

    def setup_cache(self, max_len: int) -> None:
        p = self.activation_like()
        for layer in self.layers:
            shape = (self.args.num_kv_heads, max_len, self.args.head_dim)
            layer.k_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)
            layer.v_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)
        cos, sin = rope_tables(self.args, max_len)
        self.cos, self.sin = cos.to(p), sin.to(p)
        self.max_len = max_len

    def forward(self, aux: Tensor, length: int, embeds: Tensor, k: int, mode: str | None = None) -> tuple[Tensor, Tensor]:
        """One draft pass: the m newest verified positions' target states aux [m, n*H] join the context (rows
        length - m .. length - 1), then the block embeds [B, H] at positions length .. length + B - 1 runs
        -> (logits [k, V], normed states [k, H]) of the k block rows guessing tokens length + 1 .. length + k.
        `mode` "prefill" marks the first call of a generation (eager)."""
        B = embeds.shape[0]
        self.add_context(aux, length)
        block = torch.arange(length, length + B)
        mask = None
        if self.causal:  # a block row sees the context and the block rows up to itself
            mask = torch.ones(B, length + B, dtype=torch.bool).tril(length)
        x = embeds
        for layer in self.layers:
            x = layer(x, self.cos[block], self.sin[block], length, mask)
        rows = rms_norm(x[self.first_row : self.first_row + k], self.norm, self.args.norm_eps)
        return self.lm_head(rows), rows

    def add_context(self, aux: Tensor, length: int) -> None:
        """The m verified positions' target states aux [m, n*H] into every layer's cache, rows length - m .. length - 1
        (each layer's keys and values depend only on ctx, so the layers' order does not matter)."""
        slots = torch.arange(length - aux.shape[0], length)
        ctx = rms_norm(self.fc(aux), self.hidden_norm, self.args.norm_eps)
        for layer in self.layers:
            layer.add_context(ctx, self.cos[slots], self.sin[slots], slots)


class MarkovHead(nn.Module):
    """DSpark's Markov head (Model Optimizer's DSparkModule, same weight names): a logit bias for a block row from the
    token before it, markov_w2(W1[prev]); gated: W1[prev] gated by the row's state; rnn: a GRU-like state s carried
    along the block, the bias read from the state before the row."""

    def __init__(self, vocab: int, rank: int, hidden: int, kind: str):
        super().__init__()
        self.kind = kind
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = Linear(rank, vocab, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def forward(self, prev: Tensor, row: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """prev [1] (the token before the row), row [1, H] -> (bias [1, V], the state the next row starts from)."""
        e = self.markov_w1(prev)
        if self.kind == "vanilla":
            return self.markov_w2(e), state
        if self.kind == "gated":
            return self.markov_w2(torch.sigmoid(self.gate_proj(torch.cat((row, e), -1))) * e), state
        state = torch.zeros_like(e) if state is None else state
        gate, candidate, out = self.joint_proj(torch.cat((state, e, row), -1)).chunk(3, -1)
        gate = torch.sigmoid(gate)
        return self.markov_w2(torch.tanh(out)), gate * state + (1 - gate) * torch.tanh(candidate)


class DFlashDrafter:
    """Drafts the chain root -> k tokens from one pass of the block [root, mask, ...]. Its cache holds one row per
    verified token; `accepted` hands it the target's states of the newly verified positions, which the next
    draft pass adds to the context before running the block (one compiled call per step). With a DSpark `markov`
    head, the guesses are then made one row after another (markov_chain)."""

    name = "dflash"

    def __init__(self, net: DFlashDraft, embed: nn.Embedding, info: DFlashInfo, markov: MarkovHead | None = None):
        self.net, self.embed, self.info, self.markov = net, embed, info, markov
        self.length = 0  # verified positions whose states the draft has, or is about to get (pending)
        self.pending: Tensor | None = None
        self.first = True

    def setup(self, max_len: int) -> None:
        # the target reserves max_len rows for its k + 1 verified ones; the block runs at positions length ..
        # length + block rows - 1 (a DSpark block is block_size rows whatever k), up to block_size rows further
        need = max_len + self.info.block_size
        if self.net.max_len < need:
            self.net.setup_cache(need)

    def start(self, prompt: Tensor, first: int, aux: Tensor | None) -> None:
        self.pending, self.length, self.first = aux, prompt.numel(), True

    def accepted(self, tokens: Tensor, aux: Tensor | None) -> None:
        # aux rows: the root and the accepted drafts, now verified; tokens[-1] is the next root. Rows wait for the
        # next draft pass (a step drafted by another drafter, e.g. a suffix match, leaves them waiting longer)
        self.pending = aux if self.pending is None else torch.cat((self.pending, aux))
        self.length += aux.shape[0]

    def passes_per_step(self, spec: DraftSpec) -> int:
        """One pass drafts the whole block (the target's lm_head, part of the network, over its k rows)."""
        return 1

    def draft(self, root: int, spec: DraftSpec, temperature: float = 0.0, generator=None) -> tuple[Tree, Tensor | None]:
        if spec.shape != "chain":
            raise ModelError("a DFlash block drafts a chain", "use draft.shape: chain")
        k = min(spec.k, self.info.guesses)
        width = self.info.block_size if self.info.projector == "dspark" else k + 1  # as the engines run it (above)
        block = torch.full((width,), self.info.mask_token_id)
        block[0] = root
        mode = "prefill" if self.first else None
        pending = self.pending
        if not self.first and (excess := pending.shape[0] - spec.max_nodes()) > 0:
            # rows left waiting by several suffix-drafted steps in a row: the oldest join the cache eagerly, so the
            # compiled pass meets only the row counts 1..max_nodes that warm_up_row_counts compiled
            self.net.add_context(pending[:excess], self.length - pending.shape[0] + excess)
            pending = pending[excess:].clone()
        logits, rows = self.net.step(pending, self.length, self.embed(block), k, mode)
        self.first, self.pending = False, None
        ids, q = self.guesses(root, logits, rows, temperature, generator)
        tree = Tree.root(root)
        for j, t in enumerate(ids):
            tree.add(t, j)
        return tree, q

    def guesses(self, root: int, logits: Tensor, rows: Tensor, temperature: float, generator=None) -> tuple[list[int], Tensor | None]:
        """The chain's tokens from the block rows' logits [k, V] and normed states [k, H] (and, sampled, each guess's
        q [k, V]): each row's own choice, or DSpark's Markov chain."""
        if self.markov is None:
            return choose(logits, temperature, generator)
        return self.markov_chain(root, logits, rows, temperature, generator)

    def markov_chain(self, root: int, logits: Tensor, rows: Tensor, temperature: float, generator=None) -> tuple[list[int], Tensor | None]:
        """DSpark's guesses, one row after another: row j's logits plus the Markov bias from guess j - 1 (the root's
        for j = 0). Sampled, guess j comes from its own q_j given the guesses before it, as any chain draft's."""
        prev, state, ids, qs = torch.tensor([root]), None, [], []
        for j in range(logits.shape[0]):
            bias, state = self.markov(prev, rows[j : j + 1], state)
            guess, q = choose(logits[j : j + 1] + bias, temperature, generator)
            ids += guess
            qs.append(q)
            prev = torch.tensor(guess)
        return ids, torch.cat(qs) if temperature > 0 else None


def choose(logits: Tensor, temperature: float, generator=None) -> tuple[list[int], Tensor | None]:
    """Each row's guess: its argmax, or at temperature > 0 a draw from its own q (returned, [rows, V])."""
    if temperature <= 0:
        return logits.argmax(-1).tolist(), None
    # each guess drawn from its own q_j: accepting x_j with min(1, p_j(x_j) / q_j(x_j)) keeps the output distributed
    # as the target's (decode.py)
    q = softmax_t(logits, temperature)
    return torch.multinomial(q, 1, generator=generator)[:, 0].tolist(), q


# DSpark's optional confidence head predicts each guess's acceptance for a serving-side scheduler; every draft here
# is verified as a whole chain, so its weights are left unread
UNREAD_KEYS = ("confidence_proj.", "confidence_head.")


def load_dflash(folder: Path, target_hidden: int | None, target_layers: int | None,
                dtype: torch.dtype = torch.float32, architecture: str = "DFlashDraftModel",
                layer: Callable[[ModelArgs], DFlashLayer] = DFlashLayer,
                own: tuple[str, ...] = ()) -> tuple[DFlashDraft, DFlashInfo, MarkovHead | None, dict[str, Tensor]]:
    """(block network, its settings, DSpark's Markov head or None, the weights named `own`) from an exported DFlash
    or DSpark draft, or a draft of a family built on DFlash's block (its `architecture`, its `layer`, its own weights
    beside the block's, left for it to load)."""
    folder = Path(folder)
    cfg = read_config(folder)
    if architecture not in (cfg.get("architectures") or []):
        raise ArtifactError(f"'{folder}' is not a {architecture.removesuffix('DraftModel')} draft (architectures "
                            f"{cfg.get('architectures')})", f"expected {architecture}")
    dc = cfg.get("dflash_config") or {}
    layers = tuple(dc.get("target_layer_ids") or ())
    if not layers or "mask_token_id" not in dc or "block_size" not in cfg:
        raise ArtifactError(f"'{folder}/config.json' lacks block_size or dflash_config.target_layer_ids/mask_token_id")
    projector = dc.get("projector_type") or "dflash"
    if projector not in ("dflash", "dspark"):
        raise ArtifactError(f"'{folder}' is a {projector} draft (dflash_config.projector_type)",
                            "the runtime drafts with DFlash and DSpark drafts")
    args = ModelArgs.from_hf({**cfg, "architectures": ["Qwen3ForCausalLM"]})
    if target_hidden is not None and args.hidden_size != target_hidden:
        raise ArtifactError(f"the draft's hidden size {args.hidden_size} does not match the target's {target_hidden}",
                            "the draft was trained for another model")
    if target_layers is not None and (bad := [i for i in layers if not 0 <= i < target_layers]):
        raise ArtifactError(f"the draft reads target layers {bad}, the target has {target_layers}")
    state = {k.removeprefix(NESTED_MARKOV): v.to(dtype) for k, v in read_safetensors(folder).items()
             if not k.startswith(UNREAD_KEYS)}
    head = {k: state.pop(k) for k in [k for k in state if k.startswith(MARKOV_KEYS)]}
    extra = {k: state.pop(k) for k in [k for k in state if k.startswith(own)]} if own else {}
    state = {k.removesuffix(".weight") if k.endswith("norm.weight") else k: v for k, v in fuse_projections(state).items()}
    state = {k.replace("self_attn.", ""): v for k, v in state.items()}
    with torch.device("meta"):
        model = DFlashDraft(args, len(layers), bool(dc.get("causal", False)), first_row=0 if projector == "dspark" else 1,
                            layer=layer)
    load_weights(model, state, folder)
    info = DFlashInfo(layers, int(cfg["block_size"]), int(dc["mask_token_id"]), bool(dc.get("causal", False)), projector)
    markov = load_markov(head, dc, args, folder) if projector == "dspark" else None
    return model.eval().requires_grad_(False), info, markov, extra


def load_markov(state: dict[str, Tensor], dc: dict, args: ModelArgs, folder: Path) -> MarkovHead:
    """DSpark's Markov head from its weights and dflash_config's markov_rank and markov_head_type."""
    kind = dc.get("markov_head_type", "vanilla")
    if "markov_rank" not in dc or kind not in ("vanilla", "gated", "rnn"):
        raise ArtifactError(f"'{folder}/config.json': a DSpark draft needs dflash_config.markov_rank and a markov_head_type "
                            f"of vanilla, gated or rnn (got {dc.get('markov_rank')}, {kind!r})")
    with torch.device("meta"):
        head = MarkovHead(args.vocab_size, int(dc["markov_rank"]), args.hidden_size, kind)
    load_weights(head, state, folder)
    return head.eval().requires_grad_(False)


def load_weights(module: nn.Module, state: dict[str, Tensor], folder: Path) -> None:
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise ArtifactError(f"weights in '{folder}' do not fit its config.json: {str(e)[:300]}") from None


def load_dflash_drafter(draft_dir: Path, target, dtype=torch.float32, weights: str = "auto",
                        settings: RuntimeSettings | None = None) -> DFlashDrafter:
    """The exported DFlash (or DSpark) draft, sharing the target's embedding and lm_head (the draft's products,
    its use of the lm_head included, in bfloat16 where `kernels.store_bf16` finds that faster: `weights`); the
    target is set to hand out the states of the layers the draft reads. Run as `settings` say (default: as the
    target runs)."""
    net, info, markov, _ = load_dflash(draft_dir, target.args.hidden_size, target.args.num_layers, dtype)
    share_target(net, info, target, list(markov.modules()) if markov is not None else [], weights, settings)
    return DFlashDrafter(net, target.embed_tokens, info, markov)


def share_target(net: DFlashDraft, info: DFlashInfo, target, extra: list[nn.Module], weights: str = "auto",
                 settings: RuntimeSettings | None = None) -> None:
    """A loaded block draft joined to its target: the target's lm_head (in bfloat16 with the draft's products and
    those of `extra` where `kernels.store_bf16` finds that faster: `weights`), its settings, and the target set to
    hand out the states of the layers the draft reads."""
    from trtspec.runtime.kernels import Linear, choose_kernels, store_bf16

    if not 0 <= info.mask_token_id < target.args.vocab_size:
        raise ArtifactError(f"the draft's mask token {info.mask_token_id} is outside the target's vocabulary")
    net.settings = settings or getattr(target, "settings", DEFAULT_SETTINGS)
    net.kernel_choice = choose_kernels(net, settings=net.settings)
    with torch.device("meta"):
        lm_head = Linear(*reversed(target.lm_head.weight.shape), bias=False)
    # shared unless stored in bf16
    # (an HF-path target's lm_head is a plain nn.Linear: the default kernels, nothing packed)
    lm_head.weight = target.lm_head.weight
    lm_head.kernels, lm_head.packed = getattr(target.lm_head, "kernels", Linear.kernels), getattr(target.lm_head, "packed", None)
    products = [lm_head] + [m for m in extra if isinstance(m, Linear)]
    net.kernel_choice["draft_weights"] = store_bf16(net, products, weights)
    net.lm_head = lm_head
    target.aux_layers = info.target_layers
