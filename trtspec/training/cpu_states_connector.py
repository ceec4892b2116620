"""vLLM's reference hidden-states connector, made to run where there is no CUDA.

vLLM 0.32's `ExampleHiddenStatesConnector` (speculative method `extract_hidden_states`) copies each finished request's
states out of its cache-only layer through pinned memory, a CUDA stream and a CUDA event, then writes them from a
thread pool: on a CPU build the first `pin_memory=True` raises. This subclass keeps everything else of it (the
scheduler side, the file layout `{hidden_states [tokens, ids, hidden], token_ids}`, the lock files clients wait on) and
replaces that one write with a plain synchronous copy and save. vLLM loads it by module path
(`kv_connector_module_path`), so it must import without trtspec's own imports.
"""

from __future__ import annotations

import os

from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _Done:
    """Stands where the reference keeps a CUDA event: the copy finished before it was recorded."""

    @staticmethod
    def query() -> bool:
        return True


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        import torch
        from safetensors.torch import save_file

        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size).reshape(1, -1) + blocks.reshape(-1, 1) * self._block_size).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        try:
            save_file({"hidden_states": states, "token_ids": pending.token_ids.clone()}, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases the lock a reader waits on
        self._req_copy_events[pending.req_id] = _Done()
