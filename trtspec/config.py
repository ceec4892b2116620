"""One strict, typed build config: a YAML file plus `--set section.key=value` overrides.

Unknown keys and wrong types are errors that name the key, the file and the nearest valid key.
Fields that belong to the base model (hidden size, vocab, heads, positions) are not here: they are
read from the model itself (see convert.derive_eagle_config).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trtspec.errors import ConfigError

STAGES = ("data", "convert", "train", "quantize", "export", "engine", "validate")
QUANT_FORMATS = ("none", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "nvfp4")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


class ModelSection(Section):
    # demo:smollm2-135m-instruct, a local HF folder, a .gguf file, or a hub id (needs a network)
    source: str = "demo:smollm2-135m-instruct"
    # compute dtype; auto = float32 on CPU, bfloat16 on GPU
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


class DataSource(Section):
    # regenerate: answer `path` (prompts) with the target itself; jsonl: OpenAI/HF `messages` or
    # ShareGPT `conversations`; text: one document per line; hf: a datasets name (needs a network)
    kind: Literal["regenerate", "jsonl", "text", "hf"]
    path: str
    split: str = "train"
    # cap on rows taken from this source (null = all)
    limit: int | None = Field(default=None, ge=1)


class DataSection(Section):
    sources: list[DataSource] = Field(min_length=1)
    # training sequence length; longer conversations are truncated and counted
    seq_len: int = Field(default=256, ge=16, le=65536)
    # tokens the target writes per prompt when regenerating
    max_new_tokens: int = Field(default=160, ge=1, le=8192)
    # prompts answered per batch when regenerating (left-padded)
    batch_size: int = Field(default=8, ge=1, le=1024)
    # share of conversations kept out of training for acceptance evaluation
    holdout_fraction: float = Field(default=0.1, ge=0.0, lt=1.0)
    # regenerate with a system prompt-less chat template, greedy (the draft learns the greedy target)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    # the target's dtype while it writes answers; auto = model.dtype; fastest = bfloat16 on a GPU or a CPU with native
    # bf16 (AVX512-BF16/AMX; its greedy tokens agree with float32's on nearly every position, fine for training
    # text), else model.dtype (elsewhere bf16 is emulated and slower than float32)
    dtype: Literal["auto", "fastest", "float32", "bfloat16", "float16"] = "auto"


class ConvertSection(Section):
    # target layers whose hidden states feed the head; null = TensorRT-LLM's {1, L//2-1, L-4}
    aux_layers: list[int] | None = None
    # draft output vocabulary (most frequent training tokens, with d2t); null = the target's full vocab
    draft_vocab_size: int | None = Field(default=None, ge=16)
    # decoder layers in the head (EAGLE-3 uses 1)
    num_layers: int = Field(default=1, ge=1, le=8)
    # start the head from the target's weights (its layer after the deepest aux layer, final norm, lm_head rows;
    # trtspec.eagle.init_head_from_target) instead of modelopt's random init (better held-out AL: docs/results.md). Exact for
    # Llama/Mistral and Qwen2 (the head gets attention_bias for its q/k/v biases); Qwen3's q/k norms have no place
    # in an EAGLE-3 head, so there the copy is close, not equal (listed in convert's metrics: init_not_copied)
    init_from_target: bool = False
    # any other eagle_architecture_config field, applied last (e.g. intermediate_size: 1536)
    overrides: dict[str, Any] = Field(default_factory=dict)


class TrainSection(Section):
    # offline: target hidden states computed once and reused each epoch; online: target run every step
    mode: Literal["offline", "online"] = "offline"
    epochs: float = Field(default=3.0, gt=0)
    # stop after this many optimizer steps (null = epochs decide)
    max_steps: int | None = Field(default=None, ge=1)
    # train on the first N training rows only (a random sample: the data stage shuffles); null = all of them.
    # For learning curves (scripts/bench_recipe.py): the target's hidden states are still those of every row
    max_rows: int | None = Field(default=None, ge=1)
    batch_size: int = Field(default=4, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    lr: float = Field(default=5e-4, gt=0, lt=1)
    warmup_ratio: float = Field(default=0.05, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)
    # head training math (autocast) and the target's math while caching its hidden states; auto = bfloat16
    # on a GPU or on a CPU with native bf16 (AVX512-BF16/AMX), else float32
    precision: Literal["auto", "float32", "bfloat16"] = "auto"
    # train-time-test steps of the EAGLE-3 loss
    ttt_steps: int = Field(default=3, ge=1, le=8)
    save_steps: int = Field(default=100, ge=1)
    logging_steps: int = Field(default=10, ge=1)
    # acceptance evaluation on the held-out split during training (0 = only at the end)
    eval_steps: int = Field(default=0, ge=0)
    # held-out prompts the acceptance is measured on (the first N): on the demo 16 read AL@3 1.74 for a head
    # that 64 read 1.66, so fewer are noisy; each costs one greedy answer from the target (once per target)
    eval_prompts: int = Field(default=64, ge=1)


class QuantizeSection(Section):
    format: Literal["none", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "nvfp4"] = "none"
    kv_cache: Literal["none", "fp8"] = "none"
    calib_samples: int = Field(default=32, ge=1)
    # int4 block size; null = largest of 128/64/32 that divides every quantized layer's input width
    block_size: int | None = Field(default=None, ge=8)
    # agreement/perplexity measured over this many held-out prompts
    eval_prompts: int = Field(default=8, ge=1)
    eval_new_tokens: int = Field(default=32, ge=1)
    quantize_lm_head: bool = False


class ExportSection(Section):
    # draft dtype in the checkpoint; auto = the target's compute dtype
    draft_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # also export one draft step as ONNX and check it against PyTorch with onnxruntime
    onnx: bool = True
    # that check: max |onnxruntime - PyTorch| as a fraction of each output's scale (max |PyTorch|)
    onnx_tolerance: float = Field(default=1e-3, gt=0)


class EngineSection(Section):
    # where the engine stage runs the bundle: pytorch = TensorRT-LLM's LLM API (its PyTorch backend: EAGLE-3,
    # draft-target and n-gram; needs a GPU); vllm = vLLM (its CPU build runs here: bash scripts/setup.sh --engines vllm)
    backend: Literal["pytorch", "vllm"] = "pytorch"
    decoding: Literal["eagle3", "draft_target", "ngram"] = "eagle3"
    max_draft_len: int = Field(default=3, ge=1, le=16)
    tensor_parallel_size: int = Field(default=1, ge=1)
    max_batch_size: int = Field(default=8, ge=1)
    eagle3_one_model: bool = True
    use_dynamic_tree: bool = False
    dynamic_tree_max_topk: int = Field(default=4, ge=1)
    max_total_draft_tokens: int | None = Field(default=None, ge=1)
    free_gpu_memory_fraction: float = Field(default=0.8, gt=0, le=1)
    enable_block_reuse: bool = False
    # draft model for decoding: draft_target (HF folder or demo:...; relative to the YAML's folder)
    draft_model: str | None = None
    # n-gram drafting: longest prompt suffix matched against the pool
    ngram_max_matching: int = Field(default=2, ge=1, le=16)
    # --- measurement only (ENGINE_MEASUREMENT_KEYS: not in the bundle, so changing one redoes the engine stage only)
    # requests submitted together when timing (1 = one at a time; more = concurrent load, where speculation can stop
    # paying on a compute-bound machine); the first one's speedup is the headline
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8])
    # prompts (built-in, chat-templated) and answer length for the engine's checks
    num_prompts: int = Field(default=8, ge=1, le=64)
    max_new_tokens: int = Field(default=128, ge=1, le=8192)


ENGINE_MEASUREMENT_KEYS = ("batch_sizes", "num_prompts", "max_new_tokens")


class ValidateSection(Section):
    # prompts: null = the data stage's held-out split; else a JSONL (prompt|messages) or text file
    prompts: str | None = None
    num_prompts: int = Field(default=8, ge=1)
    max_new_tokens: int = Field(default=128, ge=1)
    draft_len: int = Field(default=3, ge=1, le=16)
    # chain | tree (static) | dynamic_tree (EAGLE-2 style top-k)
    draft_shape: Literal["chain", "tree", "dynamic_tree"] = "chain"
    tree_topk: int = Field(default=4, ge=1)
    tree_total_tokens: int = Field(default=16, ge=1)
    repeats: int = Field(default=2, ge=1)
    # torch.compile the runtime's decode/verify/draft passes (inductor, needs a C++ compiler; else eager, and the report says why)
    compile: bool = True
    # also time HF assisted generation and prompt lookup
    compare_hf_assisted: bool = True
    # small model (same tokenizer) for HF assisted generation; null = that comparison is skipped
    assistant_model: str | None = None
    # sampling check at temperature > 0 (statistical test on the first tokens)
    sampling_check: bool = True
    temperature: float = Field(default=0.8, gt=0, le=2.0)
    # gates: exit 1 when missed (null = not gated)
    min_acceptance_length: float | None = Field(default=None, ge=1.0)
    min_speedup: float | None = Field(default=None, gt=0)
    require_exact: bool = False


class BuildConfig(Section):
    # one line on what this recipe is for
    description: str = ""
    seed: int = 0
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection
    convert: ConvertSection = Field(default_factory=ConvertSection)
    train: TrainSection = Field(default_factory=TrainSection)
    quantize: QuantizeSection = Field(default_factory=QuantizeSection)
    export: ExportSection = Field(default_factory=ExportSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    validate_: ValidateSection = Field(default_factory=ValidateSection, alias="validate")

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    # where the YAML lives: relative paths inside it are relative to this folder (not a YAML key)
    _base_dir: Path = Path(".")

    @model_validator(mode="after")
    def _check_conflicts(self) -> BuildConfig:
        if self.quantize.format == "none" and self.quantize.kv_cache != "none":
            raise ValueError("quantize.kv_cache needs a quantize.format other than 'none'")
        if self.engine.decoding == "draft_target" and not self.engine.draft_model:
            raise ValueError("engine.decoding=draft_target needs engine.draft_model")
        return self

    def resolve_model_source(self, source: str) -> str:
        """A model named by a relative local path (a folder or a .gguf file) as an absolute one, relative to the
        YAML's folder like every other path in the config; demo: names and hub ids unchanged."""
        path = Path(source).expanduser()
        if source.startswith("demo:") or path.is_absolute():
            return source if source.startswith("demo:") else str(path)
        local = (self._base_dir / path).resolve()
        looks_local = source.startswith((".", "~")) or path.suffix == ".gguf" or local.exists()
        return str(local) if looks_local else source

    def resolve_path(self, p: str) -> Path:
        """A path from the config, relative to the config file's folder."""
        path = Path(p).expanduser()
        return path if path.is_absolute() else (self._base_dir / path).resolve()

    def section(self, name: str) -> dict[str, Any]:
        return getattr(self, "validate_" if name == "validate" else name).model_dump(mode="json")


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


