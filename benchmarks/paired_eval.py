"""Two held-out evaluations of the same tasks, level by level: is the second better beyond noise?

    .venv/bin/python -m benchmarks.paired_eval runs/demo-<time>/eval-sft runs/demo-<time>/eval-rl

Each directory is what `vistarl eval` or `vistarl demo learn` saves (`episode-NNN/trajectory.json`).
Prints each side's successes and its most frequent final replies (a policy that answers one constant
reply shows here), the levels solved by one side only, and the exact two-sided McNemar p-value of
those discordant pairs: the paired test for two success rates measured on the same levels.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path

from benchmarks.harness import benchmark_parser


def outcomes(eval_dir: Path) -> dict[str, tuple[bool, str]]:
    """Per task (its group id): whether it was solved, and the last reply."""
    found = {}
    for path in sorted(eval_dir.glob("episode-*/trajectory.json")):
        trajectory = json.loads(path.read_text())
        replies = [m["content"] for m in trajectory["messages"] if m["role"] == "assistant"]
        solved = trajectory["metrics"].get("env/success", 0.0) > 0
        found[trajectory["group_id"]] = (solved, str(replies[-1]) if replies else "")
    if not found:
        raise SystemExit(f"{eval_dir} holds no episode-*/trajectory.json")
    return found


def mcnemar_p(only_first: int, only_second: int) -> float:
    """The exact two-sided McNemar p-value: the discordant pairs against a fair coin."""
    n = only_first + only_second
    tail = sum(math.comb(n, i) for i in range(min(only_first, only_second) + 1)) / 2**n
    return min(1.0, 2 * tail)


def main(argv: list[str] | None = None) -> None:
    """Print the comparison of the two directories."""
    parser: argparse.ArgumentParser = benchmark_parser(__doc__)
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    args = parser.parse_args(argv)
    first, second = outcomes(args.first), outcomes(args.second)
    if first.keys() != second.keys():
        raise SystemExit("the two evaluations played different tasks")
    for name, side in ((args.first, first), (args.second, second)):
        replies = Counter(reply for _, reply in side.values()).most_common(3)
        print(f"{name}: {sum(s for s, _ in side.values())} of {len(side)} solved; replies {replies}")
    only_first = sum(first[k][0] and not second[k][0] for k in first)
    only_second = sum(second[k][0] and not first[k][0] for k in first)
    print(f"solved by the first only: {only_first}; by the second only: {only_second}")
    print(f"exact McNemar p = {mcnemar_p(only_first, only_second):.3f}")


if __name__ == "__main__":
    main()
