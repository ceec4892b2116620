"""The EAGLE-3 head through modelopt: attach it to a base model, fix its first layer to TensorRT-LLM's semantics,
draft from every position at once for evaluation, save and load its weights. Every touch of modelopt's private
parts lives here (written against nvidia-modelopt 0.47, the range pyproject.toml pins).

EAGLE-3 draft step (TensorRT-LLM / vLLM semantics, which the exported checkpoint is served with):

    h      = fc(cat(aux_1, aux_2, aux_3))            # pre-final-norm outputs of 3 target layers, [T, 3H] -> [T, H]
    x      = cat(input_layernorm(embed(tok)), hidden_norm(h))   # [T, 2H] into layer 0's q/k/v projections
    out    = h + attn(x); out = out + mlp(post_attention_layernorm(out))
    logits = lm_head(norm(out));  draft token = argmax + d2t[argmax]   (d2t only with a compressed vocab)

Later draft steps feed the layer's own pre-norm output `out` back in as `h`.
modelopt 0.47 runs layer 0's input_layernorm on h *and then* hidden_norm (double norm); `patch_first_layer_norm`
makes training match the formula above.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

from trtspec.errors import ArtifactError, ConfigError

HEAD_FILE = "head.safetensors"
CONFIG_FILE = "eagle_config.json"  # the mtsp.convert config, in convert/ and train/


def derive_eagle_config(base: Any, convert: Any) -> dict:
    """The mtsp.convert config for `base` (an HF config): modelopt's EAGLE-3 defaults, sized like the base.

    `convert` is the ConvertSection: aux_layers, draft_vocab_size, num_layers, then `overrides` applied last.
    """
    from modelopt.torch.speculative.config import EAGLE3_DEFAULT_CFG

    from trtspec.targets import default_aux_layers, draft_dims, family_of, text_config

    text = text_config(base)
    family_of(base)  # one line for a model no family declares
    layers = text.num_hidden_layers
    # ascending, as modelopt's hooks and TensorRT-LLM's capture set concatenate them (offline states follow the list)
    aux = sorted(convert.aux_layers) if convert.aux_layers is not None else default_aux_layers(layers)
    bad = [i for i in aux if not 0 <= i < layers - 1]  # hidden_states[L] is post-norm: not an aux layer
    if bad or len(set(aux)) != len(aux):
        raise ConfigError(f"convert.aux_layers {aux}: need distinct layer ids in 0..{layers - 2}")
    dims = draft_dims(base)
    vocab = dims["vocab_size"]
    draft_vocab = convert.draft_vocab_size or vocab
    if draft_vocab > vocab:
        raise ConfigError(f"convert.draft_vocab_size {draft_vocab} is larger than the target vocab ({vocab})")
    rope = dims.pop("rope_parameters")

    cfg = copy.deepcopy(EAGLE3_DEFAULT_CFG["config"])
    arch = cfg["eagle_architecture_config"]
    arch.update(
        **dims,
        draft_vocab_size=draft_vocab,
        hidden_act="silu",  # the draft is a Llama layer whatever the target's activation (engines load it as one)
        rope_scaling=rope,
        rope_theta=rope["rope_theta"],
        num_hidden_layers=convert.num_layers,
        eagle_aux_hidden_state_layer_ids=aux,
        fc_norm=convert.fc_norm,  # EAGLE-3.1 (add_eagle31 puts them in place; modelopt 0.47 knows neither)
        norm_output=convert.norm_output,
        use_aux_hidden_state=True,
        use_last_layernorm=True,
        torch_dtype="float32",
    )
    # modelopt builds the head's config with the base model's config class: a sliding-window family's defaults
    # (GPT-OSS: sliding layers of 128) would make the head's training cache a sliding one. The head attends to all.
    if getattr(text, "layer_types", None) is not None:
        arch["layer_types"] = ["full_attention"] * convert.num_layers
    if getattr(text, "sliding_window", None) is not None:
        arch["sliding_window"] = None if window_may_be_none(type(text)) else dims["max_position_embeddings"]
    if hasattr(text, "per_layer_config"):  # Gemma 4's per-layer shapes (and its class's default ones): one layer, one shape
        arch["per_layer_config"] = {}
    if convert.init_from_target and getattr(text, "attention_bias", text.model_type == "qwen2"):
        arch["attention_bias"] = True  # the copied layer's q/k/v biases need a place (o_proj's stays zero for Qwen2)
    for key, value in convert.overrides.items():
        if key not in arch and key not in ("attention_bias", "mlp_bias"):
            raise ConfigError(
                f"convert.overrides.{key} is not an eagle_architecture_config field",
                f"known: {', '.join(sorted(arch))}",
            )
        check_override(key, value, arch.get(key))
        arch[key] = value
    # modelopt 0.47 writes a yarn rope (factor 32) into the exported draft config whenever training used the
    # default rope; the draft would then be served with a rope it was never trained with. Export what we train.
    cfg.update(eagle_decoder_type="llama", eagle_offline=False, eagle_use_torch_compile=False, eagle_export_rope_scaling={})
    return cfg


def window_may_be_none(config_class: type) -> bool:
    """Whether the config class takes sliding_window None (no window); Gemma 4's wants a number: a window as long
    as any sequence attends to all the same."""
    field = getattr(config_class, "__dataclass_fields__", {}).get("sliding_window")
    return field is None or "None" in str(field.type)


def check_override(key: str, value: Any, default: Any) -> None:
    """An override has its field's type, and a size or count is a finite positive number: Model Optimizer would
    build a head from anything (a negative width fails deep inside torch)."""
    def refuse(what: str) -> None:
        raise ConfigError(f"convert.overrides.{key}: {value!r} is not {what}")

    if isinstance(default, bool) or key in ("attention_bias", "mlp_bias"):
        if not isinstance(value, bool):
            refuse("true or false")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
            refuse("a whole number in 1..1048576")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            refuse("a finite number >= 0")
    elif isinstance(default, str) and not isinstance(value, str):
        refuse("a string")


# eagle_architecture_config fields that init_from_target needs equal to the target's (it copies a target layer)
LAYER_SHAPE = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")


def pick_draft_vocab(counts: Any, size: int, always: list[int]) -> Any:
    """The `size` most frequent target ids (ties by id), `always` included; sorted ascending, as d2t needs."""
    import torch

    score = counts.double().clone()
    score[torch.as_tensor(always, dtype=torch.long)] = float("inf")
    top = torch.topk(score, size, sorted=False).indices
    return torch.sort(top).values


def build_eagle_model(base_model: Any, eagle_cfg: dict) -> Any:
    """mtsp.convert(base, [("eagle", cfg)]) with torch.compile off, then the first-layer norm patched.

    The base model is converted in place (modelopt's way) and returned; its parameters stay frozen.
    """
    import modelopt.torch.speculative as mtsp

    cfg = copy.deepcopy(eagle_cfg)
    cfg["eagle_use_torch_compile"] = False  # max-autotune spends minutes on a CPU for nothing
    model = mtsp.convert(base_model, [("eagle", cfg)])
    add_eagle31(model, cfg["eagle_architecture_config"])
    init_rope(model.eagle_module)
    patch_first_layer_norm(model.eagle_module)
    accept_draft_vocab_logits(model)
    cache_ttt_masks_per_length(model)
    return model


def add_eagle31(model: Any, arch: dict) -> None:
    """EAGLE-3.1's two changes to the head, as vLLM's llama_eagle3 runs them:

        fc_norm:      h = fc(cat(norm_1(aux_1), ..., norm_n(aux_n)))   one RMSNorm per auxiliary hidden state
        norm_output:  a draft step's next input is norm(out), not out  (training-time-test steps included)

    The norms are parameters of the head (eagle_module.fc_norm.{i}.weight, saved and exported with it), applied by a
    hook on fc so that every caller of fc (training, modelopt's pseudo-generation) gets them."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    eagle = model.eagle_module
    if arch.get("fc_norm"):
        hidden, n = eagle.fc.weight.shape[0], eagle.fc.weight.shape[1] // eagle.fc.weight.shape[0]
        eps = arch.get("rms_norm_eps", 1e-6)
        eagle.fc_norm = torch.nn.ModuleList(LlamaRMSNorm(hidden, eps=eps) for _ in range(n)).to(eagle.fc.weight)

        def norm_chunks(_fc: Any, args: tuple) -> tuple:
            chunks = args[0].chunk(len(eagle.fc_norm), dim=-1)
            return (torch.cat([norm(c) for norm, c in zip(eagle.fc_norm, chunks, strict=True)], dim=-1), *args[1:])

        eagle.fc.register_forward_pre_hook(norm_chunks)
    if arch.get("norm_output"):
        inner = model._eagle_forward

        def post_norm_output(*args: Any, **kwargs: Any) -> tuple:
            post, _pre, logits, cache = inner(*args, **kwargs)
            return post, post, logits, cache

        model._eagle_forward = post_norm_output


def cache_ttt_masks_per_length(model: Any) -> None:
    """modelopt 0.47 caches each TTT step's attention mask for the first sequence length it sees (its recipes pad
    every batch to one length); trtspec's batches are cut to their longest row, so key the cache by length too."""
    masks: dict[tuple[int, int], Any] = {}

    def get_mask(batch_size: int, seq_length: int, ttt_step: int) -> Any:
        key = (seq_length, ttt_step)
        if key not in masks:
            masks[key] = model._compute_ttt_attention_mask(batch_size, seq_length, ttt_step)
        return masks[key]

    model._get_ttt_attention_mask = get_mask


def accept_draft_vocab_logits(model: Any) -> None:
    """Let callers pass target logits already restricted to the draft vocab (offline training computes only
    those 8k columns, not 49k); full-vocab logits are still gathered through d2t as modelopt does."""
    gather = model._map_logits_to_draft_vocab

    def to_draft_vocab(logits: Any) -> Any:
        return logits if logits.shape[-1] == model.eagle_config.draft_vocab_size else gather(logits)

    model._map_logits_to_draft_vocab = to_draft_vocab


def init_rope(eagle_module: Any) -> None:
    """Create the head's rotary embedding up front: modelopt 0.47 passes `device=`, which transformers 5 refuses.

    modelopt builds the head's config with the base model's config class; for families with a rope per layer type
    (Gemma 3, ...) that class nests the rope per type again: the head is one Llama layer with the full-attention rope
    (trtspec.targets.rope_parameters), as engines load it."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from trtspec.targets import rope_parameters

    config = eagle_module.config
    if isinstance((getattr(config, "rope_parameters", None) or {}).get("full_attention"), dict):
        config.rope_parameters = rope_parameters(config)
    if not hasattr(eagle_module, "rotary_emb"):
        device = next(eagle_module.parameters()).device
        eagle_module.rotary_emb = LlamaRotaryEmbedding(config=eagle_module.config).to(device)


def eagle3_first_layer_input(layer: Any, embeds: Any, h: Any) -> Any:
    """The attention input of the draft's first layer: cat(input_layernorm(embeds), hidden_norm(h))."""
    import torch

    return torch.cat((layer.input_layernorm(embeds), layer.hidden_norm(h)), dim=-1)


def _stash_h(layer: Any, args: tuple, kwargs: dict) -> None:
    # the decoder layer is about to norm h with input_layernorm: keep the raw h for the attention hook
    layer._eagle3_h = args[0] if args else kwargs["hidden_states"]


def _attention_input(eagle_module: Any, attn: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    layer = eagle_module.layers[0]
    embeds, h = eagle_module._input_embeds, layer._eagle3_h
    if embeds is None or h is None:
        raise RuntimeError("EAGLE-3 first layer called outside EagleModule.forward")
    eagle_module._input_embeds, layer._eagle3_h = None, None
    kwargs["hidden_states"] = eagle3_first_layer_input(layer, embeds, h)
    return args, kwargs


def patch_first_layer_norm(eagle_module: Any) -> None:
    """Replace modelopt's first-attention pre-hook: h gets hidden_norm only (not input_layernorm too).

    The residual of layer 0 stays the raw h, as in TensorRT-LLM. Idempotent.
    """
    import functools

    if getattr(eagle_module, "_trtspec_norm_patched", False):
        return
    if not hasattr(eagle_module, "fc"):
        return  # not an EAGLE-3 (aux hidden state) head: nothing to patch
    layer = eagle_module.layers[0]
    attn = layer.self_attn
    for hid, hook in list(attn._forward_pre_hooks.items()):
        if getattr(hook, "__name__", "") == "_eagle3_attention_forward_pre_hook":
            del attn._forward_pre_hooks[hid]
            attn._forward_pre_hooks_with_kwargs.pop(hid, None)
    layer._eagle3_h = None
    layer.register_forward_pre_hook(_stash_h, with_kwargs=True)
    attn.register_forward_pre_hook(functools.partial(_attention_input, eagle_module), with_kwargs=True)
    eagle_module._trtspec_norm_patched = True


def head_state_dict(model: Any) -> dict:
    """The head's weights (and d2t), keys relative to eagle_module, detached and contiguous."""
    return {k: v.detach().contiguous().clone() for k, v in model.eagle_module.state_dict().items()}


def save_head(model: Any, path: str | Path) -> Path:
    """Write the head's weights (fc, layers.0.*, norm, lm_head, d2t) to a safetensors file."""
    from trtspec.artifacts import write_tensors

    return write_tensors(Path(path), head_state_dict(model))


def load_head(model: Any, path: str | Path) -> Any:
    """Load head weights saved by save_head into a model built by build_eagle_model (same eagle_config)."""
    from trtspec.artifacts import read_tensors

    path = Path(path)
    state = read_tensors(path, "EAGLE head weights")
    own = model.eagle_module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        raise ArtifactError(
            f"'{path}' does not fit this head: missing {missing[:3]}, unexpected {unexpected[:3]}, wrong shape {wrong[:3]}",
            "the head was built with another eagle_config; re-run convert and train",
        )
    from trtspec.training.sharding import is_sharded, load_full_state

    if is_sharded(model.eagle_module):  # FSDP (train.sharding): every rank reads the file and keeps its shard
        load_full_state(model.eagle_module, state)
    else:
        model.eagle_module.load_state_dict(state)
    return model


def set_draft_vocab(model: Any, draft_to_target: Any) -> None:
    """Store d2t (d2t[i] = target_id - i) for a draft vocab whose i-th token is target token draft_to_target[i]."""
    import torch

    ids = torch.as_tensor(draft_to_target, dtype=torch.long)
    d2t = model.eagle_module.d2t
    if ids.shape != d2t.shape:
        raise ValueError(f"draft vocab has {ids.numel()} ids, the head expects {d2t.numel()}")
    d2t.copy_(ids - torch.arange(ids.numel()))


def init_head_from_target(model: Any) -> tuple[int, list[str]]:
    """Start the head from the target's own weights instead of random ones.

    With a = the deepest aux layer, fc starts as passing aux layer a's state through ([0 | ... | I]) and head
    layer i starts as a copy of target layer a + 1 + i: the layer that reads that state inside the target. Layer 0
    reads cat(norm(embed(tok)), norm(h)): the h half of q/k/v is the target's, the token half keeps its random
    init, so before training the head computes target layer a + 1 on aux layer a's state, nudged by the token.
    norm and lm_head are the target's final norm and its lm_head (the draft vocab's rows, through d2t). Biases the
    head has and the target lacks start at zero. Returns (the target layer copied, the parameters of the copied
    layers the head has no place for, e.g. Qwen3's q/k norms: then the head starts close to the layer, not equal).
    """
    import torch

    from trtspec.errors import ConfigError

    head, target = model.eagle_module, model._base_model
    aux = model.eagle_config.eagle_aux_hidden_state_layer_ids
    hidden = head.fc.weight.shape[0]
    first = aux[-1] + 1  # aux layers are ascending and below the last layer (derive_eagle_config)
    pairs = []  # (head parameter, target weight or None for zero)
    dropped: set[str] = set()
    for i, layer in enumerate(head.layers):
        src = target.layers[min(first + i, len(target.layers) - 1)]
        used = set()
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "post_attention_layernorm"):
            w, b = layer.get_submodule(name).weight, getattr(layer.get_submodule(name), "bias", None)
            token_half = i == 0 and name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
            pairs.append((w[:, hidden:] if token_half else w, src.get_submodule(name).weight))
            src_b = getattr(src.get_submodule(name), "bias", None)
            if b is not None:
                pairs.append((b, src_b))
            used.update({f"{name}.weight", f"{name}.bias"} if b is not None else {f"{name}.weight"})
        norm = layer.hidden_norm if i == 0 else layer.input_layernorm
        pairs.append((norm.weight, src.input_layernorm.weight))
        used.add("input_layernorm.weight")
        dropped |= {n for n, _ in src.named_parameters()} - used
    pairs.append((head.norm.weight, model._base_model_norm.weight))
    if hasattr(head, "lm_head"):
        rows = draft_to_target_ids(model, torch.arange(head.lm_head.weight.shape[0], device=head.lm_head.weight.device))
        pairs.append((head.lm_head.weight, model._base_model_lm_head.weight[rows]))
    if bad := [tuple(w.shape) for w, src in pairs if src is not None and w.shape != src.shape]:
        raise ConfigError(f"convert.init_from_target: the head's layers are not shaped like the target's ({bad[0]})",
                          "drop the convert.overrides that resize the head, or set init_from_target: false")
    with torch.no_grad():
        for w, src in pairs:
            w.zero_() if src is None else w.copy_(src)
        head.fc.weight.zero_()
        head.fc.weight[:, (len(aux) - 1) * hidden :] = torch.eye(hidden)  # aux states are concatenated in order
    return first, sorted(dropped)


def draft_to_target_ids(model: Any, draft_ids: Any) -> Any:
    """Target token ids for draft-vocab ids (identity without a compressed vocab)."""
    d2t = getattr(model.eagle_module, "d2t", None)
    return draft_ids if d2t is None else draft_ids + d2t[draft_ids]


def rows_at(keep: Any, x: Any, fn: Any) -> Any:
    """fn applied to the rows of x where `keep` [B, T] is true, zeros elsewhere: [B, T, out]."""
    vals = fn(x[keep])
    return vals.new_zeros(*keep.shape, vals.shape[-1]).index_put((keep,), vals)


def draft_target_logits(model: Any, last: Any, keep: Any = None) -> Any:
    """The target's logits restricted to the draft vocab (all of it without one): lm_head rows d2t maps to.
    keep [B, T]: only at these positions, zeros elsewhere (where the loss does not look).

    Computing 8k logits instead of 49k is most of what makes offline steps cheap; softmax over the draft
    vocab is what modelopt would take after its own gather."""
    weight = model._base_model_lm_head.weight
    d2t = getattr(model.eagle_module, "d2t", None)
    if d2t is not None:
        import torch

        weight = weight[torch.arange(len(d2t), device=d2t.device) + d2t]
    logits = lambda h: h.to(weight.dtype) @ weight.T  # noqa: E731
    return logits(last) if keep is None else rows_at(keep, last, logits)


def chain_drafts(model: Any, input_ids: Any, aux: Any, last: Any, k: int) -> Any:
    """Greedy chain drafts of length k from every position at once (teacher-forced, modelopt's TTT masks).

    drafts[b, j, s] is the s-th draft token (target ids) of the chain that starts after position j+1, i.e.
    the guess for token j+2+s given tokens 0..j+1 and target states 0..j. The chain uses the true tokens as
    its inputs, which equal the drafts exactly while the drafts are being accepted — so acceptance computed
    from it is exact for greedy decoding."""
    import torch
    from modelopt.torch.speculative.plugins.modeling_eagle import EagleBaseModelOutput
    from transformers import DynamicCache

    b, t = input_ids.shape
    with torch.no_grad():
        dtype = model.eagle_module.fc.weight.dtype
        logits = draft_target_logits(model, last)
        base = EagleBaseModelOutput(out_hiddens=last.to(dtype), aux_hiddens=aux.to(dtype), logits=logits)
        cache = DynamicCache(config=model.eagle_module.config)
        embeds, hiddens, mask0, pos, _, _ = model._prepare_eagle_inputs(input_ids, None, None, cache, base)
        out = torch.zeros(b, t, k, dtype=torch.long, device=input_ids.device)
        for s in range(k):
            mask = mask0 if s == 0 else model._compute_ttt_attention_mask(b, t, s)
            _, hidden, step_logits, cache = model._eagle_forward(hiddens, embeds, mask, pos, cache)
            hiddens = hidden.roll(1, 1)
            # step s at position j+s continues the chain that started at j
            tok = draft_to_target_ids(model, step_logits.argmax(-1))
            out[:, : t - s, s] = tok[:, s:]
    return out
