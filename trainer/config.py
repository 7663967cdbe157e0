"""The training run's configuration: one typed model, loaded from YAML plus dotted `--set` overrides
(parsed and checked against the model by `trainer/overrides.py`).

Every section forbids unknown keys, so a typo in a config file or an override is an error that names
the key instead of a silently ignored setting. `load_config` turns pydantic's errors into one
`ConfigError` whose lines each start with the dotted path of the offending field.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vistarl.services.env_api import load_env_factory
from vistarl.trainer.overrides import OverrideError, apply_overrides, section_at, suggest_key

AdvantageEstimator = Literal["grpo", "dr_grpo", "gae", "mc", "turn_gae"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
KLType = Literal["k1", "k2", "k3"]

CRITIC_ESTIMATORS: frozenset[str] = frozenset({"gae", "turn_gae"})
GROUP_ESTIMATORS: frozenset[str] = frozenset({"grpo", "dr_grpo"})

_ENGINE_RE = re.compile(r"^(?P<kind>hf|sglang)(?::(?P<url>https?://[^\s,]+(,https?://[^\s,]+)*))?$")
_IMPORT_PATH_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*([.:][A-Za-z_]\w*)$")
OPENENV_SCHEMES = ("openenv+ws://", "openenv+wss://")
"""The schemes of an OpenEnv server's env URL: its WebSocket URL (`ws://`, `wss://`) behind `openenv+`."""


def is_openenv(spec: str) -> bool:
    """Whether an env spec (a URL, a name or an import path) names an OpenEnv server."""
    return spec.startswith(OPENENV_SCHEMES)


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names every bad field."""


class _Section(BaseModel):
    """Base of every section: unknown keys are errors, and assignments are validated too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


Arch = Literal["auto", "qwen2_5_vl", "qwen3_vl"]
"""A checkpoint's architecture, as its config.json's `model_type` names it; `auto` takes whichever it is."""


class ModelConfig(_Section):
    """The policy checkpoint: a local directory (nothing is downloaded) and how to load it."""

    path: str = "runs/tiny-qwen2_5_vl"
    arch: Arch = "auto"
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    gradient_checkpointing: bool = True
    uncheckpointed_layers: int = Field(
        default=0,
        ge=0,
        description="with gradient_checkpointing, the last N decoder layers keep their activations: less "
        "recompute for more memory (about 1 GB per layer per 8k tokens for a 3B model)",
    )
    checkpoint_scope: Literal["layer", "mlp"] = Field(
        default="layer",
        description="with gradient_checkpointing, what a decoder layer recomputes in backward: the whole "
        "layer, or only its MLP (no attention recompute, about 0.2 GB more per layer per 8k tokens at 3B)",
    )
    freeze_vision: bool = False
    compile: bool = Field(
        default=False,
        description="torch.compile each decoder layer and vision block, and the logprob chunks (GPU runs)",
    )
    compute_dtype: Literal["auto", "bfloat16", "float32"] = Field(
        default="auto",
        description="the trainer's matmul dtype over float32 master weights; auto: bfloat16 on GPU, "
        "float32 on CPU (sharded runs always compute in bfloat16 on GPU)",
    )

    def check_arch(self, path: Path | None = None, *, named_by: str = "model.arch") -> None:
        """A ConfigError unless the checkpoint at `path` (default: `path`) is of `arch`: one architecture's
        checkpoint trained under the other's config runs, with nothing to say the two disagree. `named_by`
        is where the user set `arch`, for the message."""
        where = Path(self.path) if path is None else path
        try:
            found = json.loads((where / "config.json").read_text()).get("model_type")
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{where} is not a checkpoint directory (its config.json: {exc})") from None
        if self.arch != "auto" and found != self.arch:
            raise ConfigError(
                f"{where} holds a {found} checkpoint (its config.json's model_type), but {named_by} is "
                f"{self.arch}: set {named_by} to {found} (or auto), or give a {self.arch} checkpoint"
            )


