"""Tasks at reset over a real socket: task ids of built-in and `--data` splits, inline samples, errors.

One `vistarl serve tests.envs.quiz` process serves the module, once with envs in its threads and once with
two env worker processes, with two extra splits from parquet files the module writes (one directory, one
file, small row groups so that rows come from several groups).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.envs.quiz import ANSWER_TOOL, SPLIT_SIZES, QuizSample, quiz_row
from tests.envs.serving import counter_server, served
from tests.wire import assert_error, reset
from vistarl.clients import AsyncEnvClient, EnvClient, TaskNotFoundError
from vistarl.clients.images import decode_image, encode_image
from vistarl.clients.protocol import InfoResponse, ResetResponse
from vistarl.devtools.servers import vistarl_cmd
from vistarl.services.datasets import load_splits

QUIZ_ENV = "tests.envs.quiz"
DATA_ROWS = {"extra": 10, "more": 4, "solo": 3}
MAX_PIXELS = 64 * 64
TIMEOUT = 30.0


def write_split(path: Path, name: str, rows: int) -> None:
    """A parquet split of `rows` generated quiz rows, three to a row group."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([quiz_row(name, i) for i in range(rows)]), path, row_group_size=3)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A dataset directory (splits `extra`, `more`) and a lone parquet file (split `solo`)."""
    root = tmp_path_factory.mktemp("quiz-data")
    write_split(root / "dir" / "extra.parquet", "extra", DATA_ROWS["extra"])
    write_split(root / "dir" / "more.parquet", "more", DATA_ROWS["more"])
    write_split(root / "solo.parquet", "solo", DATA_ROWS["solo"])
    return [root / "dir", root / "solo.parquet"]


@pytest.fixture(scope="module", params=[0, 2], ids=["threads", "2-env-workers"])
def url(request: pytest.FixtureRequest, data: list[Path]) -> Iterator[str]:
    flags = ["--env-workers", str(request.param)]
    for path in data:
        flags += ["--data", str(path)]
    with served(QUIZ_ENV, *flags, env={"VISTARL_MAX_IMAGE_PIXELS": str(MAX_PIXELS)}) as base:
        yield base


@pytest.fixture
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        yield client


def assert_shows(first: ResetResponse, row: dict[str, Any]) -> None:
    """The first observation asks `row`'s question with its image."""
    assert first.observation.text.startswith(row["question"])
    shown = decode_image(first.observation.images[0]).convert("RGB").getpixel((0, 0))
    assert shown == decode_image(row["images"][0]).convert("RGB").getpixel((0, 0))


def test_info_lists_the_splits_the_sample_schema_and_the_tools(http: httpx.Client) -> None:
    info = InfoResponse.model_validate(http.get("/info").json())
    sizes = {split.name: split.size for split in info.datasets.splits}
    assert sizes == {**SPLIT_SIZES, **DATA_ROWS}
    assert "SPLIT/INDEX" in info.datasets.task_id_form
    assert info.datasets.sample_schema is not None
    assert set(info.datasets.sample_schema["properties"]) == set(QuizSample.model_fields)
    assert info.tools == [ANSWER_TOOL]


@pytest.mark.parametrize(
    ("split", "index"), [("test", 3), ("train", 0), ("extra", 7), ("more", 3), ("solo", 2)]
)
def test_a_task_id_starts_that_row(http: httpx.Client, split: str, index: int) -> None:
    row = quiz_row(split, index)
    first = reset(http, task_id=f"{split}/{index}")
    assert_shows(first, row)
    assert first.info == {"id": row["id"]}
    answer = http.post("/step", json={"session_id": first.session_id, "action": row["answer"]}).json()
    assert (answer["reward"], answer["done"]) == (1.0, True)


def test_an_inline_sample_starts_an_episode(http: httpx.Client) -> None:
    image = Image.new("RGB", (6, 5), (7, 8, 9))
    sample = {"question": "Which colour?", "answer": "dark", "images": [encode_image(image)]}
    first = reset(http, sample=sample, format=True)
    assert_shows(first, sample)
    assert decode_image(first.observation.images[0]).size == (6, 5)
    wrong = http.post("/step", json={"session_id": first.session_id, "action": "light"}).json()
    assert (wrong["reward"], wrong["done"]) == (0.0, False)


def test_a_seed_and_no_task_keep_their_meaning(http: httpx.Client) -> None:
    assert_shows(reset(http, seed=5), quiz_row("train", 5))
    assert_shows(reset(http), quiz_row("train", 0))


@pytest.mark.parametrize("task_id", ["test/5", "nope/0", "extra/10"])
def test_an_unknown_task_is_404_task_not_found(http: httpx.Client, task_id: str) -> None:
    assert_error(http.post("/reset", json={"task_id": task_id}), 404, "task_not_found", task_id.split("/")[0])


@pytest.mark.parametrize("task_id", ["test", "test/x", "test/-1", "/3"])
def test_a_task_id_not_of_the_form_is_422(http: httpx.Client, task_id: str) -> None:
    assert_error(http.post("/reset", json={"task_id": task_id}), 422, "validation_error", "SPLIT/INDEX")


