"""The episode loop with a real model: the tiny checkpoint through HFEngine against a real Sokoban server.

A random-init model rarely emits `<|im_end|>`, so to get multi-turn episodes some jobs make every
token a stop token (`stop_token_ids` over the whole vocabulary): each reply is then one sampled
token that ends with finish reason `stop`. Other jobs keep the normal stops and are cut by length.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from tests.test_env_handle import env_process
from vistarl.cli.main import app
from vistarl.services.env_api import load_env_factory
from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.learner.logprobs import sequence_logprobs
from vistarl.trainer.queue.consumer import ResultConsumer
from vistarl.trainer.queue.episode_runner import make_episode_runner
from vistarl.trainer.queue.memory import MemoryQueue
from vistarl.trainer.queue.worker import WorkerOptions, run_worker
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.spec import EngineSpec
from vistarl.trainer.rollout.env_handle import Envs
from vistarl.trainer.rollout.job import EpisodeSettings, group_jobs
from vistarl.trainer.rollout.runner import RolloutRunner, run_jobs
from vistarl.trainer.rollout.trajectory import Status, Trajectory

TEMPERATURE = 0.8
ATOL = 1e-4
ANY_QWEN_VOCAB = 2**18
SMALL = {"options": {"cell_size": 16}}  # 96x96 images: 9 image tokens each, for speed on CPU


@pytest.fixture(scope="module")
def sokoban_url() -> Iterator[str]:
    with env_process("sokoban") as (url, _):
        yield url


@pytest.fixture
async def engine(tiny_qwen25: Path) -> AsyncIterator[HFEngine]:
    loaded = HFEngine.from_pretrained(tiny_qwen25)
    yield loaded
    await loaded.close()


def one_token_replies(engine: HFEngine, config: RolloutConfig) -> EpisodeSettings:
    """`config`'s settings, with every token a stop token: one-token replies that finish with `stop`."""
    return EpisodeSettings.of(config).sampled_with(stop_token_ids=list(range(engine.vocab_size)))


def generated_runs(trajectory: Trajectory) -> list[list[int]]:
    """The maximal runs of mask-1 tokens, in order."""
    runs: list[list[int]] = []
    previous = 0
    for token, bit in zip(trajectory.train_ids, trajectory.loss_mask, strict=True):
        if bit:
            if previous:
                runs[-1].append(token)
            else:
                runs.append([token])
        previous = bit
    return runs


async def test_hf_episodes_are_token_exact_and_match_the_trainer_logprobs(
    engine: HFEngine, sokoban_url: str
) -> None:
    config = RolloutConfig(max_turns=3, max_new_tokens=4, rollout_temperature=TEMPERATURE)
    jobs = [
        *group_jobs(
            sokoban_url, [SMALL | {"seed": 1}], 2, settings=one_token_replies(engine, config), prefix="stop"
        ),
        *group_jobs(
            sokoban_url, [SMALL | {"seed": 2}], 2, settings=EpisodeSettings.of(config), prefix="length"
        ),
    ]
    envs = Envs(token="", outage_s=10.0)
    runner = RolloutRunner(engine, engine.processor, config, envs=envs)
    results = [Trajectory.from_dict(t) async for t in run_jobs(runner, jobs, concurrency=4)]
    await envs.aclose()
    by_id = {t.episode_id: t for t in results}
    prefix = engine.processor.tokenizer.encode("<|im_start|>assistant\n")
    for trajectory in by_id.values():
        stop_group = trajectory.group_id.startswith("stop")
        cut_by = "the turn budget of 3 turns" if stop_group else "the reply hit its limit"
        assert trajectory.status is Status.TRUNCATED and cut_by in (trajectory.error or ""), trajectory.error
        runs = generated_runs(trajectory)
        assert [len(run) for run in runs] == ([1, 1, 1] if stop_group else [4])
        assert len(trajectory.turn_rewards) == (3 if stop_group else 0)
        # Each reply sits right after the generation prompt, on both tracks.
        train, engine_track = trajectory.train_ids, trajectory.engine_ids
        starts = [i for i, bit in enumerate(trajectory.loss_mask) if bit and not trajectory.loss_mask[i - 1]]
        assert all(train[s - len(prefix) : s] == prefix for s in starts)
        assert engine.processor.expand_image_pads(engine_track, trajectory.image_grid_thw) == train
        mask = np.array(trajectory.loss_mask, dtype=bool)
        logprobs = np.array(trajectory.rollout_logprobs)
        assert np.all(logprobs[~mask] == 0.0) and np.all(logprobs[mask] < 0.0)
        assert len(trajectory.images) == len(trajectory.image_grid_thw) == len(runs)
        assert trajectory.policy_version == 0
        assert Trajectory.from_msgpack(trajectory.to_msgpack()) == trajectory
        with torch.no_grad():
            recomputed = sequence_logprobs(
                engine.model,
                engine.processor,
                train,
                trajectory.images,
                TEMPERATURE,
                mask=trajectory.loss_mask,
            )
        scored = recomputed[torch.tensor(trajectory.loss_mask, dtype=torch.bool)]
        np.testing.assert_allclose(logprobs[mask], scored.numpy(), atol=ATOL)


