"""The EAGLE-3 head's training forward (DraftFamily.train_forward, run by trtspec.training.trainer): modelopt's
EAGLE-3 loss over the train-time-test steps, with the draft and target logits computed only where scored."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

from trtspec.eagle.head import draft_target_logits, rows_at


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
