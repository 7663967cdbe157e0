"""PNG encoding of the envs' frames: the wire's writer (`vistarl.clients.images.png_bytes`) against Pillow's.

    .venv/bin/python -m benchmarks.png_encoding [--envs sokoban geo3k vsi] [--episodes 8] [--repeats 20]

For each env, the reset images of `--episodes` episodes (seeds 0, 1, ...; Sokoban's 384x384 palette
frames, Geo3k's 448x448 grayscale diagrams, VSI's nine 384x384 RGB views) are encoded `--repeats`
times each by both writers, after one untimed pass: `png_bytes` (8-bit modes written by the project,
deflated by ISA-L at level 1) and Pillow's `Image.save(format="PNG", compress_level=1)`, the encoder the
wire used before. Prints CPU ms per image and the mean PNG size for each, and checks that both files
decode to the same pixels.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass

from PIL import Image

from benchmarks.harness import benchmark_parser, markdown_header
from vistarl.clients.images import pillow_png, png_bytes
from vistarl.services.env_api import load_env_factory


@dataclass(frozen=True)
class Figures:
    """One writer on one env's images."""

    env: str
    writer: str
    images: int
    cpu_ms: float
    mean_bytes: float


def frames(env_name: str, episodes: int) -> list[Image.Image]:
    """The images of the first observation of `episodes` episodes of `env_name`."""
    factory = load_env_factory(env_name)
    factory.preload()
    images: list[Image.Image] = []
    for seed in range(episodes):
        env = factory.create(factory.options_model(), seed, None)
        observation, _ = env.reset()
        images.extend(observation["images"])
        env.close()
    return images


def measure(
    env: str, writer: str, encode: Callable[[Image.Image], bytes], images: list[Image.Image], repeats: int
) -> Figures:
    """CPU ms per image of `encode` over `repeats` passes of `images` (after one untimed pass)."""
    sizes = [len(encode(img)) for img in images]
    start = time.process_time()
    for _ in range(repeats):
        for img in images:
            encode(img)
    used = time.process_time() - start
    return Figures(env, writer, len(images), 1000 * used / (repeats * len(images)), sum(sizes) / len(sizes))


def same_pixels(images: list[Image.Image]) -> bool:
    """Whether both writers' files decode to the pixels of every image."""
    for img in images:
        ours, pillows = (Image.open(io.BytesIO(encode(img))) for encode in (png_bytes, pillow_png))
        if not ours.tobytes() == pillows.tobytes() == img.tobytes():
            return False
    return True


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--envs", nargs="+", default=["sokoban", "geo3k", "vsi"])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(markdown_header("env", "images", "writer", "CPU ms/image", "mean bytes", text=("env", "writer")))
    for env in args.envs:
        images = frames(env, args.episodes)
        if not same_pixels(images):
            raise SystemExit(f"{env}: the two writers' PNGs decode to different pixels")
        rows = [
            measure(env, "png_bytes (ISA-L level 1)", png_bytes, images, args.repeats),
            measure(env, "Pillow, compress_level=1", pillow_png, images, args.repeats),
        ]
        for row in rows:
            print(f"| {env} | {row.images} | {row.writer} | {row.cpu_ms:.3f} | {row.mean_bytes:.0f} |")
        print(f"| {env} | | speed-up | {rows[1].cpu_ms / rows[0].cpu_ms:.1f}x | |")


if __name__ == "__main__":
    main()
