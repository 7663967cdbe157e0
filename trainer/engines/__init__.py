"""Generation engines: one interface, `async generate(GenerateRequest) -> GenerateResult`, two engines.

- `SGLangEngine(url, processor)`: SGLang's native HTTP API (production), or `vistarl engine serve`.
- `HFEngine(model, processor)` / `HFEngine.from_pretrained(dir)`: transformers in this process.

`make_engine(spec)` builds one from a spec string (see its docstring). docs/engines.md has the details.
"""

from __future__ import annotations

from typing import Any

from trainer.engines.base import (
    Engine,
    EngineError,
    EngineRequestError,
    EngineUnavailableError,
    GenerateRequest,
    GenerateResult,
)
from trainer.engines.hf import HFEngine
from trainer.engines.sglang import SGLangEngine
from trainer.engines.sglang_api import FinishReason, SamplingParams
from trainer.processor import VLProcessor

__all__ = [
    "Engine",
    "EngineError",
    "EngineRequestError",
    "EngineUnavailableError",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "HFEngine",
    "SGLangEngine",
    "SamplingParams",
    "make_engine",
]


def make_engine(spec: str, processor: VLProcessor | None = None, **options: Any) -> Engine:
    """Build the engine named by `spec`; `options` go to the engine's constructor.

    - `hf:DIR`: an in-process `HFEngine` loaded from the checkpoint directory DIR.
    - `hf:http://host:port`: a `vistarl engine serve` server, reached through `SGLangEngine` (it speaks
      SGLang's API).
    - `sglang:http://host:port`: an SGLang server or router.

    `processor` is the policy's processor, which `SGLangEngine` needs for its prompt-length check.
    """
    kind, sep, target = spec.partition(":")
    if not sep or not target or kind not in ("hf", "sglang"):
        raise ValueError(
            f"engine spec {spec!r} is not hf:DIR, hf:http://host:port or sglang:http://host:port"
        )
    if target.startswith(("http://", "https://")):
        return SGLangEngine(target, processor, **options)
    if kind == "sglang":
        raise ValueError(f"engine spec {spec!r}: SGLang runs as a server, give its URL (sglang:http://...)")
    return HFEngine.from_pretrained(target, **options)
