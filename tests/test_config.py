"""Training config: YAML loading, dotted overrides, and errors that name the offending field."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from vistarl.services.env_api import load_env_factory
from vistarl.trainer.config import ConfigError, TrainConfig, load_config
from vistarl.trainer.overrides import parse_override
from vistarl.trainer.run.directory import run_name

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
DOCUMENTED = sorted([ROOT / "README.md", ROOT / "DEVELOPERS.md", *(ROOT / "docs").rglob("*.md")])


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_sokoban_config_matches_the_seed_run_settings() -> None:
    cfg = load_config(CONFIGS / "sokoban.yaml", [])
    assert cfg.model.arch == "qwen3_vl"
    assert cfg.algo.advantage_estimator == "grpo"
    assert cfg.optim.lr == pytest.approx(1e-6)
    assert (cfg.algo.eps_clip, cfg.algo.eps_clip_high) == (0.2, 0.28)
    assert not cfg.algo.use_kl and not cfg.algo.needs_critic
    assert (cfg.rollout.rollout_batch_size, cfg.rollout.n_samples_per_prompt) == (4, 4)
    assert (cfg.rollout.rollout_temperature, cfg.rollout.rollout_top_p) == (0.8, 0.9)
    assert (cfg.rollout.rollout_max_response_len, cfg.rollout.max_turns) == (1536, 8)
    assert (cfg.rollout.engine_kind, cfg.rollout.engine_url) == ("sglang", "http://127.0.0.1:30000")


def test_tiny_config_is_a_short_cpu_run() -> None:
    cfg = load_config(CONFIGS / "sokoban_tiny.yaml", [])
    assert 3 <= cfg.train.steps <= 5
    assert cfg.model.dtype == "float32"
    assert (cfg.rollout.engine_kind, cfg.rollout.engine_url, cfg.rollout.queue) == ("hf", None, None)
    assert cfg.rollout.samples_per_step == 8
    assert cfg.rollout.max_turns * cfg.rollout.max_new_tokens <= cfg.rollout.rollout_max_response_len


@pytest.mark.parametrize("name", ["sokoban.yaml", "sokoban_tiny.yaml"])
def test_shipped_env_options_pass_the_environment_own_validation(name: str) -> None:
    cfg = load_config(CONFIGS / name, [])
    options = load_env_factory(cfg.env.name).options_model.model_validate(cfg.env.options)
    assert options.model_dump(include=set(cfg.env.options)) == cfg.env.options


def test_no_file_gives_valid_defaults() -> None:
    assert load_config(None, []) == TrainConfig()


def test_yaml_values_and_untouched_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, "rollout:\n  max_turns: 3\noptim:\n  lr: 3.0e-6\n  betas: [0.9, 0.95]\n")
    cfg = load_config(path, [])
    assert cfg.rollout.max_turns == 3
    assert cfg.optim.lr == pytest.approx(3e-6)
    assert cfg.optim.betas == (0.9, 0.95)
    assert cfg.rollout.n_samples_per_prompt == TrainConfig().rollout.n_samples_per_prompt


def test_dotted_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "rollout:\n  n_samples_per_prompt: 4\n")
    cfg = load_config(
        path,
        [
            "rollout.n_samples_per_prompt=8",
            "optim.lr=1e-5",
            "optim.betas=[0.8, 0.9]",
            "rollout.engine=sglang:http://10.0.0.2:30000",
            "algo.dual_clip_c=null",
            "env.options.grid_size=8",
            "algo.advantage_estimator=turn_gae",
            "train.run_dir=runs/x",
        ],
    )
    assert cfg.rollout.n_samples_per_prompt == 8
    assert cfg.optim.lr == pytest.approx(1e-5)
    assert cfg.optim.betas == (0.8, 0.9)
    assert cfg.rollout.engine_url == "http://10.0.0.2:30000"
    assert cfg.algo.dual_clip_c is None
    assert cfg.env.options == {"grid_size": 8}
    assert cfg.algo.needs_critic
    assert cfg.train.run_dir == Path("runs/x")


def test_parse_override_reads_yaml_scalars_and_lists() -> None:
    assert parse_override("rollout.max_turns=5", TrainConfig) == (["rollout", "max_turns"], 5)
    assert parse_override("env.eval_seeds=[1, 9]", TrainConfig) == (["env", "eval_seeds"], [1, 9])
    assert parse_override("rollout.queue=", TrainConfig) == (["rollout", "queue"], None)
    assert parse_override("model.path=a=b", TrainConfig) == (["model", "path"], "a=b")
    assert parse_override("env.options.calc_score=format", TrainConfig)[1] == "format"


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) for every line of the docs that gives `--set`, backslash continuations joined."""
    found = []
    for path in DOCUMENTED:
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        for number, line in enumerate(text.splitlines(), 1):
            if "--set " in line and "section.key=value" not in line:
                found.append((f"{path.relative_to(ROOT)}:{number}", line))
    return found


