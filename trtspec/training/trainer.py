"""Training a draft with HF Trainer, for every family: the dataset over the data stage's tensors (and cached target
states), length-grouped batches that resume mid-epoch, the family's own training forward (DraftFamily.train_forward:
EAGLE-3's is trtspec.eagle.train_step.head_forward), a callback logging each step, and resuming from the last complete
checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec import ranks
from trtspec.errors import MissingDependency
from trtspec.training.sharding import ShardedHead
from trtspec.training.states import row_lengths

if TYPE_CHECKING:
    from trtspec.draft_family import TrainableDraft

# The HF Trainer's private methods the head's trainer overrides or calls (all in make_trainer), with the parameters
# it relies on, as in transformers 5.0-5.19 (pyproject pins <5.20; tests/unit/test_trainer_private.py checks each).
TRAINER_PRIVATE = {
    "_get_train_sampler": ("train_dataset",),  # overridden: length-grouped batches by the global batch, resumable
    "_save": ("output_dir", "state_dict"),  # overridden: a checkpoint holds the head only (the base is frozen)
    "_load_from_checkpoint": ("resume_from_checkpoint", "model"),  # overridden: reads that head back
    "_save_checkpoint": ("model", "trial"),  # overridden: a sharded head's optimizer shards, before trainer_state
    "_load_optimizer_and_scheduler": ("checkpoint",),  # overridden: reads those shards back
    "_get_output_dir": ("trial",),  # called: where the Trainer writes checkpoint-N
    "_save_rng_state": ("output_dir",),  # called: the RNG state a resumed run continues from
}


def check_trainer_api() -> None:
    """One clear line, before any training, where the installed transformers changed a TRAINER_PRIVATE method."""
    import transformers

    if changed := private_api_changes(transformers.Trainer):
        raise MissingDependency(f"transformers {transformers.__version__} changed the Trainer methods the head's "
                                f"trainer relies on: {', '.join(changed)}", "pip install 'transformers>=4.55,<5.20'")


def private_api_changes(trainer_cls: Any) -> list[str]:
    """TRAINER_PRIVATE entries the installed Trainer no longer has as written: '_save(output_dir, state_dict)'."""
    import inspect

    changed = []
    for name, params in TRAINER_PRIVATE.items():
        method = getattr(trainer_cls, name, None)
        have = tuple(inspect.signature(method).parameters)[1:] if callable(method) else None
        if have != params:
            changed.append(f"{name}({', '.join(params)})")
    return changed


class HeadDataset:
    """Rows of the data stage's tensors (+ cached hidden states offline), each cut to its real length;
    `collate` pads a batch to its longest row. The loss mask is shifted to modelopt's convention:
    modelopt scores position t against the target's prediction *for t+1*, so loss_mask[t] = is_label[t+1]."""

    def __init__(self, tokens: dict, states: Any = None, shift_labels: bool = True):
        import torch

        self.tokens = tokens
        self.states = states
        self.lengths = [max(1, n) for n in row_lengths(tokens)]
        lm = tokens["loss_mask"]
        # shift_labels=False: the mask as the data stage wrote it (a drafter scoring position t against token t)
        self.loss_mask = torch.cat([lm[:, 1:], torch.zeros_like(lm[:, :1])], dim=1) if shift_labels else lm

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
            aux, last = self.states.row(i, n)
            row["aux_hidden_states"] = torch.from_numpy(aux)
            row["base_model_hidden_states"] = torch.from_numpy(last)
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

    def order(self) -> list[int]:
        """This epoch's rows in the order they are read (streamed states extract them in it)."""
        import torch
        from transformers.trainer_pt_utils import get_length_grouped_indices

        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return list(get_length_grouped_indices(self.lengths, self.batch_size, generator=g))

    def __iter__(self):
        return iter(self.order())


