"""Multi-turn Sokoban episodes through the HF engine, without and with its prefix cache: the prompt tokens
each configuration computes, and the share of the engine's time in prompt passes.

    .venv/bin/python -m benchmarks.engine_turns                        # tiny Qwen2.5-VL on this CPU
    python3 -m benchmarks.engine_turns --shape qwen3_vl_2b --checkpoints DIR --device cuda \\
        --rows 16 --group-size 4 --turns 8 --new-tokens 24            # the Sokoban system run's shape

`--rows` episodes play at once, `--group-size` of them on each level (Sokoban seed = episode // group size),
`--turns` turns each, as a rollout step of the system run does: the engine replies (greedy, at most
`--new-tokens`; random weights rarely stop, so a reply cut short is closed with `<|im_end|>`, as the token
rules close it, docs/tokens.md), the env (in this process) steps on the reply's text, and the next turn
resends the whole history with its images. Each configuration plays the same episodes twice on a fresh
engine: an unmeasured round (CUDA graphs captured), then the measured one, its prefix cache emptied first.
Printed per configuration: wall seconds, prompt tokens (all of the requests'), those computed and those
taken from the cache, the prompt passes' seconds and their share of the batches' seconds; then whether the
two configurations gave the same ids (greedy: they should, up to bf16 near ties on a GPU). An episode
whose reply holds an image pad, which the token rules refuse, ends there (counted). Not counted: loading,
the envs' resets and steps outside the engine's batches.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

from benchmarks.engine_generate import checkpoint_for, dtype_of, shape_parser
from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.rollout.engines.base import GenerateRequest
from vistarl.trainer.rollout.engines.hf import DEFAULT_PREFIX_CACHE_MB, HFEngine
from vistarl.trainer.rollout.engines.hf.batch import EngineStats
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams
from vistarl.trainer.rollout.env_handle import Envs
from vistarl.trainer.rollout.episode_env import opening_messages
from vistarl.trainer.rollout.job import EpisodeJob, EpisodeSettings
from vistarl.trainer.rollout.tokenization import TokenTrackError, TokenTracks, TurnEncoder

ENV = "sokoban"


@dataclass(frozen=True)
class Played:
    """One measured round: its wall time, the engine's counters over it, each episode's generated ids, and
    the episodes that ended early on a refused reply."""

    wall_s: float
    stats: EngineStats
    outputs: list[list[int]]
    refused: int


async def episode(
    engine: HFEngine, envs: Envs, index: int, args: argparse.Namespace
) -> tuple[list[int], bool]:
    """Play episode `index`: its generated ids, and whether a refused reply ended it early."""
    env = await envs.open(ENV)
    seed = index // args.group_size
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
    settings = EpisodeSettings.of(RolloutConfig()).model_copy(update={"sampling": params})
    job = EpisodeJob(
        episode_id=f"turns-{index}", group_id=f"turns-{seed}", env=ENV, seed=seed, settings=settings
    )
    tracks = TokenTracks(TurnEncoder(engine.processor))
    outputs: list[int] = []
    try:
        message, _ = await env.reset(job)
        tracks.add_prompt(opening_messages(env, message))
        for turn in range(args.turns):
            request = GenerateRequest(
                engine_ids=list(tracks.engine_ids), images=list(tracks.images), sampling=params
            )
            result = await engine.generate(request)
            outputs += result.output_ids
            tracks.add_generation(result.output_ids, result.logprobs, text=result.text)
            message, step = await env.step(result.text)
            if step.done or turn == args.turns - 1:
                break
            tracks.add_observation(message)
    except TokenTrackError:
        return outputs, True
    finally:
        await env.close()
    return outputs, False


async def play(engine: HFEngine, args: argparse.Namespace) -> Played:
    """Every episode at once, from a fresh start of the engine's counters."""
    envs = Envs()
    engine.stats = EngineStats()
    started = time.perf_counter()
    try:
        done = await asyncio.gather(*(episode(engine, envs, index, args) for index in range(args.rows)))
    finally:
        await envs.aclose()
    wall = time.perf_counter() - started
    return Played(wall, engine.stats, [ids for ids, _ in done], sum(refused for _, refused in done))


def report(label: str, played: Played) -> None:
    """One printed row."""
    stats = played.stats
    share = stats.prompt_s / stats.batch_s if stats.batch_s else 0.0
    print(
        f"{label:<18} wall={played.wall_s:7.2f}s  prompt tokens={stats.prompt_tokens:>8}"
        f"  computed={stats.computed_prompt_tokens:>8}  cached={stats.cached_prompt_tokens:>8}"
        f"  prompt passes={stats.prompt_passes:>4} {stats.prompt_s:7.2f}s"
        f" ({share:.0%} of {stats.batch_s:.2f}s)"
        f"  refused replies={played.refused}",
        flush=True,
    )


async def measure(checkpoint: str, args: argparse.Namespace, prefix_cache_mb: int) -> Played:
    """Two rounds on a fresh engine, the second measured after its prefix cache was emptied."""
    engine = HFEngine.from_pretrained(
        checkpoint,
        device=args.device,
        dtype=dtype_of(args),
        max_batch_size=args.rows,
        prefix_cache_mb=prefix_cache_mb,
    )
    try:
        await play(engine, args)
        await engine.flush_cache()
        return await play(engine, args)
    finally:
        await engine.close()


def main() -> None:
    parser = shape_parser(__doc__, rows=16)
    parser.set_defaults(new_tokens=24)
    parser.add_argument("--group-size", type=int, default=4, help="episodes on each level")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--prefix-cache-mb", type=int, default=DEFAULT_PREFIX_CACHE_MB, help="its bound")
    args = parser.parse_args()
    checkpoint = checkpoint_for(args)
    without = asyncio.run(measure(checkpoint, args, 0))
    report("no prefix cache", without)
    cached = asyncio.run(measure(checkpoint, args, args.prefix_cache_mb))
    report("prefix cache", cached)
    same = sum(a == b for a, b in zip(without.outputs, cached.outputs, strict=True))
    print(f"same ids with and without the cache: {same} of {args.rows} episodes", flush=True)
    agreed = [common_prefix(a, b) for a, b in zip(without.outputs, cached.outputs, strict=True)]
    print(f"ids agreed before parting, per episode: {agreed} (of {[len(a) for a in without.outputs]})")


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids two episodes' outputs share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


if __name__ == "__main__":
    main()
