"""TEST DOUBLE: tensorrt_llm.llmapi config classes, with the field names of the selected release."""

from tensorrt_llm.llmapi.llm_args import (
    DraftTargetDecodingConfig,
    EagleDecodingConfig,
    KvCacheConfig,
    NGramDecodingConfig,
    newer,
)

__all__ = ["EagleDecodingConfig", "KvCacheConfig", "NGramDecodingConfig", "DraftTargetDecodingConfig"]
if newer():
    from tensorrt_llm.llmapi.llm_args import (  # noqa: F401
        DFlashDecodingConfig,
        DSparkDecodingConfig,
        Eagle3DecodingConfig,
        SADecodingConfig,
        SAEnhancerConfig,
    )

    __all__ += ["DFlashDecodingConfig", "DSparkDecodingConfig", "Eagle3DecodingConfig", "SADecodingConfig", "SAEnhancerConfig"]
