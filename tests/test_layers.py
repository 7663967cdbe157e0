"""The folders import one way: the trainer reaches envs only through `clients/` and the sessions contract
(`services/sessions_api.py`), never the env server's internals (`services/server/`); `serving/` (the HTTP
plumbing both servers share) imports neither side; and the learner and the rollout side meet only in
what both may import (`trainer.weights`, the processor, `Trajectory`), never in each other's code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN: list[tuple[str, str, frozenset[str]]] = [
    ("trainer", "services.server", frozenset()),
    ("serving", "services", frozenset()),
    ("serving", "trainer", frozenset()),
    ("trainer/rollout", "trainer.learner", frozenset()),
    ("trainer/learner", "trainer.rollout.engines", frozenset()),
    ("trainer/weights", "trainer.learner", frozenset()),
    ("trainer/weights", "trainer.rollout", frozenset({"trainer.rollout.engines.sglang_api"})),
]
"""(a folder of the repository, a module prefix its files must not import, the modules allowed anyway)."""


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code (`from a import b` counts `a` and `a.b`)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def violations(folder: str, prefix: str, allowed: frozenset[str]) -> list[str]:
    """`file: module` for each import of `prefix` (or below it) by a file under `folder`."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for module in sorted(imported_modules(path)):
            inside = module == prefix or module.startswith(prefix + ".")
            if inside and not any(module == a or module.startswith(a + ".") for a in allowed):
                found.append(f"{path.relative_to(ROOT)}: {module}")
    return found


@pytest.mark.parametrize(
    ("folder", "prefix", "allowed"), FORBIDDEN, ids=[f"{f}-{p}" for f, p, _ in FORBIDDEN]
)
def test_folder_does_not_import_the_other_side(folder: str, prefix: str, allowed: frozenset[str]) -> None:
    assert (ROOT / folder).is_dir()
    assert violations(folder, prefix, allowed) == []


def test_the_walk_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n    from trainer.learner.fsdp import shard_model\n    import trainer.rollout\n"
    )
    assert imported_modules(source) == {
        "trainer.learner.fsdp",
        "trainer.learner.fsdp.shard_model",
        "trainer.rollout",
    }
