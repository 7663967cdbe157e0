"""The folders import one way: the trainer reaches envs only through `clients/` and the sessions contract
(`services/sessions_api.py`), never the env server's internals (`services/server/`); `services/` never
imports the trainer; `clients/` (what an external agent installs) imports no torch; `benchmarks/` and
`vistarl/devtools/` import nothing from the tests (tests may import them); `vistarl/httpserver/` (the HTTP
plumbing both servers share) imports neither side; and the learner and the rollout side meet only in
what both may import (`vistarl.trainer.weights`, `vistarl.trainer.modeling`, the processor, `Trajectory`),
never in each other's code. No two modules of `clients/`, `services/` and `trainer/` import each other.

Inside `trainer/` the rooms show the design, and at most 8 modules stay at its top. `trainer/run/`, the
run driver, may import every room; the rooms (`learner`, `rollout`, `queue`, `weights`, `modeling`)
import no driver (`vistarl.trainer.run`, nor `sft`, `curriculum` or `eval` at the top); `trainer/modeling/`,
how the models run for the learner and the HF engine alike, imports nothing else of `trainer/`; and
the basics at the top (`config`, `overrides`, `seeds`, `imports`) import nothing of `trainer/` but
each other. Relative imports count as the absolute names they resolve to."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ROOMS = ("learner", "rollout", "queue", "weights", "modeling")
"""`trainer/`'s subpackages below the run driver (`run`), which imports them all."""
DRIVERS = ("vistarl.trainer.run", "vistarl.trainer.sft", "vistarl.trainer.curriculum", "vistarl.trainer.eval")
"""What runs a training, an SFT run, a curriculum or an evaluation: none of the rooms imports it."""
BASICS = ("config", "overrides", "seeds", "imports")
"""`trainer/`'s top-level modules that every room may import: the typed config and small helpers."""
MAX_TOP_MODULES = 8
LINKED = ("clients", "services", "trainer")
"""The folders at the repository's top that `vistarl/` links to, imported as `vistarl.<folder>`."""

