"""Vision-tower inputs derived on the host from `image_grid_thw`, so the tower never syncs with the GPU.

A Qwen-VL vision tower derives patch positions, attention bounds and, in Qwen2.5-VL, the window order
from `grid_thw` with `.tolist()`, `repeat_interleave` and `.item()`: each a wait for the GPU, several per
forward. transformers lets the caller hand them in precomputed (`transformers.vision_utils`, under an
`image_` prefix that `get_image_features` strips); `vision_inputs` computes them with those same helpers
from the grid on the host, and pins them for an asynchronous copy to the GPU.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.vision_utils import (
    get_vision_cu_seqlens,
    get_vision_interpolation_indices_and_weights,
    get_vision_position_ids,
    get_vision_window_index,
)

from vistarl.trainer.modeling.device import host_to_device


def vision_inputs(visual: Any, grid_thw: torch.Tensor, device: torch.device) -> dict[str, Any]:
    """The precomputed inputs of `visual` (a Qwen2.5-VL or Qwen3-VL tower) for images of `grid_thw`
    (`[images, 3]`, on the host), as backbone kwargs on `device`."""
    merge = visual.spatial_merge_size
    cu_seqlens = get_vision_cu_seqlens(grid_thw)
    inputs: dict[str, Any] = {
        "position_ids": get_vision_position_ids(grid_thw, merge),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": _longest(cu_seqlens),
    }
    if hasattr(visual, "window_size"):  # Qwen2.5-VL: most blocks attend within windows
        window_index, cu_window_seqlens = get_vision_window_index(
            grid_thw, spatial_merge_size=merge, window_size=visual.window_size, patch_size=visual.patch_size
        )
        inputs |= {
            "window_index": window_index,
            "cu_window_seqlens": cu_window_seqlens,
            "max_window_seqlen": _longest(cu_window_seqlens),
        }
    if hasattr(visual, "num_grid_per_side"):  # Qwen3-VL: learned positions resampled to each grid
        indices, weights = get_vision_interpolation_indices_and_weights(
            grid_thw,
            num_grid_per_side=visual.num_grid_per_side,
            mode=visual.interpolation_mode,
            align_corners=visual.interpolation_align_corners,
            spatial_merge_size=visual.config.spatial_merge_size,
        )
        inputs |= {"interp_indices": indices, "interp_weights": weights}
    return {
        f"image_{name}": host_to_device(value, device) if isinstance(value, torch.Tensor) else value
        for name, value in inputs.items()
    }


def _longest(cu_seqlens: torch.Tensor) -> int:
    return int(cu_seqlens.diff().max())
