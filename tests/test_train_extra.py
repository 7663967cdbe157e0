"""`vistarl[train]` alone: installed in a fresh venv, it brings no env's dependencies and the trainer imports.

Slow by nature (1.5 to 4 min on a busy 2-core machine, most of it unpacking torch and transformers): it
installs the package as `make install` does (editable, so nothing is built into the source tree), from
the same package indexes the project's venv came from and the torch build that venv holds, with pip's own
dependency resolution (no `--no-deps`), so that a dependency the trainer needs but the extra leaves out
fails here. Bytecode compilation is skipped, which changes nothing about what is installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.machine import outlasting

ROOT = Path(__file__).resolve().parents[1]
ENV_ONLY = ("moderngl", "mcp", "math_verify")
"""Import names of dependencies that only an env or MCP needs: none may come with `vistarl[train]`."""

CHECK = f"""
import importlib.util, sys
import vistarl.trainer.run.train, vistarl.trainer.run.stack
import vistarl.trainer.sft, vistarl.trainer.curriculum, vistarl.trainer.eval
import vistarl.trainer.queue.worker
import vistarl.cli.main
present = [name for name in {ENV_ONLY!r} if importlib.util.find_spec(name) is not None]
assert not present, f"installed with vistarl[train]: {{present}}"
env_packages = tuple(f"vistarl.services.{{env}}" for env in ("sokoban", "geo3k", "vsi"))
envs = sorted(m for m in sys.modules if m.startswith(env_packages))
assert not envs, f"the trainer imports env packages: {{envs}}"
print("trainer imported from", vistarl.trainer.run.train.__file__)
"""


INSTALL_S = 840.0
"""How long installing `vistarl[train]` with torch may take."""
RUN_S = 120.0
"""How long making the venv, and importing the trainer in it, may take."""


@pytest.mark.slow
@outlasting(RUN_S, INSTALL_S, RUN_S)
def test_the_train_extra_installs_alone_and_the_trainer_imports(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=RUN_S)
    python = venv / "bin" / "python"
    install = [
        *(sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile"),
        f"torch=={torch.__version__}",  # the build this venv holds (here the CPU one), not a CUDA one
        "--editable",
        f"{ROOT}[train]",
    ]
    subprocess.run(install, check=True, timeout=INSTALL_S, cwd=tmp_path)
    done = subprocess.run(
        [str(python), "-c", CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=RUN_S
    )
    assert done.returncode == 0, done.stderr
    assert f"trainer imported from {ROOT}" in done.stdout