class OpenEnvAdapter(_Section):
    """How an OpenEnv server's episodes meet the model (`env.url: openenv+ws://HOST:PORT`; docs/training.md,
    "OpenEnv envs"): which observation fields make the chat message, and where the reply goes in the action.
    It travels with each job as the query of the env URL (`spec`), so a rollout worker anywhere reads it."""

    text_fields: list[str] = Field(
        default_factory=list,
        description="observation fields shown as the message's text, in order (other values than strings "
        "as JSON)",
    )
    image_fields: list[str] = Field(
        default_factory=list,
        description="observation fields holding an image or a list of images: base64 (PNG, JPEG or WebP) or "
        "data URLs",
    )
    action_field: str = Field(default="message", min_length=1, description="the action field the reply fills")
    json_action: bool = Field(
        default=False,
        description="the action is instead the reply's (last) JSON object, checked against the env's action "
        "schema; a reply without a valid one ends the episode with a turn reward of 0",
    )
    system_prompt: str = Field(default="", description="the system message of every episode")

    def check(self) -> OpenEnvAdapter:
        """This adapter, or a ValueError when it shows the model no field of the observation."""
        if not self.text_fields and not self.image_fields:
            raise ValueError("an OpenEnv env needs text_fields or image_fields, the fields the model sees")
        return self

    def spec(self, url: str) -> str:
        """The env a job names: `url` (`openenv+ws://...`) with this adapter as its query."""
        return f"{url}?{urllib.parse.urlencode(self.model_dump(exclude_defaults=True), doseq=True)}"

    @classmethod
    def parse(cls, spec: str) -> tuple[str, OpenEnvAdapter]:
        """The server's WebSocket base URL and the adapter of an env `spec`; a ValueError says what is bad."""
        parts = urllib.parse.urlsplit(spec)
        if not is_openenv(spec) or not parts.netloc:
            raise ValueError(f"{spec!r} is not an OpenEnv env URL like openenv+ws://HOST:PORT")
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        lists = {"text_fields", "image_fields"}
        fields = {key: values if key in lists else values[-1] for key, values in query.items()}
        adapter = cls.model_validate(fields).check()
        scheme = parts.scheme.removeprefix("openenv+")
        return urllib.parse.urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", "")), adapter


