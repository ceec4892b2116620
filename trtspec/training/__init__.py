"""Training a draft, for every family (trtspec.draft_family.DraftFamily): the HF Trainer over the data stage's rows
(trainer), the frozen target's hidden states the draft reads (states), FSDP for a draft's weights (sharding) and the
acceptance measure on the target's greedy answers (acceptance). Nothing here knows a family: what is the family's own
(its training forward, its drafts, how its weights are saved) comes in through DraftFamily."""
