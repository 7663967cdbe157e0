"""Rollout-side token overhead: TokenTracks cost per turn, with many episodes interleaved.

Target: < 2 ms per turn per image at concurrency 64. Episodes run interleaved turn by turn, as a
rollout worker's event loop would run them; every observation carries fresh images.

    .venv/bin/python -m benchmarks.token_tracks [--checkpoint DIR] [--episodes 64] [--turns 8]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from PIL import Image

from benchmarks.harness import benchmark_parser
from vistarl.clients.images import encode_image
from vistarl.devtools.tiny_checkpoint import ARCHS, write_tiny_checkpoint
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TokenTracks, TurnEncoder
from vistarl.trainer.rollout.trajectory import Status, Trajectory

REPLY = "I see the box left of me, so I push it.\n<answer>Left</answer>"
FEEDBACK = "Turn {turn}: you moved Left. Reward -0.1. Boxes on target: 1 of 2. Steps left: 12. What next?"


def observation(turn: int, images: list[str]) -> dict[str, Any]:
    """A Sokoban-like observation message: the images, then feedback text."""
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": FEEDBACK.format(turn=turn)}]}


def run(encoder: TurnEncoder, episodes: int, turns: int, images_per_turn: int) -> dict[str, float]:
    """Time add_generation + add_observation over interleaved episodes; return per-turn figures."""
    frames = [
        encode_image(Image.new("RGB", (192, 192), (i % 256, (7 * i) % 256, 90)))
        for i in range(episodes * (turns + 1) * images_per_turn)
    ]
    reply = [*encoder.encode(REPLY), encoder.ids.im_end]
    logprobs = [-0.1] * len(reply)
    tracks = [TokenTracks(encoder) for _ in range(episodes)]
    for e, track in enumerate(tracks):
        urls = frames[e * images_per_turn : (e + 1) * images_per_turn]
        track.add_prompt([{"role": "system", "content": "You solve Sokoban."}, observation(0, urls)])
    per_turn: list[float] = []
    k = episodes * images_per_turn
    for turn in range(1, turns + 1):
        for track in tracks:
            urls = frames[k : k + images_per_turn]
            k += images_per_turn
            start = time.perf_counter()
            track.add_generation(reply, logprobs, text=REPLY)
            track.add_observation(observation(turn, urls))
            per_turn.append(time.perf_counter() - start)
    start = time.perf_counter()
    for i, track in enumerate(tracks):
        Trajectory.from_tracks(
            track, episode_id=f"ep-{i}", group_id="g", policy_version=0, status=Status.COMPLETED
        ).to_msgpack()
    pack_s = (time.perf_counter() - start) / episodes
    return {
        "turn_ms_median": statistics.median(per_turn) * 1e3,
        "turn_ms_p99": sorted(per_turn)[int(0.99 * (len(per_turn) - 1))] * 1e3,
        "context_tokens": float(tracks[0].context_length),
        "trajectory_pack_ms": pack_s * 1e3,
    }


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--checkpoint", type=Path, help="checkpoint directory (default: tiny ones)")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints = (
            {args.checkpoint.name: args.checkpoint}
            if args.checkpoint
            else {arch: write_tiny_checkpoint(Path(tmp) / arch, arch) for arch in ARCHS}
        )
        for name, path in checkpoints.items():
            encoder = TurnEncoder(VLProcessor.from_pretrained(path))
            for images in (1, 2):
                r = run(encoder, args.episodes, args.turns, images)
                print(
                    f"{name}: {args.episodes} episodes x {args.turns} turns, {images} image(s)/turn: "
                    f"median {r['turn_ms_median']:.3f} ms/turn "
                    f"({r['turn_ms_median'] / images:.3f} ms/turn/image), p99 {r['turn_ms_p99']:.3f} ms, "
                    f"context {r['context_tokens']:.0f} tokens, trajectory to msgpack "
                    f"{r['trajectory_pack_ms']:.3f} ms"
                )


if __name__ == "__main__":
    main()