class EnvConfig(_Section):
    """Which environment to train against: a running server (`url`), or `name` served on this machine."""

    name: str = Field(
        default="sokoban",
        min_length=1,
        description="registered env name or import path; with an OpenEnv env.url, only the run's name",
    )
    url: str | None = Field(
        default=None,
        pattern=r"^(https?|openenv\+wss?)://[^\s?]+$",
        description="an env server (http:// or https://), or an OpenEnv server (openenv+ws:// or "
        "openenv+wss://, adapted by env.openenv)",
    )
    openenv: OpenEnvAdapter = Field(default_factory=OpenEnvAdapter)
    serve: bool = Field(
        default=True, description="without url: run `vistarl serve NAME` on a loopback port (else in process)"
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="the env's reset options, checked against env.name's options model; with an OpenEnv "
        "env.url, the reset's arguments, sent unchecked (OpenEnv's /schema describes no reset)",
    )
    dataset: Path | None = Field(
        default=None, description="train on the rows of this parquet (samples of the env), instead of seeds"
    )
    task_split: str | None = Field(
        default=None, description="train on the tasks of this split the env holds (SPLIT/INDEX), instead"
    )
    eval_split: str | None = Field(
        default=None, description="evaluate on this split the env holds (e.g. test), instead of eval_seeds"
    )
    reward_path: str | None = None
    eval_seeds: tuple[int, int] = (100_000, 100_032)
    confirm_seeds: tuple[int, int] | None = Field(
        default=None,
        description="a second held-out seed range [start, stop), evaluated after the run "
        "(scripts/run_demo_gpu.sh's CONFIRM_SEEDS): training plays neither its seeds nor their levels",
    )

    @field_validator("reward_path")
    @classmethod
    def _import_path(cls, value: str | None) -> str | None:
        """A reward function is named `package.module:function` (or `package.module.function`)."""
        if value is not None and not _IMPORT_PATH_RE.match(value):
            raise ValueError(f"{value!r} is not an import path like 'package.module:function'")
        return value

    @field_validator("eval_seeds", "confirm_seeds")
    @classmethod
    def _seed_range(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        """Held-out seeds are the half-open range [start, stop) and must not be empty."""
        if value is not None and value[0] >= value[1]:
            raise ValueError(f"[start, stop) must have start < stop, got {list(value)}")
        return value

    @model_validator(mode="after")
    def _one_task_source(self) -> EnvConfig:
        """Training tasks come from seeds, a parquet of samples or an env split (not both of the last two);
        an OpenEnv env takes seeds alone, and the adapter of `env.openenv` applies to it alone."""
        if self.dataset is not None and self.task_split is not None:
            raise ValueError("give env.dataset or env.task_split, not both")
        if not self.is_openenv:
            if self.openenv != OpenEnvAdapter():
                raise ValueError(
                    "env.openenv adapts an OpenEnv server: set env.url to openenv+ws://HOST:PORT"
                )
            return self
        self.openenv.check()
        splits = [key for key in ("dataset", "task_split", "eval_split") if getattr(self, key) is not None]
        if splits:
            raise ValueError(f"an OpenEnv env plays seeds: it takes no env.{' or env.'.join(splits)}")
        return self

    @property
    def is_openenv(self) -> bool:
        """Whether `url` names an OpenEnv server."""
        return self.url is not None and is_openenv(self.url)

    @property
    def remote(self) -> str | None:
        """The env that jobs name when it runs elsewhere: `url`, an OpenEnv server's with its adapter."""
        return self.openenv.spec(self.url) if self.url is not None and self.is_openenv else self.url

    @property
    def eval_seed_range(self) -> range:
        """The evaluation seeds as a `range`."""
        return range(*self.eval_seeds)

    @property
    def held_out_seed_ranges(self) -> tuple[range, ...]:
        """Every held-out seed range: `eval_seeds`, then `confirm_seeds` when set."""
        confirm = () if self.confirm_seeds is None else (range(*self.confirm_seeds),)
        return (self.eval_seed_range, *confirm)


def check_budgets(max_new_tokens: int, rollout_max_response_len: int, rollout_max_context_len: int) -> None:
    """A ValueError naming the budgets unless the per-turn one fits in the episode's, which fits in the
    context: the rule of the run's config and of every job's settings."""
    if max_new_tokens > rollout_max_response_len:
        raise ValueError(
            f"max_new_tokens ({max_new_tokens}) exceeds rollout_max_response_len ({rollout_max_response_len})"
        )
    if rollout_max_response_len >= rollout_max_context_len:
        raise ValueError(
            f"rollout_max_response_len ({rollout_max_response_len}) must be below "
            f"rollout_max_context_len ({rollout_max_context_len})"
        )


class RolloutConfig(_Section):
    """How episodes are generated: group sizes, budgets, sampling, engine and queue."""

    n_samples_per_prompt: int = Field(default=4, ge=1)
    rollout_batch_size: int = Field(default=4, ge=1, description="prompts (groups) per training step")
    max_turns: int = Field(default=8, ge=1)
    rollout_max_response_len: int = Field(default=1536, ge=1, description="generated tokens per episode")
    max_new_tokens: int = Field(default=512, ge=1, description="generated tokens per turn")
    rollout_max_context_len: int = Field(default=8192, ge=1)
    rollout_temperature: float = Field(default=1.0, gt=0)
    rollout_top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=-1, ge=-1, description="-1 disables top-k")
    stop: list[str] | None = Field(default=None, description="stop strings: a reply ends at the first")
    concurrency: int = Field(default=8, ge=1, description="episodes in flight per worker")
    engine: str = "hf"
    cuda_graphs: bool = Field(
        default=True,
        description="the embedded engine captures each decode step from its static KV cache on a GPU in a "
        "CUDA graph and replays it (off: the same step runs eagerly, several times slower at 3B; "
        "docs/benchmarks.md, 'The HF engine's decode step')",
    )
    prefix_cache: bool = Field(
        default=True,
        description="the embedded engine keeps finished requests' KV cache, so an episode's next turn "
        "prefills only what it adds to the last one (docs/engines.md, 'Prefix cache')",
    )
    prefix_cache_mb: int = Field(
        default=8192, ge=1, description="the prefix cache's bound in MiB on the engine's device (LRU)"
    )
    hold_joins: bool = Field(
        default=True,
        description="the embedded engine lets a request that arrives alone wait, up to its mean prompt pass, "
        "before joining the running batch, so that turns arriving one by one share a pass instead of "
        "each stalling every live row (docs/engines.md, 'Joining a running batch')",
    )
    gil_switch_ms: float = Field(
        default=0.05,
        ge=0,
        description="on a GPU, the process's GIL switch interval at most this: the engine's model thread and "
        "the learner's take the GIL back after every torch call, which Python's 5 ms interval delays while "
        "the rollout's envs and prompts run Python (`python -m benchmarks.gil_switch`; 0: leave Python's)",
    )
    queue: str | None = Field(default=None, pattern=r"^(redis|rediss|unix)://\S+$")
    local_workers: int = Field(default=1, ge=0, description="in-process rollout workers; 0: external ones")
    workers_on_every_rank: bool = Field(
        default=True,
        description="under torchrun with embedded engines, a shared queue (`queue`) and every rank on one "
        "node, every rank runs `local_workers` workers on its own engine, each with its share of "
        "`concurrency`, so that every rank's process carries its episodes' env calls, prompts and requests "
        "(off: rank 0's workers run them all, reaching the other ranks' engines over HTTP)",
    )
    collect_timeout_s: float = Field(default=1800.0, gt=0, description="longest wait for one step's episodes")
    episode_timeout_s: float | None = Field(default=600.0, gt=0, description="deadline of one episode")
    env_outage_s: float = Field(
        default=60.0, gt=0, description="how long a call to an env server retries through an outage"
    )
    namespace: str = Field(default="vistarl", min_length=1, pattern=r"^[\w.-]+$")
    max_staleness: int = Field(default=0, ge=0, description="policy versions a trajectory may lag behind")
    async_mode: bool = False
    start_together_s: float = Field(
        default=1.0,
        ge=0,
        description="with embedded engines and in-process workers (not async_mode, whose resets overlap the "
        "update), a batch's first requests wait until every episode the workers run at once has sent its "
        "first, this long at most, and start as one batch instead of each starting or joining a batch of a "
        "few rows as its reset ends; with overlap_resets, the hold until the push waits for them at its end "
        "(0: no wait)",
    )
    overlap_resets: bool = Field(
        default=False,
        description="synchronous mode: the next step's episodes reset their envs and build their prompts "
        "during the update, while the engine holds their generation for the new weights",
    )

    @field_validator("engine")
    @classmethod
    def _engine_spec(cls, value: str) -> str:
        """`hf` (embedded), `hf:URL` or `sglang:URL`, a URL or several comma-separated; SGLang only runs
        as a server."""
        match = _ENGINE_RE.match(value)
        if match is None or (match["kind"] == "sglang" and match["url"] is None):
            raise ValueError(
                f"{value!r} is not 'hf', 'hf:http://host:port' or 'sglang:http://host:port' (several "
                "servers: their URLs comma-separated)"
            )
        return value

    @model_validator(mode="after")
    def _budgets(self) -> RolloutConfig:
        """The per-turn budget fits in the episode budget, which fits in the context."""
        check_budgets(self.max_new_tokens, self.rollout_max_response_len, self.rollout_max_context_len)
        return self

    @property
    def engine_kind(self) -> Literal["hf", "sglang"]:
        """The engine family named by `engine`."""
        return "sglang" if self.engine.startswith("sglang") else "hf"

    @property
    def engine_url(self) -> str | None:
        """The engine server's URL (several, comma-separated, for a pool), or None for the embedded
        engine."""
        match = _ENGINE_RE.match(self.engine)
        return match["url"] if match else None

    @property
    def samples_per_step(self) -> int:
        """Trajectories per training step: prompts times samples per prompt."""
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def spreads_workers(self) -> bool:
        """Whether every rank's in-process workers play episodes on its own embedded engine: the queue is
        shared, so every rank can take jobs from it (`workers_on_every_rank`)."""
        return self.workers_on_every_rank and self.queue is not None and self.local_workers > 0

    def rank_concurrency(self, ranks: int) -> int:
        """Episodes a worker runs at once when each of `ranks` ranks runs its own workers: its share of
        `concurrency`, so that the run has as many in flight as rank 0's workers alone would."""
        return max(1, math.ceil(self.concurrency / ranks))

    def engine_batch(self, engines: int) -> int:
        """Requests one of `engines` embedded engines batches: its share of the episodes that the in-process
        workers run at once (one worker's when there are none here), the rows of its static KV cache. With
        every rank's workers on its own engine, what they run at once."""
        if engines > 1 and self.spreads_workers:
            return self.local_workers * self.rank_concurrency(engines)
        return max(1, math.ceil(max(1, self.local_workers) * self.concurrency / engines))