async def test_the_default_runner_works_through_a_worker(tiny_qwen25: Path, sokoban_url: str) -> None:
    queue = MemoryQueue()
    options = WorkerOptions(
        engine=EngineSpec(kind="hf", target=str(tiny_qwen25)),
        env_urls={"sokoban": sokoban_url},
        reward_path="vistarl.services.sokoban.reward",
        concurrency=4,
    )
    settings = EpisodeSettings.of(RolloutConfig(max_turns=2, max_new_tokens=3))
    settings = settings.sampled_with(stop_token_ids=list(range(ANY_QWEN_VOCAB)))
    jobs = group_jobs(
        "sokoban", [SMALL | {"seed": 4}, SMALL | {"seed": 5}], 2, settings=settings, policy_version=3
    )
    await queue.enqueue(jobs)
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(options, stop, factory=make_episode_runner, queue=queue))
    try:
        results = await ResultConsumer(queue).collect(len(jobs), timeout_s=120)
    finally:
        stop.set()
        await asyncio.wait_for(worker, timeout=60)
    assert sorted(r.episode_id for r in results) == sorted(j.episode_id for j in jobs)
    for result in results:
        trajectory = Trajectory.from_dict(result)
        assert trajectory.status is Status.TRUNCATED, trajectory.error  # 1-token replies never solve a level
        assert trajectory.error == "the turn budget of 2 turns is spent"
        assert trajectory.policy_version == 0, "the engine's weight version wins over the job's"
        metrics = trajectory.metrics
        expected = (
            sum(trajectory.turn_rewards) / 2
            + 5 * metrics["env/success"]
            + metrics["env/dist0"]
            - metrics["env/dist1"]
        )
        assert trajectory.episode_reward == pytest.approx(expected)


def test_the_rollout_command_writes_trajectories_and_a_summary(tiny_qwen25: Path, tmp_path: Path) -> None:
    out = tmp_path / "rollouts.jsonl"
    args = [
        "rollout", "--env", "sokoban", "--engine", f"hf:{tiny_qwen25}", "--episodes", "4",
        "--group-size", "2", "--out", str(out), "--concurrency", "4", "--seed", "7",
        "--max-turns", "2", "--max-new-tokens", "3", "--options", '{"grid_size": 5, "cell_size": 16}',
    ]  # fmt: skip
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 4
    assert sorted({t["group_id"] for t in lines}) == ["ep-g0", "ep-g1"]
    assert all(t["status"] == "TRUNCATED" and sum(t["loss_mask"]) == 3 for t in lines)
    assert "TRUNCATED" in done.output and "tokens/s" in done.output
    bad = CliRunner().invoke(
        app, [*args[:5], "--episodes", "3", "--group-size", "2", "--out", str(out)], env={"COLUMNS": "200"}
    )
    assert bad.exit_code != 0 and "do not split into groups of 2" in bad.output


def test_the_rollout_command_plays_an_envs_split_and_a_parquet_of_samples(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    rows = [load_env_factory("geo3k").splits()["test"][index] for index in (5, 6)]
    tasks = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist(rows), tasks)
    common = [
        "rollout",
        "--env",
        "geo3k",
        "--engine",
        f"hf:{tiny_qwen25}",
        "--episodes",
        "2",
        "--max-turns",
        "1",
    ]
    played = {}
    for name, flags in {"split": ["--task-split", "test"], "parquet": ["--tasks", str(tasks)]}.items():
        out = tmp_path / f"{name}.jsonl"
        done = CliRunner().invoke(app, [*common, *flags, "--out", str(out), "--max-new-tokens", "2"])
        assert done.exit_code == 0, done.output
        played[name] = [json.loads(line)["images"] for line in out.read_text().splitlines()]
    assert played["split"][0] != played["split"][1], "groups play the split's rows 0 and 1"
    assert all(images for images in played["split"] + played["parquet"])
    both = CliRunner().invoke(app, [*common, "--task-split", "test", "--tasks", str(tasks), "--out", "x"])
    assert both.exit_code != 0 and "not both" in both.output
