"""The checks validate runs on a bundle, each a function of what the runtime and HF produced: the reference a
quantized target is held to, the greedy match, acceptance statistics, the speeds per category, the sampling check
at temperature > 0, and the gates (how the methods are timed and what limits their speed: trtspec.measure)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.errors import DataError, ModelError
from trtspec.generation import first_divergence, hf_answer

if TYPE_CHECKING:
    from trtspec.config import BuildConfig


def check_context_length(rows: list[dict], prompts: list[list[int]], max_new: int, ctx_len: int, source: str = "") -> None:
    """Every prompt and `max_new` answer tokens fit the target's window, else one line naming the first that does not."""
    too_long = [(r["id"], len(p)) for r, p in zip(rows, prompts, strict=True) if len(p) + max_new > ctx_len]
    if too_long:
        where = f"{source}: " if source else ""
        raise DataError(f"{where}{len(too_long)} prompt(s) (first: {too_long[0][0]}, {too_long[0][1]} tokens) plus {max_new} "
                        f"new tokens exceed the target's context of {ctx_len}",
                        "use shorter prompts or lower eval.max_new_tokens")


def hf_quantized_reference(source: Path, target_dir: Path) -> Any:
    """The bundle's quantized target as transformers runs it with its weights dequantized (the original architecture,
    from the bundle's config; `source` is the original model, whose architecture the bundle keeps)."""
    import torch

    from trtspec.runtime.hf_target import dequantized_model

    return dequantized_model(target_dir, torch.float32)[0]


def quantized_reference(source: Path, target_dir: Path, quant: dict, dq_notes: list[str], rows: list[dict],
                        prompts: list[list[int]], hf_out: list[list[int]], max_new: int, eos: set[int]) -> tuple[list, str, dict]:
    """A quantized target's reference: HF generate on the original architecture with the bundle's dequantized
    weights, and how far that is from the unquantized model. -> (outputs, what they are, the quantization report)."""
    import torch

    hfq = hf_quantized_reference(source, target_dir)
    with torch.inference_mode():
        reference = [hf_answer(hfq, p, max_new, eos) for p in prompts]
    div = [first_divergence(a, b) for a, b in zip(hf_out, reference, strict=True)]
    report = {
        "format": quant.get("quantization", quant).get("quant_algo", "?") if isinstance(quant, dict) else "?",
        "dequantized": True, "dropped": dq_notes,
        "note": "weights dequantized to float32 (weight * weight_scale); activation/KV quantization is not simulated",
        "identical_to_unquantized": sum(d is None for d in div),
        "first_divergence_from_unquantized": {r["id"]: d for r, d in zip(rows, div, strict=True) if d is not None},
    }
    return reference, "HF generate, original architecture with the bundle's weights dequantized (weight * weight_scale), float32", report


