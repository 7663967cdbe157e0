"""Weight sync: checkpoint names, HF directories, buckets, and engines scoring like the trainer after one."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import torch.distributed as dist
from fastapi import FastAPI
from safetensors import safe_open
from transformers import PreTrainedModel

from tests.servers import free_port, running_process, vistarl_cmd
from trainer.learner.models import load_lm
from trainer.learner.weight_sync import (
    DiskSync,
    DistributedSync,
    DistributedTarget,
    InProcessSync,
    WeightSyncMismatch,
    bucket_tensors,
    checkpoint_name,
    distributed_bodies,
    init_weight_update_group,
    live_name,
    save_hf_weights,
    to_checkpoint_state,
    verify_weight_sync,
)
from trainer.rollout.engines.hf import HFEngine
from trainer.rollout.engines.sglang import SGLangEngine
from trainer.rollout.engines.sglang_api import InitWeightsUpdateGroupBody, UpdateWeightsFromDistributedBody
from trainer.rollout.processor import VLProcessor


def nudge(model: PreTrainedModel, amount: float = 0.02, seed: int = 1) -> dict[str, torch.Tensor]:
    """Add small seeded noise to every parameter (tied ones once); returns the new state dict."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(amount * torch.randn(parameter.shape, generator=generator))
    return model.state_dict()


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def arch_checkpoint(request: pytest.FixtureRequest, tiny_checkpoints: dict[str, Path]) -> Path:
    return tiny_checkpoints[request.param]


def test_checkpoint_names_are_the_names_transformers_saves(arch_checkpoint: Path) -> None:
    model = load_lm(arch_checkpoint)
    with safe_open(str(arch_checkpoint / "model.safetensors"), "pt") as saved:
        saved_names = set(saved.keys())
    assert set(to_checkpoint_state(model.state_dict(), model.config)) == saved_names
    model_type = model.config.model_type
    for name in model.state_dict():
        assert live_name(checkpoint_name(name, model_type), model_type) == name
    for name in saved_names:
        assert checkpoint_name(live_name(name, model_type), model_type) == name


def test_qwen2_5_vl_renames_to_sglang_loader_prefixes() -> None:
    assert checkpoint_name("model.language_model.layers.0.mlp.up_proj.weight", "qwen2_5_vl") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert (
        checkpoint_name("model.visual.blocks.1.attn.qkv.weight", "qwen2_5_vl")
        == "visual.blocks.1.attn.qkv.weight"
    )
    assert checkpoint_name("lm_head.weight", "qwen2_5_vl") == "lm_head.weight"
    assert live_name("visual.merger.mlp.0.bias", "qwen2_5_vl") == "model.visual.merger.mlp.0.bias"
    with pytest.raises(ValueError, match="known: qwen2_5_vl, qwen3_vl"):
        checkpoint_name("model.layers.0.weight", "llama")


