"""DFlash2 (z-lab's DFlash2: speculators 0.9 trains it, vLLM 0.32 serves it as `method: dflash` with
`architectures: [DFlash2DraftModel]`): a DFlash block drafter with two additions, both the identity at start, so an
untrained DFlash2 is the DFlash it is built on.

    per draft layer:  h = conv_a.prepare(norm(x));  x += conv_a.finish(attn(h));  h = conv_m.prepare(norm(x));
                      x += conv_m.finish(mlp(h))
    conv (along the block's rows, causal):  out_j = sum_t (base_t + delta_jt) * y_{j-t},  delta_j = W norm(x)_j
                      (grouped: one coefficient per conv_group_size channels; context rows never pass through it)
    selector (per guessing row j, after the block's logits u_j):
                      C_j = top-k(u_j);  s_j(prev, c) = u_j[c] + sum_r P[prev, r] (W_h hid_j)[r] S[c, r]
                      guess_j = argmax_c s_j(guess_{j-1}, c),  guess_0's predecessor = the root

The backbone is Model Optimizer's DFlash (`mtsp.convert` mode dflash, the `dflash` config section); Model Optimizer
has no DFlash2, so the convolutions and the selector are speculators' own modules (`speculators.models.dflash2`),
attached to the converted draft (head.py). Its export is Model Optimizer's DFlash export with the architecture and
the dflash_config keys vLLM's qwen3_dflash2 reads (export.py); trtspec's runtime drafts with it (runtime.py).
"""
