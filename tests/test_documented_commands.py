"""Every `vistarl …` command in the README and docs/ runs as written.

Each documented command is parsed by the real command line (every subcommand, option and value type);
a command with `--config` must resolve to a valid config with its `--set` overrides; and the cheap ones
run for real, from a scratch directory that links the repository's configs. Paths of user data the docs
only name (a downloaded parquet) may be absent.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer

from vistarl.cli.main import app
from vistarl.devtools.servers import vistarl_cmd
from vistarl.trainer.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL)
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")
COMMAND_LINE = re.compile(r"^\s*(\$ )?([A-Z_][A-Z0-9_]*=\S* +)*vistarl ")
"""A shell line that runs `vistarl`, after any `VAR=value` assignments."""
CHEAP = {("vsi", "render"), ("demo", "solver"), ("sokoban", "demos")}
"""Commands run for real: each takes seconds on the CI machine. `model tiny` is run (and its checkpoint
checked) by tests/test_tiny_checkpoint.py; its heavier shapes write 43-105M parameters."""


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every `vistarl` command line in a fenced block, continuation lines joined."""
    found = []
    for doc in DOCS:
        for block in FENCE.findall(doc.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                if not COMMAND_LINE.match(line):
                    continue
                words = shlex.split(line.split(" #")[0].removeprefix("$ "), comments=True)
                while words and ASSIGNMENT.match(words[0]):
                    words.pop(0)
                if words and words[0] == "vistarl":
                    found.append((f"{doc.name}: {line.strip()[:80]}", [w for w in words[1:] if w != "&"]))
    return found


COMMANDS = documented_commands()


def _cheap(argv: list[str]) -> bool:
    """Whether a documented command takes seconds: one of CHEAP."""
    return tuple(argv[:2]) in CHEAP


def parse(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """The documented argv through the real CLI: the subcommand path and its parsed parameters."""
    command: Any = typer.main.get_command(app)
    context = command.make_context("vistarl", list(argv))
    path = []
    while hasattr(command, "resolve_command"):
        name, command, rest = command.resolve_command(context, [*context._protected_args, *context.args])
        path.append(name)
        context = command.make_context(name, rest, parent=context)
    return " ".join(path), dict(context.params)


def _what_it_runs(argv: list[str]) -> str:
    """The command as the CLI parses it, less the path it writes to: two commands that differ only there,
    or in a flag given at its default, run the same code."""
    path, params = parse(argv)
    return repr((path, sorted((k, repr(v)) for k, v in params.items() if k != "out")))


RUNS = {_what_it_runs(argv): (where, argv) for where, argv in COMMANDS if _cheap(argv)}
"""The cheap commands, each distinct one once."""


def test_the_docs_document_commands() -> None:
    assert len(COMMANDS) >= 20, COMMANDS


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_documented_command_parses_and_its_config_resolves(where: str, argv: list[str]) -> None:
    try:
        path, params = parse(argv)
    except typer.BadParameter as exc:
        assert "does not exist" in str(exc) and not _in_repo(str(exc)), f"{where}: {exc}"
        return
    config = params.get("config")
    if config is not None:
        cfg = load_config(ROOT / config, list(params.get("set_") or []))
        assert cfg.env.name, where
    assert path, where


@pytest.mark.parametrize(("where", "argv"), list(RUNS.values()), ids=[where for where, _ in RUNS.values()])
def test_a_cheap_documented_command_runs(
    where: str, argv: list[str], tmp_path: Path, tiny_qwen25: Path
) -> None:
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tiny-qwen2_5_vl").symlink_to(tiny_qwen25)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VISTARL_API_TOKEN": ""}
    done = subprocess.run(
        vistarl_cmd(*argv), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"{where}\n{done.stdout}\n{done.stderr}"


def _in_repo(message: str) -> bool:
    """Whether a missing path named in an error is one the repository should hold."""
    return any(part in message for part in ("configs/", "runs/tiny"))