class AlgoConfig(_Section):
    """The RL algorithm: advantage estimator, PPO clipping, KL, entropy and TIS."""

    advantage_estimator: AdvantageEstimator = "grpo"
    gamma: float = Field(default=1.0, ge=0, le=1, description="token-level discount")
    lam: float = Field(default=1.0, ge=0, le=1, description="GAE lambda")
    gamma_turn: float = Field(default=0.95, ge=0, le=1, description="turn-level discount (turn_gae)")
    eps_clip: float = Field(default=0.2, gt=0, lt=1)
    eps_clip_high: float = Field(default=0.2, gt=0)
    dual_clip_c: float | None = Field(default=3.0, gt=1, description="None disables dual clip")
    value_clip: float = Field(default=0.2, gt=0)
    loss_agg_mode: LossAggMode = "token-mean"
    kl_loss_coef: float = Field(default=0.0, ge=0)
    kl_loss_type: KLType = "k3"
    entropy_coef: float = Field(
        default=0.0, ge=0, description="the entropy bonus's weight (its first, with a target)"
    )
    entropy_target: float | None = Field(
        default=None,
        gt=0,
        description="nats a token: adapt the bonus's weight to hold the entropy near it "
        "(trainer/learner/entropy_control.py); None keeps entropy_coef fixed",
    )
    entropy_coef_step: float = Field(
        default=5e-4, ge=0, description="the weight's change a step, with a target"
    )
    entropy_coef_max: float = Field(default=0.01, ge=0, description="the weight's ceiling, with a target")
    tis_cap: float | None = Field(default=2.0, gt=0, description="None disables TIS")
    ppo_epochs: int = Field(default=1, ge=1)
    old_logprobs: Literal["auto", "recompute", "update_pass"] = Field(
        default="auto",
        description="recompute: a no-grad pass before the update; update_pass: the update's own forward, "
        "detached (on-policy updates only); auto: update_pass where the update is on-policy",
    )

    @model_validator(mode="after")
    def _entropy_within_ceiling(self) -> AlgoConfig:
        """An adaptive bonus starts at `entropy_coef`, which its ceiling must allow."""
        if self.entropy_target is not None and self.entropy_coef > self.entropy_coef_max:
            raise ValueError(
                f"algo.entropy_coef ({self.entropy_coef}) is above "
                f"algo.entropy_coef_max ({self.entropy_coef_max})"
            )
        return self

    @property
    def use_kl(self) -> bool:
        """A reference model is loaded only when the KL loss has weight."""
        return self.kl_loss_coef > 0

    @property
    def needs_critic(self) -> bool:
        """GAE-style estimators need a value model."""
        return self.advantage_estimator in CRITIC_ESTIMATORS


