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

ARCHITECTURE = "DFlash2DraftModel"  # what an exported DFlash2 draft's config.json names (vLLM's registry entry)
SELECTOR_KEY = "candidate_selector."  # the selector's weights in the export, beside the block's
# why trtspec runs no engine with it and writes no launcher: in the engines' sources read, only vLLM's V2 model
# runner drafts with DFlash2 (vllm/config/vllm.py refuses it on V1: "DFlash candidate-head drafts"; V1 would load it
# as DFlash and drop the selector silently), and that runner's DFlash2 speculator is Triton kernels on a GPU
NO_ENGINE = ("a DFlash2 draft is served by vLLM's V2 model runner on a GPU only (VLLM_USE_V2_MODEL_RUNNER=1, "
             "--speculative-config '{\"method\": \"dflash\", \"model\": \"draft\", \"num_speculative_tokens\": K}'): "
             "vLLM's CPU build refuses it ('Model Runner V1 does not support: DFlash candidate-head drafts') and "
             "TensorRT-LLM and SGLang have no DFlash2 drafter, so the bundle has no launcher and trtspec's runtime "
             "serves it in validate")
