"""The EAGLE-3 draft as exported in bundle/draft (LlamaForCausalLMEagle3), with TensorRT-LLM's semantics.

Draft position t reads the token *after* t and a hidden state of position t:

    h_t    = fc(cat(aux_t))            for positions the target has verified (aux = target layer outputs)
           = out_{t-1}                  for positions the draft itself proposed (its own pre-norm output)
EAGLE-3.1 (config fc_norm, norm_output, as vLLM reads them): fc(cat(norm_i(aux_i))), and norm(out_{t-1}).
    x      = cat(input_layernorm(embed(token_{t+1})), hidden_norm(h_t))     -> layer 0's q/k/v
    out_t  = layer0(x) with residual h_t  (then any further plain layers)
    logits = lm_head(norm(out_t))  predicts token_{t+2};  target id = i + d2t[i] when the vocab is compressed

Positions are those of the hidden state (t), as in modelopt's pseudo_speculative_generate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from trtspec.eagle import ARCHITECTURES
from trtspec.errors import ArtifactError
from trtspec.runtime.drafters import DraftSpec, ModelDrafter, softmax_t
from trtspec.runtime.kernels import Linear, choose_kernels, store_bf16
from trtspec.runtime.model import (
    Block,
    ModelArgs,
    Stepper,
    hf_to_runtime_keys,
    read_config,
    read_safetensors,
    rms_norm,
)
from trtspec.runtime.settings import DEFAULT as DEFAULT_SETTINGS
from trtspec.runtime.settings import RuntimeSettings
from trtspec.runtime.tree import Tree, tree_levels


@dataclass
class Eagle3Info:
    aux_layers: tuple[int, ...]
    draft_vocab_size: int
    vocab_size: int
    hidden_size: int


class Eagle3Draft(Stepper):
    PASSES = ("forward", "chain", "dynamic_tree", "static_tree")

    def __init__(self, args: ModelArgs, num_aux: int, draft_vocab: int, has_norm: bool, fc_norm: bool = False,
                 norm_output: bool = False):
        super().__init__()
        H = args.hidden_size
        self.args = args
        self.fc = Linear(num_aux * H, H, bias=False)
        self.fc_norm = nn.Parameter(torch.ones(num_aux, H)) if fc_norm else None  # EAGLE-3.1: a norm per aux state
        self.norm_output = norm_output  # EAGLE-3.1: the next step's hidden input is the post-norm output
        self.layers = nn.ModuleList(Block(args, attn_in=2 * H if i == 0 else None) for i in range(args.num_layers))
        self.hidden_norm = nn.Parameter(torch.ones(H))
        self.norm = nn.Parameter(torch.ones(H)) if has_norm else None
        self.lm_head = Linear(H, draft_vocab, bias=False)
        self.register_buffer("draft_to_target", torch.arange(draft_vocab), persistent=False)
        self.embed_tokens: nn.Embedding | None = None  # the target's, set by the runtime's loader (the chain pass embeds)

    def forward(self, embeds: Tensor, h: Tensor, positions: Tensor, slots: Tensor, length: int, mask) -> tuple[Tensor, Tensor]:
        """One draft pass over the KV cache: embeds/h [T, H] -> (draft-vocab logits [T, Vd], pre-norm output [T, H])."""
        logits, out = self.draft_step(embeds[None], h[None], self.cos[positions], self.sin[positions], slots, length, mask)
        return logits[0], out[0]

    def project(self, aux: Tensor) -> Tensor:
        """The verified positions' hidden input h = fc(cat(aux)) [T, H]; EAGLE-3.1 norms each aux state first."""
        if self.fc_norm is not None:
            n, H = self.fc_norm.shape
            aux = (torch.nn.functional.rms_norm(aux.unflatten(-1, (n, H)), (H,), None, self.args.norm_eps) * self.fc_norm).flatten(-2)
        return self.fc(aux)

    def catch_up(self, tokens: Tensor, aux: Tensor, length: int) -> tuple[Tensor, Tensor]:
        """The m newest verified positions (tokens [m]: the token after each; aux [m, A]: the target's states there)
        join the cache at rows length .. length + m - 1 -> (the last row's logits [1, Vd], pre-norm output [1, H])."""
        m = tokens.shape[0]
        rows = torch.arange(length, length + m)
        mask = None if m == 1 else torch.arange(length + m)[None, :] <= rows[:, None]
        logits, hidden = self.forward(self.embed_tokens(tokens), self.project(aux), rows, rows, length + m, mask)
        return logits[-1:], hidden[-1:]

    def chain(self, tokens: Tensor, aux: Tensor, length: int, k: int, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        """A whole chain draft in one pass (one compiled call per speculative step): the m newest verified
        positions (tokens [m]: the token after each; aux [m, A]: the target's states there) join the cache at rows
        length .. length + m - 1, then each guess is fed back for the next, k guesses in all, each written one row
        further (rows the caller forgets). The j-th guess is argmax(logits_j + noise_j): greedy without noise, a
        sample of softmax(logits_j / T) with noise = T x Gumbel noise [k, Vd] (the Gumbel-max trick).
        -> (guesses in the draft vocab [k], their logits [k, Vd])."""
        m = tokens.shape[0]
        logits, hidden = self.catch_up(tokens, aux, length)
        guesses, all_logits = [], []
        for j in range(k):
            guess = (logits if noise is None else logits + noise[j]).argmax(-1)
            guesses.append(guess)
            all_logits.append(logits)
            if j + 1 < k:  # the guess sits at position length + m + j, in the row of that number
                row = torch.full((1,), length + m + j)
                logits, hidden = self.forward(self.embed_tokens(self.draft_to_target[guess]), hidden, row, row,
                                              length + m + j + 1, None)
        return torch.cat(guesses), torch.cat(all_logits)

    def expand(self, ids: Tensor, hidden: Tensor, ancestors: Tensor, first: int, used: int, depth: int) -> tuple[Tensor, Tensor, Tensor]:
        """Run n tree nodes of one depth in one pass: ids [n] (draft vocab), their parents' outputs [n, H], the
        draft rows of their ancestors [n, used - first] (rows first .. used - 1 hold the nodes run so far; the root's
        query is the last verified row, first - 1). Each node takes the next row from `used` on, at position
        first - 1 + depth, attending to the verified rows, its ancestors' rows and its own.
        -> (logits of its children [n, Vd], its output [n, H], its ancestors' rows and its own [n, used + n - first])."""
        n = ids.shape[0]
        own = torch.eye(n, dtype=torch.bool)
        mask = torch.cat((torch.ones(n, first, dtype=torch.bool), ancestors, own), dim=1)
        rows = used + torch.arange(n)
        logits, out = self.forward(self.embed_tokens(self.draft_to_target[ids]), hidden, torch.full((n,), first - 1 + depth),
                                   rows, used + n, mask)
        return logits, out, torch.cat((ancestors, own), dim=1)

    def dynamic_tree(self, tokens: Tensor, aux: Tensor, length: int, depth: int, topk: int) -> tuple[Tensor, Tensor, Tensor]:
        """EAGLE-2's dynamic tree in one pass (one compiled call per speculative step): the pending verified rows
        join the cache as in `chain` (L = length + m rows after them), then `depth` levels of candidates:

            level 1:  the root's top-k guesses, score = log q(guess | root)
            level d:  each of the k best-scored nodes of level d - 1 (the frontier) is run (`expand`); its top-k
                      children score parent score + log q(child | path)

        A child never outscores its parent, so any best-scored set of nodes is closed under ancestors (the caller
        keeps the best `total`). Rows past L are forgotten by the caller.
        -> (tokens in the draft vocab, parent node, score) of the topk + (depth - 1) topk^2 candidates, as tables
        [N] whose entry i is node i + 1 (node 0 is the root)."""
        first = length + tokens.shape[0]
        logits, hidden = self.catch_up(tokens, aux, length)
        top = torch.log_softmax(logits[0], -1).topk(topk)
        ids, parents, scores = [top.indices], [torch.zeros(topk, dtype=torch.long)], [top.values]
        front, front_ids, front_scores = torch.arange(1, topk + 1), top.indices, top.values
        front_hidden, ancestors = hidden.expand(topk, -1), torch.zeros(topk, 0, dtype=torch.bool)
        for d in range(1, depth):
            logits, out, rows = self.expand(front_ids, front_hidden, ancestors, first, first + (d - 1) * topk, d)
            top = torch.log_softmax(logits, -1).topk(topk)  # [k frontier nodes, k children]
            child_scores = (top.values + front_scores[:, None]).flatten()
            nodes = 1 + sum(x.numel() for x in ids) + torch.arange(topk * topk)
            ids.append(top.indices.flatten())
            parents.append(front[:, None].expand(topk, topk).flatten())
            scores.append(child_scores)
            best = child_scores.topk(topk).indices
            front, front_ids, front_scores = nodes[best], ids[-1][best], child_scores[best]
            front_hidden, ancestors = out[best // topk], rows[best // topk]
        return torch.cat(ids), torch.cat(parents), torch.cat(scores)

    def static_tree(self, tokens: Tensor, aux: Tensor, length: int, levels: tuple[tuple[tuple[int, int], ...], ...]) -> Tensor:
        """A fixed tree in one pass (one compiled call per speculative step): the pending verified rows join the
        cache as in `chain`, then level by level the nodes with children are run (`expand`) and each child takes
        its parent's guess of its rank. `levels[d - 1]` lists the nodes of depth d as (parent: its index among the
        nodes of depth d - 1, 0 for the root; rank: 0 = the parent's top guess), `tree_levels` makes them from rank
        paths. -> the nodes' tokens in the draft vocab, level by level [N]."""
        first = used = length + tokens.shape[0]
        logits, out = self.catch_up(tokens, aux, length)  # the root's: its children's logits, its output
        run, rows, all_ids = [0], torch.zeros(1, 0, dtype=torch.bool), []  # run: the nodes above with children
        for d, level in enumerate(levels, start=1):
            parent, ranks = torch.tensor([run.index(p) for p, _ in level]), torch.tensor([r for _, r in level])
            ids = logits.topk(1 + max(r for _, r in level)).indices[parent, ranks]
            out, rows = out[parent], rows[parent]
            all_ids.append(ids)
            if d < len(levels):  # run the nodes of depth d with children, in their order
                run = sorted({p for p, _ in levels[d]})
                at = torch.tensor(run)
                logits, out, rows = self.expand(ids[at], out[at], rows[at], first, used, d)
                used += len(run)
        return torch.cat(all_ids)

    def draft_step(self, embeds: Tensor, h: Tensor, cos: Tensor, sin: Tensor, slots: Tensor | None, length: int,
                   mask) -> tuple[Tensor, Tensor]:
        """The draft step itself (the only implementation: the runtime's passes and the ONNX graph run it):
        embeds/h [B, T, H] -> (logits [B, T, Vd], the output the next step reads [B, T, H]: before the final norm,
        after it with norm_output); `slots` None = no KV cache."""
        first = self.layers[0]
        eps = self.args.norm_eps
        x = torch.cat((rms_norm(embeds, first.input_layernorm, eps), rms_norm(h, self.hidden_norm, eps)), dim=-1)
        out = first(h, cos, sin, slots, length, mask, attn_input=x)
        for layer in self.layers[1:]:
            out = layer(out, cos, sin, slots, length, mask)
        normed = rms_norm(out, self.norm, eps) if self.norm is not None else out
        return self.lm_head(normed), normed if self.norm_output else out


def load_eagle3(folder: Path, target_lm_head: Tensor | None, target_hidden: int | None,
                dtype: torch.dtype = torch.float32) -> tuple[Eagle3Draft, Eagle3Info]:
    """Load bundle/draft; the target's lm_head is used when the draft has none (TensorRT-LLM's rule). Without a
    target (None, None) the draft must bring its own lm_head."""
    folder = Path(folder)
    cfg = read_config(folder)
    archs = cfg.get("architectures") or []
    if not set(ARCHITECTURES) & set(archs) and "draft_vocab_size" not in cfg:
        raise ArtifactError(f"'{folder}' is not an EAGLE-3 draft (architectures {archs})", "expected LlamaForCausalLMEagle3")
    aux = tuple((cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or ())
    if not aux:
        raise ArtifactError(f"'{folder}/config.json' has no eagle_config.eagle_aux_hidden_state_layer_ids")
    args = ModelArgs.from_hf({**cfg, "architectures": ["LlamaForCausalLM"]})
    vocab, dvocab = cfg["vocab_size"], cfg.get("draft_vocab_size") or cfg["vocab_size"]
    if target_hidden is not None and args.hidden_size != target_hidden:
        raise ArtifactError(f"the draft's hidden size {args.hidden_size} does not match the target's {target_hidden}",
                            "the draft was trained for another model")
    if target_lm_head is not None and vocab != target_lm_head.shape[0]:
        raise ArtifactError(f"the draft's vocab size {vocab} does not match the target's {target_lm_head.shape[0]}",
                            "the draft was trained for another model")
    state = hf_to_runtime_keys({k: v.to(dtype) if v.is_floating_point() else v for k, v in read_safetensors(folder).items()})
    d2t = state.pop("d2t", None)
    state.pop("t2d", None)  # the inverse map, for converters that want it: d2t says the same
    if "lm_head.weight" not in state:
        if dvocab != vocab or target_lm_head is None:
            raise ArtifactError(f"'{folder}' has no lm_head.weight" + (f" for its compressed vocab ({dvocab})" if dvocab != vocab else ""))
        state["lm_head.weight"] = target_lm_head
    if d2t is None and dvocab != vocab:
        raise ArtifactError(f"'{folder}' has a compressed vocab ({dvocab}) but no d2t table")
    fc = state.get("fc.weight")
    if fc is None or fc.shape != (args.hidden_size, len(aux) * args.hidden_size):
        raise ArtifactError(f"'{folder}': fc.weight should be [{args.hidden_size}, {len(aux) * args.hidden_size}]"
                            f" for {len(aux)} aux layers, got {None if fc is None else list(fc.shape)}")
    fc_norm = bool(cfg.get("fc_norm"))
    if fc_norm:  # EAGLE-3.1: fc_norm.{i}.weight, one per aux state, as one [n, H] table
        try:
            state["fc_norm"] = torch.stack([state.pop(f"fc_norm.{i}.weight") for i in range(len(aux))])
        except KeyError as e:
            raise ArtifactError(f"'{folder}' says fc_norm but has no {e.args[0]}") from None
    with torch.device("meta"):
        model = Eagle3Draft(args, len(aux), dvocab, has_norm="norm" in state, fc_norm=fc_norm,
                            norm_output=bool(cfg.get("norm_output")))
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise ArtifactError(f"weights in '{folder}' do not fit its config.json: {str(e)[:300]}") from None
    model.draft_to_target = torch.arange(dvocab) + (d2t.long() if d2t is not None else 0)
    info = Eagle3Info(aux, dvocab, vocab, args.hidden_size)
    return model.eval().requires_grad_(False), info


class Eagle3Drafter(ModelDrafter):
    """EAGLE-3: verified positions wait (pending) until the next draft; a draft then runs as one pass of the network:
    the pending rows and every guess (Eagle3Draft.chain), or every level of a tree (.dynamic_tree, .static_tree)."""

    name = "eagle3"
    one_pass_trees = True  # trees drafted by the network's one-pass tree passes (False: one draft call per depth)

    def __init__(self, draft, embed: torch.nn.Embedding, vocab_size: int):
        d2t = draft.draft_to_target
        identity = d2t.numel() == vocab_size and bool((d2t == torch.arange(vocab_size)).all())
        super().__init__(None if identity else d2t, vocab_size)
        self.net, self.embed = draft, embed
        self.pending: tuple[Tensor, Tensor] | None = None  # (tokens, aux) of verified positions not in the cache yet

    def setup(self, max_len: int) -> None:
        if self.net.max_len < max_len:
            self.net.setup_cache(max_len)

    def _verified_hidden(self, aux: Tensor | None) -> Tensor:
        return self.net.project(aux)

    def _forward(self, tokens, hidden, positions, slots, length, mask):
        return self.net.step(self.embed(tokens), hidden, positions, slots, length, mask)

    def _forward_eager(self, tokens, hidden, positions, slots, length, mask):
        return self.net.forward(self.embed(tokens), hidden, positions, slots, length, mask)

    def start(self, prompt: Tensor, first: int, aux: Tensor | None) -> None:
        # draft position t reads (token t+1, aux_t): the prompt shifted left by one, then the first target token;
        # all but the last position go in now (a prefill), the last waits for the first draft
        self.length = 0
        tokens = torch.cat((prompt[1:], torch.tensor([first])))
        if tokens.numel() > 1:
            self._catch_up(tokens[:-1], aux[:-1])
        self.pending = (tokens[-1:].clone(), aux[-1:].clone())  # a copy: a view's offset would be part of the compiled guard

    def accepted(self, tokens: Tensor, aux: Tensor | None) -> None:
        # a step drafted by another drafter (a suffix match) leaves the rows waiting longer
        if self.pending is not None:
            tokens, aux = torch.cat((self.pending[0], tokens)), torch.cat((self.pending[1], aux))
        self.pending = (tokens, aux)

    def draft(self, root: int, spec: DraftSpec, temperature: float = 0.0, generator=None) -> tuple[Tree, Tensor | None]:
        if spec.shape != "chain" and (temperature > 0 or not self.one_pass_trees):
            self._catch_up(*self.pending)
            self.pending = None
            return super().draft(root, spec, temperature, generator)
        tokens, aux = self.pending
        if (excess := tokens.numel() - spec.max_nodes()) > 0:
            # rows left waiting by several suffix-drafted steps in a row: the oldest join the cache in one eager
            # pass, so the compiled pass meets only the row counts 1..max_nodes that warm_up_row_counts compiled
            self._catch_up(tokens[:excess], aux[:excess], forward=self._forward_eager)
            tokens, aux = tokens[excess:].clone(), aux[excess:].clone()
        if spec.shape == "dynamic_tree":
            return self._dynamic_tree(root, tokens, aux, spec), None
        if spec.shape == "tree":
            return self._static_tree(root, tokens, aux, spec), None
        noise = None
        if temperature > 0:  # Gumbel-max: argmax(logits + T g), g = -log(-log u), is a sample of softmax(logits / T)
            u = torch.rand(spec.k, self.net.lm_head.weight.shape[0], generator=generator)
            noise = -temperature * torch.log(-torch.log(u))
        guesses, logits = self._draft_pass("chain", tokens, aux, spec.k, noise)
        tree = Tree.root(root)
        for j, t in enumerate(self.to_target(guesses).tolist()):
            tree.add(t, j)
        return tree, self.full_probs(softmax_t(logits, temperature)) if temperature > 0 else None

    def _draft_pass(self, name: str, tokens: Tensor, aux: Tensor, *args):
        """The network's one-pass draft `name` (Eagle3Draft.chain, .dynamic_tree, .static_tree) after the pending
        rows (tokens, aux), which join the cache; the rows it drafts are forgotten."""
        out = self.net.run_pass(name, tokens, aux, self.length, *args)
        self.length += tokens.numel()
        self.pending = None
        return out

    def _dynamic_tree(self, root: int, tokens: Tensor, aux: Tensor, spec: DraftSpec) -> Tree:
        """Eagle3Draft.dynamic_tree's candidates, the best `spec.total` kept (draft_dynamic_tree's tree, in one pass)."""
        ids, parents, scores = self._draft_pass("dynamic_tree", tokens, aux, spec.k, spec.topk)
        tree = Tree.root(root)
        for t, p, s in zip(self.to_target(ids).tolist(), parents.tolist(), scores.tolist(), strict=True):
            tree.add(t, p, s)
        return tree.best(spec.total)

    def _static_tree(self, root: int, tokens: Tensor, aux: Tensor, spec: DraftSpec) -> Tree:
        """Eagle3Draft.static_tree's nodes as a Tree (draft_static_tree's tree, in one pass)."""
        levels = tree_levels(spec.tree_choices())
        ids = self.to_target(self._draft_pass("static_tree", tokens, aux, levels)).tolist()
        tree, above = Tree.root(root), 0  # the node ids of the level above start at `above`
        for level in levels:
            start = len(tree)
            for parent, _ in level:
                tree.add(ids[len(tree) - 1], above + parent)
            above = start
        return tree


def load_eagle3_drafter(draft_dir: Path, target, dtype=torch.float32, weights: str = "auto",
                        settings: RuntimeSettings | None = None) -> Eagle3Drafter:
    """The exported EAGLE-3 draft, sharing the target's embedding (and lm_head when the draft has none); its
    products in bfloat16 where `kernels.store_bf16` finds that faster (`weights`); run as `settings` say (default:
    as the target runs)."""
    net, info = load_eagle3(draft_dir, target.lm_head.weight, target.args.hidden_size, dtype)
    net.settings = settings or getattr(target, "settings", DEFAULT_SETTINGS)
    net.kernel_choice = choose_kernels(net, settings=net.settings)
    net.kernel_choice["draft_weights"] = store_bf16(net, choice=weights)
    net.embed_tokens = target.embed_tokens
    if tuple(target.aux_layers) != info.aux_layers:
        bad = [i for i in info.aux_layers if i >= target.args.num_layers]
        if bad:
            raise ArtifactError(f"the draft reads target layers {bad}, the target has {target.args.num_layers}")
        target.aux_layers = info.aux_layers
    return Eagle3Drafter(net, target.embed_tokens, target.args.vocab_size)
