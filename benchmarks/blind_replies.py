"""How much of a Sokoban held-out set a reply that never looks at the board solves.

    .venv/bin/python -m benchmarks.blind_replies --config configs/sokoban_demo_gpu.yaml
    .venv/bin/python -m benchmarks.blind_replies --config configs/sokoban_demo_gpu.yaml \
        --seeds 200000 200200 runs/seeds/3moves-seed1/eval-sft runs/seeds/3moves-seed1/eval-rl

Plays every reply of one to `max_actions_per_turn` moves on each level of the config's held-out range
(`env.eval_seeds`, or `--seeds`) and prints the levels' optimal lengths and the replies that solve the
most levels: what a policy gets without reading the board. For each EVAL_DIR (what `vistarl eval` or
`vistarl demo learn` saves for the same levels) it prints how many levels its greedy policy solved and
with how many distinct replies: a policy that reads the board answers most boards differently.
"""

from __future__ import annotations

import argparse
import itertools
from collections import Counter
from pathlib import Path

from benchmarks.harness import benchmark_parser
from benchmarks.paired_eval import outcomes
from vistarl.services.sokoban.env import SokobanEnv
from vistarl.services.sokoban.options import SokobanOptions
from vistarl.trainer.config import ConfigError, load_config

MOVES = ("Up", "Down", "Left", "Right")


def blind_replies(options: SokobanOptions) -> list[str]:
    """Every reply of one to `max_actions_per_turn` moves, as a policy would write it."""
    return [
        ", ".join(moves)
        for length in range(1, options.max_actions_per_turn + 1)
        for moves in itertools.product(MOVES, repeat=length)
    ]


def solved_by_reply(options: SokobanOptions, seeds: range) -> tuple[Counter[str], Counter[int]]:
    """How many of the levels of `seeds` each blind reply solves in one turn, and the levels' optimal
    solution lengths."""
    solved: Counter[str] = Counter()
    lengths: Counter[int] = Counter()
    replies = blind_replies(options)
    for seed in seeds:
        env = SokobanEnv(options, seed=seed)
        lengths[env.optimal_moves or 0] += 1
        for reply in replies:
            env.reset()
            solved[reply] += bool(env.step(reply).info["success"])
    return solved, lengths


def main(argv: list[str] | None = None) -> None:
    """Print the blind replies' success and the policies' distinct replies."""
    parser: argparse.ArgumentParser = benchmark_parser(__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/sokoban_demo_gpu.yaml"))
    parser.add_argument(
        "--seeds", type=int, nargs=2, metavar=("FIRST", "END"), help="default: env.eval_seeds"
    )
    parser.add_argument("--top", type=int, default=5, help="how many of the best blind replies to print")
    parser.add_argument("eval_dirs", type=Path, nargs="*")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, [])
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    if cfg.env.name != "sokoban":
        raise SystemExit(f"{args.config} trains on {cfg.env.name}, not sokoban")
    options = SokobanOptions.model_validate(cfg.env.options)
    seeds = range(*(args.seeds or cfg.env.eval_seeds))
    if not seeds:
        raise SystemExit(f"no levels in the seed range {seeds.start}-{seeds.stop}: END must be above FIRST")
    solved, lengths = solved_by_reply(options, seeds)
    print(f"{len(seeds)} levels, seeds {seeds.start}-{seeds.stop - 1}", end="; ")
    print(f"optimal lengths {dict(sorted(lengths.items()))}")
    best = ", ".join(f"{reply!r} {100 * n / len(seeds):.1f}%" for reply, n in solved.most_common(args.top))
    print(f"best blind replies: {best}")
    for eval_dir in args.eval_dirs:
        found = outcomes(eval_dir)
        wins = sum(won for won, _ in found.values())
        distinct = len({reply for _, reply in found.values()})
        share = f"{100 * wins / len(found):.1f}%"
        print(f"{eval_dir}: {share} solved with {distinct} distinct replies to {len(found)} boards")


if __name__ == "__main__":
    main()
