"""FSDP for the draft (`train.sharding: fsdp` in a multi-process launch): each process holds 1/N of the draft's
weights, gradients and AdamW state (torch FSDP2, `fully_shard`) instead of DDP's full copy of all three. The draft is
the converted model's attribute its family names (DraftFamily.module_attr: eagle_module for EAGLE-3; config refuses
fsdp for a DFlash draft so far).

The HF Trainer takes a model that is already sharded as one "sharded at load time" (transformers'
`is_distributed_loading_by_transformers`): it neither wraps it in DDP nor moves it, and clips the DTensor gradients.
Accelerate's own FSDP is not used because it shards on GPUs only (a CPU launch gets DDP). What the Trainer does not
do for such a model, this module does:

- the head's checkpoint: the full weights, gathered from every process (collective), written by rank 0;
- the optimizer's state: each process's shard, by torch.distributed.checkpoint (DCP), so a killed run resumes;
- evaluation: rank 0 keeps an unsharded copy of the head (weights only, no gradients or optimizer state) that the
  gathered weights are loaded into, and evaluates with it; the sharded head never runs on one process alone.

The base model (frozen target) stays whole in every process, as with DDP.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec import ranks

OPTIMIZER_DIR = "optimizer_shards"  # DCP's files of the optimizer state, in a Trainer checkpoint folder
SCHEDULER_FILE = "scheduler.pt"


@dataclass
class ShardedHead:
    attr: str  # the draft's attribute in the converted model (DraftFamily.module_attr)
    sharded: Any  # the draft module the model trains with: FSDP2 parameters (DTensors)
    plain: Any  # rank 0: an unsharded draft module for evaluation and saving; None elsewhere


def shard_head(model: Any, attr: str) -> ShardedHead:
    """Replace the draft (model.<attr>) by an FSDP2-sharded copy over all processes of the launch (gloo on CPUs, nccl
    on GPUs); rank 0 keeps the unsharded original for evaluation."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    plain = getattr(model, attr)
    sharded = copy.deepcopy(plain)  # hooks that refer to the module (first-layer input patch) follow the copy
    mesh = init_device_mesh("cuda" if torch.cuda.is_available() else "cpu", (ranks.size(),))
    setattr(model, attr, sharded)
    # a unit per decoder layer (gathered one at a time), one for each part Model Optimizer's model calls outside the
    # draft's own forward (EAGLE-3: fc on the target's states, lm_head on the head's output), one for the rest
    # (norms); the whole model is the root FSDP wants a forward to enter by, its target's (frozen) weights left whole
    units = [*sharded.layers, *(getattr(sharded, n) for n in ("fc", "lm_head") if hasattr(sharded, n)), sharded]
    for unit in units:
        fully_shard(unit, mesh=mesh)
    target = {p for name, p in model.named_parameters() if not name.startswith(f"{attr}.")}
    fully_shard(model, mesh=mesh, ignored_params=target)
    model._is_distributed_loading_by_transformers = True  # transformers: the Trainer leaves placement and reduction to FSDP
    if ranks.is_main():
        plain.requires_grad_(False)
    return ShardedHead(attr, sharded, plain if ranks.is_main() else None)


def local_parameters(module: Any) -> int:
    """Parameters this process holds of `module` (its shards' sizes for FSDP parameters)."""
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in module.parameters())


def is_sharded(module: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def full_state(module: Any) -> dict:
    """The whole state dict of a sharded module, on rank 0 (CPU tensors); {} on the others. Every rank must call."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(module: Any, state: dict) -> None:
    """Load whole tensors (what full_state returns, read on every rank) into a sharded module: each rank keeps its
    shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=True))


@contextmanager
def full_head(model: Any, head: ShardedHead | None) -> Iterator[None]:
    """Within: on rank 0, the model's draft is the unsharded one holding the trained weights. Every rank must enter
    (the weights are gathered from all). Nothing to do without sharding."""
    if head is None:
        yield
        return
    keep_full_head(model, head)
    try:
        yield
    finally:
        setattr(model, head.attr, head.sharded)


def save_optimizer(model: Any, optimizer: Any, folder: Path) -> None:
    """Every rank writes its shard of the optimizer's state under folder/OPTIMIZER_DIR (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(Path(folder) / OPTIMIZER_DIR))


def load_optimizer(model: Any, optimizer: Any, folder: Path) -> None:
    """Each rank reads its shard of the optimizer's state saved by save_optimizer (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=str(Path(folder) / OPTIMIZER_DIR))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def keep_full_head(model: Any, head: ShardedHead) -> None:
    """Rank 0's model takes the unsharded head, loaded with the weights gathered from the sharded one (after
    training: for what follows on rank 0 alone, evaluation and saving). Every rank must call."""
    state = full_state(head.sharded)
    if head.plain is not None:
        head.plain.load_state_dict(state)
        setattr(model, head.attr, head.plain)
