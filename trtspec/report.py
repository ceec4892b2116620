"""The validate report: report.json, report.md and PNG plots (matplotlib Figure objects, no pyplot state)."""

from __future__ import annotations

import json
from pathlib import Path


def speedup_text(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"


def _save(out: Path, name: str, fig) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    return name


def _plots(out: Path, r: dict) -> list[str]:
    # Figure objects, not pyplot: no global backend switch (an inline Jupyter backend keeps working)
    from matplotlib.figure import Figure

    k = r["draft_len"]
    fig = Figure(figsize=(5, 3))
    ax = fig.subplots()
    ax.bar(range(k + 1), r["acceptance_histogram"], color="tab:blue")
    ax.set(xlabel="draft tokens accepted per target forward", ylabel="steps", title=f"acceptance (AL {r['acceptance_length']:.2f})")
    files = [_save(out, "acceptance_histogram.png", fig)]

    fig = Figure(figsize=(5, 3))
    ax = fig.subplots()
    ax.plot(range(1, k + 1), r["per_position_acceptance"], marker="o")
    ax.set(xlabel="draft position", ylabel="P(accepted | proposed)", ylim=(0, 1.05), title="per-position acceptance")
    files.append(_save(out, "per_position_acceptance.png", fig))

    tps = r["tokens_per_s"]
    fig = Figure(figsize=(6, 3))
    ax = fig.subplots()
    ax.barh(list(tps), list(tps.values()), color=["tab:gray" if m != "speculative" else "tab:green" for m in tps])
    ax.set(xlabel="tokens/s (batch 1)", title=f"speed: {r['speedup_vs_hf']:.2f}x over HF generate")
    files.append(_save(out, "speed.png", fig))
    if r.get("per_category"):
        files.append(_interval_plot(out, "acceptance_by_category.png", list(r["per_category"]),
                                    list(r["per_category"].values()), "category", "acceptance by category"))
    if r.get("per_context"):
        files.append(_interval_plot(out, "acceptance_by_context.png", [str(c["context_tokens"]) for c in r["per_context"]],
                                    r["per_context"], "tokens of context before the answer", "acceptance by context length"))
    return files


def _interval_plot(out: Path, name: str, labels: list[str], rows: list[dict], xlabel: str, title: str) -> str:
    """AL per group (rows with acceptance_length and ci95) with its 95% interval as error bars."""
    from matplotlib.figure import Figure

    al = [v["acceptance_length"] for v in rows]
    err = [[a - v["ci95"][0] for a, v in zip(al, rows, strict=True)], [v["ci95"][1] - a for a, v in zip(al, rows, strict=True)]]
    fig = Figure(figsize=(max(4, 0.9 * len(labels) + 2), 3))
    ax = fig.subplots()
    ax.errorbar(range(len(labels)), al, yerr=err, fmt="o", capsize=4)
    ax.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 4 else 0)
    ax.set(xlabel=xlabel, ylabel="AL (95% interval)", title=title)
    return _save(out, name, fig)


def draft_storage(draft_kernels: dict | None) -> str:
    """' The draft's weights: bfloat16 (timed ...)' where the loader decided how to store them, else ''."""
    d = (draft_kernels or {}).get("draft_weights")
    if not d:
        return ""
    timed = ", ".join(f"{k} {v:.1f} ms" for k, v in d.get("ms_per_pass", {}).items())
    return f" The draft's weights: {d['weights']}" + (f" (its products over 1..8 rows: {timed})." if timed else ".")


def pass_kind(target_kernels: dict) -> str:
    """How the target's decode and verification passes run: one native call each, or the compiled `forward`."""
    if target_kernels.get("native_pass"):
        return " The target's decode and verification passes run as one native call each (`decoder_step`)."
    return " The target's decode and verification passes run as its compiled `forward` (no native pass here)."


def packed_copy(target_kernels: dict) -> str:
    """' The packed kernel reads a copy of the weights (N MB of memory).' where `packed` was chosen, why it was left
    out of the choice where it was, else ''."""
    mb = target_kernels.get("packed_mb") or 0
    if mb:
        return f" The `packed` kernel reads a copy of the weights packed in panels ({mb:.0f} MB of memory beside them)."
    why = target_kernels.get("packed_left_out")
    return f" The `packed` kernel was left out: {why}." if why else ""


def decode_fraction(lim: dict) -> str:
    """The decode steps' fraction of the limit, said the way it was measured (per run against the bandwidth sampled
    around each run, or the median speed against the median bandwidth)."""
    runs = lim.get("decode_fraction_runs") or []
    if not runs:
        return f"**{lim['decode_fraction_of_limit']:.0%} of the limit**"
    return (f"each run against the bandwidth sampled right before and after it: **{lim['decode_fraction_of_limit']:.0%} of "
            f"the limit** (median of {len(runs)} runs, {min(runs):.0%}-{max(runs):.0%})")


