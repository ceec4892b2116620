"""What the vLLM interop tests share: a bundle's eos ids, and prompts run one at a time through vLLM's CPU build with
vLLM's own acceptance counters read around them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def build_on_ci_data(ci_run: Path, run: Path, config: Path, overrides: list[str]) -> Path:
    """`config` with `overrides` built up to the bundle in `run`, on the EAGLE-3 interop run's data stage (the same
    answers, reused: the data stage must come out cached)."""
    import shutil

    from trtspec.artifacts import MARKER
    from trtspec.config import load_config
    from trtspec.pipeline import runner as pipeline

    run.mkdir()
    shutil.copy(ci_run / MARKER, run / MARKER)
    shutil.copytree(ci_run / "data", run / "data")
    results = pipeline.run_build(load_config(config, overrides), run, until="export")
    assert [r.status for r in results if r.stage == "data"] == ["cached"], results
    assert not [r for r in results if r.status == "failed"], results
    return run


def eos_of(bundle: Path) -> set[int]:
    from trtspec.generation import eos_ids
    from trtspec.models import load_tokenizer

    return eos_ids(bundle / "target", load_tokenizer(bundle / "target"))


def vllm_run(bundle: Path, draft: Path | None, prompts: list[list[int]], k: int, max_new: int) -> tuple[list[list[int]], dict]:
    """Each prompt alone through vLLM (with `draft`, k tokens per step; None: the target alone) -> (greedy outputs,
    acceptance from vLLM's counters)."""
    from trtspec.draft_families import speculative_method
    from trtspec.engines import vllm as vl

    llm = vl.load(bundle / "target", draft, k, max(map(len, prompts)) + max_new + 16, 4,
                  method=speculative_method(draft) if draft else None)
    try:
        before = vl.spec_counters(llm)
        outputs = [vl.generate(llm, [p], max_new)[0] for p in prompts]
        return outputs, vl.acceptance(before, vl.spec_counters(llm)) if draft else {}
    finally:
        vl.shutdown(llm)


@contextmanager
def vllm_model(vc, cls) -> Iterator:
    """vLLM's model class `cls` built under the engine config `vc` as its model runner builds it (world size 1, this
    process; the distributed state made once per process), the config current while the caller loads weights."""
    import torch.distributed as dist
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    from trtspec.engines.vllm.sweep import free_port

    with set_current_vllm_config(vc):
        if not dist.is_initialized():
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
        ensure_model_parallel_initialized(1, 1)
        yield cls(vllm_config=vc)
