"""Weight sync: checkpoint names, HF directories, buckets, and engines scoring like the trainer after a
push through the bucketed path (one process, and two FSDP2 ranks under torchrun)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from tests.machine import outlasting
from tests.weight_probe import WeightSyncMismatch, nudge, verify_weight_sync
from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.httpserver.launch import free_port
from vistarl.trainer.learner.models import load_lm
from vistarl.trainer.rollout.engines.base import EngineRequestError
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.engines.sglang import SGLangEngine
from vistarl.trainer.rollout.engines.sglang_api import UpdateWeightsFromDistributedBody
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.weights.buckets import Bucket, bucket_tensors, gathered_buckets
from vistarl.trainer.weights.disk import DiskSync, save_hf_weights
from vistarl.trainer.weights.in_process import InProcessSync
from vistarl.trainer.weights.names import checkpoint_name, is_tied, live_name, to_checkpoint_state
from vistarl.trainer.weights.nccl import DistributedSync, DistributedTarget, distributed_body
from vistarl.trainer.weights.sync import WeightSync, transport_kind
from vistarl.trainer.weights.transport import EngineCalls, Transport

REPO = Path(__file__).resolve().parents[1]
RANKS_S = 300.0
"""How long two torchrun ranks may take to push here."""
ENGINE_START_S = 180.0
"""How long `vistarl engine serve` may take to answer."""


async def push(
    transport: Transport,
    model: nn.Module,
    version: int,
    *,
    dtype: torch.dtype | None = None,
    bucket_bytes: int = 1024 * 1024,
) -> None:
    """Push `model` through the bucketed path from one rank, as the trainer's compute thread does."""
    sync = WeightSync(model.config, dtype, bucket_bytes, transport)
    try:
        await asyncio.to_thread(sync.push, model, version)
    finally:
        await asyncio.to_thread(sync.close)


def engine_calls() -> EngineCalls:
    """Calls into engines living on the running event loop."""
    return EngineCalls(asyncio.get_running_loop(), 60)


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
    in_bf16 = bucket_tensors(tensors, bucket_bytes=30 * 2, dtype=torch.bfloat16)
    assert [[name for name, _ in bucket] for bucket in in_bf16] == [[n for n, _ in b] for b in buckets]
    ids = [("ids", torch.zeros(20, dtype=torch.int64)), ("w", torch.zeros(10))]
    assert len(bucket_tensors(ids, bucket_bytes=20 * 8, dtype=torch.bfloat16)) == 2, "integers keep dtype"


def test_gathered_buckets_cover_the_state_dict_once_cast_without_the_tied_head(tiny_qwen25: Path) -> None:
    model = load_lm(tiny_qwen25)
    state = model.state_dict()
    buckets = list(gathered_buckets(model, model.config, torch.bfloat16, 256 * 1024))
    assert len(buckets) > 2 and [b.last for b in buckets] == [False] * (len(buckets) - 1) + [True]
    pushed = dict(tensor for bucket in buckets for tensor in bucket.tensors)
    assert sorted(pushed) == sorted(set(state) - {"lm_head.weight"})
    for name, tensor in pushed.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, state[name].to(torch.bfloat16)), name
    assert all(b.nbytes <= 256 * 1024 or len(b.tensors) == 1 for b in buckets)


def test_distributed_body_describes_a_bucket_under_checkpoint_names_and_the_last_sets_the_version() -> None:
    tensors = [
        ("model.language_model.norm.weight", torch.zeros(2, 3, dtype=torch.bfloat16)),
        ("model.visual.merger.ln_q.bias", torch.zeros(4)),
    ]
    first = distributed_body(Bucket(tensors, last=False), "qwen2_5_vl", "g", 7)
    assert first.names == ["model.norm.weight", "visual.merger.ln_q.bias"]
    assert first.dtypes == ["bfloat16", "float32"] and first.shapes == [[2, 3], [4]]
    assert (first.flush_cache, first.weight_version, first.group_name) == (False, None, "g")
    last = distributed_body(Bucket(tensors[:1], last=True), "qwen2_5_vl", "g", 7)
    assert (last.flush_cache, last.weight_version) == (True, "7")
    wire = last.model_dump_json(exclude_none=True)
    assert UpdateWeightsFromDistributedBody.model_validate_json(wire) == last


def test_each_engine_kind_names_its_transport(tiny_qwen25: Path) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    server = SGLangEngine("http://127.0.0.1:1")
    assert transport_kind(server, "nccl") == "nccl" and transport_kind(server, "disk") == "disk"
    assert transport_kind(HFEngine.from_pretrained(tiny_qwen25), "disk") == "in_process"
    with pytest.raises(ValueError, match=r"sync\.mode=nccl is not a transport ScriptedEngine takes"):
        transport_kind(ScriptedEngine(processor, ["hi"]), "nccl")


