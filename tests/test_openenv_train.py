"""OpenEnv servers as training envs: `vistarl train` runs GRPO steps of the tiny model against a real
openenv-core server (`tests/envs/openenv_colors.py`: a text field, an image field, a reward) through an
`openenv+ws://` env URL, and every trajectory is token-exact, with the rewards the env gave. Failures on
the OpenEnv side (an error answer, a closed socket, a schema the adapter does not fit, a stall) end the
episode FAILED with the env's message, within the env timeout; a vistarl server is an OpenEnv server too
(docs/training.md, "OpenEnv envs")."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image

from tests.envs.openenv_colors import COLORS, color_of, prompt, reward, square
from tests.envs.serving import served_process
from tests.machine import outlasting
from tests.runners import SETTINGS
from tests.test_rollout_hf import generated_runs
from vistarl.clients.images import encode_image
from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.httpserver.launch import free_port
from vistarl.trainer.config import ConfigError, OpenEnvAdapter, load_config
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.env_handle import Envs
from vistarl.trainer.rollout.job import group_jobs
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.runner import RolloutRunner
from vistarl.trainer.rollout.tokenization import TokenTracks, TurnEncoder
from vistarl.trainer.rollout.trajectory import Status, Trajectory

TRAIN_S = 600.0
"""How long `vistarl train`'s two steps may take here."""

ADAPTER = OpenEnvAdapter(
    text_fields=["prompt"], image_fields=["image"], system_prompt="Name the colour of the square."
)


@contextlib.contextmanager
def colors_server() -> Iterator[str]:
    """The colour env under openenv-core's server on a free loopback port; yields its `http://` URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "tests.envs.openenv_colors", "--port", str(port)]
    with running_process(command, ready_url=f"{url}/health", timeout=120):
        yield url


@pytest.fixture(scope="module")
def colors() -> Iterator[str]:
    with colors_server() as url:
        yield url


@pytest.fixture(scope="module")
def processor(tiny_qwen25: Path) -> VLProcessor:
    return VLProcessor.from_pretrained(tiny_qwen25)


def spec(url: str, adapter: OpenEnvAdapter = ADAPTER) -> str:
    return adapter.spec(url.replace("http://", "openenv+ws://"))


def user(color: str, turn: int) -> dict[str, Any]:
    """The message the colour env's observation of turn `turn` should become: the square, then the text."""
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": encode_image(square(color))}},
            {"type": "text", "text": prompt(turn)},
        ],
    }


def check_played(trajectory: Trajectory, image_dir: Path, processor: VLProcessor) -> None:
    """The trajectory is what the token rules make of the env's observations and the generated ids, its
    rewards are the env's for the replies it was sent, and its seed is the one the env was reset with (the
    seed picks the square's colour)."""
    shown = []
    for index in range(len(trajectory.images)):
        with Image.open(image_dir / f"image-{index:02d}.png") as image:
            shown.append(image.convert("RGB"))
    color = next(name for name, rgb in COLORS.items() if rgb == shown[0].getpixel((0, 0)))
    assert trajectory.seed is not None and color == color_of(trajectory.seed)
    assert all(image.tobytes() == square(color).tobytes() for image in shown)
    runs = generated_runs(trajectory)
    replies = [processor.tokenizer.decode(run, skip_special_tokens=True) for run in runs]
    assert len(trajectory.turn_rewards) in (len(runs), len(runs) - 1)  # a reply cut by its limit is not sent
    assert trajectory.turn_rewards == [
        reward(text, color) for text in replies[: len(trajectory.turn_rewards)]
    ]
    tracks = TokenTracks(TurnEncoder(processor))
    tracks.add_prompt([{"role": "system", "content": ADAPTER.system_prompt}, user(color, 0)])
    for turn, run in enumerate(runs):
        if turn:
            tracks.add_observation(user(color, turn))
        at = len(tracks.train_ids)
        tracks.add_generation(run, trajectory.rollout_logprobs[at : at + len(run)])
    assert list(tracks.engine_ids) == trajectory.engine_ids
    assert list(tracks.train_ids) == trajectory.train_ids and list(tracks.loss_mask) == trajectory.loss_mask
    assert list(tracks.rollout_logprobs) == trajectory.rollout_logprobs


