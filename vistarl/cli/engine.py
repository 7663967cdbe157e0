"""`vistarl engine serve`: the in-process transformers engine behind SGLang's HTTP API."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from vistarl.cli.options import Host, MaxBodyBytes
from vistarl.cli.serve import _exit_cleanly, log_to_stderr

engine_app = typer.Typer(help="Generation engines.", no_args_is_help=True)


@engine_app.command("serve")
def serve(
    model: Annotated[Path, typer.Option(exists=True, file_okay=False, help="HF checkpoint directory.")],
    arch: Annotated[
        str,
        typer.Option(
            help="The architecture the checkpoint must be, as a config's model.arch: qwen2_5_vl, qwen3_vl, "
            "or auto (either)."
        ),
    ] = "auto",
    host: Host = None,
    port: Annotated[int | None, typer.Option(help="TCP port, 30000 by default. (env VISTARL_PORT)")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N. (env VISTARL_DEVICE)")] = None,
    max_batch_size: Annotated[
        int | None, typer.Option(help="Requests decoded together. (env VISTARL_MAX_BATCH_SIZE)")
    ] = None,
    max_body_bytes: MaxBodyBytes = None,
    log_level: Annotated[str | None, typer.Option(help="uvicorn log level. (env VISTARL_LOG_LEVEL)")] = None,
    await_weights: Annotated[
        bool | None,
        typer.Option(
            help="Generate nothing until a trainer pushes weights, as a restarted engine must. "
            "(env VISTARL_AWAIT_WEIGHTS)",
            show_default=False,
        ),
    ] = None,
    cuda_graphs: Annotated[
        bool | None,
        typer.Option(
            help="On a GPU, capture each decode step in a CUDA graph; off: eager steps. [default: on] "
            "(env VISTARL_CUDA_GRAPHS)",
            show_default=False,
        ),
    ] = None,
    prefix_cache: Annotated[
        bool | None,
        typer.Option(
            help="Keep finished requests' KV cache, so a conversation's next turn prefills only what it "
            "adds. [default: on] (env VISTARL_PREFIX_CACHE)",
            show_default=False,
        ),
    ] = None,
    prefix_cache_mb: Annotated[
        int | None,
        typer.Option(
            help="The prefix cache's bound in MiB on the model's device; the least recently used goes first. "
            "[default: 8192] (env VISTARL_PREFIX_CACHE_MB)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve a checkpoint with the HF engine over SGLang's /generate API. VISTARL_API_TOKEN sets a token."""
    from pydantic import ValidationError

    from vistarl.trainer.config import ConfigError, ModelConfig

    try:  # before torch loads: a checkpoint of another architecture is refused at once
        ModelConfig.model_validate({"path": str(model), "arch": arch}).check_arch(named_by="--arch")
    except (ConfigError, ValidationError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--model/--arch") from None
    import uvicorn

    from vistarl.trainer.rollout.engines.hf import HFEngine
    from vistarl.trainer.rollout.engines.server import EngineServerSettings, create_app
    from vistarl.trainer.rollout.engines.sglang_api import SERVER_KEEP_ALIVE_S

    flags: dict[str, Any] = {
        "host": host,
        "port": port,
        "device": device,
        "max_batch_size": max_batch_size,
        "max_body_bytes": max_body_bytes,
        "log_level": log_level,
        "await_weights": await_weights,
        "cuda_graphs": cuda_graphs,
        "prefix_cache": prefix_cache,
        "prefix_cache_mb": prefix_cache_mb,
    }
    try:
        settings = EngineServerSettings(**{name: value for name, value in flags.items() if value is not None})
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    log_to_stderr(settings.log_level)
    engine = HFEngine.from_pretrained(
        model,
        device=settings.device,
        max_batch_size=settings.max_batch_size,
        cuda_graphs=settings.cuda_graphs,
        prefix_cache_mb=settings.prefix_cache_bound_mb,
    )
    signal.signal(signal.SIGTERM, _exit_cleanly)
    app = create_app(engine, settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_keep_alive=SERVER_KEEP_ALIVE_S,
    )


def register(app: typer.Typer) -> None:
    """Add `engine ...` to the `vistarl` command line."""
    app.add_typer(engine_app, name="engine")
