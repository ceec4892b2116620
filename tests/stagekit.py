"""Test models and upstream stage folders built directly on them (no data/convert/train run), for stage-level tests."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from trtspec.artifacts import RunDir, write_json
from trtspec.config import config_from_dict
from trtspec.models import load_tokenizer, resolve_model
from trtspec.pipeline.stage import StageContext

CONVERSATIONS = [
    ("Name three colors.", "Red, green and blue are three colors."),
    ("What is 12 plus 30?", "12 plus 30 is 42."),
    ("Write a haiku about rain.", "Soft rain on the roof, a quiet song in the night, puddles hold the sky."),
    ("Explain what a CPU does.", "A CPU runs the instructions of programs: it fetches, decodes and executes them."),
    ("Say hello to a friend.", "Hello, my friend! It is good to see you again."),
    ("List two fruits.", "Apples and bananas."),
]


# A ChatML template that shows tools and tool calls the way Hermes-style templates do (written for these tests)
TOOL_TEMPLATE = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call these functions:
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role != 'system' %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def load_script(name: str):
    """scripts/NAME.py imported as a module (its main() and helpers), for the tests of the project's scripts."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_config(model_dir: Path, base_dir: Path, **sections: Any):
    raw = {"model": {"source": str(model_dir)},
           "data": {"sources": [{"kind": "jsonl", "path": "unused.jsonl"}], "max_new_tokens": 16}}
    raw.update(sections)
    return config_from_dict(raw, base_dir=base_dir)


def make_data(run: Path, model_dir: Path, seq_len: int = 64) -> Path:
    """run/data with train/heldout jsonl + token tensors, as the data stage writes them (plus a done manifest)."""
    import torch

    from trtspec.chat import tokenize_rows
    from trtspec.models import load_tokenizer

    RunDir(run).ensure()
    tok = load_tokenizer(model_dir)
    rows = [
        {"id": str(i), "category": "chat", "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for i, (q, a) in enumerate(CONVERSATIONS)
    ]
    data = run / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, split in (("train", rows[:4]), ("heldout", rows[4:])):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in split))
        torch.save(tokenize_rows(split, tok, seq_len)[0], data / f"{name}_tokens.pt")
    write_json(data / "manifest.json", {"stage": "data", "kind": "trtspec/data", "status": "done"})
    return data


def make_train(run: Path, model_dir: Path, draft_vocab: int = 256, seed: int = 0) -> Path:
    """run/train with eagle_config.json + head.safetensors: a tiny head with random (not initial) weights and a d2t."""
    import torch
    from transformers import AutoConfig

    from trtspec.config import ConvertSection
    from trtspec.eagle import head as eagle
    from trtspec.eagle.head import derive_eagle_config
    from trtspec.models import load_model

    RunDir(run).ensure()
    cfg = derive_eagle_config(
        AutoConfig.from_pretrained(model_dir), ConvertSection(aux_layers=[0, 1, 2], draft_vocab_size=draft_vocab)
    )
    model = eagle.build_eagle_model(load_model(model_dir, "float32", "cpu"), cfg)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.eagle_module.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    eagle.set_draft_vocab(model, torch.arange(draft_vocab) * 7)
    train = run / "train"
    train.mkdir(parents=True, exist_ok=True)
    (train / "eagle_config.json").write_text(json.dumps(cfg, indent=2))
    eagle.save_head(model, train / eagle.HEAD_FILE)
    return train


class BareCtx(SimpleNamespace):
    """The StageContext fields a stage reads, without a run directory (cfg, out, work, inputs, manifests, stage)."""

    model_path = StageContext.model_path
    model_stamp = StageContext.model_stamp

    def log(self, msg: str) -> None:
        pass


