"""An engine object (vLLM's `LLM`) held in this process, or in a spawned process of its own, and called the same way.

vLLM serves some families through its Transformers backend (vllm/model_executor/models/transformers/), which rewrites
transformers' classes in the process it runs in: a later HF load of that target in the same build then fails. For
those the engine lives in a spawned process (`spawned=True`), and only what the functions take and return (token ids,
file paths, errors) crosses over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trtspec.errors import ProcessDied

_HELD: dict[str, Any] = {}  # in a spawned worker: the engine its opener built


def _open_here(opener: Callable[..., Any], args: tuple) -> None:
    _HELD["engine"] = opener(*args)


def _call_here(fn: Callable[..., Any], args: tuple) -> Any:
    return fn(_HELD["engine"], *args)


def _close_here(closer: Callable[[Any], None]) -> None:
    engine = _HELD.pop("engine", None)
    if engine is not None:
        closer(engine)


def spawned_pool() -> Any:
    """A pool of one spawned process (a fresh interpreter: nothing of this one's modules carried over)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    return ProcessPoolExecutor(1, mp_context=get_context("spawn"))


def ask(pool: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) in the pool's process: its result or its error; a process that ended without answering
    (now or before) as one clear error."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        return pool.submit(fn, *args, **kwargs).result()
    except BrokenProcessPool as e:
        raise ProcessDied("the engine's own process ended without answering (killed: most often for memory)",
                          "check free memory (`dmesg | tail` names the kernel's kills), lower the batch or "
                          "max_num_seqs, and re-run: finished stages are kept") from e


def in_own_process(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) once, in a spawned process of its own, for what leaves this one changed."""
    with spawned_pool() as pool:
        return ask(pool, fn, *args, **kwargs)


class EngineWorker:
    """`opener(*args)` builds the engine on the first call; `call(fn, *a)` runs `fn(engine, *a)` where the engine
    lives; `close()` runs `closer(engine)` and, when spawned, ends its process. Functions are passed by name
    (module-level), so a spawned worker imports them."""

    def __init__(self, opener: Callable[..., Any], args: tuple, closer: Callable[[Any], None], spawned: bool = False):
        self.opener, self.args, self.closer, self.spawned = opener, args, closer, spawned
        self.engine: Any = None
        self.pool: Any = None

    @property
    def opened(self) -> bool:
        return self.engine is not None or self.pool is not None

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if not self.spawned:
            if self.engine is None:
                self.engine = self.opener(*self.args)
            return fn(self.engine, *args)
        if self.pool is None:
            pool = spawned_pool()
            try:
                ask(pool, _open_here, self.opener, self.args)
            except BaseException:
                pool.shutdown()
                raise
            self.pool = pool
        return ask(self.pool, _call_here, fn, args)

    def close(self) -> None:
        if self.pool is not None:
            pool, self.pool = self.pool, None
            try:
                ask(pool, _close_here, self.closer)
            except ProcessDied:
                pass  # the engine went with its process: nothing left to close
            finally:
                pool.shutdown()
        if self.engine is not None:
            engine, self.engine = self.engine, None
            self.closer(engine)
