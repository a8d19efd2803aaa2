"""Who may import whom inside thinkrl/: the picture in docs/architecture.md, held against the code.

A unit is a package under thinkrl/ (config, learner, ...) or a top-level module (batch, cli, ...). Every
`import thinkrl...` counts, late ones inside functions and TYPE_CHECKING ones included. ALLOWED lists, for
each unit, the units it may import; a unit that is not listed, an import outside its list, or an import loop
between units fails the test, naming the file and line. Change ALLOWED and the picture together.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "thinkrl"

ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "batch": set(),
    "ops": set(),
    "distributed": set(),
    "sharding": {"errors"},  # FSDP2: whole weights for the sampler and checkpoints, the CPU launch path
    "config": {"errors"},  # settings and their checks only: never a stage
    "models": {"config", "errors"},
    "methods": {"batch", "ops", "errors", "config"},  # the plugin surface: pure losses over a TokenBatch
    "accel": {"models", "errors"},  # CPU speed-ups: no stage
    "forward": {"accel", "models", "errors"},  # the completion pass shared by learner and rollout
    "verifier": {"config", "errors"},
    "rewards": {"verifier"},  # the built-in reward functions users name as thinkrl.rewards:NAME
    "data": {"config", "errors", "verifier"},
    "run": {"config", "distributed", "errors", "models", "verifier"},
    "rollout": {"accel", "config", "data", "distributed", "errors", "forward", "models", "sharding", "verifier"},
    "learner": {"accel", "batch", "config", "distributed", "errors", "forward", "methods", "models", "ops", "rollout", "sharding"},
    "evaluation": {"accel", "config", "data", "errors", "models", "rollout", "run", "verifier"},
    "settings": {"config", "errors", "methods", "run"},  # where config meets the method registry
    "setup": {"config", "data", "errors", "learner", "methods", "models", "rollout", "run", "settings", "sharding", "verifier"},
    "train": {
        "accel",
        "config",
        "distributed",
        "errors",
        "evaluation",
        "learner",
        "models",
        "rollout",
        "run",
        "settings",
        "setup",
        "sharding",
        "verifier",
    },
    # a study runs ordinary runs (as commands) and reads their directories back; before it runs, it loads its
    # plugins and calls each arm's method once on a synthetic batch to learn its metric names (study/known.py);
    # a probe takes one update apart
    "study": {"batch", "config", "errors", "methods", "run", "settings"},
    "probe": {
        "accel",
        "study",
        "batch",
        "config",
        "data",
        "errors",
        "forward",
        "learner",
        "methods",
        "models",
        "rollout",
        "run",
        "settings",
        "setup",
        "verifier",
    },
    # thinkrl config: a train command's config, before it runs; train --dry-run: its engine path and memory, no weights
    "preview": {"accel", "config", "data", "errors", "forward", "learner", "methods", "models", "rollout", "settings", "setup", "sharding"},
    # thinkrl serve: the vLLM server command a run with rollout.engine=vllm_server samples from
    "serve": {"config", "errors", "models", "settings"},
    "cli": {"config", "errors", "evaluation", "methods", "preview", "probe", "run", "serve", "settings", "study", "train"},
    "__main__": {"cli"},
    "__init__": set(),
}


def unit_of(root: Path, path: Path) -> str:
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_unit(root: Path, name: str) -> str | None:
    """The unit a dotted name `thinkrl.x.y` lands in (None: not thinkrl's)."""
    parts = name.split(".")
    if parts[0] != root.name or len(parts) < 2:
        return None
    return parts[1]


def edges(root: Path) -> list[tuple[str, str, str]]:
    """(importing unit, imported unit, file:line) for every import of another unit under `root`."""
    out = []
    for path in sorted(root.rglob("*.py")):
        src = unit_of(root, path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from thinkrl import accel` imports the unit accel; `from thinkrl.x import y`, the unit x
                names = [f"{node.module}.{a.name}" for a in node.names] if node.module == root.name else [node.module]
            for name in names:
                dst = imported_unit(root, name)
                if dst is not None and dst != src:
                    out.append((src, dst, f"{path.relative_to(root.parent)}:{node.lineno}"))
    return out


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop between units, as a path that ends where it starts; None if there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def violations(root: Path) -> list[str]:
    found = edges(root)
    units = {unit_of(root, p) for p in root.rglob("*.py")}
    problems = [f"{u}: not in ALLOWED (say what it may import)" for u in sorted(units - set(ALLOWED))]
    problems += [f"{where}: {src} imports {dst}" for src, dst, where in found if src in ALLOWED and dst not in ALLOWED[src]]
    graph: dict[str, set[str]] = {}
    for src, dst, _ in found:
        graph.setdefault(src, set()).add(dst)
    loop = cycle(graph)
    if loop:
        problems.append("import loop: " + " -> ".join(loop))
    return problems


def test_the_package_follows_the_import_rules_and_has_no_loop():
    assert violations(PACKAGE) == []


def test_the_rules_themselves_have_no_loop_and_name_only_units():
    assert cycle(ALLOWED) is None
    assert all(dst in ALLOWED for allowed in ALLOWED.values() for dst in allowed)


def test_a_forbidden_import_is_caught_late_ones_too(tmp_path):
    root = tmp_path / "thinkrl"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    assert violations(root) == []
    grading = root / "verifier" / "grading.py"
    grading.write_text(grading.read_text() + "\n\ndef _late():\n    from thinkrl.learner import update  # noqa\n")
    problems = violations(root)
    line = len(grading.read_text().splitlines())
    assert f"thinkrl/verifier/grading.py:{line}: verifier imports learner" in problems
    assert any(p.startswith("import loop: ") and "verifier" in p and "learner" in p for p in problems), problems


def test_an_upward_import_into_config_and_a_new_unit_are_caught(tmp_path):
    root = tmp_path / "thinkrl"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    load = root / "config" / "load.py"
    load.write_text(load.read_text() + "\nfrom thinkrl import methods  # noqa\n")
    (root / "helpers.py").write_text("from thinkrl import train  # noqa\n")
    problems = violations(root)
    assert any(p.endswith("config imports methods") for p in problems), problems
    assert "helpers: not in ALLOWED (say what it may import)" in problems
    assert any(p.startswith("import loop: ") for p in problems)  # methods imports config, config methods


def test_the_loop_finder_names_a_loop():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