def hf_assisted_methods(cfg: BuildConfig, hf: Any, source: Path, eos: set[int]) -> tuple[dict, dict[str, str], dict[str, str]]:
    """HF's own speed-ups to compare with: prompt lookup, and assisted generation with validate.assistant_model (or,
    without one, HF's self-speculation from the target's first layers). -> (methods, skipped, notes)."""
    from trtspec.models import load_model, resolve_model
    from trtspec.runtime.drafters import same_tokenizer

    v, n_new = cfg.validate_, cfg.eval.max_new_tokens
    if not v.compare_hf:
        why = "validate.compare_hf is false"
        return {}, {"hf_assisted": why, "hf_prompt_lookup": why}, {}
    methods = {"hf_prompt_lookup": lambda p: hf_answer(hf, p, n_new, eos, prompt_lookup_num_tokens=cfg.draft.length)}
    notes = {}
    if v.assistant_model:
        assistant_dir = resolve_model(v.assistant_model)
        if not same_tokenizer(assistant_dir, source):
            raise ModelError(f"validate.assistant_model '{v.assistant_model}' has another tokenizer than the target")
        assistant = load_model(assistant_dir, "float32", "cpu")
        methods["hf_assisted"] = lambda p: hf_answer(hf, p, n_new, eos, assistant_model=assistant)
    else:
        exit_layer = max(1, hf.config.num_hidden_layers // 4)
        methods["hf_assisted"] = lambda p: hf_early_exit_answer(hf, p, n_new, eos, exit_layer)
        notes["hf_assisted"] = f"HF assisted generation, assistant_early_exit={exit_layer} (validate.assistant_model not set)"
    return methods, {}, notes


def hf_early_exit_answer(hf: Any, prompt: list[int], max_new: int, eos: set[int], exit_layer: int) -> list[int]:
    """HF assisted generation drafting with the target's own first `exit_layer` layers. transformers sets the model's
    num_hidden_layers to `exit_layer` for each draft and back after it; a draft that raises (its cache on some layer
    patterns: GPT-OSS, Gemma 4) left the model that short, and every later generate on it failed: set back here."""
    config = getattr(hf, hf.base_model_prefix).config
    layers = config.num_hidden_layers
    try:
        return hf_answer(hf, prompt, max_new, eos, assistant_early_exit=exit_layer)
    finally:
        config.num_hidden_layers = layers


def runnable_comparisons(methods: dict, prompt: list[int], skipped: dict[str, str], log: Any,
                         baseline: Callable[[list[int]], list[int]] | None = None, min_speed: float = 0.0) -> dict:
    """The optional comparisons (HF's own speed-ups) worth timing on this model, each tried once on one prompt: one
    that raises inside the library (transformers' assisted generation fails on some layer patterns) is skipped with
    its reason in the report, and the build goes on; with `baseline` (HF generate), one reading under `min_speed`
    times the baseline's speed on that prompt is skipped with both figures (not timed over every prompt)."""
    import time

    kept, base_tps = {}, None
    for name, method in methods.items():
        start = time.perf_counter()
        try:
            tokens = len(method(prompt))
        except Exception as e:  # noqa: BLE001 - a library's failure on this model: a comparison the report goes without
            skipped[name] = f"transformers raised {type(e).__name__} on this model: {str(e).splitlines()[0][:160] if str(e) else ''}"
            log(f"{name} skipped: {skipped[name]}")
            continue
        tps = tokens / (time.perf_counter() - start)
        if baseline is not None and min_speed > 0:
            if base_tps is None:
                start = time.perf_counter()
                base_tps = len(baseline(prompt)) / (time.perf_counter() - start)
            if tps < min_speed * base_tps:
                skipped[name] = (f"{tps / base_tps:.2f}x HF generate on the first prompt ({tps:.1f} against {base_tps:.1f} "
                                 f"tok/s), under validate.compare_hf_min_speed {min_speed}: not timed further")
                log(f"{name} skipped: {skipped[name]}")
                continue
        kept[name] = method
    return kept


def sampling_check(target: Any, drafter: Any, prompt: list[int], spec: Any, temperature: float, eos: set[int], n: int, seed: int,
                   repeat: bool = False) -> dict:
    """Distribution of the first speculated token vs the target's exact one (chi-square, pooled small bins).

    `drafted`: how many of the samples had a draft to verify. A suffix drafter proposes only after a match, so with
    `repeat` the context is the prompt followed by its last 16 tokens again (the last of them given as the first
    generated token): its suffix then matches the prompt's end and every sample verifies a suffix draft."""
    import torch

    from trtspec.runtime.decode import generate, prefill, speculative_decode

    if repeat:
        tail = prompt[-16:]
        prompt, first = prompt + tail[:-1], tail[-1]
    p = torch.tensor(prompt)
    if not repeat:
        first = generate(target, p, 1).tokens[0]
    with torch.inference_mode():
        exact = torch.softmax(prefill(target, torch.tensor(prompt + [first]))[0].float() / temperature, -1)
    g = torch.Generator().manual_seed(seed)
    counts, drafted = Counter(), 0
    for _ in range(n):
        out = speculative_decode(target, drafter, p, 2, spec, eos=set(), temperature=temperature, generator=g, first_token=first)
        counts[out.tokens[1]] += 1
        drafted += sum(out.stats.drafted) > 0
    expected = exact * n
    big = (expected >= 5).nonzero().flatten().tolist()
    obs = [counts.get(t, 0) for t in big] + [n - sum(counts.get(t, 0) for t in big)]
    exp = [float(expected[t]) for t in big] + [n - float(expected[big].sum())]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True) if e > 0)
    dof = max(1, len(obs) - 1)
    tv = 0.5 * sum(abs(counts.get(t, 0) / n - float(exact[t])) for t in set(counts) | set(big))
    return {"samples": n, "temperature": temperature, "bins": len(obs), "chi2": round(chi2, 2), "dof": dof,
            "threshold": round(dof + 4 * (2 * dof) ** 0.5, 2), "passed": chi2 < dof + 4 * (2 * dof) ** 0.5,
            "total_variation": round(tv, 4), "drafted": drafted,
            "context": "the shortest prompt and its last 16 tokens again" if repeat else "the shortest prompt"}


