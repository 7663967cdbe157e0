"""The disk transport, and HF checkpoint directories: the buckets are written as a checkpoint directory
the engines load (`/update_weights_from_disk`), each push once, however many engines read it; SGLang and
`vistarl engine serve` both take it."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from safetensors.torch import save_file
from transformers import PretrainedConfig

from vistarl.trainer.weights.buckets import Bucket
from vistarl.trainer.weights.names import to_checkpoint_state
from vistarl.trainer.weights.transport import EngineCalls, PausableEngine, paused

__all__ = ["WEIGHTS_FILE", "DiskEngine", "DiskSync", "save_hf_weights"]

WEIGHTS_FILE = "model.safetensors"
# Files of a checkpoint directory that hold weights (or their index) or the config: written, not copied.
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.safetensors.index.json", "config.json")


def save_hf_weights(
    state_dict: Mapping[str, torch.Tensor],
    config: PretrainedConfig,
    out_dir: str | Path,
    source_dir: str | Path,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write an HF checkpoint directory: config, weights under checkpoint names, and `source_dir`'s
    tokenizer / processor / template files, so `from_pretrained(out_dir)` and SGLang load it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for path in Path(source_dir).iterdir():
        if path.is_file() and not any(path.match(pattern) for pattern in _WEIGHT_PATTERNS):
            shutil.copy2(path, out / path.name)
    saved = to_checkpoint_state(state_dict, config, dtype)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in saved.items()}
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    config = copy.deepcopy(config)
    if dtype is not None:
        config.dtype = dtype
    config.save_pretrained(out)
    return out


@runtime_checkable
class DiskEngine(PausableEngine, Protocol):
    """An engine that loads checkpoint directories."""

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> str:
        """Load weights from an HF checkpoint directory; returns the new weight version."""
        ...


class DiskSync:
    """Write an HF directory per version under `root` and have the engines load it (all at once); older
    ones are removed.

    The buckets come to host memory here (a file needs them there). With `pause`, generation is paused
    around the load (SGLang's `/pause_generation` in `retract` mode keeps in-flight requests, which
    resume on the new weights). `dtype` is what `config.json` records as the weights' dtype. `reconnect`
    names the engines later pushes reach (the directory must be readable by all of them).
    """

    def __init__(
        self,
        engines: Sequence[DiskEngine],
        calls: EngineCalls,
        root: str | Path,
        config: PretrainedConfig,
        source_dir: str | Path,
        *,
        dtype: torch.dtype | None = None,
        pause: bool = False,
    ) -> None:
        self.engines = list(engines)
        self.reached = list(self.engines)
        self.calls = calls
        self.root = Path(root)
        self.config = config
        self.source_dir = Path(source_dir)
        self.dtype = dtype
        self.pause = pause
        self._previous: Path | None = None

    def push(self, buckets: Iterable[Bucket], version: int) -> None:
        """Save, load on the engine, then delete the previous version's directory."""
        state = {name: tensor.cpu() for bucket in buckets for name, tensor in bucket.tensors}
        path = self.root / f"policy-v{version:06d}"
        save_hf_weights(state, self.config, path, self.source_dir, self.dtype)
        with paused(self.calls, self.reached, self.pause):
            self.calls.each(
                engine.update_weights_from_disk(str(path.resolve()), str(version)) for engine in self.reached
            )
        if self._previous is not None and self._previous != path:
            shutil.rmtree(self._previous, ignore_errors=True)
        self._previous = path

    def reconnect(self, engines: Sequence[int] | None) -> None:
        """Later pushes reach these engines (None: all)."""
        self.reached = self.engines if engines is None else [self.engines[i] for i in engines]

    def close(self) -> None:
        """Keep the last directory: it is the weights the engines serve."""
