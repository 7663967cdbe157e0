"""`vistarl train` end to end on the embedded stack: one step of the tiny Sokoban config, as users run it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from tests.machine import outlasting
from tests.servers import wait_until
from vistarl.cli.main import app
from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.httpserver.launch import free_port
from vistarl.trainer.config import load_config
from vistarl.trainer.rollout.engines.base import EngineUnavailableError
from vistarl.trainer.run.outputs import draw_curve, failure_places

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "sokoban_tiny.yaml"
TRAIN_S = 600.0
"""How long a `vistarl train` run of a step or two may take here."""
FIRST_STEP_S = 300.0
"""How long a `vistarl train` run may take to its first step."""


@outlasting(TRAIN_S)
def test_one_step_of_the_tiny_sokoban_config_leaves_a_complete_run_directory(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        f"model.path={tiny_qwen25}",
        f"train.run_dir={run_dir}",
        "train.steps=3",
        "train.max_time_s=0.001",  # so it stops, and saves, after its first step
        "logging.tensorboard=true",
    ]
    command = vistarl_cmd("train", "--config", str(CONFIG), *(arg for o in overrides for arg in ("--set", o)))
    done = subprocess.run(command, capture_output=True, text=True, timeout=TRAIN_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert str(run_dir) in done.stdout
    assert "train.max_time_s=0.001 s has passed; stopping" in done.stdout

    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and record["policy_version"] == 1.0
    assert record["rollout/episodes"] == 8.0 and record["rollout/missing"] == 0.0
    for key in ("reward/mean", "train/logprob_abs_diff", "train/grad_norm", "train/entropy", "time/rollout"):
        assert key in record
    assert record["train/logprob_abs_diff"] < 1e-3, "the embedded engine and the trainer disagree"
    assert record["engine/prompt_passes"] >= 1 and record["engine/decode_steps"] >= 1
    assert 0 < record["engine/prompt_share"] < 1 and record["engine/decode_step_ms"] > 0
    assert 1 <= record["engine/rows_per_step"] <= 8, "a decode step runs one to eight episodes' rows"

    with Image.open(run_dir / "reward_curve.png") as curve:
        assert curve.width > 100
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    samples = sorted((run_dir / "samples" / "step-000001").iterdir())
    assert len(samples) == 2
    sample = json.loads((samples[0] / "trajectory.json").read_text())
    assert sample["images"] and all((samples[0] / name).is_file() for name in sample["images"])
    checkpoint = run_dir / "checkpoints" / "step-000001"
    assert (checkpoint / "actor" / "model.safetensors").is_file()
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-000001"


def test_a_bad_override_is_a_usage_error_naming_the_key() -> None:
    result = CliRunner().invoke(app, ["train", "--config", str(CONFIG), "--set", "train.stepz=1"])
    assert result.exit_code == 2
    assert "train.stepz" in result.output and "steps" in result.output


@contextlib.contextmanager
def dropping_server() -> Iterator[str]:
    """A loopback port that reads each request and closes the connection unanswered, like an engine
    that dies under the call; yields its URL."""
    listener = socket.create_server(("127.0.0.1", free_port()))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                connection, _ = listener.accept()
                with connection:
                    connection.settimeout(2.0)
                    with contextlib.suppress(OSError):
                        connection.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def test_an_engine_that_cannot_be_reached_is_a_clean_error(tiny_qwen25: Path, tmp_path: Path) -> None:
    with dropping_server() as engine_url:
        overrides = [
            f"model.path={tiny_qwen25}",
            f"train.run_dir={tmp_path / 'run'}",
            "train.steps=1",
            f"rollout.engine=hf:{engine_url}",
            "env.url=http://127.0.0.1:1",  # the weights go to the engine before any episode starts
        ]
        args = ["train", "--config", str(CONFIG), *(arg for o in overrides for arg in ("--set", o))]
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert not isinstance(result.exception, EngineUnavailableError), "a traceback, not a clean error"
    assert "training failed" in result.output and f"{engine_url}/update_weights_from_disk" in result.output


def test_a_step_without_episodes_points_where_their_failures_are(tmp_path: Path) -> None:
    served_here = failure_places(load_config(CONFIG, []), tmp_path)
    assert served_here.startswith(str(tmp_path / "env-server.log"))
    assert "warnings above" in served_here
    external = load_config(
        CONFIG,
        [
            "env.url=http://envs:8000",
            "rollout.queue=redis://redis:6379/0",
            "rollout.local_workers=0",
            "rollout.namespace=run-7",
        ],
    )
    elsewhere = failure_places(external, tmp_path)
    assert "env-server.log" not in elsewhere and "http://envs:8000" in elsewhere
    assert "vistarl queue dlq --namespace run-7" in elsewhere


def test_the_curve_draws_held_out_success_over_training_success_where_the_run_evaluated(
    tmp_path: Path,
) -> None:
    """`draw_curve` adds the periodic held-out evaluation as a second (orange) line on the success panel."""
    records = [{"step": s, "reward/mean": 0.1 * s, "env/success": 0.1 * s} for s in range(1, 5)]

    def orange_pixels(path: Path) -> int:
        with Image.open(path) as image:
            pixels = image.convert("RGB").get_flattened_data()
            return sum(1 for r, g, b in pixels if r > 230 and 100 < g < 150 and b < 60)

    plain = draw_curve(records, tmp_path / "plain.png")
    records[1]["eval/success_rate"] = records[3]["eval/success_rate"] = 0.5
    evaluated = draw_curve(records, tmp_path / "evaluated.png")
    assert orange_pixels(plain) == 0
    assert orange_pixels(evaluated) > 100


@pytest.mark.slow  # a training run and its env server in subprocesses: a minute of CPU
@outlasting(FIRST_STEP_S, TRAIN_S)
def test_a_run_whose_env_server_dies_stops_naming_it_and_counts_no_step_without_episodes(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    """SIGKILL the env server after the first step: each later try has only FAILED episodes, which is no
    step; after `train.max_unusable_steps` tries in a row the run exits 1 naming the server's URL.

    A real `vistarl train` process and env server, so it takes as long as the one-step test above
    (about 30 s here, mostly the trainer's start); `rollout.env_outage_s=1` keeps each failed try short.
    """
    run_dir = tmp_path / "run"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = vistarl_cmd("serve", "sokoban", "--port", str(port), "--log-level", "warning")
    overrides = [
        f"model.path={tiny_qwen25}",
        f"train.run_dir={run_dir}",
        "train.steps=50",  # more than the run can finish before the kill
        "train.max_unusable_steps=2",
        "rollout.rollout_batch_size=1",
        "rollout.n_samples_per_prompt=2",
        "rollout.max_turns=1",
        "rollout.env_outage_s=1",
        "logging.tensorboard=false",
        f"env.url={url}",
    ]
    command = vistarl_cmd("train", "--config", str(CONFIG), *(arg for o in overrides for arg in ("--set", o)))
    with running_process(server, ready_url=f"{url}/health", env={"VISTARL_API_TOKEN": ""}) as env_proc:
        trainer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            first_step = run_dir / "metrics.jsonl"
            assert wait_until(lambda: first_step.is_file() or trainer.poll() is not None, FIRST_STEP_S)
            os.killpg(env_proc.pid, signal.SIGKILL)
            output, _ = trainer.communicate(timeout=TRAIN_S)
        finally:
            trainer.kill()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    said = " ".join(output.split())  # the console wraps long lines
    assert trainer.returncode == 1, output
    assert "2 tries in a row had no episode to learn from" in said and url in said, output
    assert "nothing to learn from" in said
    assert [r["step"] for r in records] == list(range(1, len(records) + 1)) and len(records) < 50
    for record in records:  # every step that counted had episodes to learn from
        assert record.get("rollout/status/COMPLETED", 0) + record.get("rollout/status/TRUNCATED", 0) > 0