def target_identity(model_config: Any) -> dict:
    """What makes two reports' acceptance comparable on the target's side: its family and shape."""
    from trtspec.targets import text_config

    t = text_config(model_config)
    return {"model_type": t.model_type, "hidden_size": t.hidden_size, "layers": t.num_hidden_layers,
            "vocab_size": t.vocab_size}


def read_baseline(path: Path, identity: dict, draft_len: int) -> dict[str, float]:
    """validate.baseline: {category: AL} from an earlier validate report.json (or any JSON with its per_category),
    refused in one line when it is no such file, or measured on another target or draft length."""
    import json

    from trtspec.errors import ConfigError

    where = f"validate.baseline '{path}'"
    if not path.is_file():
        raise ConfigError(f"{where} does not exist", "name an earlier run's validate/report.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{where} is not JSON ({e.__class__.__name__})", "name an earlier run's validate/report.json") from None
    cats = data.get("per_category") if isinstance(data, dict) else None
    if not isinstance(cats, dict) or not cats or not all(
            isinstance(v, dict) and isinstance(v.get("acceptance_length"), (int, float)) for v in cats.values()):
        raise ConfigError(f"{where} has no per_category acceptance lengths",
                          "a validate report.json has them: {\"per_category\": {\"math\": {\"acceptance_length\": 2.1}}}")
    if (other := data.get("target")) and other != identity:
        raise ConfigError(f"{where} was measured on another target ({describe(other)}; this build: {describe(identity)})",
                          "compare with a report of the same model")
    if data.get("draft_len") not in (None, draft_len):
        raise ConfigError(f"{where} was measured at draft length {data['draft_len']}, this build drafts {draft_len}",
                          "AL depends on the draft length: compare like with like")
    return {c: float(v["acceptance_length"]) for c, v in cats.items()}


def check_baseline_categories(baseline: dict[str, float], categories: set[str], where: str) -> None:
    """A baseline that shares no category with the prompts this run measures gates nothing: refused, naming both."""
    from trtspec.errors import ConfigError

    if categories and not categories & set(baseline):
        raise ConfigError(f"validate.baseline '{where}' shares no category with this run's prompts (baseline: "
                          f"{', '.join(sorted(baseline))}; this run: {', '.join(sorted(categories))})",
                          "name a report measured on the same prompt set, or give prompts of its categories")


def describe(identity: dict) -> str:
    return (f"{identity.get('model_type')} {identity.get('hidden_size')} wide, {identity.get('layers')} layers, "
            f"vocab {identity.get('vocab_size')}")