def config_from_dict(raw: Any, source: str = "<config>", base_dir: Path | None = None) -> BuildConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(raw).__name__}")
    try:
        cfg = BuildConfig.model_validate(_coerce_numbers(raw))
    except ValidationError as e:
        errors = sorted(e.errors(), key=lambda err: err["type"] != "extra_forbidden")  # typos first
        lines = [_format_error(err, source) for err in errors]
        raise ConfigError(lines[0] + (f" (and {len(lines) - 1} more problem(s))" if len(lines) > 1 else "")) from None
    cfg._base_dir = base_dir or Path(".").resolve()
    cfg.model.source = cfg.resolve_model_source(cfg.model.source)
    if cfg.engine.draft_model:
        cfg.engine.draft_model = cfg.resolve_model_source(cfg.engine.draft_model)
    if cfg.validate_.assistant_model:
        cfg.validate_.assistant_model = cfg.resolve_model_source(cfg.validate_.assistant_model)
    return cfg


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> BuildConfig:
    """Read a build config YAML (and the one it `extends`), apply --set overrides, validate strictly."""
    path = Path(path)
    raw = apply_overrides(read_yaml_with_parents(path), list(overrides))
    return config_from_dict(raw, source=str(path), base_dir=path.resolve().parent)


def read_yaml_with_parents(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The YAML mapping at `path`; with `extends: other.yaml` (relative to it), that file's mapping first and this
    one merged over it section by section (a key set here wins; lists are replaced, not appended)."""
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist", "pass a YAML from build_configs/")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'extends' loops back to itself")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file") from None
    except OSError as e:
        raise ConfigError(f"config file '{path}' cannot be read: {e.strerror}") from None
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