class OptimConfig(_Section):
    """AdamW settings for the actor (and the critic, with its own learning rate)."""

    lr: float = Field(default=1e-6, gt=0)
    critic_lr: float = Field(default=1e-5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(default=1.0, gt=0)
    warmup_steps: int = Field(default=0, ge=0)

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        """Adam's betas lie in [0, 1)."""
        if not all(0 <= beta < 1 for beta in value):
            raise ValueError(f"each beta must be in [0, 1), got {list(value)}")
        return value


class TrainLoopConfig(_Section):
    """The training loop: length, batch sizes, seed, checkpoints and the run directory."""

    steps: int = Field(default=100, ge=1)
    max_time_s: float | None = Field(
        default=None, gt=0, description="end (and save) after the step that passes this many seconds of RL"
    )
    global_batch_size: int | None = Field(
        default=None, ge=1, description="trajectories per optimizer step; None: a whole step's (on-policy)"
    )
    micro_batch_tokens: int = Field(
        default=16384, ge=1, description="token budget of one micro-batch per rank"
    )
    vision_pass_micro_batches: int = Field(
        default=4, ge=1, description="consecutive micro-batches whose images share one vision-tower pass"
    )
    seed: int = 0
    save_every: int = Field(default=0, ge=0, description="0: save only at the end")
    save_last: bool = Field(
        default=True, description="save at the end; false for a measured run that needs no checkpoint"
    )
    eval_every: int = Field(default=0, ge=0, description="0: never evaluate")
    run_dir: Path | None = Field(default=None, description="None: runs/<config name>-<timestamp>")
    resume: bool = False
    save_samples: int = Field(default=2, ge=0, description="trajectories per step kept with their images")
    max_unusable_steps: int = Field(
        default=3,
        ge=1,
        description="tries in a row of one step that may bring no episode to learn from (all failed: an env "
        "server down) before the run stops with an error naming the env; such a try is not a step",
    )
    keep_checkpoints: int | None = Field(
        default=None, ge=1, description="the newest checkpoints of the run kept on disk; None: all"
    )
    optimizer_state_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="AdamW's two moments: bfloat16 halves its state, 8 to 4 bytes a parameter, "
        "stochastically rounded (trainer/learner/optimizers.py)",
    )
    optimizer_offload: Literal["none", "critic"] = Field(
        default="none",
        description="critic: the critic's weights, gradients and AdamW state in host memory, where its "
        "optimizer steps (FSDP2's CPU offload, under torchrun); the actor's stay on the GPU, which pushes "
        "them",
    )
    memory_check: Literal["refuse", "warn", "off"] = Field(
        default="refuse",
        description="before the models load, the run's peak GPU memory is estimated "
        "(trainer/learner/memory_budget.py): refuse a run that cannot fit, naming what to change; warn: say "
        "so and start; off: no estimate",
    )
    gpu_memory_gib: float | None = Field(
        default=None,
        gt=0,
        description="the GPU memory the check plans for; None: the device's free memory at start (on the "
        "CPU, no check unless this is set)",
    )

    def periodic_save(self, step: int) -> bool:
        """Whether step `step` saves a checkpoint every `save_every` steps (the last one aside)."""
        return self.save_every > 0 and step % self.save_every == 0


