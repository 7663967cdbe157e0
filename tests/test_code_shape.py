"""The trainer keeps its shape: `trainer/run/train.py` reads in one sitting (at most 250 lines, no function
over 40 statements), `sft.py` takes nothing from the RL loop, and the queue's private methods stay
inside the queue's backends.

Statements are counted with `ast`, every statement at any depth of a function's body (a nested
function's own statements count toward the function that holds it), so a loop cannot hide its size in
a long line or a closure.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layers import imported_modules

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "trainer" / "run" / "train.py"
QUEUE_BACKENDS = {ROOT / "trainer" / "queue" / name for name in ("base.py", "memory.py", "redis.py")}
CODE = ("trainer", "services", "clients", "vistarl", "benchmarks")
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
    assert lines <= MAX_LINES, f"trainer/run/train.py has {lines} lines; move what is not the loop out of it"


def test_no_function_in_train_py_has_over_40_statements() -> None:
    counts = statement_counts(TRAIN.read_text())
    assert counts, "no function found in trainer/run/train.py"
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


def test_sft_imports_nothing_from_the_rl_loop() -> None:
    loop = [
        m for m in imported_modules(ROOT / "trainer" / "sft.py") if m.startswith("vistarl.trainer.run.train")
    ]
    assert loop == []


def queue_private_methods() -> set[str]:
    """The names of `EpisodeQueue`'s private methods (its storage primitives and helpers)."""
    tree = ast.parse((ROOT / "trainer" / "queue" / "base.py").read_text())
    queue = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EpisodeQueue")
    return {
        n.name
        for n in queue.body
        if isinstance(n, Function) and n.name.startswith("_") and not n.name.startswith("__")
    }


def test_only_the_queue_backends_call_the_queues_private_methods() -> None:
    private = queue_private_methods()
    assert {"_add", "_requeue", "_bury"} <= private
    calls = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}"
        for folder in CODE
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path not in QUEUE_BACKENDS
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in private
    ]
    assert calls == []
