"""Build the engine a spec names: `make_engine` alone, or `load_engine` with the policy's processor."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from vistarl.trainer.rollout.alignment import check_engine_alignment
from vistarl.trainer.rollout.engines.base import Engine
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.pool import EnginePool
from vistarl.trainer.rollout.engines.sglang import SGLangEngine
from vistarl.trainer.rollout.engines.spec import EngineSpec
from vistarl.trainer.rollout.processor import VLProcessor

__all__ = ["POOLED_RETRY_DEADLINE_S", "load_engine", "make_engine", "pooled"]

POOLED_RETRY_DEADLINE_S = 10.0
"""How long a pool's member retries an unreachable server before its request aborts (and goes to another
member): a lone server is waited for longer (`SGLangEngine`'s default), as nothing else can generate."""


def make_engine(spec: str | EngineSpec, processor: VLProcessor | None = None, **options: Any) -> Engine:
    """The engine of `spec`; `options` go to its constructor.

    A server (`hf:URL`, `sglang:URL`) is reached through `SGLangEngine`, which needs the policy's
    `processor` for its prompt-length check, several through an `EnginePool` of them; `hf:DIR` is an
    `HFEngine` loaded in this process.
    """
    spec = EngineSpec.parse(spec) if isinstance(spec, str) else spec
    if spec.is_server:
        return pooled(_servers(spec, processor, **options))
    return HFEngine.from_pretrained(spec.target, **options)


def pooled(servers: list[SGLangEngine]) -> Engine:
    """One server as it is; several as an `EnginePool`."""
    return servers[0] if len(servers) == 1 else EnginePool(servers)


def _servers(spec: EngineSpec, processor: VLProcessor | None, **options: Any) -> list[SGLangEngine]:
    """A client of each server `spec` names; a pool's members give up on a dead server sooner."""
    if len(spec.urls) > 1:
        options.setdefault("retry_deadline_s", POOLED_RETRY_DEADLINE_S)
    return [SGLangEngine(url, processor, **options) for url in spec.urls]


async def load_engine(spec: EngineSpec, tokenizer: Path | None = None) -> tuple[Engine, VLProcessor]:
    """The engine of `spec` and the policy's processor: the checkpoint's for `hf:DIR`; for a server,
    the one in `tokenizer` if given, else the one at the model path its `/model_info` reports (checked
    against its tokenizer path, if other), which must be a directory here: nothing is downloaded. Of
    several servers, the first one's paths are read."""
    if not spec.is_server:
        if not Path(spec.target).is_dir():
            raise ValueError(f"engine checkpoint directory {spec.target} does not exist")
        local = await asyncio.to_thread(HFEngine.from_pretrained, spec.target)
        return local, local.processor
    servers = _servers(spec, None)
    engine = pooled(servers)
    try:
        processor = await _server_processor(servers[0], tokenizer)
    except BaseException:
        await engine.close()
        raise
    for server in servers:
        server.processor = processor
    return engine, processor


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
