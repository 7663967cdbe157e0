"""Vision-tower inputs derived on the host from `image_grid_thw`, so the tower never syncs with the GPU.

A Qwen-VL vision tower derives patch positions, attention bounds and, in Qwen2.5-VL, the window order
from `grid_thw` with `.tolist()`, `repeat_interleave` and `.item()`: each a wait for the GPU, several per
forward. transformers lets the caller hand them in precomputed (`transformers.vision_utils`, under an
`image_` prefix that `get_image_features` strips); `vision_inputs` computes them with those same helpers
from the grid on the host, and pins them for an asynchronous copy to the GPU.

They depend on the grids and the tower's settings alone, and a run's images mostly share a few grids (every
Sokoban frame has one), so they are made once for each of the last `CACHED_LAYOUTS` (settings, grids,
device). Making them is no longer free once several images go together: a few hundred small CPU ops, whose
intra-op threads wait on a busy host (on two loaded cores, 0.2 ms for one image and 30-60 ms for 2-16).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from transformers.vision_utils import (
    get_vision_cu_seqlens,
    get_vision_interpolation_indices_and_weights,
    get_vision_position_ids,
    get_vision_window_index,
)

from vistarl.trainer.modeling.device import host_to_device

CACHED_LAYOUTS = 256


def vision_inputs(visual: Any, grid_thw: torch.Tensor, device: torch.device) -> dict[str, Any]:
    """The precomputed inputs of `visual` (a Qwen2.5-VL or Qwen3-VL tower) for images of `grid_thw`
    (`[images, 3]`, on the host), as backbone kwargs on `device` (shared with other calls: read only)."""
    grids = tuple(tuple(row) for row in grid_thw.tolist())
    return dict(_vision_inputs(_TowerSettings.of(visual), grids, device))


@dataclass(frozen=True)
class _TowerSettings:
    """What of a vision tower its precomputed inputs depend on (Qwen2.5-VL's windows, Qwen3-VL's grid)."""

    merge: int
    window_size: int | None
    patch_size: int | None
    num_grid_per_side: int | None
    interpolation_mode: str | None
    align_corners: bool | None

    @classmethod
    def of(cls, visual: Any) -> _TowerSettings:
        return cls(
            visual.spatial_merge_size,
            getattr(visual, "window_size", None),
            getattr(visual, "patch_size", None),
            getattr(visual, "num_grid_per_side", None),
            getattr(visual, "interpolation_mode", None),
            getattr(visual, "interpolation_align_corners", None),
        )


@functools.lru_cache(maxsize=CACHED_LAYOUTS)
def _vision_inputs(
    tower: _TowerSettings, grids: tuple[tuple[int, ...], ...], device: torch.device
) -> dict[str, Any]:
    """`vision_inputs` made anew, outside inference mode: the engine's prompt pass asks under it, and the
    learner's forward, which saves them for backward, may take the same tensors next."""
    with torch.inference_mode(False):
        return _made(tower, torch.tensor(grids, dtype=torch.long).reshape(-1, 3), device)


def _made(tower: _TowerSettings, grid_thw: torch.Tensor, device: torch.device) -> dict[str, Any]:
    """The inputs of `tower` for images of `grid_thw` (host), on `device`."""
    cu_seqlens = get_vision_cu_seqlens(grid_thw)
    inputs: dict[str, Any] = {
        "position_ids": get_vision_position_ids(grid_thw, tower.merge),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": _longest(cu_seqlens),
    }
    if tower.window_size is not None:  # Qwen2.5-VL: most blocks attend within windows
        window_index, cu_window_seqlens = get_vision_window_index(
            grid_thw,
            spatial_merge_size=tower.merge,
            window_size=tower.window_size,
            patch_size=tower.patch_size,
        )
        inputs |= {
            "window_index": window_index,
            "cu_window_seqlens": cu_window_seqlens,
            "max_window_seqlen": _longest(cu_window_seqlens),
        }
    if tower.num_grid_per_side is not None:  # Qwen3-VL: learned positions resampled to each grid
        indices, weights = get_vision_interpolation_indices_and_weights(
            grid_thw,
            num_grid_per_side=tower.num_grid_per_side,
            mode=tower.interpolation_mode,
            align_corners=tower.align_corners,
            spatial_merge_size=tower.merge,
        )
        inputs |= {"interp_indices": indices, "interp_weights": weights}
    return {
        f"image_{name}": host_to_device(value, device) if isinstance(value, torch.Tensor) else value
        for name, value in inputs.items()
    }


def _longest(cu_seqlens: torch.Tensor) -> int:
    return int(cu_seqlens.diff().max())
