"""Evaluation suites (eval.suites): where the prompts validate measures on come from, each with its category.

A suite is one of
  jsonl    a JSONL file of the user's; its columns named by prompt_field (text), messages_field (chat turns) and
           category_field, read by read_suite_file
  hf       a `datasets` dataset read with the same mapping (hf_suite_rows): a hub id through datasets.load_dataset
           (with no network: one line naming the id and the local copies that need none), or a local copy: a data
           file (.parquet/.json/.jsonl/.csv/.arrow, load_dataset's data_files) or a folder written by save_to_disk
           (load_from_disk)
  builtin  the project's prompt generator (trtspec.demo_prompts), no file, no hub (builtin_rows)
Rows are {id, category, messages}, as validate reads them. A problem is a DataError naming the suite, the file or
dataset, the column and the first row lacking it; the build's preflight reads every suite before the first stage.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.chat import json_array, prompt_turns, read_text, role_content, row_prompt, row_tools, split_lines
from trtspec.errors import DataError
from trtspec.hf_datasets import load_hf_dataset

if TYPE_CHECKING:
    from trtspec.config import BuildConfig, EvalSuite

# prompts per builtin category at most (eval.num_prompts is at most 256: 6 x 64 covers it)
BUILTIN_PER_CATEGORY = 64


def suite_label(s: EvalSuite) -> str:
    """How the report's prompt_source names a suite."""
    if s.kind == "builtin":
        return "builtin" + (f" ({', '.join(s.categories)})" if s.categories else "")
    if s.kind == "jsonl":
        return f"jsonl:{s.path}"
    return f"hf:{s.path}" + (f"[{s.subset}]" if s.subset else "") + f":{s.split}"


def unmapped(s: EvalSuite) -> bool:
    """Whether the suite names neither a prompt_field nor a messages_field: a row without the default columns is then
    read as the data stage reads one (chat.row_prompt: ShareGPT, SpecForge and Model Optimizer `conversations`,
    LMSYS-Chat `conversation`, instruction rows)."""
    return not {"prompt_field", "messages_field"} & s.model_fields_set


def mapped_row(rec: dict, s: EvalSuite, where: str, at: str, row_id: str) -> dict:
    """One record of a jsonl or hf suite as {id, category, messages, tools}, through the suite's column mapping (or,
    where the suite sets none and the row lacks the default columns, its turns as the data stage reads them:
    unmapped); a `tools` column is the tools the prompt offers (an agent's request)."""
    pf, mf, cf = s.prompt_field, s.messages_field, s.category_field
    text = rec.get(pf)
    if isinstance(text, list) and text and all(isinstance(x, str) for x in text):
        text = text[0]  # a list of turns (MT-Bench's `prompt`): the first
    if pf in rec and rec[pf] is not None:
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: {at}'s '{pf}' is not a non-empty text", "set the suite's prompt_field to the "
                            "column that holds the prompt")
        msgs = [{"role": "user", "content": text}]
    elif mf in rec and rec[mf] is not None:
        msgs = prompt_turns(role_content(rec[mf])) if isinstance(rec[mf], list) else None
        if msgs is None:
            raise DataError(f"{where}: {at}'s '{mf}' is not a list of {{role, content}} (or {{from, value}}) turns with a prompt",
                            "set the suite's messages_field to the column that holds the chat turns")
    elif unmapped(s) and (msgs := row_prompt(rec)) is not None:
        pass
    else:
        raise DataError(f"{where}: {at} has no '{pf}' (text) or '{mf}' (messages) column",
                        "set the suite's prompt_field or messages_field to the column that holds the prompt")
    category = rec.get(cf)
    if category is None or (isinstance(category, str) and not category.strip()):
        if "category_field" in s.model_fields_set:
            raise DataError(f"{where}: {at} has no '{cf}' column (the suite's category_field)",
                            "give every row a category, or drop category_field (rows without one are 'chat')")
        category = "chat"
    tools, _ = row_tools(rec)
    if tools is None:
        raise DataError(f"{where}: {at}'s 'tools' is not a list of tool objects (OpenAI's function specs)",
                        "give each row the tools its request offered, or none")
    rid = rec.get("id")
    return {"id": str(rid) if isinstance(rid, (str, int)) else row_id, "category": str(category), "messages": msgs,
            **tools}


def only_categories(rows: list[dict], s: EvalSuite, where: str) -> list[dict]:
    """The rows of the suite's `categories` (all with none named); a named category with no row is an error."""
    if not s.categories:
        return rows
    have = list(dict.fromkeys(r["category"] for r in rows))
    if missing := [c for c in s.categories if c not in have]:
        raise DataError(f"{where} has no row of category '{missing[0]}' (its categories: {', '.join(have) or 'none'})",
                        "check the suite's categories and category_field")
    return [r for r in rows if r["category"] in s.categories]


