"""The train stage: fine-tune the EAGLE-3 head with the base frozen (HF Trainer, modelopt's EAGLE-3 loss with
train-time-test steps), then measure acceptance on the held-out split.

offline mode: the target's aux-layer hidden states (and its last, post-norm hidden state) are computed once into
ctx.work (fp16 memmaps) and every epoch reads them; the target's decoder layers are dropped from memory.
online mode: the target runs on every step (what multi-GPU users with large data sets want).

Writes train/head.safetensors, train/eagle_config.json, train/train_log.jsonl (per optimizer step: loss,
per-TTT-step accuracy, lr) and acceptance metrics. Checkpoints (head + optimizer) live in ctx.work; a killed
run resumes from the last one.
"""

from __future__ import annotations

import gc
import json
import math
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trtspec.errors import ArtifactError, DataError
from trtspec.pipeline import StageContext

EVAL_MAX_DRAFT = 4  # acceptance measured for chain drafts of length 1..EVAL_MAX_DRAFT


# ---------------------------------------------------------------- target hidden states


def base_states(base: Any, input_ids: Any, attention_mask: Any, aux_layers: list[int], bf16: bool = False) -> tuple[Any, Any]:
    """(aux, last): concat of the aux layers' outputs (pre-final-norm) [B, T, len(aux)*H], final post-norm [B, T, H].
    bf16: the target's matmuls in bfloat16 (autocast), its weights untouched."""
    import torch

    with torch.no_grad(), torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        out = base.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    if hasattr(base, "_aux_hidden_states"):
        base._aux_hidden_states.clear()  # modelopt's own hooks also collected them
    # hidden_states[0] = embeddings, hidden_states[i + 1] = output of decoder layer i
    aux = torch.cat([out.hidden_states[i + 1] for i in aux_layers], dim=-1)
    return aux.float(), out.last_hidden_state.float()


def row_lengths(tokens: dict) -> list[int]:
    """Real (unpadded) length of each right-padded row."""
    return tokens["attention_mask"].sum(1).tolist()


def cache_states(base: Any, tokens: dict, aux_layers: list[int], folder: Path, batch_size: int, log: Any, bf16: bool = False) -> dict:
    """Target hidden states of every training row in fp16 memmaps under `folder`; resumes after a kill.
    Rows go through the target shortest first, each batch cut to its longest row: little compute on padding."""
    import numpy as np
    import torch
    from tqdm import tqdm

    n, t = tokens["input_ids"].shape
    h = base.config.hidden_size
    folder.mkdir(parents=True, exist_ok=True)
    shapes = {"aux": (n, t, h * len(aux_layers)), "last": (n, t, h)}
    progress = folder / "rows_done.json"
    saved = json.loads(progress.read_text()) if progress.is_file() else {}
    done = saved["rows"] if saved.get("order") == "by_length" else 0  # a cache filled in another order: start over
    mode = "r+" if done else "w+"
    maps = {k: np.lib.format.open_memmap(folder / f"{k}.npy", mode=mode, dtype=np.float16, shape=s) for k, s in shapes.items()}
    if done < n:
        log(f"caching target hidden states for {n} rows ({'resuming at ' + str(done) if done else 'once'}, {'bf16' if bf16 else 'fp32'} math)")
    lengths = row_lengths(tokens)
    order = sorted(range(n), key=lambda i: (lengths[i], i))
    device = next(base.parameters()).device
    bar = tqdm(total=n, initial=done, desc="target hidden states", unit="row", disable=done >= n)
    for i in range(done, n, batch_size):
        rows = order[i : i + batch_size]
        cut = max(1, max(lengths[r] for r in rows))
        ids = tokens["input_ids"][rows, :cut].to(device)
        aux, last = base_states(base, ids, tokens["attention_mask"][rows, :cut].to(device), aux_layers, bf16)
        for k, v in (("aux", aux), ("last", last)):
            maps[k][rows, :cut] = v.to(torch.float16).cpu().numpy()
            maps[k].flush()
        progress.write_text(json.dumps({"rows": i + len(rows), "order": "by_length"}))
        bar.update(len(rows))
    bar.close()
    return {k: np.load(folder / f"{k}.npy", mmap_mode="r") for k in shapes}