class SyncConfig(_Section):
    """How weights reach the engine after each step (`vistarl.trainer.weights`; the embedded engine is updated
    in process, whatever `mode` says)."""

    mode: Literal["disk", "nccl"] = Field(
        default="disk", description="disk: /update_weights_from_disk; nccl: SGLang's broadcast (sglang only)"
    )
    dir: Path | None = Field(default=None, description="disk mode: a directory the engine can read")
    dtype: Literal["bfloat16", "float16", "float32"] | None = Field(
        default=None, description="dtype of the pushed weights; None: model.dtype"
    )
    master_address: str = Field(default="127.0.0.1", description="nccl: trainer rank 0's address")
    master_port: int = Field(default=29600, ge=1, le=65535)
    engine_world_size: int = Field(default=1, ge=1, description="nccl: each SGLang server's GPUs (tp x dp)")
    engine_urls: list[Annotated[str, Field(pattern=r"^https?://[^\s,]+$")]] = Field(
        default_factory=list,
        description="the servers behind rollout.engine when it is a router (SGLang's): pushes go to each of "
        "them, generation through the router; empty: pushes go to rollout.engine's own server(s)",
    )
    bucket_mb: int = Field(
        default=512, ge=1, description="MiB of pushed weights gathered on the GPU, and sent, at a time"
    )
    watch_s: float = Field(
        default=2.0,
        ge=0,
        description="seconds between checks that an engine server serves the trainer's weights (one that "
        "restarted is pushed them again, trainer/run/weight_keeper.py); 0: never",
    )
    engine_return_s: float = Field(
        default=600.0,
        gt=0,
        description="how long a push that failed waits for its engine server to answer again",
    )


