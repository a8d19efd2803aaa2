"""The package stays readable: short functions, short files, a small top level.

A function over MAX_FUNCTION lines needs a comment right above it (above its decorators) that starts with
"# over 60 lines:" and says why; a file over MAX_FILE lines fails; thinkrl/ holds only the entry points and the
shared modules TOP_LEVEL names, everything else lives in a stage's folder.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "thinkrl"
MAX_FUNCTION = 60
MAX_FILE = 300
NOTE = "# over 60 lines:"
TOP_LEVEL = {
    "__init__.py", "__main__.py", "cli.py", "train.py", "serve.py", "setup.py", "settings.py",  # entry points, run assembly
    "batch.py", "ops.py", "errors.py", "models.py", "distributed.py", "sharding.py", "forward.py", "rewards.py",  # shared
}  # fmt: skip


def long_functions(root: Path) -> list[str]:
    """file:line name (N lines) of every function over MAX_FUNCTION lines without the note above it."""
    out = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                noted = any(lines[i].strip().startswith(NOTE) for i in range(max(0, first - 4), first - 1))
                if n > MAX_FUNCTION and not noted:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_over_60_lines_without_a_note_saying_why():
    assert long_functions(PACKAGE) == []


def test_the_check_finds_a_long_function_and_accepts_a_noted_one(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION))
    (root / "a.py").write_text(f"def long():\n{body}\n\n# over 60 lines: a table\n@staticmethod\ndef noted():\n{body}")
    assert long_functions(root) == [f"pkg/a.py:1 long ({MAX_FUNCTION + 1} lines)"]


def test_no_file_over_300_lines():
    assert [f"{p} ({n})" for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_FILE] == []


def test_the_top_level_holds_entry_points_and_shared_modules_only():
    assert {p.name for p in PACKAGE.glob("*.py")} <= TOP_LEVEL
