"""`EngineSpec`: which generation engine to drive, as given on a command line or in a config.

`hf:DIR` is a checkpoint loaded in this process; `hf:URL` a `vistarl engine serve` server; `sglang:URL`
an SGLang server or router. Servers speak SGLang's HTTP API either way. Several servers, comma-separated
(`hf:URL1,URL2`), are one engine pool (`vistarl.trainer.rollout.engines.pool`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EngineSpec"]


class EngineSpec(BaseModel):
    """The generation engine a runner should drive: `sglang:URL`, `hf:URL` or `hf:DIR`; a server's URL may
    be several, comma-separated."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["sglang", "hf"]
    target: str = Field(min_length=1, description="server URL, or a local model directory")

    @classmethod
    def parse(cls, text: str) -> EngineSpec:
        """Parse `sglang:http://host:30000`, `hf:http://host:30000` (either with more URLs after commas)
        or `hf:/path/to/model`."""
        kind, sep, target = text.partition(":")
        if not sep or kind not in ("sglang", "hf") or not target:
            raise ValueError(f"engine {text!r} is not hf:DIR, hf:http://host:port or sglang:http://host:port")
        spec = cls.model_validate({"kind": kind, "target": target})
        if kind == "sglang" and not spec.is_server:
            raise ValueError(f"engine {text!r}: SGLang runs as a server, give its URL (sglang:http://...)")
        if spec.is_server and not all(url.startswith(("http://", "https://")) for url in spec.urls):
            raise ValueError(f"engine {text!r}: each comma-separated server is an http:// or https:// URL")
        return spec

    @property
    def is_server(self) -> bool:
        """Whether the engine is reached over HTTP rather than loaded in this process."""
        return self.target.startswith(("http://", "https://"))

    @property
    def urls(self) -> list[str]:
        """The servers' URLs (one, or several for a pool); none for an engine in this process."""
        return self.target.split(",") if self.is_server else []

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}"