class SFTConfig(_Section):
    """Supervised fine-tuning (`vistarl sft`): what to imitate and for how long."""

    data: Path | None = Field(
        default=None,
        description="JSONL of demonstrations ({messages}, as `vistarl sokoban demos` writes) or of "
        "trajectories (as `vistarl rollout` writes)",
    )
    epochs: int = Field(default=1, ge=1)
    batch_size: int = Field(default=16, ge=1, description="trajectories per optimizer step")
    lr: float | None = Field(default=None, gt=0, description="the SFT learning rate; None: optim.lr")
    min_reward: float | None = Field(
        default=None, description="keep only trajectories whose episode reward is at least this"
    )
    transcribe_data: Path | None = Field(
        default=None,
        description="JSONL of boards to read (the image in, its text grid out: `transcription` in "
        "services/sokoban/demos.py), each imitated once before `data`: the reading stage; None: none",
    )
    transcribe_boards: int = Field(
        default=0,
        ge=0,
        description="`vistarl demo learn`: generated boards it writes to `transcribe_data` for the reading "
        "stage (seeds from 1,000,000); 0: no reading stage",
    )
    warmup_steps: int | None = Field(
        default=None, ge=0, description="each SFT stage's linear warmup in optimizer steps; None: optim's"
    )
    schedule: Literal["constant", "linear", "cosine"] = Field(
        default="constant",
        description="each SFT stage's learning rate after its warmup: constant, or decaying linearly or "
        "along a half cosine towards zero at the stage's last step",
    )
    transcribe_system_prompt: bool | Literal["alternate"] = Field(
        default=True,
        description="`vistarl demo learn`: the boards to read carry the env's system prompt; false: the "
        "image and the instruction alone; alternate: every other board with it",
    )
    vision_lr_scale: float = Field(
        default=1.0,
        gt=0,
        description="the vision tower's (and its merger's) learning rate in every SFT stage, as a multiple "
        "of the text model's",
    )
    freeze_text_steps: int = Field(
        default=0,
        ge=0,
        description="the reading stage's first steps that train the vision tower and its merger alone (the "
        "text model's learning rate held at 0); 0: none",
    )


class WandbConfig(_Section):
    """Weights & Biases (`trainer/run/wandb_sink.py`): off unless `mode` is online or offline (offline
    writes the run under the run directory's `wandb/`, for `wandb sync`, with no network)."""

    project: str = Field(default="vistarl", min_length=1)
    name: str | None = Field(default=None, description="the W&B run's name; None: the run directory's name")
    mode: Literal["disabled", "online", "offline"] = "disabled"


class LoggingConfig(_Section):
    """Where a run's logs go besides its run directory's files: TensorBoard, and Weights & Biases."""

    tensorboard: bool = True
    wandb: WandbConfig = Field(default_factory=WandbConfig)


class TrainConfig(_Section):
    """A whole training run."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainLoopConfig = Field(default_factory=TrainLoopConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @property
    def mini_batch_size(self) -> int:
        """Trajectories per optimizer step: `train.global_batch_size`, else all of a step's."""
        return self.train.global_batch_size or self.rollout.samples_per_step

    @property
    def on_policy(self) -> bool:
        """Whether the update is exactly on-policy: one epoch of one mini-batch of current-policy episodes,
        so the policy at its forward pass is the one that sampled them (docs/algorithms.md)."""
        return (
            self.algo.ppo_epochs == 1
            and self.mini_batch_size == self.rollout.samples_per_step
            and not self.rollout.async_mode
            and self.rollout.max_staleness == 0
        )

    @property
    def old_logprobs_from_update(self) -> bool:
        """Whether the update takes its old logprobs from its own forward pass instead of a recompute."""
        return self.algo.old_logprobs == "update_pass" or (
            self.algo.old_logprobs == "auto" and self.on_policy
        )

    @model_validator(mode="after")
    def _cross_section(self) -> TrainConfig:
        """Batch sizes fit together, group baselines have a group, and the modes fit the stack."""
        samples = self.rollout.samples_per_step
        if samples % self.mini_batch_size:
            divisors = [d for d in range(1, samples + 1) if samples % d == 0]
            raise ValueError(
                f"train.global_batch_size ({self.train.global_batch_size}) must divide "
                f"rollout.rollout_batch_size * rollout.n_samples_per_prompt ({samples}): set it to one of "
                f"{divisors}, or leave it out for one optimizer step per rollout batch"
            )
        if self.algo.advantage_estimator in GROUP_ESTIMATORS and self.rollout.n_samples_per_prompt < 2:
            raise ValueError(
                f"algo.advantage_estimator={self.algo.advantage_estimator} needs "
                f"rollout.n_samples_per_prompt >= 2 (got {self.rollout.n_samples_per_prompt})"
            )
        if self.algo.old_logprobs == "update_pass" and not self.on_policy:
            raise ValueError(
                "algo.old_logprobs=update_pass needs an on-policy update (algo.ppo_epochs=1, one mini-batch "
                "per step, rollout.async_mode=false, rollout.max_staleness=0): otherwise the policy that "
                "sampled the episodes is not the one the update starts from; use recompute or auto"
            )
        if self.rollout.async_mode and self.rollout.max_staleness < 1:
            raise ValueError(
                "rollout.async_mode trains on episodes one version old: set rollout.max_staleness >= 1"
            )
        if self.train.micro_batch_tokens < self.rollout.rollout_max_context_len:
            raise ValueError(
                f"train.micro_batch_tokens ({self.train.micro_batch_tokens}) must hold one whole episode "
                f"of rollout.rollout_max_context_len ({self.rollout.rollout_max_context_len}) tokens"
            )
        if self.sync.mode == "nccl" and self.rollout.engine_kind != "sglang":
            raise ValueError("sync.mode=nccl needs rollout.engine=sglang:URL")
        if self.sync.engine_urls and (self.rollout.engine_url or ",").count(",") != 0:
            raise ValueError(
                "sync.engine_urls are the servers behind a router: set rollout.engine to the router's one URL"
            )
        if self.rollout.local_workers == 0 and self.env.url is None and self.env.serve:
            raise ValueError(
                "external workers (rollout.local_workers=0) cannot reach an env server on this machine's "
                "loopback: set env.url, or env.serve=false to run the env inside the workers"
            )
        if self.rollout.local_workers == 0 and self.rollout.queue is None:
            raise ValueError(
                "rollout.local_workers=0 leaves the in-memory queue without workers: set rollout.queue"
            )
        return self


