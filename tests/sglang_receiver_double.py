"""`SGLangReceiverDouble`: a test double of an SGLang server's weight-update side (SGLang needs a GPU).

It speaks SGLang's protocol from SGLang's own facts, not through the sender's code (`vistarl.trainer.weights`
and its request models are never imported):

- `POST /init_weights_update_group {master_address, master_port, rank_offset, world_size, group_name,
  backend}` (SGLang's `InitWeightsUpdateGroupReqInput`): join the group as SGLang's model runner does,
  as rank `rank_offset + tp_rank` (one tensor-parallel rank here, so `rank_offset`) of `world_size`,
  through a TCP rendezvous at `master_address:master_port` whose keys live under the group's name,
  with torch's own process-group constructor.
- `POST /update_weights_from_distributed {names, dtypes, shapes, group_name, flush_cache,
  abort_all_requests, weight_version, load_format, torch_empty_cache}`
  (`UpdateWeightsFromDistributedReqInput`): allocate an empty tensor per announced name, dtype and
  shape, start every broadcast from rank 0 at once, then wait for them all.
- `POST /pause_generation {mode}` and `POST /continue_generation`: recorded.

A body must hold the request's required keys and no key SGLang does not define (`sglang_request`).
Every call answers `{success, message}`, as SGLang's do. Each bucket is saved as it arrived, to
`DIR/bucket-NNN.safetensors`; `GET /received` lists the calls in order and the bodies of the group
and update calls.

    python -m tests.sglang_receiver_double PORT DIR
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import uvicorn
from fastapi import FastAPI, HTTPException
from safetensors.torch import save_file
from torch.distributed.distributed_c10d import GroupName, PrefixStore, _new_process_group_helper, _world

TIMEOUT = timedelta(seconds=60)

Fields = tuple[frozenset[str], dict[str, Any]]
"""A request's required keys, and its optional ones with their defaults."""

INIT_GROUP: Fields = (
    frozenset({"master_address", "master_port", "rank_offset", "world_size"}),
    {"group_name": "weight_update_group", "backend": "nccl"},
)
"""SGLang's `InitWeightsUpdateGroupReqInput`."""

UPDATE_FROM_DISTRIBUTED: Fields = (
    frozenset({"names", "dtypes", "shapes"}),
    {
        "group_name": "weight_update_group",
        "flush_cache": True,
        "abort_all_requests": False,
        "weight_version": None,
        "load_format": None,
        "torch_empty_cache": False,
    },
)
"""SGLang's `UpdateWeightsFromDistributedReqInput`."""


def sglang_request(body: dict[str, Any], fields: Fields) -> dict[str, Any]:
    """`body` with SGLang's defaults filled in; a missing key is refused, and so is a key SGLang does not
    define (SGLang would ignore it, so whatever the sender meant by it would silently not happen)."""
    required, defaults = fields
    missing, unknown = sorted(required - body.keys()), sorted(body.keys() - required - defaults.keys())
    if missing or unknown:
        raise HTTPException(422, f"missing keys {missing}, keys SGLang does not define {unknown}")
    return {**defaults, **body}


class SGLangReceiverDouble:
    """The double's state and its FastAPI app (see the module docstring)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.groups: dict[str, dist.ProcessGroup] = {}
        self.calls: list[str] = []
        self.inits: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []

    def join(self, body: dict[str, Any], tp_rank: int = 0) -> None:
        """Join the group as SGLang's `init_custom_process_group` does: a client of the rendezvous store
        (rank 0, the trainer, serves it), seen through a prefix named after the group."""
        world_size, name = body["world_size"], body["group_name"]
        store = dist.TCPStore(body["master_address"], body["master_port"], world_size, False, timeout=TIMEOUT)
        group, _ = _new_process_group_helper(
            world_size,
            body["rank_offset"] + tp_rank,
            [],
            dist.Backend(body["backend"]),
            PrefixStore(name, store),
            group_name=GroupName(name),
            timeout=TIMEOUT,
        )
        _world.pg_group_ranks[group] = {r: r for r in range(world_size)}
        self.groups[name] = group

    def receive(self, body: dict[str, Any]) -> None:
        """One bucket, as SGLang's model runner receives it, saved as it came."""
        group = self.groups[body["group_name"]]
        tensors = {
            name: torch.empty(shape, dtype=getattr(torch, dtype))
            for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"], strict=True)
        }
        works = [dist.broadcast(tensor, src=0, group=group, async_op=True) for tensor in tensors.values()]
        for work in works:
            assert work is not None
            work.wait(TIMEOUT)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(self.out_dir / f"bucket-{len(self.updates):03d}.safetensors"))
        self.updates.append(body)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        def health() -> dict[str, bool]:
            return {"ok": True}

        @app.post("/init_weights_update_group")
        def init(raw: dict[str, Any]) -> dict[str, Any]:
            body = sglang_request(raw, INIT_GROUP)
            self.calls.append("init")
            self.inits.append(body)
            try:
                self.join(body)
            except (RuntimeError, ValueError) as exc:  # a store that never fills times out as RuntimeError
                return {"success": False, "message": f"Failed to initialize custom process group: {exc}."}
            return {"success": True, "message": "Succeeded to initialize custom process group."}

        @app.post("/update_weights_from_distributed")
        def update(raw: dict[str, Any]) -> dict[str, Any]:
            body = sglang_request(raw, UPDATE_FROM_DISTRIBUTED)
            if body["group_name"] not in self.groups or body["load_format"] is not None:
                return {
                    "success": False,
                    "message": f"no group {body['group_name']!r} or unknown load_format",
                }
            self.receive(body)
            self.calls.append("update")
            return {"success": True, "message": "Succeeded to update parameter online."}

        @app.post("/pause_generation")
        def pause(body: dict[str, Any]) -> dict[str, Any]:
            self.calls.append(f"pause:{body.get('mode')}")
            return {"success": True, "message": ""}

        @app.post("/continue_generation")
        def resume() -> dict[str, Any]:
            self.calls.append("continue")
            return {"success": True, "message": ""}

        @app.get("/received")
        def received() -> dict[str, Any]:
            return {"calls": self.calls, "inits": self.inits, "updates": self.updates}

        return app


if __name__ == "__main__":
    double = SGLangReceiverDouble(Path(sys.argv[2]))
    uvicorn.run(double.app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