class HeadDataset:
    """Rows of the data stage's tensors (+ cached hidden states offline), each cut to its real length;
    `collate` pads a batch to its longest row. The loss mask is shifted to modelopt's convention:
    modelopt scores position t against the target's prediction *for t+1*, so loss_mask[t] = is_label[t+1]."""

    def __init__(self, tokens: dict, states: dict | None = None):
        import torch

        self.tokens = tokens
        self.states = states
        self.lengths = [max(1, n) for n in row_lengths(tokens)]
        lm = tokens["loss_mask"]
        self.loss_mask = torch.cat([lm[:, 1:], torch.zeros_like(lm[:, :1])], dim=1)

    def __len__(self) -> int:
        return len(self.tokens["input_ids"])

    def __getitem__(self, i: int) -> dict:
        import torch

        n = self.lengths[i]
        row = {
            "input_ids": self.tokens["input_ids"][i, :n],
            "attention_mask": self.tokens["attention_mask"][i, :n].long(),
            "loss_mask": self.loss_mask[i, :n].long(),
        }
        if self.states is not None:
            row["aux_hidden_states"] = torch.from_numpy(self.states["aux"][i, :n].copy())
            row["base_model_hidden_states"] = torch.from_numpy(self.states["last"][i, :n].copy())
        return row

    @staticmethod
    def collate(rows: list[dict]) -> dict:
        """Right-pad every field to the batch's longest row, rounded up to a multiple of 16 (few distinct shapes:
        few cached TTT masks); zeros are masked out by the attention and loss masks."""
        import torch

        n = -(-max(len(r["input_ids"]) for r in rows) // 16) * 16
        pad = lambda x: torch.nn.functional.pad(x, (0, 0) * (x.dim() - 1) + (0, n - len(x)))  # noqa: E731
        return {k: torch.stack([pad(r[k]) for r in rows]) for k in rows[0]}


class LengthGroupedEpochSampler:
    """Batches of similar length (transformers' length grouping: little padding), shuffled from seed + epoch,
    so a run resumed mid-epoch sees the same order as one that never stopped."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int):
        self.lengths, self.batch_size, self.seed, self.epoch = lengths, batch_size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        import torch
        from transformers.trainer_pt_utils import get_length_grouped_indices

        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=g))


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


@contextmanager
def draft_logits_where_scored(model: Any, loss_mask: Any):
    """Within: the head's lm_head computes logits only where modelopt's loss reads them, zeros elsewhere.

    modelopt's TTT step s scores the draft logits at position p against the target's prediction at p + 1,
    weighted by loss_mask[p + 1] (for p >= s). Zero logits elsewhere change neither the loss (their weight is 0)
    nor the gradients, and skip the lm_head's matmuls (a third of a step's FLOPs) on prompt tokens and padding,
    a quarter of the positions in the demo's batches. Only a head with its own lm_head (a draft vocab): the
    target's lm_head also makes the target's logits when training online."""
    lm_head = getattr(model.eagle_module, "lm_head", None)
    if lm_head is None:
        yield
        return
    import torch

    keep = torch.nn.functional.pad(loss_mask[:, 1:], (0, 1)).bool()
    full = lm_head.forward
    lm_head.forward = lambda h: rows_at(keep, h, full)
    try:
        yield
    finally:
        del lm_head.forward  # back to the class's own forward


def head_forward(model: Any, batch: dict, unwrapped: Any = None) -> Any:
    """One training forward of the head on a batch of HeadDataset.collate: modelopt's EAGLE-3 loss (TTT steps).
    Offline batches carry the target's cached states; the target's logits are computed here, where scored.
    `unwrapped`: the EAGLE model inside `model` when a DDP/FSDP wrapper runs the forward (multi-GPU)."""
    eagle_model = unwrapped or model
    batch = dict(batch)
    kwargs = {}
    if "aux_hidden_states" in batch:
        dtype = eagle_model.eagle_module.fc.weight.dtype
        last = batch.pop("base_model_hidden_states").to(dtype)
        kwargs["base_model_outputs"] = {
            "aux_hidden_states": batch.pop("aux_hidden_states").to(dtype),
            "base_model_hidden_states": last,
            "base_model_logits": draft_target_logits(eagle_model, last, batch["loss_mask"].bool()),
        }
    with draft_logits_where_scored(eagle_model, batch["loss_mask"]):
        return model(**batch, **kwargs)


# ---------------------------------------------------------------- acceptance


def chain_drafts(model: Any, input_ids: Any, aux: Any, last: Any, k: int) -> Any:
    """Greedy chain drafts of length k from every position at once (teacher-forced, modelopt's TTT masks).

    drafts[b, j, s] is the s-th draft token (target ids) of the chain that starts after position j+1, i.e.
    the guess for token j+2+s given tokens 0..j+1 and target states 0..j. The chain uses the true tokens as
    its inputs, which equal the drafts exactly while the drafts are being accepted — so acceptance computed
    from it is exact for greedy decoding."""
    import torch
    from modelopt.torch.speculative.plugins.modeling_eagle import EagleBaseModelOutput
    from transformers import DynamicCache

    from trtspec.eagle import draft_to_target_ids

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


def acceptance(drafts: Any, seq: Any, start: int, k: int) -> tuple[int, int, list[int]]:
    """Simulate greedy speculative decoding with chain drafts of length k over the target's greedy output `seq`.

    `seq[start]` is the first generated token (from the prefill). A verification step at accepted length q
    (tokens 0..q known, target states for 0..q-1) drafts seq[q+1..q+k] from position j=q-1, accepts the
    longest matching prefix a, and yields 1 + a tokens (the target's own token comes free).
    Returns (tokens, target forwards, accepted count per draft position)."""
    n = len(seq)
    q, tokens, forwards = start, 0, 0
    per_pos = [0] * k
    while q + 1 < n:
        a = 0
        while a < k and q + 1 + a < n and int(drafts[q - 1, a]) == int(seq[q + 1 + a]):
            per_pos[a] += 1
            a += 1
        tokens += min(1 + a, n - 1 - q)  # the last step's bonus token may lie past the known answer
        forwards += 1
        q += 1 + a
    return tokens, forwards, per_pos


def al_interval(per_prompt: list[tuple[int, int]], resamples: int = 1000, seed: int = 0) -> list[float]:
    """95% bootstrap interval of AL = sum(tokens) / sum(forwards) over prompts drawn again with replacement: how
    much the figure would move on another draw of held-out prompts (not on another training run)."""
    import torch

    counts = torch.tensor(per_prompt, dtype=torch.float64)  # [prompts, (tokens, forwards)]
    idx = torch.randint(len(counts), (resamples, len(counts)), generator=torch.Generator().manual_seed(seed))
    sums = counts[idx].sum(1)
    al = sums[:, 0] / sums[:, 1].clamp_min(1)
    return [round(float(q), 3) for q in torch.quantile(al, torch.tensor([0.025, 0.975], dtype=torch.float64))]


def evaluate_acceptance(model: Any, eval_set: list[dict], k_max: int = EVAL_MAX_DRAFT) -> dict:
    """AL (tokens per target forward) for chain drafts of length 1..k_max with its 95% bootstrap interval over the
    prompts, and per-position acceptance at k_max."""
    per_prompt: dict[int, list[tuple[int, int]]] = {k: [] for k in range(1, k_max + 1)}
    per_pos = [0] * k_max
    was_training = model.training
    model.eval()
    for ex in eval_set:
        ids = ex["input_ids"][None]
        drafts = chain_drafts(model, ids, ex["aux"][None], ex["last"][None], k_max)[0]
        for k in per_prompt:
            tok, fwd, pos = acceptance(drafts, ex["input_ids"], ex["start"], k)
            per_prompt[k].append((tok, fwd))
            if k == k_max:
                per_pos = [a + b for a, b in zip(per_pos, pos, strict=True)]
    model.train(was_training)
    steps = sum(f for _, f in per_prompt[k_max])  # verification steps at k_max
    out: dict[str, Any] = {}
    for k, counts in per_prompt.items():
        out[f"AL@{k}"] = round(sum(t for t, _ in counts) / max(sum(f for _, f in counts), 1), 3)
        out[f"AL@{k}_ci95"] = al_interval(counts) if counts else None
    # acceptance of draft position i = share of verification steps whose first i+1 drafts were all accepted
    return {**out, "accept_rate_by_position": [round(a / max(steps, 1), 3) for a in per_pos]}


def greedy_answers(base: Any, tok: Any, rows: list[dict], max_new_tokens: int, batch_size: int = 16) -> list[dict]:
    """The target's greedy answers to rows' prompts (batched), as {input_ids: prompt + answer, start}."""
    import torch

    from trtspec.stages.data import generate_batch

    out = []
    for i in range(0, len(rows), batch_size):
        texts = [tok.apply_chat_template(r["messages"][:-1], tokenize=False, add_generation_prompt=True) for r in rows[i : i + batch_size]]
        out += [{"input_ids": torch.tensor(prompt + answer), "start": len(prompt)} for prompt, answer in generate_batch(base, tok, texts, max_new_tokens)]
    return out


EVAL_SEQS = "eval_seqs.pt"  # the unquantized target's greedy answers to the first train.eval_prompts held-out prompts


EVAL_BATCH = 64  # held-out prompts answered at once by the unquantized target (the train stage's evaluation)


def build_eval_set(base: Any, tok: Any, rows: list[dict], aux_layers: list[int], max_new_tokens: int, cache: Path, log: Any,
                   batch_size: int = 16) -> list[dict]:
    """The target's greedy answers to held-out prompts, with their hidden states (cached in ctx.work)."""
    import torch

    if cache.is_file():
        seqs = torch.load(cache, weights_only=True)
    else:
        log(f"generating greedy target answers for {len(rows)} held-out prompts (acceptance evaluation)")
        seqs = greedy_answers(base, tok, rows, max_new_tokens, batch_size)
        torch.save(seqs, cache)
    return with_states(base, seqs, aux_layers)


def with_states(base: Any, seqs: list[dict], aux_layers: list[int]) -> list[dict]:
    """Acceptance-set entries {input_ids, start, aux, last}: each sequence's target states from a forward of its own."""
    import torch

    out = []
    for s in seqs:
        ids = s["input_ids"].to(next(base.parameters()).device)[None]
        aux, last = base_states(base, ids, torch.ones_like(ids), aux_layers)
        out.append({"input_ids": ids[0], "start": int(s["start"]), "aux": aux[0], "last": last[0]})
    return out


def training_rows_set(tokens: dict, states: dict | None, base: Any, aux_layers: list[int], n: int) -> list[dict]:
    """The first n training rows as an acceptance set, with the states the head trained on (the offline cache, else
    a target forward): how well the head fits what it learned from. Against the held-out AL this tells a head
    short of data (fits, does not generalise) from one short of capacity or training (does not even fit).
    A row is a greedy answer of the target only when the data stage regenerated it; other rows measure the head
    against the data's own tokens."""
    import torch

    picked = []  # (row, its length, its first label)
    for i, length in enumerate(row_lengths(tokens)):
        labels = tokens["loss_mask"][i, :length].nonzero()
        if len(labels):
            picked.append((i, length, int(labels[0])))
        if len(picked) == n:
            break
    seqs = [{"input_ids": tokens["input_ids"][i, :length], "start": start} for i, length, start in picked]
    if states is None:
        return with_states(base, seqs, aux_layers)
    device = next(base.parameters()).device
    return [{"input_ids": s["input_ids"].to(device), "start": s["start"],
             **{k: torch.from_numpy(states[k][i, :length].astype("float32")).to(device) for k in ("aux", "last")}}
            for s, (i, length, _) in zip(seqs, picked, strict=True)]


# ---------------------------------------------------------------- training


def make_trainer(model: Any, dataset: Any, args: Any, log_file: Path, eval_fn: Any, eval_steps: int):
    from transformers import Trainer, TrainerCallback

    from trtspec import eagle

    class StepLog(TrainerCallback):
        """One JSON line per optimizer step: loss and per-TTT-step accuracy averaged over its micro-batches."""

        def __init__(self):
            self.buf: list[tuple[float, list[float]]] = []

        def on_step_end(self, args, state, control, **kw):
            if not self.buf:
                return
            loss = sum(b[0] for b in self.buf) / len(self.buf)
            accs = [round(sum(b[1][i] for b in self.buf) / len(self.buf), 4) for i in range(len(self.buf[0][1]))]
            lr = kw["lr_scheduler"].get_last_lr()[0] if kw.get("lr_scheduler") else None
            row = {"step": state.global_step, "epoch": round(state.epoch or 0, 3), "loss": round(loss, 4), "acc_ttt": accs, "lr": lr}
            if eval_steps and state.global_step % eval_steps == 0:
                row["eval"] = eval_fn()
            with open(log_file, "a") as f:
                f.write(json.dumps(row) + "\n")
            self.buf.clear()

    step_log = StepLog()

    class EagleTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = head_forward(model, inputs, self.accelerator.unwrap_model(model))
            step_log.buf.append((float(out.loss.detach()), [float(a) for a in out.train_acc[0]]))
            return (out.loss, out) if return_outputs else out.loss

        def _get_train_sampler(self, train_dataset=None):
            ds = train_dataset or self.train_dataset
            return LengthGroupedEpochSampler(ds.lengths, self.args.train_batch_size * self.args.gradient_accumulation_steps, self.args.seed)

        def _save(self, output_dir=None, state_dict=None):
            # checkpoints hold the head only (the base is frozen and already on disk)
            eagle.save_head(self.model, Path(output_dir or self.args.output_dir) / eagle.HEAD_FILE)

        def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
            eagle.load_head(self.model, Path(resume_from_checkpoint) / eagle.HEAD_FILE)

    return EagleTrainer(model=model, args=args, train_dataset=dataset, data_collator=HeadDataset.collate, callbacks=[step_log])


def training_args(ctx: StageContext, out_dir: Path) -> Any:
    import torch
    from transformers import TrainingArguments

    from trtspec.models import use_bf16

    t = ctx.cfg.train
    gpu = torch.cuda.is_available()
    return TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=t.batch_size,
        gradient_accumulation_steps=t.grad_accum,
        learning_rate=t.lr,
        weight_decay=t.weight_decay,
        lr_scheduler_type="cosine",
        warmup_steps=t.warmup_ratio,  # transformers 5: a float < 1 is a share of the steps
        num_train_epochs=t.epochs,
        max_steps=t.max_steps or -1,
        save_strategy="steps",
        save_steps=t.save_steps,
        save_total_limit=2,
        logging_steps=t.logging_steps,
        bf16=use_bf16(t.precision),  # autocast; the head's weights and optimizer state stay fp32
        use_cpu=not gpu,
        seed=ctx.cfg.seed,
        data_seed=ctx.cfg.seed,
        report_to=[],
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=False,
        save_only_model=False,
    )


def target_states_dir(ctx: StageContext, aux_layers: list[int]) -> Path:
    """Scratch for what the frozen target computes (hidden states of the training rows, held-out greedy answers),
    beside the stage's own scratch.

    Keyed on the target (a local one by its files' sizes and mtimes too), the data stage's files and the aux layers
    only: a new lr, schedule, epoch count or batch size reuses it, so trying a recipe costs the training alone."""
    from trtspec.artifacts import fingerprint, keyed_scratch
    from trtspec.models import model_stamp, use_bf16

    files = ctx.manifests["data"]["files"]  # sha256 recorded by the data stage (and checked by the pipeline)
    what = {
        "model": [ctx.cfg.model.source, ctx.cfg.model.dtype],
        "data": {f: files[f]["sha256"] for f in ("train_tokens.pt", "heldout.jsonl")},
        "aux_layers": aux_layers,
        "bf16": use_bf16(ctx.cfg.train.precision),
    }
    if stamp := model_stamp(ctx.cfg.model.source):
        what["model_files"] = stamp
    key = fingerprint(what)
    return keyed_scratch(ctx.work.parent, "target", key)


def _load_tokens(folder: Path, name: str) -> dict:
    import torch

    path = folder / f"{name}_tokens.pt"
    if not path.is_file():
        raise ArtifactError(f"'{path}' is missing", "re-run the data stage")
    return torch.load(path, weights_only=True)


def _read_rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def run(ctx: StageContext) -> dict:
    import time

    from trtspec import eagle
    from trtspec.models import load_model, load_tokenizer, matmul_attention_on_cpu, resolve_model, use_bf16

    t_cfg = ctx.cfg.train
    data_dir, conv_dir = ctx.inputs["data"], ctx.inputs["convert"]
    eagle_cfg = json.loads((conv_dir / "eagle_config.json").read_text())
    eagle_cfg["eagle_ttt_steps"] = t_cfg.ttt_steps
    aux_layers = eagle_cfg["eagle_architecture_config"]["eagle_aux_hidden_state_layer_ids"]
    tokens = _load_tokens(data_dir, "train")
    if len(tokens["input_ids"]) == 0:
        raise DataError("the data stage produced no training rows", "add data sources")
    path = resolve_model(ctx.cfg.model.source)
    tok = load_tokenizer(path)
    base = load_model(path, ctx.cfg.model.dtype)
    base.config.num_orig_hidden_layers = base.config.num_hidden_layers

    target_dir = target_states_dir(ctx, aux_layers)
    heldout = _read_rows(data_dir / "heldout.jsonl")[: t_cfg.eval_prompts]
    eval_file = target_dir / f"eval_seqs-{len(heldout)}x{ctx.cfg.data.max_new_tokens}.pt"
    with matmul_attention_on_cpu(base):
        eval_set = build_eval_set(base, tok, heldout, aux_layers, ctx.cfg.data.max_new_tokens, eval_file, ctx.log, EVAL_BATCH)

    t0 = time.time()
    states = None
    if t_cfg.mode == "offline":
        states = cache_states(base, tokens, aux_layers, target_dir / "states", 16, ctx.log, use_bf16(t_cfg.precision))
        eagle_cfg["eagle_offline"] = True  # modelopt drops the target's decoder layers
    cache_s = time.time() - t0
    model = eagle.build_eagle_model(base, eagle_cfg)
    eagle.load_head(model, conv_dir / "head_init.safetensors")
    gc.collect()

    ckpt_dir = ctx.work / "checkpoints"
    log_file = ctx.work / "train_log.jsonl"
    last_ckpt = last_complete_checkpoint(ckpt_dir, ctx.log)
    if last_ckpt:
        ctx.log(f"resuming from {Path(last_ckpt).name}")
        _truncate_log(log_file, int(Path(last_ckpt).name.split("-")[-1]))
    elif log_file.exists():
        log_file.unlink()

    if t_cfg.max_rows and t_cfg.max_rows < len(tokens["input_ids"]):
        ctx.log(f"training on the first {t_cfg.max_rows} of {len(tokens['input_ids'])} rows (train.max_rows)")
        tokens = {k: v[: t_cfg.max_rows] for k, v in tokens.items()}  # states rows line up: same order, a prefix
    trainer = make_trainer(model, HeadDataset(tokens, states), training_args(ctx, ckpt_dir), log_file,
                           lambda: evaluate_acceptance(model, eval_set), t_cfg.eval_steps)
    t1 = time.time()
    result = trainer.train(resume_from_checkpoint=last_ckpt)
    train_s = time.time() - t1
    steps = trainer.state.global_step

    fit_set = training_rows_set(tokens, states, model, aux_layers, len(eval_set))
    ctx.log(f"measuring acceptance on {len(eval_set)} held-out prompts and {len(fit_set)} training rows")
    acc = evaluate_acceptance(model, eval_set)
    fit = evaluate_acceptance(model, fit_set)
    eagle.save_head(model, ctx.out / eagle.HEAD_FILE)
    shutil.copyfile(eval_file, ctx.out / EVAL_SEQS)  # export's acceptance check reuses these greedy answers
    eagle_cfg["eagle_offline"] = False  # the head is used with a full target from here on
    (ctx.out / "eagle_config.json").write_text(json.dumps(eagle_cfg, indent=2) + "\n")
    shutil.copyfile(log_file, ctx.out / "train_log.jsonl") if log_file.is_file() else (ctx.out / "train_log.jsonl").touch()
    # the head is in the stage's output now; a finished run's checkpoints would only make a forced redo (--force,
    # --from train) "resume" at its last step and train nothing. Killed between here and the manifest: it retrains.
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    rows = _read_rows(ctx.out / "train_log.jsonl")
    final = rows[-1] if rows else {}
    label_tokens = int(tokens["loss_mask"].sum())
    mean_len = float(tokens["attention_mask"].sum()) / max(len(tokens["attention_mask"]), 1)
    k_head = min(3, EVAL_MAX_DRAFT)
    metrics = {
        "mode": t_cfg.mode,
        "steps": steps,
        "resumed_from_step": int(Path(last_ckpt).name.split("-")[-1]) if last_ckpt else 0,
        "train_loss": round(float(result.training_loss), 4) if math.isfinite(result.training_loss) else None,
        "final_acc_ttt": final.get("acc_ttt"),
        "cache_states_s": round(cache_s, 1),
        "train_s": round(train_s, 1),
        # real (unpadded) tokens: batches are grouped by length and cut to their longest row
        "train_tokens_per_s": round(steps * t_cfg.batch_size * t_cfg.grad_accum * mean_len / max(train_s, 1e-9), 1),
        "precision": "bfloat16" if use_bf16(t_cfg.precision) else "float32",
        "train_rows": len(tokens["input_ids"]),
        "label_tokens": label_tokens,
        "eval_prompts": len(eval_set),
        **acc,
        # the same measure on training rows: far above the held-out AL = short of data, close to it = short of fit
        "fit": {k: v for k, v in fit.items() if "ci95" not in k},
        "headline": f"AL@{k_head} {acc[f'AL@{k_head}']:.2f} held-out ({len(eval_set)} prompts"
        + (", 95% CI {:.2f}-{:.2f}".format(*acc[f"AL@{k_head}_ci95"]) if acc[f"AL@{k_head}_ci95"] else "")
        + f"), {steps} steps {t_cfg.mode}",
    }
    ctx.log(metrics["headline"] + f"; by draft position {acc['accept_rate_by_position']}; on training rows AL@{k_head} {fit[f'AL@{k_head}']:.2f}")
    return metrics


def last_complete_checkpoint(ckpt_dir: Path, log: Any) -> str | None:
    """The newest checkpoint the Trainer finished writing (trainer_state.json is written last); a checkpoint
    cut short by a kill is removed, never resumed from."""
    from transformers.trainer_utils import get_last_checkpoint

    while ckpt_dir.is_dir() and (last := get_last_checkpoint(str(ckpt_dir))):
        if (Path(last) / "trainer_state.json").is_file():
            return last
        log(f"removing incomplete {Path(last).name} (interrupted while it was written)")
        shutil.rmtree(last)
    return None


def _truncate_log(log_file: Path, step: int) -> None:
    """Drop log lines past the checkpoint we resume from (they will be logged again)."""
    if log_file.is_file():
        keep = [x for x in log_file.read_text().splitlines() if x.strip() and _step_of(x) <= step]
        log_file.write_text("".join(x + "\n" for x in keep))


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return 1 << 62