def baseline_gate(report: dict, baseline: dict[str, float], tolerance: float, min_prompts: int = 1) -> dict:
    """Per category measured in both: AL may fall at most `tolerance` (relative) below the baseline's. A category
    this run measured on fewer than `min_prompts` prompts is listed (too_few_prompts), not gated."""
    cats = report["per_category"]
    few = sorted(c for c in baseline if c in cats and (cats[c].get("prompts") or min_prompts) < min_prompts)
    now = {c: v["acceptance_length"] for c, v in cats.items() if c not in few}
    dropped = {c: (now[c], base) for c, base in baseline.items() if c in now and now[c] < base * (1 - tolerance)}
    worst = min(dropped, key=lambda c: dropped[c][0] / dropped[c][1]) if dropped else None
    message = (f"category '{worst}': AL {dropped[worst][0]:.2f} is {1 - dropped[worst][0] / dropped[worst][1]:.1%} below "
               f"the baseline's {dropped[worst][1]:.2f} (tolerance {tolerance:.0%})" if worst else
               f"per-category AL within {tolerance:.0%} of the baseline")
    if few:
        message += f"; not gated, fewer than {min_prompts} prompts: {', '.join(few)}"
    return {"gate": "baseline", "passed": not dropped, "message": message, "too_few_prompts": few,
            "compared": sorted(set(now) & set(baseline)), "not_measured": sorted(set(baseline) - set(now)),
            "dropped": {c: {"now": a, "baseline": b} for c, (a, b) in dropped.items()}}


def check_gates(v: Any, report: dict, baseline: dict[str, float] | None = None) -> list[dict]:
    gates = []
    if v.require_exact:
        m = report["greedy_match"]
        gates.append({"gate": "require_exact", "passed": m["matched"] == m["total"],
                      "message": f"greedy outputs identical on {m['matched']}/{m['total']} prompts (required: all)"})
    if v.min_acceptance_length is not None:
        gates.append({"gate": "min_acceptance_length", "passed": report["acceptance_length"] >= v.min_acceptance_length,
                      "message": f"acceptance length {report['acceptance_length']:.2f} < required {v.min_acceptance_length}"})
    if v.min_speedup is not None:
        gates.append({"gate": "min_speedup", "passed": report["speedup_vs_hf"] >= v.min_speedup,
                      "message": f"speedup {report['speedup_vs_hf']:.2f}x over HF generate < required {v.min_speedup}x"})
    if baseline is not None:
        gates.append(baseline_gate(report, baseline, v.baseline_tolerance, v.baseline_min_prompts))
    return gates


def greedy_match(rows: list[dict], outputs: dict[str, list], reference: list[list[int]]) -> dict:
    """How many speculative (and no-draft) greedy outputs equal the reference, and where the others first differ."""
    spec = [g.tokens for g in outputs["speculative"]]
    nodraft = [g.tokens for g in outputs["runtime_no_draft"]]
    mismatches = {r["id"]: first_divergence(s, ref) for r, s, ref in zip(rows, spec, reference, strict=True) if s != ref}
    return {"matched": len(rows) - len(mismatches), "total": len(rows), "first_divergence": mismatches,
            "runtime_no_draft_matched": sum(a == b for a, b in zip(nodraft, reference, strict=True))}


def acceptance_summary(rows: list[dict], generations: list, k: int, reference: list[list[int]] | None = None) -> dict:
    """AL = tokens per target forward in the decode phase; its histogram, per-position rate, and per category of the
    prompts (their `category`): AL with its 95% bootstrap interval over the category's prompts, per-position
    acceptance, and how many greedy outputs equal the reference."""
    from trtspec.runtime import Stats

    total, groups = Stats(), defaultdict(list)
    for i, (r, g) in enumerate(zip(rows, generations, strict=True)):
        total.merge(g.stats)
        groups[r["category"]].append(i)
    return {
        "acceptance_length": round(total.acceptance_length(), 3),
        "acceptance_histogram": total.histogram(k),
        "per_position_acceptance": [round(x, 4) for x in total.per_position(k)],
        "per_category": {c: category_summary([generations[i] for i in idx], k,
                                             None if reference is None else [reference[i] for i in idx])
                         for c, idx in sorted(groups.items())},
    }


