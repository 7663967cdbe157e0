"""`openenv validate --url`, openenv-core's own runtime check of an OpenEnv server (the CLI beside this
interpreter, release `OPENENV_CORE_VERSION`), passes against `vistarl serve` of every registered env, with
and without a bearer token: `/health` says `healthy`, `/schema` and `/metadata` are open as OpenEnv's are,
`POST /mcp {}` is a JSON-RPC error with 200, and `/state` is among the OpenAPI paths beside `/reset` and
`/step` (docs/server.md, "Authentication"; docs/agents.md, "OpenEnv and TRL")."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

from tests.envs.serving import served
from vistarl.services.env_api import ENV_MODULES

OPENENV = Path(sys.executable).with_name("openenv")
TOKEN = "validate-token"
CRITERIA = 6
"""The runtime criteria of openenv-core 0.3.0's validator, every one required."""


def test_openenv_validate_passes_against_every_env_with_and_without_a_token() -> None:
    with contextlib.ExitStack() as servers:
        urls = {
            (name, token): servers.enter_context(
                served(name, "--env-workers", "0", env={"VISTARL_API_TOKEN": token} if token else None)
            )
            for name in sorted(ENV_MODULES)
            for token in ("", TOKEN)
        }
        runs = {  # the validators run side by side: each spends seconds importing openenv-core
            target: subprocess.Popen(
                [str(OPENENV), "validate", "--url", url, "--timeout", "60"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for target, url in urls.items()
        }
        for (name, token), run in runs.items():
            stdout, stderr = run.communicate(timeout=300)
            where = f"{name}, {'with' if token else 'without'} a token"
            assert run.returncode == 0, f"{where}: {stdout}{stderr}"
            report = json.loads(stdout)
            assert report["passed"] and report["mode"] == "simulation", f"{where}: {report}"
            assert report["summary"]["passed_count"] == CRITERIA, f"{where}: {report['summary']}"
