"""The built wheel installs one top-level import package, `vistarl`, and lives beside PyPI's `devtools`
and `trainer` (Coqui's), names that vistarl's own folders once took.

The wheel is built from this checkout (setuptools follows `vistarl/`'s links to `clients/`, `services/`
and `trainer/`) and installed into a fresh venv with PyPI's two packages. The dependencies already in
this project's venv are lent to the fresh one through a `.pth` line placed after its own site-packages,
so that nothing of the size of torch is installed again; what the fresh venv itself holds comes first.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.machine import outlasting

ROOT = Path(__file__).resolve().parents[1]
PYPI_NEIGHBOURS = ("devtools==0.13.0", "trainer==0.0.36")
"""PyPI's packages whose import names vistarl's folders took before they moved under `vistarl`."""

CHECK = """
import devtools, trainer
import vistarl.trainer.run.train, vistarl.services.sokoban, vistarl.clients.http, vistarl.cli.main
import vistarl.devtools.tiny_checkpoint, vistarl.launcher.plan, vistarl.httpserver.guard
assert hasattr(devtools, "debug"), devtools.__file__
assert hasattr(trainer, "Trainer"), trainer.__file__
for module in (vistarl.trainer.run.train, vistarl.services.sokoban, vistarl.cli.main):
    assert "site-packages" in module.__file__, module.__file__
print("both sides import:", devtools.__file__, trainer.__file__, vistarl.__file__)
"""


BUILD_S = 300.0
"""How long building the wheel may take."""
INSTALL_S = 300.0
"""How long one `pip install` may take."""
RUN_S = 120.0
"""How long a command in the new venv (and making it) may take."""


def build_wheel(out: Path) -> Path:
    """The wheel of this checkout, built without isolation from the project venv's setuptools."""
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*command, "--wheel-dir", str(out), str(ROOT)], check=True, timeout=BUILD_S, cwd=out)
    (wheel,) = out.glob("vistarl-*.whl")
    return wheel


@outlasting(BUILD_S)
def test_the_wheel_holds_one_top_level_package_and_the_linked_folders_files(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"vistarl"}
    for linked in ("clients/protocol.py", "services/sokoban/__init__.py", "trainer/run/train.py"):
        assert f"vistarl/{linked}" in names
        member = zipfile.ZipFile(wheel).read(f"vistarl/{linked}")
        assert member == (ROOT / linked).read_bytes(), f"{linked} is not the file itself in the wheel"
    assert any(n.startswith("vistarl/services/sokoban/data/boxoban/") for n in names), "package data left out"


@pytest.mark.slow
@outlasting(BUILD_S, 2 * INSTALL_S, 4 * RUN_S)
def test_the_wheel_installs_beside_pypis_devtools_and_trainer(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=RUN_S)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=RUN_S,
    ).stdout.strip()
    Path(site, "zz_project_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile"]
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True, timeout=INSTALL_S, cwd=tmp_path)
    subprocess.run([*pip, *PYPI_NEIGHBOURS], check=True, timeout=INSTALL_S, cwd=tmp_path)
    done = subprocess.run(
        [str(python), "-c", CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=RUN_S
    )
    assert done.returncode == 0, done.stderr
    assert "both sides import" in done.stdout
    vistarl = subprocess.run(
        [str(venv / "bin" / "vistarl"), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=RUN_S
    )
    assert vistarl.returncode == 0 and "serve" in vistarl.stdout, vistarl.stderr
