"""The processes of a multi-process launch (`torchrun --nproc_per_node N $(which trtspec) build ...`, or
`accelerate launch`): rank 0 runs the pipeline and alone owns the run directory; every rank joins the stages that
train (DDP), and waits for rank 0 between them.

The launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT) says who is who. Rank 0 tells the others what to run
by a broadcast over a gloo group whose timeout is as long as rank 0's other stages may take (WAIT). A rank that dies
ends the launch (torchrun stops the others); the next launch resumes training from its last checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

WAIT = timedelta(hours=48)  # the longest a rank waits for rank 0 (data regeneration of a large recipe, say)
_control: Any = None  # the gloo group of the control messages (the default group may be nccl)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return rank() == 0


def start() -> None:
    """Join the launch's process group (once; nothing to do for a single process). GPUs: nccl for training, one
    device per local rank; CPUs: gloo."""
    global _control
    if size() == 1 or _control is not None:
        return
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=WAIT)
    _control = dist.new_group(backend="gloo", timeout=WAIT)


def stop() -> None:
    """Leave the process group (before the interpreter exits: a gloo group torn down at exit aborts the process)."""
    global _control
    if _control is not None:
        import torch.distributed as dist

        dist.destroy_process_group()
        _control = None


def broadcast(obj: Any = None) -> Any:
    """Rank 0's `obj`, on every rank (the others pass nothing)."""
    if size() == 1:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_control)
    return box[0]


def barrier() -> None:
    if size() > 1:
        import torch.distributed as dist

        dist.barrier(group=_control)


def mean(values: list[float]) -> list[float]:
    """The element-wise mean over ranks (what a DDP step's loss is: every rank's share of the batch)."""
    if size() == 1:
        return values
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=_control)
    return (t / size()).tolist()


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if size() == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * size()
    dist.all_gather_object(out, obj, group=_control)
    return out


@contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first (computing what goes to disk: cached target states); the others run it after,
    finding it there."""
    if not is_main():
        barrier()
    yield
    if is_main():
        barrier()