def _markdown(r: dict, plots: list[str]) -> str:
    """report.md: each section of the report in turn, the plots last."""
    names = drafting_names(r)
    lines = [*_header(r), *_greedy(r), *_acceptance(r), *_speed(r, names), *_limits(r), *_sampling(r, names), *_gates(r)]
    return "\n".join([*lines, "", *(f"![{p}]({p})" for p in plots)]) + "\n"


def drafting_names(r: dict) -> dict[str, str]:
    """How the report names each drafting: the run's own draft by its family (an EAGLE-3 head or a DFlash block)."""
    own = {"eagle3": "EAGLE-3", "dflash": "DFlash", "dflash2": "DFlash2"}.get(r.get("draft_method", "eagle3"), "the draft")
    return {"speculative": own, "suffix": "suffix", "eagle3_suffix": f"{own} + suffix"}


def _header(r: dict) -> list[str]:
    lines = [
        "# Validation report",
        "",
        f"Runtime: {r['runtime']}  ",
        f"Prompts: {r['prompts']} from {r['prompt_source']}, {r['max_new_tokens']} new tokens, draft {r['draft_shape']} "
        f"of length {r['draft_len']}, {r['threads']} CPU thread(s)",
    ]
    if "compile" in r:
        lines.append(f"Compilation: {r['compile']['note']} ({r['compile']['seconds']:.0f} s, before timing)")
    return lines


def _greedy(r: dict) -> list[str]:
    g = r["greedy_match"]
    lines = [
        "",
        "## Greedy outputs",
        "",
        f"Reference: {r['reference']}.",
        f"Speculative runtime identical on **{g['matched']}/{g['total']}** prompts; runtime without draft on "
        f"{g['runtime_no_draft_matched']}/{g['total']}.",
    ]
    if g["first_divergence"]:
        lines.append("First divergence (prompt id: token index): " + ", ".join(f"{k}: {v}" for k, v in g["first_divergence"].items()))
    q = r.get("quantization")
    if q:
        lines += ["", f"Quantized target ({q['format']}): {q['note']}.",
                  f"Identical to the unquantized model on {q['identical_to_unquantized']}/{r['prompts']} prompts."]
        if q["first_divergence_from_unquantized"]:
            lines.append("First divergence from the unquantized model: "
                         + ", ".join(f"{k}: token {v}" for k, v in q["first_divergence_from_unquantized"].items()))
    return lines


def _acceptance(r: dict) -> list[str]:
    lines = [
        "",
        "## Acceptance",
        "",
        f"Mean acceptance length (tokens per target forward): **{r['acceptance_length']:.2f}**",
        "",
        "| accepted drafts | " + " | ".join(str(i) for i in range(len(r["acceptance_histogram"]))) + " |",
        "|---|" + "---|" * len(r["acceptance_histogram"]),
        "| steps | " + " | ".join(str(x) for x in r["acceptance_histogram"]) + " |",
        "",
        "Per-position acceptance: " + ", ".join(f"{i + 1}: {p:.2f}" for i, p in enumerate(r["per_position_acceptance"])),
        "",
        "| category | prompts | AL | 95% interval | per position | greedy identical | steps | speedup vs no draft |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {c} | {v['prompts']} | {v['acceptance_length']:.2f} | {v['ci95'][0]:.2f}-{v['ci95'][1]:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in v['per_position'])} | {v.get('exact', '–')}/{v['prompts']} | {v['steps']} | "
              f"{speedup_text(v.get('speedup_vs_no_draft'))} |" for c, v in r["per_category"].items()]
    if r.get("per_context"):
        lines += ["", "| context (tokens) | prompts | AL | 95% interval | per position | greedy identical | vs shortest |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {c['context_tokens']} (bin {c['bin']}) | {c['prompts']} | {c['acceptance_length']:.2f} | "
                  f"{c['ci95'][0]:.2f}-{c['ci95'][1]:.2f} | {', '.join(f'{x:.2f}' for x in c['per_position'])} | "
                  f"{c['exact']}/{c['prompts']} | {c['vs_shortest']:.2f}x |" for c in r["per_context"]]
    return lines


def _speed(r: dict, names: dict[str, str]) -> list[str]:
    lines = ["", "## Speed (batch 1, interleaved repetitions, median)", "", "| method | tokens/s | |", "|---|---|---|"]
    notes = r.get("method_notes", {})
    lines += [f"| {m} | {t:.1f} | {notes.get(m, '')} |" for m, t in r["tokens_per_s"].items()]
    lines += [f"| {m} | – | skipped: {why} |" for m, why in r["skipped"].items()]
    lines += [
        "",
        f"Speedup over HF generate: **{r['speedup_vs_hf']:.2f}x** (speedup / AL = {r['speedup_over_al']:.2f}); "
        f"runtime without draft vs HF generate: {r['runtime_no_draft_vs_hf']:.2f}x.",
    ]
    dr = r.get("drafting")
    if dr:
        lines += ["", "## Drafting methods side by side", "", "| drafting | AL | tokens/s | greedy identical |", "|---|---|---|---|"]
        lines += [f"| {names.get(m, m)}{' (fastest)' if m == dr['fastest'] else ''} | {v['acceptance_length']:.2f} | "
                  f"{v['tokens_per_s']:.1f} | {v['identical']}/{r['prompts']} |" for m, v in dr["methods"].items()]
        lines += ["", f"`trtspec deploy triton RUN_DIR --out DIR` serves the fastest, {names.get(dr['fastest'])} "
                  "(`--drafting` picks another)."]
    if "step_cost_vs_decode" in r:
        lines += ["", f"One speculative step (drafts + verify) costs {r['step_cost_vs_decode']:.2f} plain decode steps, and "
                  f"yields AL = {r['acceptance_length']:.2f} tokens: speculation pays while AL exceeds the step cost."]
    return lines


