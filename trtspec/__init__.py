"""trtspec: a Hugging Face causal LM to a speculative-decoding deployment, and the proof that it holds."""

import sys

# Model Optimizer imports a quantization plugin for each package it finds installed; its vLLM plugin (for quantizing
# vLLM's own layers, which trtspec never asks of it) imports vLLM, seconds of every `trtspec build` where vLLM is
# installed. None here makes that one plugin's import fail as a missing module, which modelopt skips silently.
sys.modules.setdefault("modelopt.torch.quantization.plugins.vllm", None)
