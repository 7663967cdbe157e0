"""`trainer/train.py` reads in one sitting: at most 250 lines, and no function in it over 40 statements.

Statements are counted with `ast`, every statement at any depth of a function's body (a nested
function's own statements count toward the function that holds it), so a loop cannot hide its size in
a long line or a closure.
"""

from __future__ import annotations

import ast
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "trainer" / "train.py"
MAX_LINES = 250
MAX_STATEMENTS = 40

Function = ast.FunctionDef | ast.AsyncFunctionDef


def statement_counts(source: str) -> dict[str, int]:
    """Each function's (and method's) qualified name, with the statements at any depth of its body."""
    counts: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, Function):
                name = f"{prefix}{child.name}"
                counts[name] = sum(isinstance(n, ast.stmt) for n in ast.walk(child)) - 1
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), "")
    return counts


def test_train_py_holds_at_most_250_lines() -> None:
    lines = len(TRAIN.read_text().splitlines())
    assert lines <= MAX_LINES, f"trainer/train.py has {lines} lines; move what is not the loop out of it"


def test_no_function_in_train_py_has_over_40_statements() -> None:
    counts = statement_counts(TRAIN.read_text())
    assert counts, "no function found in trainer/train.py"
    too_long = {name: n for name, n in counts.items() if n > MAX_STATEMENTS}
    assert too_long == {}, f"functions over {MAX_STATEMENTS} statements: {too_long}"


def test_statements_are_counted_at_every_depth_and_in_nested_functions() -> None:
    source = (
        "class C:\n"
        "    async def m(self):\n"
        "        x = 1\n"
        "        if x:\n"
        "            for i in range(2):\n"
        "                pass\n"
        "        def inner():\n"
        "            return 1\n"
        "def f(): return [1, 2, 3]\n"
    )
    assert statement_counts(source) == {"C.m": 6, "C.m.inner": 1, "f": 1}
