"""The deployment bundle's family-neutral parts: what a draft family's export hands back (ExportedDraft), the files
every bundle holds (check_bundle), the target as an HF folder, and the README's shared paragraphs (each draft family
writes its README with them: eagle.readme, dflash.readme).

Every path written into the bundle is relative to it; the README names a local model by its folder name only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.deploy.compat import ENGINES_CHECKED, add_legacy_keys
from trtspec.errors import ArtifactError

if TYPE_CHECKING:
    from trtspec.config import BuildConfig


@dataclass
class ExportedDraft:
    """A draft written to bundle/draft by its family's export."""

    info: dict  # what the README, the serving files and the metrics say about the draft
    label: str  # how the headline names it ("draft (float32)")
    model: Any = None  # the draft model, kept where the family measures acceptance with a quantized target
    tensors: list[str] | None = None  # the checkpoint's tensor names, where the engines' loaders are checked
    no_engine: str | None = None  # why no serving engine loads this draft: the bundle then has no launcher


BUNDLE_FILES = ("target/config.json", "draft/config.json", "draft/model.safetensors")  # whatever the draft's family


def check_bundle(bundle: Path) -> None:
    """The files every exported bundle holds (BUNDLE_FILES and the target's weights), else one ArtifactError naming
    each missing one: what validate and bench read before loading anything."""
    missing = [f for f in BUNDLE_FILES if not (bundle / f).is_file()]
    if not list((bundle / "target").glob("*.safetensors")):
        missing.append("target/*.safetensors")
    if missing:
        raise ArtifactError(f"bundle '{bundle}' is missing {', '.join(missing)}", "re-run the export stage (trtspec export --force)")


def export_target(model: Any, tok: Any, out: Path, dtype: Any, quantized: bool) -> None:
    """The target as an HF folder: modelopt's unified (quantized) checkpoint, or a plain save."""
    if quantized:
        from modelopt.torch.export import export_hf_checkpoint

        export_hf_checkpoint(model, dtype=dtype, export_dir=out)
    else:
        model.to(dtype).save_pretrained(out)
    tok.save_pretrained(out)
    for name in ("config.json", "generation_config.json"):
        if not (out / name).is_file():
            raise ArtifactError(f"the target export wrote no {name}", "check the model's transformers version")
    add_legacy_keys(out)


def family_lines(target: Path, template_kwargs: dict | None = None, template_file: str | None = None) -> list[str]:
    """The README's paragraph on the target's family: which engines serve a draft for it (their support tables), the
    chat template it is served with (model.chat_template) and the variables set in it (model.chat_template_kwargs)."""
    from trtspec.engines import sglang, trtllm, vllm
    from trtspec.targets import family_if_known

    sets = ", ".join(f"`{k} = {json.dumps(v)}`" for k, v in (template_kwargs or {}).items())
    template = [f"The target's chat template is `{Path(template_file).name}` (model.chat_template), in place of the "
                "model's own: the draft was trained and measured on prompts rendered with it, and `target/` carries it, "
                "so every engine serving `target/` renders them so (no --chat-template needed).", ""] if template_file else []
    template += [f"The target's chat template sets {sets} at its top (model.chat_template_kwargs): the draft was trained "
                 "and measured on prompts rendered so, and every engine serving `target/` renders them so, whatever a "
                 "request's own chat_template_kwargs say.", ""] if sets else []
    f = family_if_known(target)
    if f is None:
        return template
    v, t, g = vllm.support.support(f.name), trtllm.support_row(f.name), sglang.support_row(f.name)
    served = "serves an EAGLE-3 draft for it" + (f" (not a DFlash one: {v.dflash})" if v.dflash else ", and a DFlash one")
    trt = f"serves EAGLE-3 {t['eagle3']}" if t["eagle3"] else "serves no EAGLE-3 draft for it"
    dflash = "and its DFlash (one-model) lists it" if t["dflash"] else "and its DFlash lists no such target"
    sgl = f"SGLang ({g['file']}) " + ("serves an EAGLE-3 draft for it." if g["eagle3"] else "serves no EAGLE-3 draft for it.")
    return template + [
        f"Target family `{f.name}`" + (f" ({f.note})" if f.note else "") + f". vLLM ({v.file}) "
        f"{f'does not: {v.eagle3}' if v.eagle3 else served}. TensorRT-LLM, by its sources, {trt}, {dflash}. {sgl} "
        "trtspec validated it on its "
        + ("native runtime." if f.runtime == "native" else "runtime's HF path (the model's own forward and cache).")]


def engine_table(not_served: dict[str, list[str]]) -> list[str]:
    """The README's table of engines: how each was checked, or why it cannot load the draft (and has no launcher)."""
    return [
        "| engine | checked |",
        "|---|---|",
        *[f"| {name} | {how} |" if name not in not_served else
          f"| {name} | cannot load this draft as trained ({'; '.join(not_served[name])}): no launcher |"
          for name, how in ENGINES_CHECKED.items()],
    ]


def source_name(cfg: BuildConfig) -> str:
    """How the README names the target: demo: and tiny: names and hub ids as written, a local folder or file by its
    name only (the bundle must not name this machine's paths)."""
    source = cfg.model.source
    if not source.startswith(("demo:", "tiny:")) and Path(source).expanduser().exists():
        return Path(source).name
    return source


def built_with() -> list[str]:
    """The README's closing section: the versions of the packages that built the bundle."""
    from trtspec.artifacts import package_versions

    return ["", "## Built with", "", ", ".join(f"{k} {v}" for k, v in package_versions().items()), ""]
