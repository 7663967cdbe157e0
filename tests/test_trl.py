"""vistarl's envs as TRL `environment_factory` classes (`vistarl.clients.trl`, docs/trl.md): the tools TRL
shows the model are the servers' own, an episode plays a real server through them with its images as
PIL, the reward TRL reads is the episode reward, and TRL's GRPOTrainer trains 2 steps on the tiny
Qwen3-VL against a real `vistarl serve sokoban`, running examples/trl_grpo.py as docs/trl.md does; with
a double of the model's replies, a rollout's tool call plays the episode inside TRL."""

from __future__ import annotations

import inspect
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from transformers.utils import get_json_schema
from trl import GRPOConfig, GRPOTrainer

from tests.envs.serving import served
from vistarl.clients import BadRequestError, EnvClient, EpisodeDoneError
from vistarl.clients.trl import Geo3k, Sokoban, TRLEnv, Vsi, dataset
from vistarl.devtools.hf_processor import load_processor
from vistarl.services.geo3k import TOOLS as GEO3K_TOOLS
from vistarl.services.geo3k.generator import generate
from vistarl.services.sokoban.tools import TOOLS as SOKOBAN_TOOLS
from vistarl.services.vsi.tools import TOOLS as VSI_TOOLS

ROOT = Path(__file__).resolve().parents[1]
ONE_PUSH = {"xsb": "#####\n#@$.#\n#####"}
"""A level that one move, Right, solves; Left walks into the wall."""


@pytest.fixture(scope="module")
def sokoban_url() -> Iterator[str]:
    with served("sokoban") as url:
        yield url


@pytest.fixture(scope="module")
def sokoban(sokoban_url: str) -> Iterator[EnvClient]:
    with EnvClient(sokoban_url, token="") as client:
        yield client


