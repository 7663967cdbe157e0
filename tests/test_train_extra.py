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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_train_extra_installs_alone_and_the_trainer_imports(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = [
        *(sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile"),
        f"torch=={torch.__version__}",  # the build this venv holds (here the CPU one), not a CUDA one
        "--editable",
        f"{ROOT}[train]",
    ]
    subprocess.run(install, check=True, timeout=840, cwd=tmp_path)
    done = subprocess.run(
        [str(python), "-c", CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert f"trainer imported from {ROOT}" in done.stdout
