"""The DFlash block drafter's section of the build config (`dflash`; DSpark through its projector)."""

from __future__ import annotations

from typing import Literal

from trtspec.sections import VOCAB_MAX, LayerId, Section, key


class DFlashSection(Section):
    block_size: int = key(8, "tokens in a draft block: the last verified token and block_size - 1 guesses (DSpark: "
                          "block_size), all from one pass (DFlash's paper and Model Optimizer use 8 or 16)", ge=2, le=32)
    num_layers: int = key(2, "decoder layers in the draft (one target layer feeds each)", ge=1, le=8)
    target_layers: list[LayerId] | None = key(None, "target layers whose outputs feed the draft, one per draft layer; "
                                              "null = Model Optimizer's uniform pick", min_length=1, max_length=8)
    intermediate_size: int | None = key(None, "the draft's MLP width; null = the target's", ge=16, le=1 << 20)
    mask_token_id: int | None = key(None, "the token standing for the unknown positions of a block; null = the "
                                    "tokenizer's mask token, else a special token no training label uses",
                                    ge=0, lt=VOCAB_MAX)
    attention: Literal["bidirectional", "causal"] = key(
        "bidirectional", "attention inside a block: bidirectional (DFlash) or causal (each guess sees earlier "
        "positions only)")
    anchors: int = key(32, "block anchors sampled per training row and step (Model Optimizer's dflash_num_anchors)",
                       ge=1, le=4096)
    loss: Literal["dpace", "decay"] = key("dpace", "weights of the block positions in the loss: dpace = confidence-"
                                          "derived (D-PACE), decay = exp(-(k - 1) / gamma) at position k, "
                                          "gamma 4 for a block of 8, 7 for 16 (the DFlash paper's)")
    projector: Literal["dflash", "dspark"] = key(
        "dflash", "how a block's rows become guesses (Model Optimizer's projector_type): dflash = each masked row "
        "guesses its own token, all at once; dspark = DeepSeek's DSpark: each row guesses the token after it "
        "(block_size guesses a pass), plus a low-rank Markov head's logit bias from the guess before it, one guess "
        "after another")
    markov_rank: int = key(256, "dspark: rank r of the Markov head, a vocab x r embedding of the previous token and an "
                           "r x vocab projection (2 x vocab x r parameters, the projection read once per guess; "
                           "DeepSpec uses 256)", ge=1, le=4096)
    markov_head: Literal["vanilla", "gated", "rnn"] = key(
        "vanilla", "dspark: the Markov head's bias: vanilla = from the previous token alone; gated = its embedding gated "
        "by the backbone's row; rnn = a GRU-like state carried through the block (the whole prefix)")
    ce_weight: float = key(0.1, "dspark: weight of the cross-entropy on the answer's tokens in the loss (DeepSpec: 0.1)",
                           ge=0, le=100)
    tvd_weight: float = key(0.9, "dspark: weight of the total-variation distance between the draft's and the target's "
                            "next-token distributions, 1 - TVD being a sampled guess's acceptance chance (DeepSpec: 0.9)",
                            ge=0, le=100)

    @property
    def guesses(self) -> int:
        """Tokens one block drafts: DFlash's rows 1..block_size - 1, DSpark's rows 0..block_size - 1."""
        return self.block_size if self.projector == "dspark" else self.block_size - 1
