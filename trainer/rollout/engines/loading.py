"""Build the engine a spec names: `make_engine` alone, or `load_engine` with the policy's processor."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from vistarl.trainer.rollout.alignment import check_engine_alignment
from vistarl.trainer.rollout.engines.base import Engine
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.sglang import SGLangEngine
from vistarl.trainer.rollout.engines.spec import EngineSpec
from vistarl.trainer.rollout.processor import VLProcessor

__all__ = ["load_engine", "make_engine"]


def make_engine(spec: str | EngineSpec, processor: VLProcessor | None = None, **options: Any) -> Engine:
    """The engine of `spec`; `options` go to its constructor.

    A server (`hf:URL`, `sglang:URL`) is reached through `SGLangEngine`, which needs the policy's
    `processor` for its prompt-length check; `hf:DIR` is an `HFEngine` loaded in this process.
    """
    spec = EngineSpec.parse(spec) if isinstance(spec, str) else spec
    if spec.is_server:
        return SGLangEngine(spec.target, processor, **options)
    return HFEngine.from_pretrained(spec.target, **options)


async def load_engine(spec: EngineSpec, tokenizer: Path | None = None) -> tuple[Engine, VLProcessor]:
    """The engine of `spec` and the policy's processor: the checkpoint's for `hf:DIR`; for a server,
    the one in `tokenizer` if given, else the one at the model path its `/model_info` reports (checked
    against its tokenizer path, if other), which must be a directory here: nothing is downloaded."""
    if not spec.is_server:
        if not Path(spec.target).is_dir():
            raise ValueError(f"engine checkpoint directory {spec.target} does not exist")
        engine = await asyncio.to_thread(HFEngine.from_pretrained, spec.target)
        return engine, engine.processor
    server = SGLangEngine(spec.target)
    try:
        processor = await _server_processor(server, tokenizer)
    except BaseException:
        await server.close()
        raise
    server.processor = processor
    return server, processor


async def _server_processor(server: SGLangEngine, tokenizer: Path | None) -> VLProcessor:
    """The processor for an engine server: from `tokenizer`, or from the paths its `/model_info` gives."""
    if tokenizer is not None:
        return await asyncio.to_thread(VLProcessor.from_pretrained, tokenizer)
    info = await server.model_info()
    try:
        processor = await asyncio.to_thread(VLProcessor.from_pretrained, info.model_path)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"the engine at {server.url} serves {info.model_path!r}, which is not readable here: "
            "mount it at that path, or name a local copy of its tokenizer (vistarl worker --tokenizer DIR)"
        ) from exc
    if info.tokenizer_path not in (None, info.model_path):
        await asyncio.to_thread(check_engine_alignment, info.tokenizer_path, processor.tokenizer)
    return processor