def overrides_of(command: str) -> tuple[Path | None, list[str]]:
    """The `--config` file and the `--set` items of a command (or of a sentence quoting `--set` in
    backticks), shell variables such as `$s` read as 0, and as a word where quoted (`"$head"`)."""
    words_in = re.sub(r"\$\w+", "0", re.sub(r'"\$\w+"', "word", command.replace("`", " ")))
    lexer = shlex.shlex(words_in, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    config = next((ROOT / words[i + 1] for i, w in enumerate(words[:-1]) if w == "--config"), None)
    return config, [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--set"]


def value_at(cfg: TrainConfig, keys: list[str]) -> Any:
    """The validated value at a dotted path, as plain data."""
    node: Any = cfg
    for key in keys:
        node = node[key] if isinstance(node, dict) else getattr(node, key)
    return list(node) if isinstance(node, tuple) else str(node) if isinstance(node, Path) else node


@pytest.mark.parametrize(
    ("where", "command"), documented_commands(), ids=[w for w, _ in documented_commands()]
)
def test_every_documented_override_loads_and_lands_where_it_says(where: str, command: str) -> None:
    config, items = overrides_of(command)
    assert items, f"{where}: no --set item read from {command!r}"
    cfg = load_config(config, items)
    for item in items:
        keys, value = parse_override(item, TrainConfig)
        landed = value_at(cfg, keys)
        assert (
            landed == value
            or landed == yaml.safe_load(str(value))
            or str(landed) == str(value)
            or (isinstance(landed, float) and landed == float(value))
        ), f"{where}: {item} gave {landed!r}"


def test_bad_type_names_the_field(tmp_path: Path) -> None:
    path = _write(tmp_path, "rollout:\n  n_samples_per_prompt: many\n")
    with pytest.raises(ConfigError, match=r"rollout\.n_samples_per_prompt: .*integer.*'many'"):
        load_config(path, [])


def test_unknown_key_in_file_names_it_and_suggests(tmp_path: Path) -> None:
    path = _write(tmp_path, "algo:\n  eps_clp: 0.2\n")
    with pytest.raises(ConfigError, match=r"algo\.eps_clp: unknown key \(did you mean 'eps_clip'\?\)"):
        load_config(path, [])
    with pytest.raises(ConfigError, match=r"optimizer: unknown key"):
        load_config(_write(tmp_path, "optimizer:\n  lr: 1.0\n"), [])


def test_unknown_override_path_is_an_error_naming_it() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown key 'rollout\.n_sample_per_prompt'.*n_samples_per_prompt"
    ):
        load_config(None, ["rollout.n_sample_per_prompt=8"])
    with pytest.raises(ConfigError, match=r"unknown key 'rolout'"):
        load_config(None, ["rolout.max_turns=2"])
    with pytest.raises(ConfigError, match=r"'rollout\.max_turns' is a value, not a section"):
        load_config(None, ["rollout.max_turns.x=2"])


@pytest.mark.parametrize("item", ["rollout.max_turns", "=3", "rollout..max_turns=3"])
def test_malformed_override(item: str) -> None:
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        load_config(None, [item])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["train.global_batch_size=5"],
            r"train\.global_batch_size \(5\) must divide .*: set it to one of \[1, 2, 4, 8, 16\]",
        ),
        (["rollout.n_samples_per_prompt=1", "train.global_batch_size=4"], r"n_samples_per_prompt >= 2"),
        (["rollout.max_new_tokens=4096"], r"rollout: max_new_tokens \(4096\) exceeds"),
        (["rollout.rollout_max_context_len=1000"], r"must be below rollout_max_context_len"),
        (["algo.eps_clip=0"], r"algo\.eps_clip: .*greater than 0"),
        (["algo.eps_clip_high=-0.1"], r"algo\.eps_clip_high: .*greater than 0"),
        (["algo.kl_loss_type=k4"], r"algo\.kl_loss_type: .*'k1', 'k2' or 'k3'"),
        (["algo.loss_agg_mode=sum"], r"algo\.loss_agg_mode"),
        (["rollout.engine=sglang"], r"rollout\.engine: 'sglang' is not"),
        (["rollout.engine=hf:http://a:1,b:2"], r"rollout\.engine: .* \(several servers: their URLs"),
        (["sync.engine_urls=[http://a:1]"], r"sync\.engine_urls are the servers behind a router"),
        (
            ["rollout.engine=sglang:http://a:1,http://b:2", "sync.engine_urls=[http://a:1]"],
            r"set rollout\.engine to the router's one URL",
        ),
        (["sync.engine_urls=[a:1]"], r"sync\.engine_urls\.0: String should match pattern"),
        (["rollout.queue=localhost:6379"], r"rollout\.queue"),
        (["env.url=localhost:8000"], r"env\.url"),
        (["env.reward_path=not a path"], r"env\.reward_path: 'not a path' is not an import path"),
        (["env.eval_seeds=[5, 5]"], r"env\.eval_seeds: .*start < stop"),
        (["optim.betas=[0.9, 1.0]"], r"optim\.betas: each beta"),
    ],
)
def test_invalid_values_are_reported_with_their_field(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_one_sample_per_prompt_is_fine_for_critic_estimators() -> None:
    cfg = load_config(
        None, ["rollout.n_samples_per_prompt=1", "train.global_batch_size=4", "algo.advantage_estimator=gae"]
    )
    assert cfg.algo.needs_critic


def test_file_problems_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml", [])
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "rollout: [unclosed\n"), [])
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(_write(tmp_path, "- 1\n- 2\n"), [])
    with pytest.raises(ConfigError, match=r"'rollout' in the config file is not a mapping"):
        load_config(_write(tmp_path, "rollout: 3\n"), ["rollout.max_turns=2"])
    assert load_config(_write(tmp_path, ""), []) == TrainConfig()