def read_suite_file(path: Path, skips: Counter, s: EvalSuite, what: str = "eval.suites file",
                    hint: str = "check eval.suites[*].path (relative to the YAML)") -> list[dict]:
    """A jsonl suite's rows (the reader the build's preflight and validate share: trtspec.pipeline.stage.InputFile).
    Every non-blank line (or every element of a file that is one JSON array, json_array) must be a JSON object with
    the prompt column: a suite measures what it holds, no row is silently dropped."""
    where = f"{what} '{path}'"
    text = read_text(path, what, hint)
    array = json_array(text)
    unit = "line" if array is None else "row"
    items = enumerate(split_lines(text) if array is None else array, 1)
    rows = []
    for n, item in items:
        if array is None and not item.strip():
            continue
        try:
            rec = json.loads(item) if array is None else item
        except json.JSONDecodeError:
            raise DataError(f"{where}: line {n} is not valid JSON", "one JSON object per line") from None
        if not isinstance(rec, dict):
            raise DataError(f"{where}: {unit} {n} is not a JSON object", "one JSON object per line")
        rows.append(mapped_row(rec, s, where, f"{unit} {n}", f"{path.stem}:{n}"))
    return only_categories(rows, s, where) if rows else rows


def hf_suite_rows(s: EvalSuite, resolve: Callable[[str], Path], where: str) -> list[dict]:
    """An hf suite's rows through its column mapping (or, unmapped, as the data stage reads rows); a column the dataset
    lacks is named with those it has."""
    ds = load_hf_dataset(s.path, s.subset, s.split, resolve, where)
    cols = list(ds.column_names)
    mapped = s.prompt_field in cols or s.messages_field in cols
    if not mapped and not (unmapped(s) and len(ds) and row_prompt(ds[0]) is not None):
        raise DataError(f"{where}: row 1 has no '{s.prompt_field}' (text) or '{s.messages_field}' (messages) column "
                        f"(its columns: {', '.join(cols)})", "set the suite's prompt_field or messages_field")
    if "category_field" in s.model_fields_set and s.category_field not in cols:
        raise DataError(f"{where}: row 1 has no '{s.category_field}' column (the suite's category_field; its columns: "
                        f"{', '.join(cols)})", "set category_field to the column that holds the category, or drop it")
    keep = [c for c in dict.fromkeys((s.prompt_field, s.messages_field, s.category_field, "id", "tools")) if c in cols]
    records = ds.select_columns(keep if mapped else cols).to_list()  # unmapped: the turns may be in any column
    rows = [mapped_row(r, s, where, f"row {n}", f"{s.path}:{n}") for n, r in enumerate(records, 1)]
    if not rows:
        raise DataError(f"{where} holds no row", "check the suite's split")
    return only_categories(rows, s, where)


def builtin_rows(seed: int, categories: Iterable[str] | None = None) -> list[dict]:
    """The builtin suite: up to BUILTIN_PER_CATEGORY prompts of each category from the project's generator,
    the categories in turn. Deterministic in `seed` (build.seed), each category from a seed stream of its own (so
    picking categories changes none of their prompts), and held out from training: no prompt of the project's
    shipped prompt sets is taken (build_configs/prompts/broad_prompts.jsonl, the demo recipe's, and demo_prompts.jsonl,
    its six kinds: demo_prompts.shipped_prompts), and validate also drops any the run's own
    training split holds."""
    from trtspec.demo_prompts import CATEGORIES, EVAL_CODE_TASKS, code_prompts, pools, shipped_prompts

    trained = shipped_prompts()
    by_category = pools(random.Random(f"trtspec eval.suites builtin {seed} math"), 4 * BUILTIN_PER_CATEGORY)
    by_category["code"] += code_prompts(EVAL_CODE_TASKS)
    groups = []
    for cat in categories or CATEGORIES:
        pool = [p for p in dict.fromkeys(by_category[cat]) if p not in trained]
        random.Random(f"trtspec eval.suites builtin {seed} {cat}").shuffle(pool)
        groups.append([{"id": f"builtin:{cat}:{j}", "category": cat, "messages": [{"role": "user", "content": p}]}
                       for j, p in enumerate(pool[:BUILTIN_PER_CATEGORY])])
    return interleave(groups)


def interleave(groups: Iterable[list]) -> list:
    """The groups' items in turn: the first of each, then the second of each... (a group that runs out is passed)."""
    groups = [list(g) for g in groups]
    return [g[j] for j in range(max(map(len, groups), default=0)) for g in groups if j < len(g)]