def make_trainer(model: Any, dataset: Any, args: Any, log_file: Path, eval_fn: Any, eval_steps: int,
                 head: ShardedHead | None, family: TrainableDraft):
    """The HF Trainer of the head. `eval_fn` is called on every rank at eval steps (gathering a sharded head is
    collective) and returns rank 0's measurement. `head`: the FSDP-sharded head (train.sharding: fsdp), whose
    checkpoints hold each rank's optimizer shard. `family`: the draft's family (its training
    forward and how its weights are saved)."""
    import torch
    from transformers import Trainer, TrainerCallback

    from trtspec.training import sharding

    check_trainer_api()

    class StepLog(TrainerCallback):
        """One JSON line per optimizer step: loss and the forward's accuracies (EAGLE-3: one per TTT step) averaged
        over its micro-batches."""

        def __init__(self):
            self.buf: list[tuple[float, ...]] = []  # (loss, each accuracy the forward reports) per micro-batch

        def on_step_end(self, args, state, control, **kw):
            if not self.buf:
                return
            # every rank's micro-batches (a DDP step's loss is their mean); rank 0 writes the row
            loss, *accs = ranks.mean([sum(b[i] for b in self.buf) / len(self.buf) for i in range(len(self.buf[0]))])
            self.buf.clear()
            evaluation = eval_fn() if eval_steps and state.global_step % eval_steps == 0 else None
            if not ranks.is_main():
                return
            lr = kw["lr_scheduler"].get_last_lr()[0] if kw.get("lr_scheduler") else None
            row = {"step": state.global_step, "epoch": round(state.epoch or 0, 3), "loss": round(loss, 4),
                   "acc_ttt": [round(a, 4) for a in accs], "lr": lr}
            if evaluation is not None:
                row["eval"] = evaluation
            with open(log_file, "a") as f:
                f.write(json.dumps(row) + "\n")

    step_log = StepLog()

    class HeadTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = family.train_forward(model, inputs, self.accelerator.unwrap_model(model))
            step_log.buf.append((float(out.loss.detach()), *(float(a) for a in out.train_acc[0])))
            return (out.loss, out) if return_outputs else out.loss

        def _get_train_sampler(self, train_dataset=None):
            # grouped by the global batch (every rank's micro-batches of one step): the rows of a step are the same
            # whatever the number of processes; accelerate hands each rank its share
            ds = train_dataset or self.train_dataset
            step_rows = self.args.train_batch_size * self.args.gradient_accumulation_steps * self.args.world_size
            sampler = LengthGroupedEpochSampler(ds.lengths, step_rows, self.args.seed)
            if hasattr(ds.states, "follow"):  # streamed states: each rank extracts the rows it reads, in that order
                ds.states.follow(sampler.order, self.args.train_batch_size, self.args.world_size, self.args.process_index)
            return sampler

        def _save(self, output_dir=None, state_dict=None):
            # checkpoints hold the head only (the base is frozen and already on disk); a sharded head is gathered
            # first (every rank is here), rank 0 writes
            with sharding.full_head(self.model, head):
                if ranks.is_main():
                    family.save_head(self.model, Path(output_dir or self.args.output_dir) / family.head_file)

        def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
            family.load_head(self.model, Path(resume_from_checkpoint) / family.head_file)

        def _save_checkpoint(self, model, trial):
            # a sharded head: the Trainer saves no optimizer state (save_only_model), each rank writes its shard
            # here, before the Trainer writes trainer_state.json (what marks a checkpoint complete)
            if head is not None:
                folder = Path(self._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}"
                sharding.save_optimizer(self.model, inner_optimizer(self.optimizer), folder)
                if ranks.is_main():
                    torch.save(self.lr_scheduler.state_dict(), folder / sharding.SCHEDULER_FILE)
                self._save_rng_state(str(folder))
                ranks.barrier()
            super()._save_checkpoint(model, trial)

        def _load_optimizer_and_scheduler(self, checkpoint):
            if head is None or checkpoint is None:
                return super()._load_optimizer_and_scheduler(checkpoint)
            sharding.load_optimizer(self.model, inner_optimizer(self.optimizer), Path(checkpoint))
            self.lr_scheduler.load_state_dict(torch.load(Path(checkpoint) / sharding.SCHEDULER_FILE, weights_only=True))

    return HeadTrainer(model=model, args=args, train_dataset=dataset, data_collator=HeadDataset.collate, callbacks=[step_log])


def inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


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


def resume_point(ckpt_dir: Path, log_file: Path, log: Any) -> tuple[str | None, int]:
    """(the checkpoint to resume from, its step), with the training log cut back to it; (None, 0) and no log for a
    fresh start."""
    last = last_complete_checkpoint(ckpt_dir, log)
    if last:
        step = int(Path(last).name.split("-")[-1])
        log(f"resuming from {Path(last).name}")
        truncate_log(log_file, step)
        return last, step
    log_file.unlink(missing_ok=True)
    return None, 0


def truncate_log(log_file: Path, step: int) -> None:
    """Drop log lines past the checkpoint we resume from (they will be logged again)."""
    if log_file.is_file():
        keep = [x for x in log_file.read_text().splitlines() if x.strip() and step_of(x) <= step]
        log_file.write_text("".join(x + "\n" for x in keep))


def step_of(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return 1 << 62
