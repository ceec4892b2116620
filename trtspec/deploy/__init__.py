"""Serving the bundle: the options and launch files each engine reads (serving), what each engine reads from a draft
(compat), and thin adapters over TensorRT-LLM's LLM API (trtllm) and vLLM (vllm_engine)."""