@pytest.mark.parametrize(
    ("sample", "mention"),
    [
        ({"question": "q?"}, "sample.answer: Field required"),
        ({"question": "q?", "answer": "a", "colour": "red"}, "sample.colour: Extra inputs are not permitted"),
        ({"question": "", "answer": "a"}, "sample.question"),
        ({"question": "q?", "answer": "a", "images": "x"}, "sample.images"),
    ],
)
def test_a_bad_sample_is_422_naming_the_field(
    http: httpx.Client, sample: dict[str, Any], mention: str
) -> None:
    assert_error(http.post("/reset", json={"sample": sample}), 422, "invalid_sample", mention)


@pytest.mark.parametrize(
    ("image", "mention"),
    [
        (encode_image(Image.new("RGB", (65, 65))), "too large"),
        ("data:image/png;base64,aGVsbG8gd29ybGQ=", "not a PNG"),
    ],
)
def test_an_image_of_a_sample_is_held_to_the_limits(http: httpx.Client, image: str, mention: str) -> None:
    sample = {"question": "q?", "answer": "a", "images": [encode_image(Image.new("RGB", (2, 2))), image]}
    assert_error(
        http.post("/reset", json={"sample": sample}), 422, "invalid_image", "sample.images.1", mention
    )


def test_at_most_one_task_per_reset(http: httpx.Client) -> None:
    both = http.post("/reset", json={"seed": 1, "task_id": "test/0"})
    assert_error(both, 422, "validation_error", "at most one", "seed and task_id")


@pytest.mark.parametrize("seed", [str(2**70), "1.1805916207174113e+21", str(-(2**63) - 1)])
def test_a_seed_past_64_bits_is_422_naming_the_range(http: httpx.Client, seed: str) -> None:
    """2**70 as Python and as JavaScript write it, and one below the range."""
    answer = http.post("/reset", content=f'{{"seed": {seed}}}', headers={"content-type": "application/json"})
    assert_error(answer, 422, "validation_error", "body.seed: a seed is an integer from -2**63 to 2**63 - 1")


def test_a_seed_at_the_64_bit_bounds_is_taken(http: httpx.Client) -> None:
    for seed in (2**63 - 1, -(2**63)):
        reset(http, seed=seed)


def test_the_clients_reset_from_tasks(url: str) -> None:
    row = quiz_row("extra", 4)
    with EnvClient(url, token="") as client:
        assert_shows(client.reset(task_id="extra/4"), row)
        with client.episode(sample=row) as ep:
            ep.step(row["answer"])
            assert (ep.done, ep.total_reward) == (True, 1.0)
        with pytest.raises(TaskNotFoundError) as missing:
            client.reset(task_id="extra/99")
        assert (missing.value.status, missing.value.code) == (404, "task_not_found")


async def test_the_async_client_resets_from_tasks(url: str) -> None:
    row = quiz_row("test", 1)
    async with AsyncEnvClient(url, token="") as client, client.episode(task_id="test/1") as ep:
        assert_shows(ResetResponse(session_id=ep.session_id, observation=ep.observation), row)
        await ep.step(row["answer"])
        assert ep.done


def test_an_env_without_a_sample_model_refuses_samples() -> None:
    with counter_server() as url, httpx.Client(base_url=url, timeout=TIMEOUT) as http:
        refused = http.post("/reset", json={"sample": {"question": "q?"}})
        assert_error(refused, 422, "invalid_sample", "counter", "takes no samples")
        assert_error(http.post("/reset", json={"task_id": "test/0"}), 404, "task_not_found", "none")
        datasets = http.get("/info").json()["datasets"]
        assert (datasets["splits"], datasets["sample_schema"]) == ([], None)


@pytest.mark.parametrize(
    ("env", "split", "row", "mention"),
    [
        (QUIZ_ENV, "test", quiz_row("x", 0), "clashes"),
        (QUIZ_ENV, "fresh", {"question": "q?"}, "answer: Field required"),
        ("tests.envs.counter", "fresh", quiz_row("x", 0), "no sample_model"),
    ],
    ids=["name-clash", "wrong-schema", "env-without-samples"],
)
def test_data_the_server_cannot_serve_stops_it_at_start(
    tmp_path: Path, env: str, split: str, row: dict[str, Any], mention: str
) -> None:
    path = tmp_path / f"{split}.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    done = subprocess.run(
        vistarl_cmd("serve", env, "--data", str(path)), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert mention in " ".join(done.stderr.split())


def test_parquet_splits_read_rows_lazily_by_row_group(data: list[Path], tmp_path: Path) -> None:
    splits = load_splits(data[0])
    assert sorted(splits) == ["extra", "more"]
    extra = splits["extra"]
    assert len(extra) == DATA_ROWS["extra"]
    assert [extra[i] for i in reversed(range(len(extra)))] == [
        quiz_row("extra", i) for i in reversed(range(10))
    ]
    with pytest.raises(IndexError):
        extra[len(extra)]
    assert list(load_splits(data[1])) == ["solo"]
    with pytest.raises(ValueError, match=r"no \.parquet files"):
        load_splits(tmp_path)
    with pytest.raises(ValueError, match="neither"):
        load_splits(tmp_path / "missing.parquet")
