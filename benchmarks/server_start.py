"""Seconds from spawning `vistarl serve ENV` to its first 200 on `/health`, the start-up a test or a
restarted replica waits for (docs/benchmarks.md, "Start-up").

    .venv/bin/python -m benchmarks.server_start --env sokoban --starts 5
    .venv/bin/python -m benchmarks.server_start --env sokoban --starts 5 -- --env-workers 0   # serve's flags

Each start is a fresh process on a free loopback port (`benchmarks.harness.served_env`, which polls
`/health` every 50 ms), stopped before the next begins. Prints each start, the median and a JSON line.
"""

from __future__ import annotations

import json
import statistics
import time

from benchmarks.harness import benchmark_parser, served_env


def time_start(env: str, flags: list[str]) -> float:
    """One start of `vistarl serve env *flags`: spawn to the first healthy answer, in seconds."""
    started = time.perf_counter()
    with served_env(env, 8, *flags):
        return time.perf_counter() - started


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--env", default="sokoban", choices=["sokoban", "geo3k", "vsi"])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("flags", nargs="*", help="flags for `vistarl serve`, after `--`")
    args = parser.parse_args()
    seconds = [time_start(args.env, args.flags) for _ in range(args.starts)]
    for index, value in enumerate(seconds, start=1):
        print(f"start {index}: {value:.2f} s to /health")
    median = statistics.median(seconds)
    print(f"{args.env}: median {median:.2f} s over {args.starts} starts")
    print(json.dumps({"env": args.env, "starts_s": seconds, "median_s": median}))


if __name__ == "__main__":
    main()
