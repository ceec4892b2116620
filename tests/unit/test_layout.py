"""The import rules of the code layout (README, "The code"): a stage imports the library and the stage contract,
never another stage or the runner; the library never imports a stage or the runner; scripts use the library only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = "trtspec.pipeline.runner"


def imported_modules(path: Path) -> set[str]:
    """Every trtspec module a file imports, at any depth of the file (function-level imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("trtspec")}


def is_stage(module: str) -> bool:
    return module.startswith("trtspec.stages.")


def test_a_stage_imports_no_other_stage_and_not_the_runner():
    for path in sorted((ROOT / "trtspec" / "stages").glob("*.py")):
        me = f"trtspec.stages.{path.stem}"
        bad = {m for m in imported_modules(path) if (is_stage(m) and m != me) or m.startswith(RUNNER)}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_library_imports_no_stage_and_not_the_runner():
    for path in sorted((ROOT / "trtspec").rglob("*.py")):
        rel = path.relative_to(ROOT / "trtspec").as_posix()
        if rel.startswith("stages/") or rel in ("cli.py", "bench.py", "pipeline/runner.py"):
            continue  # the stages themselves; the CLI, the benchmarks' harness and the runner are the ones that run them
        bad = {m for m in imported_modules(path) if is_stage(m) or m == "trtspec.stages" or m.startswith(RUNNER)}
        assert not bad, f"trtspec/{rel} imports {sorted(bad)}"


def test_scripts_use_the_library_only():
    for path in sorted((ROOT / "scripts").glob("*.py")):
        bad = {m for m in imported_modules(path) if is_stage(m) or m == "trtspec.stages"}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_shared_code_imports_no_draft_family_and_no_family_another():
    """The stages, trtspec.deploy, trtspec.training and the config are every family's (the stages reach one through
    trtspec.draft_families.family; the others are handed it, typed with trtspec.draft_family's interfaces); a family's package may
    import them and the family it extends (DFlash2 is DFlash's block with more), never another family's package."""
    families = ("trtspec.eagle", "trtspec.dflash", "trtspec.dflash2")
    extends = {"trtspec.dflash2": "trtspec.dflash"}
    shared = ("trtspec.stages", "trtspec.deploy", "trtspec.training", "trtspec.config")

    def within(m: str, package: str) -> bool:
        return m == package or m.startswith(package + ".")

    for path in sorted((ROOT / "trtspec").rglob("*.py")):
        me = module_name(path)
        own = [f for f in families if within(me, f)]
        if not own and not any(within(me, s) for s in shared):
            continue
        allowed = {*own, *(extends.get(f) for f in own)}
        bad = {m for m in imported_modules(path) for f in families if f not in allowed and within(m, f)}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_runtime_does_not_import_the_measurement_harness():
    """trtspec.measure times the runtime and reads its kernels' load-time choice, so the runtime never imports it
    (runtime/kernels.py keeps `weight_mb`, which its choice reports, for that); the stages and the scripts warm the
    runtime up through measure.warm_up, not by hand, so that every timed number is measured one way."""
    for path in sorted((ROOT / "trtspec" / "runtime").rglob("*.py")):
        bad = {m for m in imported_modules(path) if m == "trtspec.measure" or m.startswith("trtspec.measure.")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
    for path in [*sorted((ROOT / "trtspec" / "stages").glob("*.py")), *sorted((ROOT / "scripts").glob("*.py"))]:
        assert "trtspec.runtime.decode.warm_up_row_counts" not in imported_modules(path), (
            f"{path.relative_to(ROOT)} warms the runtime up by hand: use trtspec.measure.warm_up")


def test_no_script_imports_another():
    """What the scripts share lives in the library (trtspec.bench), not in each other reached through sys.path;
    code a script runs in a child process (a string) counts too."""
    names = {p.stem for p in (ROOT / "scripts").glob("*.py")}
    for path in sorted((ROOT / "scripts").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        imported = set(re.findall(r"^\s*(?:from|import)\s+(\w+)", text, re.M))
        assert not imported & names, f"scripts/{path.name} imports {sorted(imported & names)}"
        assert "sys.path" not in text, f"scripts/{path.name} edits sys.path"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """trtspec module -> the trtspec modules it imports (a `from m import name` counts as m, or m.name when that
    is a module)."""
    modules = {module_name(p): p for p in (ROOT / "trtspec").rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = {m if m in modules else m.rpartition(".")[0] for m in imported_modules(path)}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    """Function-level imports included: a cycle hidden inside a function is still two modules that need each other."""
    graph = import_graph()
    assert "trtspec.runtime.model" in graph["trtspec.eagle.runtime"]  # the graph sees imports at all
    assert not cycles(graph), cycles(graph)


def test_the_draft_families_registry_imports_each_family_so_the_graph_sees_it():
    """The registry names each family by import, not by a module path looked up at run time: with no cycle in the
    package (above), nothing a family imports (the config, the runtime, the engines, deploy, training) reaches back to
    the registry, and a new family is one import and one line there."""
    from trtspec.draft_families import DRAFT_FAMILIES

    graph = import_graph()
    assert {f"{type(f).__module__}" for f in DRAFT_FAMILIES.values()} <= graph["trtspec.draft_families"]
    assert "importlib" not in (ROOT / "trtspec" / "draft_families.py").read_text()