async def test_in_process_engine_matches_the_trainer_after_a_push(arch_checkpoint: Path) -> None:
    trainer_model = load_lm(arch_checkpoint)
    nudge(trainer_model)
    engine = HFEngine.from_pretrained(arch_checkpoint)
    try:
        with pytest.raises(WeightSyncMismatch, match="differ"):
            await verify_weight_sync(engine, trainer_model, engine.processor)
        await push(InProcessSync(engine, engine_calls()), trainer_model, 3, bucket_bytes=256 * 1024)
        assert engine.weight_version == "3"
        assert await verify_weight_sync(engine, trainer_model, engine.processor) < 1e-4
        live = engine.model.state_dict()
        assert all(torch.equal(live[name], t) for name, t in trainer_model.state_dict().items())
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
    with running_process(args, ready_url=f"{url}/health_generate", timeout=ENGINE_START_S):
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
    sync = DiskSync([remote_engine], engine_calls(), tmp_path / "weights", trainer_model.config, tiny_qwen25)
    await push(sync, trainer_model, 5)
    await push(sync, trainer_model, 6)
    assert remote_engine.weight_version == "6"
    assert [p.name for p in (tmp_path / "weights").iterdir()] == ["policy-v000006"]
    assert await verify_weight_sync(remote_engine, trainer_model, processor) < 1e-4


async def test_engine_server_matches_the_trainer_after_a_broadcast_push(
    remote_engine: SGLangEngine, served_engine: str, tiny_qwen25: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The NCCL path into `vistarl engine serve`, over gloo here: buckets in, the trainer's logprobs out.
    The trainer side runs as under torchrun, whose agent-store variable once made rank 0 wait forever."""
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    trainer_model = load_lm(tiny_qwen25)
    nudge(trainer_model, seed=4)
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    stray = UpdateWeightsFromDistributedBody(
        names=["visual.merger.ln_q.weight"], dtypes=["float32"], shapes=[[1]]
    )
    with pytest.raises(EngineRequestError, match="not in weight-update group 'weight_update_group'"):
        await remote_engine.update_weights_from_distributed(stray)
    target = DistributedTarget("127.0.0.1", free_port(), backend="gloo", timeout=timedelta(seconds=60))
    sync = DistributedSync([remote_engine], engine_calls(), target, "qwen2_5_vl")
    await push(sync, trainer_model, 7)
    info = httpx.get(f"{served_engine}/model_info", timeout=10).json()
    assert remote_engine.weight_version == info["weight_version"] == "7"
    assert await verify_weight_sync(remote_engine, trainer_model, processor) < 1e-4
    # `push` left the group; the next push forms a new one at the same address, as for a restarted engine
    nudge(trainer_model, seed=5)
    await push(sync, trainer_model, 8)
    assert remote_engine.weight_version == "8"
    assert await verify_weight_sync(remote_engine, trainer_model, processor) < 1e-4


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`SGLangReceiverDouble` in its own process: its URL, and the folder it saves the buckets to."""
    with receiver_double(tmp_path / "received") as served:
        yield served


async def test_nccl_path_sends_every_weight_exactly_in_buckets_an_sglang_receiver_takes(
    receiver: tuple[str, Path], tiny_qwen25: Path, tmp_path: Path
) -> None:
    url, received_dir = receiver
    model = load_lm(tiny_qwen25)
    nudge(model, seed=3)
    model.save_pretrained(tmp_path / "saved")  # the names and values a checkpoint of these weights holds
    expected = {
        name: t.to(torch.bfloat16) for name, t in load_file(tmp_path / "saved" / "model.safetensors").items()
    }
    bucket_bytes = 4 * 1024 * 1024
    port = free_port()
    target = DistributedTarget(
        "127.0.0.1", port, backend="gloo", group_name="g1", timeout=timedelta(seconds=60)
    )
    engine = SGLangEngine(url, retry_deadline_s=10)
    try:
        sync = DistributedSync([engine], engine_calls(), target, "qwen2_5_vl")
        await push(sync, model, 4, dtype=torch.bfloat16, bucket_bytes=bucket_bytes)
    finally:
        await engine.close()

    got = httpx.get(f"{url}/received", timeout=10).json()
    updates = got["updates"]
    assert got["calls"] == ["init", "pause:retract", *["update"] * len(updates), "continue"]
    group = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2}
    assert got["inits"] == [{**group, "group_name": "g1", "backend": "gloo"}]
    assert [(u["flush_cache"], u["weight_version"]) for u in updates] == [(False, None)] * (
        len(updates) - 1
    ) + [(True, "4")]
    buckets = [load_file(received_dir / f"bucket-{i:03d}.safetensors") for i in range(len(updates))]
    names = [name for update in updates for name in update["names"]]
    assert sorted(names) == sorted(expected), "every weight of the checkpoint, once"
    for update, bucket in zip(updates, buckets, strict=True):
        assert set(bucket) == set(update["names"])
        assert update["dtypes"] == ["bfloat16"] * len(bucket)
        for name, shape in zip(update["names"], update["shapes"], strict=True):
            assert shape == list(expected[name].shape) and torch.equal(bucket[name], expected[name]), name
    sizes = [[expected[name].nbytes for name in update["names"]] for update in updates]
    assert len(sizes) > 2 and any(len(s) == 1 and s[0] > bucket_bytes for s in sizes)
    assert any(len(s) > 1 for s in sizes)
    for size, following in itertools.pairwise(sizes):
        assert sum(size) <= bucket_bytes or len(size) == 1, "a bucket over the limit holds one tensor"
        assert sum(size) + following[0] > bucket_bytes, "each bucket is as full as the limit lets it be"