def load_config(path: str | Path | None, overrides: list[str]) -> TrainConfig:
    """Read `path` (None: all defaults), apply `section.key=value` overrides (`trainer/overrides.py`),
    and validate."""
    raw = _read_yaml(Path(path)) if path is not None else {}
    try:
        apply_overrides(raw, overrides, TrainConfig)
    except OverrideError as exc:
        raise ConfigError(str(exc)) from None
    source = str(path) if path is not None else "defaults"
    try:
        cfg = TrainConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [_describe_error(error) for error in exc.errors()]
        raise ConfigError(f"invalid config ({source}):\n  " + "\n  ".join(lines)) from None
    lines = _env_options_errors(cfg.env)
    if lines:
        raise ConfigError(f"invalid config ({source}):\n  " + "\n  ".join(lines))
    return cfg


def _env_options_errors(env: EnvConfig) -> list[str]:
    """`env.options` checked against the env's own options model, one line per problem, so that options
    the env refuses fail here rather than at the first reset. Nothing when the env cannot be loaded on
    this machine but runs at `env.url`: its server checks them at every reset. Nothing for an OpenEnv
    server: the options are its reset's arguments, which its `/schema` does not describe (docs/training.md,
    "OpenEnv envs")."""
    if env.is_openenv:
        return []
    try:
        factory = load_env_factory(env.name)
    except ValueError as exc:
        return [] if env.url is not None else [f"env.name: {exc}"]
    try:
        factory.options_model.model_validate(env.options)
    except ValidationError as exc:
        return [_describe_option_error(error, factory.options_model) for error in exc.errors()]
    return []


def _describe_option_error(error: Any, options_model: type[BaseModel]) -> str:
    """One line for a pydantic error of the env's options model, under `env.options`."""
    loc = tuple(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        hint = suggest_key(loc[-1], section_at(options_model, loc[:-1]))
        return f"env.options.{'.'.join(loc)}: unknown key{hint}"
    return _describe_error({**error, "loc": ("env", "options", *loc)})


def _read_yaml(path: Path) -> dict[str, Any]:
    """Load a YAML mapping from `path`; an empty file is an empty mapping."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(data).__name__}")
    return data


def _describe_error(error: Any) -> str:
    """One line per pydantic error: the dotted field path, then what is wrong with it."""
    loc = tuple(str(part) for part in error["loc"])
    where = ".".join(loc)
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key{suggest_key(loc[-1], section_at(TrainConfig, loc[:-1]))}"
    message = str(error["msg"]).removeprefix("Value error, ")
    if not where:
        return message
    if error["type"] == "value_error":
        return f"{where}: {message}"
    return f"{where}: {message} (got {error['input']!r})"