FORBIDDEN: list[tuple[str, str, frozenset[str]]] = [
    ("trainer", "vistarl.services.server", frozenset()),
    ("services", "vistarl.trainer", frozenset()),
    ("clients", "torch", frozenset()),
    ("benchmarks", "tests", frozenset()),
    ("vistarl/devtools", "tests", frozenset()),
    ("vistarl/httpserver", "vistarl.services", frozenset()),
    ("vistarl/httpserver", "vistarl.trainer", frozenset()),
    ("trainer/rollout", "vistarl.trainer.learner", frozenset()),
    ("trainer/learner", "vistarl.trainer.rollout.engines", frozenset()),
    ("trainer/queue", "vistarl.trainer.learner", frozenset()),
    ("trainer/weights", "vistarl.trainer.learner", frozenset()),
    ("trainer/weights", "vistarl.trainer.rollout", frozenset({"vistarl.trainer.rollout.engines.sglang_api"})),
    ("trainer/modeling", "vistarl.trainer", frozenset({"vistarl.trainer.modeling"})),
    *((f"trainer/{room}", driver, frozenset()) for room in ROOMS for driver in DRIVERS),
    *(
        (f"trainer/{basic}.py", "vistarl.trainer", frozenset(f"vistarl.trainer.{b}" for b in BASICS))
        for basic in BASICS
    ),
]
"""(a folder or file of the repository, a module prefix its files must not import, the modules allowed
anyway)."""


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
    package = module_parts(path, root)[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def module_parts(path: Path, root: Path = ROOT) -> list[str]:
    """The dotted parts of the module a file under `root` is imported as: the folders that `vistarl/`
    links to (`clients/`, `services/`, `trainer/`) are `vistarl.clients`, `vistarl.services` and
    `vistarl.trainer`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ["vistarl", *parts] if parts[0] in LINKED else parts


def violations(folder: str, prefix: str, allowed: frozenset[str], root: Path = ROOT) -> list[str]:
    """`file: module` for each import of `prefix` (or below it) by `folder` (a file, or the files under a
    folder) that no module of `allowed` covers."""
    place = root / folder
    paths = [place] if place.is_file() else sorted(place.rglob("*.py"))
    found = []
    for path in paths:
        for module in sorted(imported_modules(path, root)):
            inside = module == prefix or module.startswith(prefix + ".")
            if inside and not any(module == a or module.startswith(a + ".") for a in allowed):
                found.append(f"{path.relative_to(root)}: {module}")
    return found


@pytest.mark.parametrize(
    ("folder", "prefix", "allowed"), FORBIDDEN, ids=[f"{f}-{p}" for f, p, _ in FORBIDDEN]
)
def test_folder_does_not_import_the_other_side(folder: str, prefix: str, allowed: frozenset[str]) -> None:
    assert (ROOT / folder).exists()
    assert violations(folder, prefix, allowed) == []


def test_the_rules_find_a_room_that_imports_the_driver_or_modeling_that_imports_the_config(
    tmp_path: Path,
) -> None:
    for folder, source in {
        "trainer/learner": "from ..run import train\n",
        "trainer/modeling": "from vistarl.trainer.config import TrainConfig\nfrom . import device\n",
    }.items():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "bad.py").write_text(source)
    found = [v for rule in FORBIDDEN if rule[0].startswith("trainer/") for v in violations(*rule, tmp_path)]
    assert sorted(set(found)) == [
        "trainer/learner/bad.py: vistarl.trainer.run",
        "trainer/learner/bad.py: vistarl.trainer.run.train",
        "trainer/modeling/bad.py: vistarl.trainer.config",
        "trainer/modeling/bad.py: vistarl.trainer.config.TrainConfig",
    ]


def test_trainer_keeps_at_most_8_modules_at_its_top() -> None:
    top = sorted(p.name for p in (ROOT / "trainer").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules directly in trainer/: {top}; give them a room"
    assert {f"{basic}.py" for basic in BASICS} <= set(top)


def test_every_room_of_the_trainer_has_its_place_in_the_rules() -> None:
    rooms = {p.parent.name for p in (ROOT / "trainer").glob("*/__init__.py")}
    assert rooms == {"run", *ROOMS}, "a new room of trainer/ takes its place in ROOMS (or is the driver's)"


def test_modeling_is_shared_by_the_learner_and_the_engine() -> None:
    for user in ("trainer/learner", "trainer/rollout/engines"):
        uses = {m for p in (ROOT / user).rglob("*.py") for m in imported_modules(p)}
        assert any(m.startswith("vistarl.trainer.modeling.") for m in uses), (
            f"{user} no longer uses trainer/modeling"
        )


def mutual_imports(root: Path = ROOT) -> list[str]:
    """`a <-> b` for each two modules of the code under `root` that import each other, at any depth (one
    that waits for first use too); a package and a module inside it are not a loop (`from . import x`)."""
    files = [p for folder in LINKED if (root / folder).exists() for p in (root / folder).rglob("*.py")]
    names = {".".join(module_parts(p, root)).removesuffix(".__init__"): p for p in files}
    imports = {name: imported_modules(path, root) & names.keys() for name, path in names.items()}
    return sorted(
        f"{a} <-> {b}"
        for a in imports
        for b in imports[a]
        if a < b and a in imports[b] and not (b.startswith(a + ".") or a.startswith(b + "."))
    )


def test_no_two_modules_import_each_other() -> None:
    """A loop (`env_handle` and `openenv_env` once) leaves one of the two half-imported, and says that they
    share something that belongs to neither."""
    assert mutual_imports() == []


def test_the_loop_check_finds_two_modules_that_import_each_other(tmp_path: Path) -> None:
    rollout = tmp_path / "trainer" / "rollout"
    rollout.mkdir(parents=True)
    (rollout / "a.py").write_text("def f():\n    from vistarl.trainer.rollout.b import g\n")
    (rollout / "b.py").write_text("from .a import f\n")
    assert mutual_imports(tmp_path) == ["vistarl.trainer.rollout.a <-> vistarl.trainer.rollout.b"]


def test_the_walk_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n"
        "    from vistarl.trainer.learner.fsdp import shard_model\n"
        "    import vistarl.trainer.rollout\n"
    )
    assert imported_modules(source) == {
        "vistarl.trainer.learner.fsdp",
        "vistarl.trainer.learner.fsdp.shard_model",
        "vistarl.trainer.rollout",
    }


def test_relative_imports_count_as_the_modules_they_name(tmp_path: Path) -> None:
    package = tmp_path / "clients" / "inner"
    package.mkdir(parents=True)
    source = package / "m.py"
    source.write_text("from ..protocol import Reset\nfrom . import sibling\n")
    assert imported_modules(source, tmp_path) == {
        "vistarl.clients.protocol",
        "vistarl.clients.protocol.Reset",
        "vistarl.clients.inner",
        "vistarl.clients.inner.sibling",
    }


CLIENTS_LOAD = """
import importlib, pkgutil, sys
import vistarl.clients
for found in pkgutil.walk_packages(vistarl.clients.__path__, "vistarl.clients."):
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
    assert "vistarl.clients.http" in loaded
    assert not [
        name for name in loaded if name.split(".")[0] == "torch" or name.startswith("vistarl.trainer")
    ]


def test_code_imports_the_packages_through_the_vistarl_namespace() -> None:
    """`clients`, `services` and `trainer` are reachable at the top of a checkout too (they are its
    folders), but a module imported under two names is two modules: every import goes through `vistarl`."""
    tops = (*LINKED, "cli", "launcher", "httpserver", "devtools")
    files = [
        p for folder in (*LINKED, "vistarl", "tests", "benchmarks") for p in (ROOT / folder).rglob("*.py")
    ]
    found = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in files
        for module in sorted(imported_modules(path))
        if module.split(".")[0] in tops
    ]
    assert found == []
