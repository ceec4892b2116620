

# what an exported DFlash draft's config.json names (a DSpark export names vLLM's and SGLang's class first)
ARCHITECTURES = ("DFlashDraftModel", "Qwen3DSparkModel")