def stage_ctx(cfg: Any, run: Path, stage: str, inputs: dict[str, Path]) -> StageContext:
    """A StageContext whose out/ is a fresh folder (the pipeline's staging is not exercised here)."""
    rd = RunDir(run)
    rd.ensure()
    out = run / f".tmp-{stage}"
    out.mkdir(parents=True, exist_ok=True)
    work = run / ".work" / stage
    work.mkdir(parents=True, exist_ok=True)
    return StageContext(cfg, rd, stage, out, work, dict(inputs), {})


def tiny_llama(path: Path, vocab_from: Path | None = None, layers: int = 4, hidden: int = 64, seed: int = 0) -> Path:
    """A tiny random Llama saved as an HF folder, with a real tokenizer (the demo's) — for fast tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer(vocab_from or resolve_model("demo:smollm2-135m-instruct"))
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        architectures=["LlamaForCausalLM"],
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def rerandomized(src: Path, dst: Path, seed: int) -> Path:
    """A copy of the tiny model whose layers are re-drawn at unit gain: its greedy text wanders instead of
    repeating the last token (a tied-embedding random model mostly echoes), so equality checks mean something."""
    import torch
    from transformers import AutoModelForCausalLM

    from trtspec.models import load_tokenizer

    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "layers" in name and p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    m.save_pretrained(dst)
    load_tokenizer(src).save_pretrained(dst)
    return dst


def export_random_eagle(target_dir: Path, out: Path, keep_rope: bool = True, **convert):
    """A random EAGLE-3 head (draft vocab 512 with d2t) on `target_dir`, exported by modelopt into `out`.

    Returns the modelopt model (for pseudo_speculative_generate). keep_rope: export the trained rope instead of
    modelopt's default yarn override, so the export and modelopt's own forward agree exactly. convert: more
    ConvertSection fields."""
    import torch
    from transformers import AutoModelForCausalLM

    from trtspec.config import ConvertSection
    from trtspec.eagle.export import export_draft
    from trtspec.eagle.head import build_eagle_model, derive_eagle_config

    base = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    cfg = derive_eagle_config(base.config, ConvertSection(draft_vocab_size=512, **convert))
    if keep_rope:
        cfg["eagle_export_rope_scaling"] = {}
    torch.manual_seed(0)
    model = build_eagle_model(base, cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.eagle_module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)  # a head that proposes varied tokens
        d2t = torch.randperm(5000, generator=g)[:512].sort().values
        model.eagle_module.d2t.copy_(d2t - torch.arange(512))
    export_draft(model, out, torch.float32)
    return model


def export_random_dflash(target_dir: Path, out: Path, block_size: int = 8, **section):
    """A random DFlash drafter (2 layers reading target layers 0 and 2) on `target_dir`, exported by Model Optimizer's
    exporter (DFlashExporter, DSparkExporter for projector="dspark") into `out`. Returns the modelopt model (for
    pseudo_speculative_generate). A DSpark head's weights are drawn larger, so that its bias moves the guesses."""
    import torch
    from transformers import AutoModelForCausalLM

    from trtspec.config import DFlashSection
    from trtspec.dflash.head import build_dflash_model, derive_dflash_config

    base = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    sec = DFlashSection(block_size=block_size, num_layers=2, target_layers=[0, 2], **section)
    torch.manual_seed(0)
    model = build_dflash_model(base, derive_dflash_config(base.config, sec, mask_token_id=16)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.dflash_module.named_parameters():  # a draft that proposes varied tokens
            p.add_(torch.randn(p.shape, generator=g) * (0.3 if name.startswith(MARKOV_HEAD) else 0.05))
    model.get_exporter().export(out)
    return model


MARKOV_HEAD = ("markov_w1", "markov_w2", "gate_proj", "joint_proj")  # DSpark's head in modelopt's DSparkModule


def export_random_dflash2(target_dir: Path, out: Path, block_size: int = 8, **own):
    """A random DFlash2 drafter (DFlash's 2 layers on target layers 0 and 2, convolutions and a rank-8 selector over
    the top 4) on `target_dir`, its weights drawn away from the identity convolutions and the zero-mean selector, saved
    as the train stage leaves it and exported by the family's export into `out`. Returns the trained-side model."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from trtspec.config import DFlash2Section, DFlashSection
    from trtspec.dflash.head import derive_dflash_config, save_head
    from trtspec.dflash2 import head
    from trtspec.dflash2.export import export_dflash2_draft

    base = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    sec = DFlashSection(block_size=block_size, num_layers=2, target_layers=[0, 2])
    settings = head.settings(DFlash2Section(**{"selector_rank": 8, "selector_top_k": 4, "conv_group_size": 8, **own}))
    cfg = {**derive_dflash_config(base.config, sec, mask_token_id=16), head.KEY: settings}
    torch.manual_seed(0)
    model = head.build_dflash2_model(base, cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.dflash_module.named_parameters():  # a draft whose every part moves its guesses
            p.add_(torch.randn(p.shape, generator=g) * (1.0 if "codebook" in name else 0.2 if "conv" in name else 0.05))
    train = out.parent / "train"
    train.mkdir(parents=True, exist_ok=True)
    (train / "dflash2_config.json").write_text(json.dumps(cfg))
    save_head(model, train / "head.safetensors")
    fresh = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    export_dflash2_draft(fresh, train, out, torch.float32, target_dir)
    return model


def small_lm(seed: int, sharpness: float):
    """A random 8-token runtime LM whose next-token distributions are sharp enough to tell samplers apart."""
    import torch

    from trtspec.runtime.model import ModelArgs, Transformer

    torch.manual_seed(seed)
    m = Transformer(ModelArgs(vocab_size=8, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64))
    with torch.no_grad():
        m.lm_head.weight.mul_(sharpness)
    return m.eval()


def chi2_of_first_two(target, drafter, prompt: list[int], first: int, n: int = 1500) -> tuple[float, int]:
    """Chi-square of the first two tokens speculative sampling (temperature 1, k = 2) emits after `first` against
    the 8-token target's exact joint distribution -> (chi2, bins). Lossless sampling stays below
    bins + 4 sqrt(2 bins) (4 sd of chi-square), a wrong acceptance rule goes far above."""
    import torch

    from trtspec.runtime.decode import prefill, speculative_decode
    from trtspec.runtime.drafters import DraftSpec

    def next_probs(ids: list[int]) -> torch.Tensor:
        target.setup_cache(16)
        with torch.inference_mode():
            return torch.softmax(prefill(target, torch.tensor(ids))[0], -1)

    p1 = next_probs(prompt + [first])
    exact = torch.stack([p1[a] * next_probs(prompt + [first, a]) for a in range(8)])  # [8, 8]
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(8, 8)
    for _ in range(n):
        out = speculative_decode(target, drafter, torch.tensor(prompt), 3, DraftSpec(k=2), temperature=1.0, generator=g,
                                 first_token=first).tokens
        counts[out[1], out[2]] += 1
    expected = exact.flatten() * n
    big = expected >= 5  # bins with too few expected samples are pooled into one
    obs = torch.cat((counts.flatten()[big], counts.flatten()[~big].sum()[None]))
    exp = torch.cat((expected[big], expected[~big].sum()[None]))
    return float(((obs - exp) ** 2 / exp.clamp(min=1e-9)).sum()), int(big.sum())


def first_draft(target, drafter, ids, base_tok: int, k: int) -> list[int]:
    """The runtime's first draft after prefilling `ids` (the target's own next token must be `base_tok`, as in
    Model Optimizer's pseudo_speculative_generate): what the tests hold against modelopt's draft tokens."""
    import torch

    from trtspec.runtime.decode import prefill
    from trtspec.runtime.drafters import DraftSpec

    target.setup_cache(64)
    drafter.setup(64)
    with torch.inference_mode():
        logits, aux = prefill(target, ids)
        assert int(logits.argmax()) == base_tok
        drafter.start(ids, base_tok, aux)
        tree, _ = drafter.draft(base_tok, DraftSpec(k=k))
    return tree.tokens[1:]