def test_saved_directory_loads_back_with_the_new_weights(arch_checkpoint: Path, tmp_path: Path) -> None:
    model = load_lm(arch_checkpoint)
    weights = nudge(model)
    out = save_hf_weights(weights, model.config, tmp_path / "pushed", arch_checkpoint, dtype=torch.bfloat16)
    copied = {"tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "chat_template.jinja"}
    assert copied <= {path.name for path in out.iterdir()}
    reloaded = load_lm(out).state_dict()
    assert reloaded.keys() == weights.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(reloaded[name], tensor.to(torch.bfloat16).float(), rtol=0, atol=0)


def test_buckets_keep_order_and_respect_the_byte_limit() -> None:
    tensors = [(f"t{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 20, 5, 100, 1, 1])]
    buckets = bucket_tensors(tensors, bucket_bytes=30 * 4)
    assert [[name for name, _ in bucket] for bucket in buckets] == [
        ["t0", "t1"],
        ["t2"],
        ["t3"],
        ["t4", "t5"],
    ]
    assert [name for bucket in buckets for name, _ in bucket] == [name for name, _ in tensors]
    assert bucket_tensors([], 10) == []
    with pytest.raises(ValueError, match="bucket_bytes"):
        bucket_tensors(tensors, 0)


def test_distributed_bodies_describe_each_bucket_and_only_the_last_sets_the_version() -> None:
    buckets = [
        [("a", torch.zeros(2, 3, dtype=torch.bfloat16)), ("b", torch.zeros(4))],
        [("c", torch.zeros(1, dtype=torch.float16))],
    ]
    bodies = distributed_bodies(buckets, "g", "7")
    assert [b.names for b in bodies] == [["a", "b"], ["c"]]
    assert bodies[0].dtypes == ["bfloat16", "float32"] and bodies[1].dtypes == ["float16"]
    assert bodies[0].shapes == [[2, 3], [4]]
    assert [(b.flush_cache, b.weight_version, b.group_name) for b in bodies] == [
        (False, None, "g"),
        (True, "7", "g"),
    ]
    wire = bodies[1].model_dump_json(exclude_none=True)
    assert UpdateWeightsFromDistributedBody.model_validate_json(wire) == bodies[1]


async def test_in_process_engine_matches_the_trainer_after_a_push(arch_checkpoint: Path) -> None:
    trainer_model = load_lm(arch_checkpoint)
    nudge(trainer_model)
    engine = HFEngine.from_pretrained(arch_checkpoint)
    try:
        with pytest.raises(WeightSyncMismatch, match="differ"):
            await verify_weight_sync(engine, trainer_model, engine.processor)
        await InProcessSync(engine).push(trainer_model.state_dict(), 3)
        assert engine.weight_version == "3"
        assert await verify_weight_sync(engine, trainer_model, engine.processor) < 1e-4
    finally:
        await engine.close()


@pytest.fixture(scope="module")
def served_engine(tiny_qwen25: Path) -> Iterator[str]:
    """`vistarl engine serve` on the tiny Qwen2.5-VL checkpoint, in its own process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = vistarl_cmd(
        "engine", "serve", "--model", str(tiny_qwen25), "--port", str(port), "--log-level", "warning"
    )
    with running_process(args, ready_url=f"{url}/health_generate", timeout=180):
        yield url


@pytest.fixture
async def remote_engine(served_engine: str, tiny_qwen25: Path) -> AsyncIterator[SGLangEngine]:
    engine = SGLangEngine(served_engine, VLProcessor.from_pretrained(tiny_qwen25), retry_deadline_s=10)
    yield engine
    await engine.close()


async def test_engine_server_matches_the_trainer_after_a_disk_push(
    remote_engine: SGLangEngine, tiny_qwen25: Path, tmp_path: Path
) -> None:
    trainer_model = load_lm(tiny_qwen25)
    nudge(trainer_model, seed=2)
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    with pytest.raises(WeightSyncMismatch):
        await verify_weight_sync(remote_engine, trainer_model, processor)
    sync = DiskSync(
        remote_engine, tmp_path / "weights", trainer_model.config, tiny_qwen25, dtype=torch.float32
    )
    await sync.push(trainer_model.state_dict(), 5)
    await sync.push(trainer_model.state_dict(), 6)
    assert remote_engine.weight_version == "6"
    assert [p.name for p in (tmp_path / "weights").iterdir()] == ["policy-v000006"]
    assert await verify_weight_sync(remote_engine, trainer_model, processor) < 1e-4


def sglang_weight_receiver_stand_in() -> FastAPI:
    """Stands in for SGLang's weight-update endpoints (SGLang needs a GPU): it joins the group as SGLang
    does and receives each announced tensor by broadcast, over gloo; `/received` reports what came."""
    app = FastAPI()
    state: dict[str, Any] = {"group": None, "calls": [], "tensors": {}, "version": None}

    @app.get("/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/init_weights_update_group")
    def init(body: InitWeightsUpdateGroupBody) -> dict[str, Any]:
        state["group"] = init_weight_update_group(
            body.master_address,
            body.master_port,
            body.rank_offset,
            body.world_size,
            body.group_name,
            body.backend,
        )
        state["calls"].append("init")
        return {"success": True, "message": ""}

    @app.post("/update_weights_from_distributed")
    def update(body: UpdateWeightsFromDistributedBody) -> dict[str, Any]:
        for name, dtype, shape in zip(body.names, body.dtypes, body.shapes, strict=True):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype))
            dist.broadcast(tensor, src=0, group=state["group"])
            state["tensors"][name] = tensor
        state["calls"].append(f"update:{len(body.names)}:{body.flush_cache}")
        state["version"] = body.weight_version or state["version"]
        return {"success": True, "message": ""}

    @app.post("/pause_generation")
    def pause() -> dict[str, Any]:
        state["calls"].append("pause")
        return {}

    @app.post("/continue_generation")
    def resume() -> dict[str, Any]:
        state["calls"].append("continue")
        return {}

    @app.get("/received")
    def received() -> dict[str, Any]:
        sums = {
            name: [float(t.double().sum()), list(t.shape), str(t.dtype)]
            for name, t in state["tensors"].items()
        }
        return {
            "calls": state["calls"],
            "order": list(state["tensors"]),
            "sums": sums,
            "version": state["version"],
        }

    return app


@pytest.fixture
def receiver() -> Iterator[str]:
    port = free_port()
    code = (
        "import uvicorn; from tests.test_weight_sync import sglang_weight_receiver_stand_in as app; "
        f"uvicorn.run(app(), host='127.0.0.1', port={port}, log_level='warning')"
    )
    with running_process(
        [sys.executable, "-c", code], ready_url=f"http://127.0.0.1:{port}/health", timeout=120
    ):
        yield f"http://127.0.0.1:{port}"


async def test_nccl_path_broadcasts_every_tensor_in_the_announced_buckets(
    receiver: str, tiny_qwen25: Path
) -> None:
    model = load_lm(tiny_qwen25)
    weights = nudge(model, seed=3)
    target = DistributedTarget("127.0.0.1", free_port(), backend="gloo", bucket_bytes=16 * 1024 * 1024)
    engine = SGLangEngine(receiver, retry_deadline_s=10)
    sync = DistributedSync(engine, target, model.config, device=torch.device("cpu"), dtype=torch.float32)
    try:
        await sync.push(weights, 4)
    finally:
        await sync.close()
        await engine.close()
    got = httpx.get(f"{receiver}/received", timeout=10).json()
    expected = to_checkpoint_state(weights, model.config)
    buckets = bucket_tensors(expected.items(), target.bucket_bytes)
    assert len(buckets) > 1
    updates = [f"update:{len(b)}:{i == len(buckets) - 1}" for i, b in enumerate(buckets)]
    assert got["calls"] == ["init", "pause", *updates, "continue"]
    assert got["order"] == list(expected) and got["version"] == "4"
    for name, tensor in expected.items():
        total, shape, dtype = got["sums"][name]
        assert shape == list(tensor.shape) and dtype == "torch.float32"
        assert total == pytest.approx(float(tensor.double().sum()), rel=1e-9, abs=1e-9)
