"""Sokoban level generation: time per level for the common configs, and the generator's limits at their edges.

    .venv/bin/python -m benchmarks.sokoban_generation [--seeds 200] [--limits] [--limit-seeds 20]

(a) Time: `generate_level` for seeds 0..N-1 of 6x6 with 1 box, 8x8 with 2, and 10x10 with 3 and 4
    (wall fraction 0.05, optimal solutions of 1..100 moves, as `/reset` with only grid_size and
    num_boxes asks), one level after another in this process: wall-clock p50 / p99 / max per level,
    the CPU-time p99 (which a busy machine disturbs less), and the median optimal length. Counted:
    room, reverse walk and every exact solve; not counted: rendering and the env around the level.
(b) --limits: each grid of sides 5..10 (squares, and 5x10 / 10x5), each box count it allows, wall
    fractions 0, 0.25 and 0.5, at both edges of `generator.limits` (min_moves at its largest; max_moves
    at its smallest), for seeds 0..M-1: how many seeds got a level (every one must), the slowest, and
    the most search states a seed spent (the generator gives up after `TOTAL_STATES`).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterator

from benchmarks.harness import benchmark_parser, markdown_header
from vistarl.services.sokoban.generator import TOTAL_STATES, GenerationError, generate_level, limits

TIMED = (((6, 6), 1), ((8, 8), 2), ((10, 10), 3), ((10, 10), 4))
LIMIT_SHAPES = [(side, side) for side in range(5, 11)] + [(5, 10), (10, 5)]
LIMIT_WALLS = (0.0, 0.25, 0.5)


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile of `values` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_config(shape: tuple[int, int], num_boxes: int, seeds: int) -> str:
    """One markdown row: generation time and optimal length over `seeds` seeds of one config."""
    wall, cpu, lengths = [], [], []
    for seed in range(seeds):
        started, cpu_started = time.perf_counter(), time.process_time()
        generated = generate_level(seed, shape, num_boxes, 0.05, 1, 100)
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
        lengths.append(len(generated.solution))
    return (
        f"| {shape[0]}x{shape[1]} | {num_boxes} | {seeds} | {percentile(wall, 0.5) * 1e3:.1f} | "
        f"{percentile(wall, 0.99) * 1e3:.1f} | {max(wall) * 1e3:.1f} | {percentile(cpu, 0.99) * 1e3:.1f} | "
        f"{statistics.median(lengths):g} |"
    )


def edge_configs() -> Iterator[tuple[tuple[int, int], int, float, int, int]]:
    """(shape, boxes, wall fraction, min_moves, max_moves) at both edges of the limits."""
    for shape, wall_fraction in itertools.product(LIMIT_SHAPES, LIMIT_WALLS):
        for num_boxes in range(1, limits(shape, 1).max_boxes + 1):
            bounds = limits(shape, num_boxes)
            yield shape, num_boxes, wall_fraction, bounds.longest_min_moves, 100
            yield shape, num_boxes, wall_fraction, 1, bounds.shortest_max_moves


def check_edge(config: tuple[tuple[int, int], int, float, int, int], seeds: int) -> str:
    """One markdown row: how many of `seeds` seeds got a level at one edge, and the slowest."""
    shape, num_boxes, wall_fraction, min_moves, max_moves = config
    made, slowest, most_states = 0, 0.0, 0
    for seed in range(seeds):
        started = time.perf_counter()
        try:
            generated = generate_level(seed, shape, num_boxes, wall_fraction, min_moves, max_moves)
            made += 1
            most_states = max(most_states, generated.states)
        except GenerationError:
            pass
        slowest = max(slowest, time.perf_counter() - started)
    return (
        f"| {shape[0]}x{shape[1]} | {num_boxes} | {wall_fraction} | {min_moves}..{max_moves} | "
        f"{made}/{seeds} | {slowest * 1e3:.0f} | {most_states} |"
    )


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--seeds", type=int, default=200, help="seeds per timed config")
    parser.add_argument("--limits", action="store_true", help="also check every edge of the limits")
    parser.add_argument("--limit-seeds", type=int, default=20, help="seeds per edge")
    args = parser.parse_args()
    columns = ["grid", "boxes", "seeds", "p50 ms", "p99 ms", "max ms", "CPU p99 ms", "median moves"]
    print(markdown_header(*columns, text=("grid",)))
    for shape, num_boxes in TIMED:
        print(time_config(shape, num_boxes, args.seeds), flush=True)
    if args.limits:
        columns = ["grid", "boxes", "walls", "moves", "levels", "slowest ms"]
        columns += [f"most states (of {TOTAL_STATES})"]
        print("\n" + markdown_header(*columns, text=("grid", "moves")))
        for config in edge_configs():
            print(check_edge(config, args.limit_seeds), flush=True)


if __name__ == "__main__":
    main()