def _limits(r: dict) -> list[str]:
    from trtspec.runtime.kernels import row_labels

    lim = r.get("limits")
    if not lim:
        return []
    m, k = r["machine"], r["kernels"]["target"]
    lines = [
        "", "## What limits the speed", "",
        f"Machine: {m['model']}, {m['cores']} cores ({m['torch_threads']} torch threads), {', '.join(m['flags']) or 'no AVX2'}.",
        "Kernels chosen by timing on this machine, by rows per product (1: decode; more: verification, drafting): "
        + ", ".join(f"{n} `{c}`" for n, c in zip(row_labels(), k["by_rows"], strict=False)) + "." + packed_copy(k) + pass_kind(k) + draft_storage(r["kernels"].get("draft")),
        "",
        "| | |", "|---|---|",
        f"| memory bandwidth (best of a streaming read and a large matrix-vector product; median of samples taken among the timed runs) | {lim['bandwidth_gb_per_s']:.1f} GB/s |",
        f"| weights read per decoded token | {lim['weight_mb_per_token']:.0f} MB |",
        f"| decode limit = bandwidth / weights | {lim['limit_tokens_per_s']:.1f} tokens/s |",
        f"| runtime without draft, decode steps | {lim['decode_tokens_per_s']:.1f} tokens/s; " + decode_fraction(lim) + " |",
        f"| the same with the prompts' prefill (per answer) | {lim['no_draft_tokens_per_s']:.1f} tokens/s = "
        f"{lim['no_draft_fraction_of_limit']:.0%} of the limit |",
        f"| decode step / its weight products at the one-row kernel's streaming rate (sampled among the runs) | "
        f"{lim['decode_step_ms']:.1f} ms / {lim['weight_products_ms']:.1f} ms ({lim['weight_products_share']:.0%}; the "
        "rest is attention, norms, rope, the calls between them and the products' own shortfall) |",
        f"| speculation: AL / step cost | {lim['acceptance_length']:.2f} / {lim['step_cost_vs_decode']:.2f} = "
        f"{lim['speculative_over_no_draft']:.2f}x over no draft |",
    ]
    if lim.get("step_cost_by_bytes"):
        lines += [f"| one speculative step, measured / by bytes (verify reads the target's weights once, each draft "
                  f"pass the draft's) | {lim['step_cost_vs_decode']:.2f} / {lim['step_cost_by_bytes']:.2f} decode steps "
                  f"(the difference is the runtime's overhead) |"]
    if lim.get("step_cost_by_products"):
        lines += [f"| the same step by the products' timing at load (the verify pass's products over its "
                  f"{r['verify_rows']} rows, not one row's) | {lim['step_cost_by_products']:.2f} decode steps (above "
                  "the cost by bytes: what the rows' arithmetic adds on this machine) |"]
    return lines


def _sampling(r: dict, names: dict[str, str]) -> list[str]:
    checks = r.get("sampling_check")
    if not checks:
        return []
    lines = ["", "## Sampling check", "", "The first speculated token, sampled at temperature > 0 with each drafting, "
             "against the target's own distribution (chi-square, lossless when passed):", "",
             "| drafting | samples (with a draft) | chi-square / dof (threshold) | total variation | result |",
             "|---|---|---|---|---|"]
    return lines + [f"| {names.get(m, m)} | {s['samples']} ({s['drafted']}) at T={s['temperature']} | {s['chi2']} / {s['dof']} "
                    f"({s['threshold']}) | {s['total_variation']} | **{'passed' if s['passed'] else 'FAILED'}** |"
                    for m, s in checks.items()]


def _gates(r: dict) -> list[str]:
    if not r.get("gates"):
        return []
    return ["", "## Gates", ""] + [f"- {g['gate']}: {'passed' if g['passed'] else 'FAILED — ' + g['message']}" for g in r["gates"]]


def write_report(out: Path, report: dict) -> list[Path]:
    """Write report.json, report.md and the plots into `out`; returns the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    plots = _plots(out, report)
    (out / "report.md").write_text(_markdown(report, plots))
    return [out / "report.json", out / "report.md"] + [out / p for p in plots]
