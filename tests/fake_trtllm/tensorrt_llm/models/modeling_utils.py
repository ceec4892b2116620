"""TEST DOUBLE: SpeculativeDecodingMode of the engine backend (the --speculative_decoding_mode choices)."""

from enum import Enum


class SpeculativeDecodingMode(Enum):
    NONE = "none"
    DRAFT_TOKENS_EXTERNAL = "draft_tokens_external"
    MEDUSA = "medusa"
    LOOKAHEAD_DECODING = "lookahead_decoding"
    EXPLICIT_DRAFT_TOKENS = "explicit_draft_tokens"
    EAGLE = "eagle"
