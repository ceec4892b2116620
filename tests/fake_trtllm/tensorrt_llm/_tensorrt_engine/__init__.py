"""TEST DOUBLE: the engine backend module; absent (ImportError) on the fake 'main' (1.3.0.dev) release."""

import tensorrt_llm

if tuple(int(x) for x in tensorrt_llm.__version__.split(".")[:2]) >= (1, 3):
    raise ModuleNotFoundError("No module named 'tensorrt_llm._tensorrt_engine'", name="tensorrt_llm._tensorrt_engine")

from tensorrt_llm.llmapi.llm import _TrtLLM as LLM  # noqa: E402

__all__ = ["LLM"]
