"""The folders import one way: the trainer reaches envs only through `clients/` and the sessions contract
(`services/sessions_api.py`), never the env server's internals (`services/server/`); `services/` never
imports the trainer; `clients/` (what an external agent installs) imports no torch; `benchmarks/` and
`devtools/` import nothing from the tests (tests may import them); `serving/` (the HTTP
plumbing both servers share) imports neither side; and the learner and the rollout side meet only in
what both may import (`trainer.weights`, the processor, `Trajectory`), never in each other's code.
Relative imports count as the absolute names they resolve to."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN: list[tuple[str, str, frozenset[str]]] = [
    ("trainer", "services.server", frozenset()),
    ("services", "trainer", frozenset()),
    ("clients", "torch", frozenset()),
    ("benchmarks", "tests", frozenset()),
    ("devtools", "tests", frozenset()),
    ("serving", "services", frozenset()),
    ("serving", "trainer", frozenset()),
    ("trainer/rollout", "trainer.learner", frozenset()),
    ("trainer/learner", "trainer.rollout.engines", frozenset()),
    ("trainer/weights", "trainer.learner", frozenset()),
    ("trainer/weights", "trainer.rollout", frozenset({"trainer.rollout.engines.sglang_api"})),
]
"""(a folder of the repository, a module prefix its files must not import, the modules allowed anyway)."""


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file under `root` imports, at any depth of its code (`from a import b` counts `a`
    and `a.b`; `from .c import d`, the absolute names it resolves to)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = absolute_module(path, root, node.level, node.module)
            modules.add(base)
            modules.update(f"{base}.{alias.name}" for alias in node.names)
    return modules


def absolute_module(path: Path, root: Path, level: int, module: str | None) -> str:
    """The absolute name of the module a `from` import in `path` names: `level` dots climb from the
    file's package, as Python resolves them."""
    if level == 0:
        return module or ""
    package = list(path.relative_to(root).with_suffix("").parts)[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


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


def test_relative_imports_count_as_the_modules_they_name(tmp_path: Path) -> None:
    package = tmp_path / "clients" / "inner"
    package.mkdir(parents=True)
    source = package / "m.py"
    source.write_text("from ..protocol import Reset\nfrom . import sibling\n")
    assert imported_modules(source, tmp_path) == {
        "clients.protocol",
        "clients.protocol.Reset",
        "clients.inner",
        "clients.inner.sibling",
    }


CLIENTS_LOAD = """
import importlib, pkgutil, sys
import clients
for found in pkgutil.walk_packages(clients.__path__, "clients."):
    importlib.import_module(found.name)
print(*sys.modules)
"""
"""Imports every module of `clients/` in a fresh interpreter and prints what that loaded."""


def test_clients_load_no_torch_even_through_what_they_import() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", CLIENTS_LOAD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "clients.http" in loaded
    assert not [name for name in loaded if name.split(".")[0] in ("torch", "trainer")]