def by_category(rows: list[dict]) -> list[dict]:
    """A suite's rows with its categories in turn (each category's rows in their order): the first
    eval.num_prompts rows of a file sorted by category span its categories."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["category"], []).append(r)
    return interleave(groups.values())


def suite_rows(cfg: BuildConfig, i: int, read_file: Callable[[Path, Counter], list[dict]] | None = None) -> list[dict]:
    """eval.suites[i]'s rows, its categories in turn; `read_file` reads a jsonl suite (validate's files_read reader)."""
    s = cfg.eval.suites[i]
    name = f"eval.suites[{i}]"
    if s.kind == "builtin":
        return builtin_rows(cfg.seed, s.categories)
    if s.kind == "hf":
        return by_category(hf_suite_rows(s, cfg.resolve_path, f"{name} dataset '{s.path}' split '{s.split}'"))
    assert s.path is not None
    path = cfg.resolve_path(s.path)
    rows = (read_file or (lambda p, k: read_suite_file(p, k, s, f"{name} file")))(path, Counter())
    if not rows:
        raise DataError(f"{name} file '{path}' holds no usable prompt (empty, or blank lines only)",
                        "one JSON object per line with the suite's prompt or messages column")
    return by_category(rows)


# the builtin long documents: standard library modules whose documentation runs to thousands of tokens each
BUILTIN_DOCUMENT_MODULES = ("collections", "pathlib", "argparse", "statistics", "json", "functools", "textwrap",
                            "heapq", "itertools", "string", "fractions", "datetime", "random", "csv", "calendar")


def builtin_documents() -> list[str]:
    """Long documents with no hub and no file: the Python standard library's own module documentation as pydoc
    renders it in plain text (prose, signatures and examples), without the FILE section, the one part that names the
    machine's install path."""
    import importlib
    import pydoc

    return [pydoc.plaintext.document(importlib.import_module(m)).split("\nFILE\n")[0].strip()
            for m in BUILTIN_DOCUMENT_MODULES]


def builtin_prose(min_words: int = 50) -> list[str]:
    """Prose people wrote, with no hub and no file: the paragraphs of the Python language reference's topics
    (pydoc_data.topics, what `help("if")` prints) of at least `min_words` words and hardly any code symbols, each one
    line; for passages of real text (scripts/make_passage_prompts.py builtin) where the generator's are formulaic."""
    import re
    from pydoc_data.topics import topics

    paragraphs = (" ".join(p.split()) for _, text in sorted(topics.items()) for p in re.split(r"\n\s*\n", text))
    return [p for p in paragraphs if len(p.split()) >= min_words and sum(c in "()[]{}=*<>:_" for c in p) < 0.01 * len(p)]


def context_fill(cfg: BuildConfig, data_dir: Path | None) -> list:
    """What fills eval.context_bins' contexts (chat.at_context): the run's training conversations (data/train.jsonl),
    or documents (eval.context_documents, else builtin_documents)."""
    from trtspec.chat import read_documents, read_rows

    e = cfg.eval
    if e.context_source == "documents":
        return read_documents(cfg.resolve_path(e.context_documents), Counter()) if e.context_documents else builtin_documents()
    if data_dir is None:
        raise DataError("eval.context_bins fills contexts with the run's training conversations: the data stage was "
                        "skipped", "run the data stage, or set eval.context_source: documents")
    return read_rows(data_dir / "train.jsonl")


def acceptance_suite_read(cfg: BuildConfig) -> list:
    """eval.acceptance_suite as a file the train stage reads (hashed into its fingerprint, read whole before the
    first stage), read as validate reads a jsonl eval.suites file."""
    from functools import partial

    from trtspec.config import EvalSuite
    from trtspec.pipeline.stage import InputFile

    if not (path := cfg.eval.acceptance_suite):
        return []
    read = partial(read_suite_file, s=EvalSuite(kind="jsonl", path=path), what="eval.acceptance_suite file",
                   hint="check eval.acceptance_suite (relative to the YAML)")
    return [InputFile("eval.acceptance_suite", "eval.acceptance_suite file", path, cfg.resolve_path(path), "prompt", read)]


def context_documents_read(cfg: BuildConfig) -> list:
    """eval.context_documents as a file its stages read (train and validate: hashed into their fingerprints, read
    whole before the first stage)."""
    from functools import partial

    from trtspec.chat import read_documents
    from trtspec.pipeline.stage import InputFile

    e = cfg.eval
    if not (e.context_bins and e.context_source == "documents" and e.context_documents):
        return []
    return [InputFile("eval.context_documents", "eval.context_documents file", e.context_documents,
                      cfg.resolve_path(e.context_documents), "document", partial(read_documents))]
