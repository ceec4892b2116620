"""DFlash2's own section of the build config (`dflash2`); its backbone is the dflash section's."""

from __future__ import annotations

from trtspec.sections import Section, key


class DFlash2Section(Section):
    """DFlash2's own settings (draft.method: dflash2); its backbone is the dflash section's."""

    conv_kernel_size: int = key(2, "taps of the causal convolutions around each draft layer's attention and MLP, along "
                                "the block's rows (z-lab's and speculators' default: 2)", ge=1, le=16)
    conv_group_size: int = key(16, "channels sharing one token-dependent kernel coefficient (must divide the hidden "
                               "size; speculators' default: 16)", ge=1, le=4096)
    selector_rank: int = key(64, "rank r of the candidate selector's bilinear score from the previous token (2 x "
                             "vocab x r parameters; speculators' default 256 is for 150k-token vocabularies)", ge=1, le=4096)
    selector_top_k: int = key(16, "candidates per block row the selector re-scores: the top of the row's own logits "
                              "(a token outside them is never drafted)", ge=2, le=1024)
    selector_weight: float = key(1.0, "weight of the selector's cross-entropy beside the block's own loss", ge=0, le=100)
