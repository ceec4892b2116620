"""TEST DOUBLE of tensorrt_llm/llmapi/llm_args.py: the fields of the real classes, strict like the real ones.

Real StrictBaseModel = pydantic BaseModel with extra="forbid". Field names and types follow
tests/contracts/trtllm_api.json (read from NVIDIA/TensorRT-LLM llm_args.py of the releases named there).
"""

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

import tensorrt_llm


def newer() -> bool:
    """1.1+ (Eagle3DecodingConfig, speculative_model) vs 1.0 (EagleDecodingConfig, speculative_model_dir)."""
    return tuple(int(x) for x in tensorrt_llm.__version__.split(".")[:2]) >= (1, 1)


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


if newer():

    class DecodingBaseConfig(StrictBaseModel):
        max_draft_len: int | None = Field(default=None, ge=0)
        max_total_draft_tokens: int | None = None
        speculative_model: str | Path | None = Field(
            default=None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir"))
        max_concurrency: int | None = None
        draft_len_schedule: dict[int, int] | None = None

        @model_validator(mode="after")
        def _check_schedule(self):
            # as the real validate_draft_len_schedule_and_sort: keys (the last batch size of each tier) >= 1,
            # lengths >= 0, the smallest key's length == max_draft_len, no length above it; sorted by key. And
            # validate_max_concurrency_and_draft_len_schedule_mutually_exclusive.
            v = self.draft_len_schedule
            if v is None:
                return self
            if self.max_concurrency is not None:
                raise ValueError("max_concurrency and draft_len_schedule are mutually exclusive")
            if any(b < 1 for b in v) or any(k < 0 for k in v.values()):
                raise ValueError("draft_len_schedule: batch size threshold must be >= 1, draft length >= 0")
            if self.max_draft_len is not None and v[min(v)] != self.max_draft_len:
                raise ValueError(f"draft_len_schedule[{min(v)}] must equal max_draft_len because it is the smallest batch-size key.")
            if self.max_draft_len is not None and max(v.values()) > self.max_draft_len:
                raise ValueError("draft_len_schedule: all draft lengths must be <= max_draft_len.")
            self.draft_len_schedule = dict(sorted(v.items()))
            return self

else:

    class DecodingBaseConfig(StrictBaseModel):
        max_draft_len: int | None = None
        max_total_draft_tokens: int | None = None
        speculative_model_dir: str | Path | None = None
        max_concurrency: int | None = None


class EagleDecodingConfig(DecodingBaseConfig):
    eagle_choices: list[list[int]] | None = None
    greedy_sampling: bool | None = True
    posterior_threshold: float | None = None
    use_dynamic_tree: bool | None = False
    dynamic_tree_max_topK: int | None = None
    num_eagle_layers: int | None = None
    max_non_leaves_per_layer: int | None = None
    eagle3_one_model: bool | None = True
    eagle3_layers_to_capture: set[int] | None = None

    @model_validator(mode="after")
    def _check(self):
        # as the real validate_eagle_config: max_draft_len > 0, tree budget within topK * max_draft_len
        if not self.max_draft_len:
            raise ValueError("max_draft_len must be > 0 for Eagle")
        if self.use_dynamic_tree:
            if not self.dynamic_tree_max_topK:
                raise ValueError("dynamic_tree_max_topK should be provided")
            top = self.dynamic_tree_max_topK * self.max_draft_len
            self.max_total_draft_tokens = self.max_total_draft_tokens or top
            if not self.max_draft_len <= self.max_total_draft_tokens <= top:
                raise ValueError("max_total_draft_tokens out of range")
        if self.max_total_draft_tokens is None:
            self.max_total_draft_tokens = self.max_draft_len
        draft = getattr(self, "speculative_model", None) or getattr(self, "speculative_model_dir", None)
        if draft is None:
            raise ValueError("Draft model must be provided for EAGLE")
        return self

    @property
    def draft_dir(self):
        return getattr(self, "speculative_model", None) or getattr(self, "speculative_model_dir", None)


class SAEnhancerConfig(StrictBaseModel):
    threshold: int = Field(default=4, gt=0)
    enable_global_pool: bool = False


class SADecodingConfig(DecodingBaseConfig):
    max_matching_ngram_size: int = -1
    enable_global_pool: bool = False
    global_pool_size: int | None = None

    @model_validator(mode="after")
    def _check(self):
        if not self.max_draft_len or self.max_matching_ngram_size == 0:
            raise ValueError("SA needs max_draft_len > 0 and max_matching_ngram_size -1 or > 0")
        return self


if newer():

    class EagleDecodingConfig(EagleDecodingConfig):  # noqa: F811 - newer releases: decoding_type is a field
        decoding_type: Literal["Eagle"] = "Eagle"

    class Eagle3DecodingConfig(EagleDecodingConfig):
        decoding_type: Literal["Eagle3"] = "Eagle3"
        sa_config: SAEnhancerConfig | None = None

    class DFlashDecodingConfig(DecodingBaseConfig):
        # mask_token_id / target_layer_ids: None = read from the draft's config.json dflash_config
        mask_token_id: int | None = None
        target_layer_ids: list[int] | None = None
        decoding_type: Literal["DFlash"] = "DFlash"
        attention_backend: Literal["VANILLA", "TRTLLM"] = "VANILLA"

        @model_validator(mode="after")
        def _check(self):
            # as the real validator: one chain of max_draft_len drafts, verified as max_draft_len + 1 tokens
            if not self.max_draft_len:
                raise ValueError("max_draft_len must be > 0 for DFlash")
            if self.speculative_model is None:
                raise ValueError("Draft model must be provided for DFlash")
            self.max_total_draft_tokens = self.max_draft_len
            return self


    class DSparkDecodingConfig(DecodingBaseConfig):
        # None = read from the draft's config.json by TorchLlmArgs (see resolve_from_draft)
        mask_token_id: int | None = None
        target_layer_ids: list[int] | None = None
        block_size: int | None = Field(default=None, gt=0)
        markov_rank: int | None = None
        markov_head_type: Literal["vanilla", "gated", "rnn"] | None = None
        decoding_type: Literal["DSpark"] = "DSpark"
        attention_backend: Literal["VANILLA", "TRTLLM"] = "VANILLA"

        @model_validator(mode="after")
        def _check(self):
            self.max_total_draft_tokens = self.max_draft_len
            return self

        def resolve_from_draft(self, draft_cfg: dict) -> None:
            """As TorchLlmArgs.validate_speculative_config: max_draft_len > 0; each unset field from the draft's
            config.json (dspark_config, dflash_config, top-level dspark_<key>, top-level <key>); block_size then
            defaults to max_draft_len and must equal it."""
            if not self.max_draft_len:
                raise ValueError(f"DSpark max_draft_len must be > 0; got {self.max_draft_len}")
            sources = (draft_cfg.get("dspark_config") or {}, draft_cfg.get("dflash_config") or {}, draft_cfg)

            def get(key: str, top_level_key: str):
                for source, name in ((sources[0], key), (sources[1], key), (draft_cfg, top_level_key), (draft_cfg, key)):
                    if source.get(name) is not None:
                        return source[name]
                return None

            ckpt_layers = get("target_layer_ids", "dspark_target_layer_ids")
            if self.target_layer_ids is None:
                self.target_layer_ids = None if ckpt_layers is None else list(ckpt_layers)
            elif ckpt_layers is not None and list(self.target_layer_ids) != list(ckpt_layers):
                raise ValueError("DSpark target_layer_ids must match the checkpoint's dspark_target_layer_ids exactly")
            for field, top in (("mask_token_id", "dspark_noise_token_id"), ("block_size", "dspark_block_size"),
                               ("markov_rank", "dspark_markov_rank")):
                if getattr(self, field) is None:
                    setattr(self, field, get(field, top))
            if self.block_size is None:
                self.block_size = self.max_draft_len
            if self.block_size != self.max_draft_len:
                raise ValueError(f"DSpark block_size must equal max_draft_len; got block_size={self.block_size} and "
                                 f"max_draft_len={self.max_draft_len}")


class NGramDecodingConfig(DecodingBaseConfig):
    max_matching_ngram_size: int = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True


class DraftTargetDecodingConfig(DecodingBaseConfig):
    pass


class KvCacheConfig(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = 0.9
    dtype: str = "auto"
