"""TEST DOUBLE of tensorrt_llm — NOT TensorRT-LLM. Lets the engine stage's control flow run on a CPU.

It mirrors the public surface the stage uses (LLM, SamplingParams, llmapi configs, RequestOutput shape,
the engine backend module) and its version differences, switched by TRTSPEC_FAKE_TRTLLM_VERSION:
  1.0.0     EagleDecodingConfig only, draft path field `speculative_model_dir`, engine backend present
  1.2.0     Eagle3DecodingConfig, `speculative_model` (alias `speculative_model_dir`), engine backend present
  1.3.0.dev main of mid-2026: as 1.2.0, engine backend removed
Tokens come from Hugging Face greedy generate on the target folder (CPU); draft counters are synthetic.
"""

import os

__version__ = os.environ.get("TRTSPEC_FAKE_TRTLLM_VERSION", "1.2.0")
IS_FAKE = True

from tensorrt_llm.llmapi.llm import LLM, BuildConfig, SamplingParams  # noqa: E402

__all__ = ["LLM", "SamplingParams", "BuildConfig", "__version__"]
