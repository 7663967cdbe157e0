"""Sokoban behind a real `vistarl serve sokoban` process, through the Python client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from vistarl.clients.errors import BadRequestError
from vistarl.clients.http import EnvClient
from vistarl.clients.images import decode_image
from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.httpserver.launch import free_port
from vistarl.services.sokoban.game import Game, Level
from vistarl.services.sokoban.solver import solve


@pytest.fixture(scope="module")
def client() -> Iterator[EnvClient]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = vistarl_cmd("serve", "sokoban", "--port", str(port), "--log-level", "warning")
    with (
        running_process(command, ready_url=f"{url}/health", env={"VISTARL_API_TOKEN": ""}),
        EnvClient(url) as c,
    ):
        yield c


def test_an_episode_over_http_ends_with_the_episode_reward(client: EnvClient) -> None:
    with client.episode(seed=9, options={"render_mode": "both"}, format=True) as episode:
        assert episode.info["seed"] == 9
        level = Level.from_xsb(episode.info["level"])
        assert episode.observation.text.count("\n") > level.shape[0]
        assert decode_image(episode.observation.images[0]).size == (384, 384)
        assert episode.message is not None and episode.message.content[0].type == "image_url"
        moves = solve(level).moves
        assert moves is not None
        for start in range(0, len(moves), 3):
            result = episode.step(f"<answer>{', '.join(moves[start : start + 3])}</answer>")
        assert result.done and result.info["success"]
        assert result.info["episode_reward"] == pytest.approx(
            episode.total_reward / episode.turns + 5 + result.info["metrics"]["dist0"]
        )


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"num_boxes": 9}, "num_boxes"),
        ({"xsb": "#####\n#@x.#\n#####"}, "xsb"),
        ({"boxoban": {"file": "hard_000", "index": 5000}}, "index"),
        ({"grid_size": 5, "min_solution_len": 90}, "min_solution_len"),
        ({"grid_size": 5, "num_boxes": 3}, "larger grid_size"),
    ],
)
def test_bad_options_are_422_naming_the_problem(client: EnvClient, options: dict, field: str) -> None:
    with pytest.raises(BadRequestError) as caught:
        client.reset(options=options)
    assert caught.value.status == 422 and field in caught.value.message


@pytest.mark.parametrize(("num_boxes", "seeds"), [(3, range(1, 9)), (4, range(1, 5))])
def test_every_seed_of_a_10x10_config_gets_a_level(client: EnvClient, num_boxes: int, seeds: range) -> None:
    """Issue 15: {"grid_size": 10, "num_boxes": 3} was refused for seeds 2 and 3; Boxoban is 10x10 with 4."""
    for seed in seeds:
        with client.episode(seed=seed, options={"grid_size": 10, "num_boxes": num_boxes}) as episode:
            level = Level.from_xsb(episode.info["level"])
            assert level.shape == (10, 10) and len(level.boxes) == num_boxes
            moves = solve(level).moves
            assert moves is not None and Game(level).play(moves)
            assert 1 <= episode.info["optimal_moves"] <= len(moves)


def test_info_publishes_the_options_schema(client: EnvClient) -> None:
    info = client.info()
    assert info.name == "sokoban"
    assert {"seed", "xsb", "boxoban", "render_mode", "max_steps"} <= info.config_schema["properties"].keys()