async def test_one_broadcast_reaches_every_engine_and_a_reconnection_only_those_it_names(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    """Two SGLang receivers (`tests/sglang_receiver_double.py`) join one group behind trainer rank 0, each
    bucket is broadcast once to both, and each gets every weight bit for bit; a reconnection to the second
    alone forms a group of two without the first, which then hears nothing more."""
    model = load_lm(tiny_qwen25)
    nudge(model, seed=6)
    pushed = {name: t for name, t in model.state_dict().items() if not is_tied(name, model.config)}
    expected = {checkpoint_name(name, "qwen2_5_vl"): t for name, t in pushed.items()}
    with contextlib.ExitStack() as servers:
        doubles = [servers.enter_context(receiver_double(tmp_path / f"r{i}")) for i in range(2)]
        engines = [SGLangEngine(url, retry_deadline_s=10) for url, _ in doubles]
        port = free_port()
        target = DistributedTarget("127.0.0.1", port, backend="gloo", timeout=timedelta(seconds=60))
        sync = DistributedSync(engines, engine_calls(), target, "qwen2_5_vl")
        await push(sync, model, 4)
        sync.reconnect([1])
        await push(sync, model, 5)
        for engine in engines:
            await engine.close()
        got = [httpx.get(f"{url}/received", timeout=10).json() for url, _ in doubles]
    first, second = ({(i["rank_offset"], i["world_size"]) for i in g["inits"]} for g in got)
    assert first == {(1, 3)} and second == {(2, 3), (1, 2)}
    assert [u["weight_version"] for u in got[0]["updates"] if u["flush_cache"]] == ["4"]
    assert [u["weight_version"] for u in got[1]["updates"] if u["flush_cache"]] == ["4", "5"]
    for (_, received), updates in ((doubles[0], got[0]["updates"]), (doubles[1], got[1]["updates"])):
        arrived = {}
        for i in range(len(updates)):
            arrived.update(load_file(received / f"bucket-{i:03d}.safetensors"))
        assert set(arrived) == set(expected)
        assert all(torch.equal(arrived[name], tensor) for name, tensor in expected.items())


@contextlib.contextmanager
def receiver_double(out_dir: Path) -> Iterator[tuple[str, Path]]:
    """`SGLangReceiverDouble` in its own process: its URL, and the folder it saves the buckets to."""
    port = free_port()
    command = [sys.executable, "-m", "tests.sglang_receiver_double", str(port), str(out_dir)]
    with running_process(command, ready_url=f"http://127.0.0.1:{port}/health", timeout=120):
        yield f"http://127.0.0.1:{port}", out_dir


@pytest.mark.slow  # two torchrun ranks: minutes of CPU
@outlasting(ENGINE_START_S, RANKS_S)
def test_two_ranks_push_through_the_bucketed_path_and_the_engines_score_like_the_trainer(
    served_engine: str, tiny_qwen25: Path, tmp_path: Path
) -> None:
    """`tests/weight_push_worker.py` on 2 FSDP2 ranks (gloo): small buckets into an in-process engine and,
    over SGLang's protocol, into `vistarl engine serve`; both then score a batch of probes as a trainer
    model holding the gathered full state dict does, to 1e-5 in fp32, and the in-process engine holds
    that state dict bit for bit; shards of rows that do not split evenly gather whole too."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "tests/weight_push_worker.py",
        str(tiny_qwen25), served_engine, str(free_port()), str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=RANKS_S, check=True)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["parameters"] == result["engine_parameters"] and len(result["parameters"]) > 10
    assert result["differing"] == []
    assert result["in_process_max_diff"] < 1e-5 and result["served_max_diff"] < 1e-5
    assert (result["local_version"], result["served_version"]) == ("1", "2")
    assert result["uneven_rows_whole"] is True and result["failed_push_raised"] is True