def test_env_reward_path_and_eval_seed_range() -> None:
    cfg = load_config(
        None, ["env.reward_path=vistarl.services.sokoban.reward:episode_reward", "env.eval_seeds=[3, 6]"]
    )
    assert cfg.env.reward_path == "vistarl.services.sokoban.reward:episode_reward"
    assert list(cfg.env.eval_seed_range) == [3, 4, 5]


def test_env_options_the_env_refuses_fail_when_the_config_loads() -> None:
    tiny = CONFIGS / "sokoban_tiny.yaml"
    with pytest.raises(
        ConfigError, match=r"env\.options\.grid_sise: unknown key \(did you mean 'grid_size'\?\)"
    ):
        load_config(tiny, ["env.options.grid_sise=6"])
    with pytest.raises(ConfigError, match=r"env\.options\.max_steps: .*greater than or equal to 1 \(got 0\)"):
        load_config(tiny, ["env.options.max_steps=0"])
    with pytest.raises(ConfigError, match=r"env\.name: unknown environment 'maze'"):
        load_config(tiny, ["env.name=maze"])
    served_elsewhere = load_config(tiny, ["env.name=maze", "env.url=http://10.0.0.3:8000"])
    assert served_elsewhere.env.name == "maze", "an env served at env.url is checked by its server"


@pytest.mark.parametrize(
    ("config", "env", "name"),
    [
        ("configs/sokoban_tiny.yaml", "sokoban", "sokoban_tiny"),
        ("configs/sokoban_tiny.yaml", "tests.envs.maze", "maze-sokoban_tiny"),
        ("my.yaml", "geo3k", "geo3k-my"),
        (None, "vsi", "vsi"),
    ],
)
def test_a_run_is_named_after_its_env_as_well_as_its_config(config: str | None, env: str, name: str) -> None:
    assert run_name(Path(config) if config else None, env) == name


def test_an_engine_pool_and_a_router_with_its_servers_are_configs() -> None:
    pool = load_config(None, ["rollout.engine=hf:http://a:1,http://b:2"])
    assert pool.rollout.engine_url == "http://a:1,http://b:2" and pool.rollout.engine_kind == "hf"
    routed = load_config(
        None, ["rollout.engine=sglang:http://router:30000", "sync.engine_urls=[http://a:1, http://b:2]"]
    )
    assert routed.sync.engine_urls == ["http://a:1", "http://b:2"]


def test_with_a_shared_queue_each_ranks_workers_take_their_share_of_the_concurrency() -> None:
    """Every rank runs `local_workers` workers on its own engine when the queue is shared: each worker
    runs its share of `concurrency`, and each engine batches what its rank's workers run at once."""
    spread = load_config(None, ["rollout.queue=redis://127.0.0.1:6379", "rollout.local_workers=2"])
    spread.rollout.concurrency = 5
    assert spread.rollout.spreads_workers
    assert [spread.rollout.rank_concurrency(ranks) for ranks in (1, 2, 4, 8)] == [5, 3, 2, 1]
    assert [spread.rollout.engine_batch(ranks) for ranks in (1, 2, 4)] == [10, 6, 4]
    in_memory = load_config(None, ["rollout.local_workers=2"])
    in_memory.rollout.concurrency = 5
    assert not in_memory.rollout.spreads_workers  # no other process can take jobs from it
    assert [in_memory.rollout.engine_batch(ranks) for ranks in (1, 2, 4)] == [10, 5, 3]
    off = load_config(None, ["rollout.queue=redis://127.0.0.1:6379", "rollout.workers_on_every_rank=false"])
    assert not off.rollout.spreads_workers