def trl_tools(env_class: type[TRLEnv]) -> list[Any]:
    """The methods TRL's GRPOTrainer makes tools of: the class's public functions but reset and get_reward."""
    return [
        function
        for name, function in inspect.getmembers(env_class, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    ]


def described(tool: dict[str, Any]) -> tuple[Any, ...]:
    """What a tool's schema tells the model: its name, description, each parameter's type, choices and
    description, and the required ones (whitespace as one space, since a docstring wraps its lines)."""
    function = tool["function"]
    parameters = function["parameters"]

    def words(text: str) -> str:
        return " ".join(text.split())

    return (
        function["name"],
        words(function["description"]),
        {
            name: (spec["type"], spec.get("items"), spec.get("enum"), words(spec["description"]))
            for name, spec in parameters["properties"].items()
        },
        parameters.get("required", []),
    )


@pytest.mark.parametrize(
    ("env_class", "server_tools"), [(Sokoban, SOKOBAN_TOOLS), (Geo3k, GEO3K_TOOLS), (Vsi, VSI_TOOLS)]
)
def test_the_tools_trl_shows_the_model_are_the_servers_own(
    env_class: type[TRLEnv], server_tools: list[dict[str, Any]]
) -> None:
    """transformers writes each method's schema from its hints and docstring, as TRL has it do."""
    ours = sorted(described(get_json_schema(method)) for method in trl_tools(env_class))
    assert ours == sorted(described(tool) for tool in server_tools)


def test_reset_gives_the_envs_first_message_with_its_images_as_pil(sokoban: EnvClient) -> None:
    env = Sokoban(sokoban, options=ONE_PUSH)
    blocks = env.reset(seed=3, prompt=[{"role": "user", "content": ""}])  # TRL passes the row's columns
    wire = sokoban.reset(seed=3, options=ONE_PUSH, format=True)
    sokoban.close(wire.session_id)
    assert wire.message is not None and not isinstance(wire.message.content, str)
    assert [block["type"] for block in blocks] == [
        "image" if part.type == "image_url" else "text" for part in wire.message.content
    ]
    assert [block["text"] for block in blocks if block["type"] == "text"] == [
        part.text for part in wire.message.content if part.type == "text"
    ]
    images = [block["image"] for block in blocks if block["type"] == "image"]
    assert len(images) == 1 and isinstance(images[0], Image.Image) and env.images == images
    assert env.session_id is not None and env.turn_rewards == [] and not env.done
    env.get_reward()


def test_a_tool_call_plays_a_turn_and_the_reward_is_the_episode_reward(sokoban: EnvClient) -> None:
    env = Sokoban(sokoban, options=ONE_PUSH)
    env.reset()
    with pytest.raises(BadRequestError, match="'Jump' is not one of"):
        env.act(["Jump"])  # type: ignore[list-item]
    assert env.turn_rewards == []  # a refused call plays no turn
    blocks = env.act(["Right"])
    assert env.done and [block["type"] for block in blocks].count("image") == 1
    with pytest.raises(EpisodeDoneError):
        env.act(["Left"])
    session_id = env.session_id
    assert session_id is not None
    reward = env.get_reward()
    assert reward == env.info["episode_reward"] != sum(env.turn_rewards)
    assert env.session_id is None and sokoban.close(session_id) is False  # get_reward ended the session


def test_an_unfinished_episode_is_worth_its_turn_rewards(sokoban: EnvClient) -> None:
    env = Sokoban(sokoban, options=ONE_PUSH)
    env.reset()
    env.act(["Left"])  # into the wall: penalised, and the box stays where it was
    assert not env.done and "episode_reward" not in env.info
    assert env.get_reward() == sum(env.turn_rewards) < 0


def test_geo3k_grades_the_last_calc_score_answer_once_the_rollout_ends() -> None:
    """TRL never shows an env the model's last reply, so get_reward sends Geo3k's reply without a tool call,
    which ends the episode and grades the last answer given to calc_score."""
    answer = generate(7).answer
    with served("geo3k") as url, EnvClient(url, token="") as client:
        env = Geo3k(client)
        env.reset(seed=7)
        (feedback,) = env.calc_score(answer)
        assert "calc_score result: 1.0" in feedback["text"] and not env.done
        assert env.get_reward() == 1.0
        env.reset(seed=7)
        env.calc_score("-12345")
        assert env.get_reward() == 0.0


def test_dataset_rows_prompt_with_the_system_prompt_and_name_each_task(sokoban: EnvClient) -> None:
    rows = dataset(sokoban, seeds=range(3))
    system = sokoban.info().system_prompt
    assert rows["seed"] == [0, 1, 2]
    assert rows[0]["prompt"] == [{"role": "system", "content": system}, {"role": "user", "content": ""}]
    custom = dataset(sokoban, task_ids=["test/0"], system_prompt="Call act.")
    assert custom[0]["task_id"] == "test/0" and custom[0]["prompt"][0]["content"] == "Call act."
    for tasks in ({}, {"seeds": [1], "task_ids": ["test/0"]}, {"seeds": []}):
        with pytest.raises(ValueError, match="task"):
            dataset(sokoban, **tasks)  # type: ignore[arg-type]


def documented_run() -> list[str]:
    """The example's command line in docs/trl.md that trains on the tiny checkpoint."""
    text = (ROOT / "docs" / "trl.md").read_text()
    (line,) = re.findall(r"^python examples/trl_grpo\.py .*--model runs/tiny-qwen3.*$", text, re.MULTILINE)
    return shlex.split(line)


def server_counts(url: str) -> dict[str, float]:
    """The server's reset count and live sessions, from its /metrics."""
    text = httpx.get(f"{url}/metrics").text
    wanted = ("vistarl_env_resets_total", "vistarl_env_active_sessions")
    return {
        name: float(value)
        for name, value in re.findall(r"^(\w+) (\S+)$", text, re.MULTILINE)
        if name in wanted
    }


def test_grpo_trainer_trains_two_steps_through_the_example(
    sokoban_url: str, tiny_qwen3: Path, tmp_path: Path
) -> None:
    """docs/trl.md's command, on this server and the tiny checkpoint: 2 steps of 2 rollouts, each reset
    from the dataset and ended by get_reward. glibc keeps freed memory for the next step, as `make demo`
    runs (Makefile, DEMO_MALLOC)."""
    argv = documented_run()
    argv = [sys.executable, *[sokoban_url if w == "http://127.0.0.1:8000" else w for w in argv[1:]]]
    argv = [str(tiny_qwen3) if w == "runs/tiny-qwen3" else w for w in argv]
    before = server_counts(sokoban_url)
    malloc = {f"MALLOC_{knob}_": str(2**30) for knob in ("MMAP_THRESHOLD", "TRIM_THRESHOLD", "TOP_PAD")}
    run = subprocess.run(
        [*argv, "--out", str(tmp_path / "run")],
        cwd=ROOT,
        env={**os.environ, "VISTARL_API_TOKEN": "", **malloc},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.findall(r"^step (\d): reward [-+]\d", run.stdout, re.MULTILINE) == ["1", "2"]
    after = server_counts(sokoban_url)
    assert after["vistarl_env_resets_total"] - before["vistarl_env_resets_total"] == 4
    assert after["vistarl_env_active_sessions"] == 0


def test_a_tool_call_in_a_trl_rollout_plays_the_episode_and_trl_reads_its_reward(
    sokoban: EnvClient, tiny_qwen3: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The random tiny model writes no tool call, so a double of TRL's generation step writes the replies
    of a model that plays: the call `act(["Right"])`, then, once its result (text and the new frame) is
    in, a reply without one. TRL runs the tool, shows the frame, and logs the episode's reward."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    played: list[Sokoban] = []

    def sokoban_env() -> Sokoban:
        played.append(Sokoban(sokoban, options=ONE_PUSH))
        return played[-1]

    config = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=256,
        bf16=False,
        activation_checkpointing=False,
        save_strategy="no",
        report_to="none",
    )
    trainer = GRPOTrainer(
        model=str(tiny_qwen3),
        args=config,
        processing_class=load_processor(tiny_qwen3),
        train_dataset=dataset(sokoban, seeds=[0]),
        environment_factory=sokoban_env,
    )
    tokenizer = trainer.processing_class.tokenizer
    call = tokenizer.encode(
        '<tool_call>\n{"name": "act", "arguments": {"moves": ["Right"]}}\n</tool_call><|im_end|>'
    )
    images_seen: list[list[int]] = []

    def scripted_generation(prompt_ids: list[list[int]], images: Any, *args: Any, **kwargs: Any) -> Any:
        """The double: each rollout's first reply is the call, the reply after its result has none."""
        images_seen.append([len(rollout_images) for rollout_images in images])
        replies = call if len(images_seen) == 1 else tokenizer.encode("Solved.<|im_end|>")
        return [replies for _ in prompt_ids], None

    monkeypatch.setattr(trainer, "_generate_single_turn", scripted_generation)
    trainer.train()
    assert images_seen == [[1, 1], [2, 2]]  # the first frame, then the tool's new one as well
    (logged,) = [record for record in trainer.state.log_history if "reward" in record]
    assert logged["tools/call_frequency"] == 1.0 and logged["tools/failure_frequency"] == 0.0
    assert [env.done for env in played] == [True, True]
    assert logged["rewards/Sokoban/mean"] == pytest.approx(played[0].info["episode_reward"])