def category_speeds(rows: list[dict], timed: dict[str, dict], methods: tuple[str, ...] = ("speculative", "runtime_no_draft")) -> dict:
    """Per prompt category: each method's tokens/s over the category's prompts in every repetition (interleaved's
    run_seconds, run i of a repetition = prompt i), and the draft's speedup over the runtime without it there."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[r["category"]].append(i)
    n = len(rows)
    reps = len(timed[methods[0]]["run_seconds"]) // n
    out = {}
    for c, idx in sorted(groups.items()):
        tps = {}
        for m in methods:
            tokens = sum(len(o if isinstance(o, list) else o.tokens) for o in (timed[m]["outputs"][i] for i in idx))
            seconds = sum(timed[m]["run_seconds"][rep * n + i] for rep in range(reps) for i in idx)
            tps[m] = round(tokens * reps / seconds, 1)
        out[c] = {"tokens_per_s": tps, "speedup_vs_no_draft": round(tps[methods[0]] / tps[methods[1]], 3)}
    return out


def category_summary(generations: list, k: int, reference: list[list[int]] | None) -> dict:
    """One category's acceptance: AL (tokens per target forward) pooled over its prompts, its interval from
    resampling those prompts (runtime.decode.al_interval), P(draft position j accepted | proposed), exact outputs."""
    from trtspec.runtime import Stats
    from trtspec.runtime.decode import al_interval

    stats = Stats()
    for g in generations:
        stats.merge(g.stats)
    # per prompt: (tokens, target forwards) = (steps + accepted drafts, steps)
    per_prompt = [(g.stats.steps + sum(g.stats.accepted), g.stats.steps) for g in generations]
    out = {"prompts": len(generations), "acceptance_length": round(stats.acceptance_length(), 3),
           "ci95": al_interval(per_prompt), "per_position": [round(x, 4) for x in stats.per_position(k)],
           "steps": stats.steps}
    if reference is not None:
        out["exact"] = sum(g.tokens == r for g, r in zip(generations, reference, strict=True))
    return out


def context_curve(target: Any, drafter: Any, prompts: list[dict], fill: list, tok: Any, bins: list[int],
                  k: int, max_new: int, eos: Any, log: Any = None) -> list[dict]:
    """Acceptance by context length: each prompt after earlier conversations or documents (chat.at_context: `fill`)
    filling each bin's tokens of context before the answer; greedy chains of
    k checked against the target without a draft -> per bin {bin, context_tokens (mean), category_summary's AL,
    interval, per position, exact, vs_shortest (AL over the first bin's)}. Each prompt starts its history at its
    own place, so the bins differ in length only."""
    import torch

    from trtspec.chat import at_context, encode_row
    from trtspec.runtime import DraftSpec, generate, speculative_decode

    spec, rows = DraftSpec(shape="chain", k=k), []
    for b in bins:
        runs, plains, lengths = [], [], []
        for row, n in at_context(prompts, fill, tok, b):
            ids = torch.tensor(encode_row(tok, row))
            plains.append(generate(target, ids, max_new, eos).tokens)
            runs.append(speculative_decode(target, drafter, ids, max_new, spec, eos))
            lengths.append(n)
        rows.append({"bin": b, "context_tokens": round(sum(lengths) / len(lengths)), **category_summary(runs, k, plains)})
        rows[-1]["vs_shortest"] = round(rows[-1]["acceptance_length"] / rows[0]["acceptance_length"], 3)
        if log:
            r = rows[-1]
            log(f"context {b}: {r['context_tokens']} tokens, AL {r['acceptance_length']:.2f} ({r['ci95'][0]:.2f}-"
                f"{r['ci95'][1]:.2f}), identical {r['exact']}/{r['prompts']}, {r['vs_shortest']:.2f}x the shortest bin's")
    return rows


def drafting_summary(outputs: dict[str, list], reference: list[list[int]], tps: dict[str, float], methods: list[str],
                     suffix_len: int) -> dict:
    """The drafting methods side by side: AL, tokens/s, greedy outputs equal to the reference, and the fastest
    (`trtspec deploy triton` serves that one; suffix_len sizes its suffix drafts)."""
    from trtspec.runtime import Stats

    out = {}
    for m in methods:
        stats = Stats()
        for g in outputs[m]:
            stats.merge(g.stats)
        out[m] = {"acceptance_length": round(stats.acceptance_length(), 3), "tokens_per_s": tps[m],
                  "identical": sum(g.tokens == r for g, r in zip(outputs[m], reference, strict=True))}
    return {"methods": out, "fastest": max(methods, key=lambda m: tps[m]), "suffix_len": suffix_len}