@outlasting(TRAIN_S)
def test_vistarl_train_runs_grpo_steps_against_an_openenv_server(
    colors: str, tiny_qwen25: Path, processor: VLProcessor, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    config = {
        "model": {"path": str(tiny_qwen25), "dtype": "float32", "gradient_checkpointing": False},
        "env": {  # env.name is left at its default: the server's own options are not checked against it
            "url": colors.replace("http://", "openenv+ws://"),
            "openenv": ADAPTER.model_dump(),
            "options": {"turns": 3},
        },
        "rollout": {
            "n_samples_per_prompt": 2,
            "rollout_batch_size": 2,
            "max_turns": 3,
            "rollout_max_response_len": 24,
            "max_new_tokens": 8,
            "rollout_max_context_len": 1024,
            "stop": [" "],
            "concurrency": 4,
        },
        "algo": {"advantage_estimator": "grpo"},
        "train": {"steps": 2, "micro_batch_tokens": 2048, "save_samples": 4, "run_dir": str(run_dir)},
        "logging": {"tensorboard": False},
    }
    (tmp_path / "colors.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        vistarl_cmd("train", "--config", str(tmp_path / "colors.yaml")),
        capture_output=True,
        text=True,
        timeout=TRAIN_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["rollout/episodes"] == 4.0 and record["rollout/missing"] == 0.0
        assert record["rollout/status/FAILED"] == 0.0
        assert record["train/logprob_abs_diff"] < 1e-3, "the embedded engine and the trainer disagree"
    samples = sorted((run_dir / "samples").glob("step-*/*/trajectory.json"))
    assert len(samples) == 8
    seeds = sorted(json.loads(path.read_text())["seed"] for path in samples)
    assert seeds == [0, 0, 1, 1, 2, 2, 3, 3]  # two starts a step, two samples each
    played = 0
    for path in samples:
        record = json.loads(path.read_text())
        trajectory = Trajectory.from_dict(record)
        assert trajectory.env.startswith("openenv+ws://") and trajectory.status in (
            Status.COMPLETED,
            Status.TRUNCATED,
        )
        check_played(trajectory, path.parent, processor)
        played += len(trajectory.turn_rewards)
    assert played > 0, "no reply reached the env"


async def play(
    processor: VLProcessor,
    url: str,
    replies: list[str],
    adapter: OpenEnvAdapter = ADAPTER,
    timeout_s: float = 30.0,
    **start: Any,
) -> Trajectory:
    """One episode of scripted replies against the colour env (seed 2, a blue square, unless `start` says
    otherwise)."""
    runner = RolloutRunner(ScriptedEngine(processor, replies), processor, envs=Envs(timeout_s=timeout_s))
    try:
        return await runner(group_jobs(spec(url, adapter), [start or {"seed": 2}], 1, settings=SETTINGS)[0])
    finally:
        await runner.aclose()


async def test_scripted_replies_play_with_the_env_rewards_and_a_json_action(
    colors: str, processor: VLProcessor
) -> None:
    assert color_of(2) == "blue"
    named = await play(processor, colors, ["green?", "It is blue"])
    assert named.status is Status.COMPLETED and named.turn_rewards == [reward("green?", "blue"), 1.0]
    assert named.seed == 2
    longer = await play(processor, colors, ["red", "green", "blue"], seed=2, options={"turns": 3})
    assert longer.turn_rewards == [
        reward("red", "blue"),
        reward("green", "blue"),
        1.0,
    ]  # the env's own option
    as_json = OpenEnvAdapter(**{**ADAPTER.model_dump(), "json_action": True})
    parsed = await play(
        processor, colors, ['I say {"message": "blue"} {"note": 1} and {"message": "blue"}'], as_json
    )
    assert parsed.status is Status.COMPLETED and parsed.turn_rewards == [1.0]
    for unfit in ("no object here", '{"msg": "blue"}'):
        left = await play(processor, colors, [unfit, "blue"], as_json)
        assert left.status is Status.COMPLETED and left.turn_rewards == [0.0], (
            unfit
        )  # the env was not stepped


@pytest.mark.parametrize(
    ("adapter", "replies", "start", "error"),
    [
        (
            ADAPTER,
            ["crash"],
            {},
            "the env answered step with EXECUTION_ERROR: the colour env crashed on purpose",
        ),
        (
            OpenEnvAdapter(text_fields=["question"]),
            ["blue"],
            {},
            "schema mismatch: the env's observation has no field question",
        ),
        (
            OpenEnvAdapter(text_fields=["prompt"], action_field="text"),
            ["blue"],
            {},
            "schema mismatch: the env's action (fields ['message', 'metadata'], required ['message'])",
        ),
        (ADAPTER, ["blue"], {"task_id": "test/1"}, "not a task_id or a sample"),
    ],
)
async def test_openenv_side_failures_end_the_episode_failed_with_the_envs_message(
    colors: str,
    processor: VLProcessor,
    adapter: OpenEnvAdapter,
    replies: list[str],
    start: dict[str, Any],
    error: str,
) -> None:
    trajectory = await play(processor, colors, replies, adapter, **start)
    assert trajectory.status is Status.FAILED and error in (trajectory.error or ""), trajectory.error


async def test_a_stalled_env_fails_the_episode_within_the_timeout(
    colors: str, processor: VLProcessor
) -> None:
    stalled = await play(processor, colors, ["stall"], timeout_s=1.0)
    assert stalled.status is Status.FAILED and stalled.error == "env step timed out"


async def test_a_vistarl_server_is_an_openenv_server_and_its_closed_socket_fails_the_episode(
    processor: VLProcessor,
) -> None:
    """`vistarl serve sokoban` played as an OpenEnv server through its own `/ws`; killed under the second
    turn, its socket closes, and the episode fails with that."""
    adapter = OpenEnvAdapter(text_fields=["text"], image_fields=["images"], action_field="action")
    with served_process("sokoban", "--env-workers", "0") as (url, server):

        def kill_before_the_second_turn(index: int, _: object) -> str:
            if index == 1:
                server.kill()
                server.wait()
            return "<answer>Up</answer>"

        runner = RolloutRunner(ScriptedEngine(processor, kill_before_the_second_turn), processor, envs=Envs())
        try:
            trajectory = await runner(group_jobs(spec(url, adapter), [{"seed": 5}], 1, settings=SETTINGS)[0])
        finally:
            await runner.aclose()
    assert len(trajectory.turn_rewards) == 1 and len(trajectory.images) == 2  # the first turn went through
    assert trajectory.status is Status.FAILED and "ConnectionClosed" in (trajectory.error or ""), (
        trajectory.error
    )


def test_the_adapter_travels_in_the_env_url_and_the_config_checks_it() -> None:
    url, adapter = OpenEnvAdapter.parse(spec("http://127.0.0.1:9/"))
    assert (url, adapter) == ("ws://127.0.0.1:9", ADAPTER)
    assert OpenEnvAdapter.parse("openenv+wss://envs.example/colors?text_fields=a&json_action=true")[0] == (
        "wss://envs.example/colors"
    )
    with pytest.raises(ValueError, match="needs text_fields or image_fields"):
        OpenEnvAdapter.parse("openenv+ws://h:1")
    with pytest.raises(ValueError, match="text_fieldz"):
        OpenEnvAdapter.parse("openenv+ws://h:1?text_fieldz=a")
    cfg = load_config(None, ["env.url=openenv+ws://h:1", "env.openenv.image_fields=[image]"])
    assert cfg.env.remote == "openenv+ws://h:1?image_fields=image"
    own = ["env.url=openenv+ws://h:1", "env.openenv.text_fields=[a]", "env.options.turns=3"]
    assert load_config(None, own).env.options == {"turns": 3}  # the reset's arguments, not Sokoban's options
    for overrides, message in [
        (["env.options.turns=3"], "env.options.turns: unknown key"),  # Sokoban's options, on its own server
        (["env.url=openenv+ws://h:1"], "needs text_fields or image_fields"),
        (["env.openenv.text_fields=[a]"], "env.openenv adapts an OpenEnv server"),
        (
            ["env.url=openenv+ws://h:1", "env.openenv.text_fields=[a]", "env.eval_split=test"],
            "no env.eval_split",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(None, overrides)
