# shellcheck shell=bash
# Shared by scripts/run_sokoban.sh, run_geo3k.sh and run_vsi.sh (sourced, not run): prepare the model
# and the data, then launch the run (docs/deploy.md, "Run scripts"). Settings, from the shell:
#   MODEL_PATH  a local checkpoint directory: train configs/<env>.yaml on it, the whole system started by
#               `vistarl up` (Redis, the env server, the engine, the workers, the trainer). Unset: write
#               the tiny random-init checkpoint (vistarl model tiny) and train configs/<env>_tiny.yaml
#               with `vistarl train` alone, on CPU.
#   ENGINE_URL  with MODEL_PATH: an SGLang server already running; then `vistarl train` alone trains on
#               it (the config's Redis must be running too), under torchrun with NPROC processes.
#   TRAINER_GPUS, ENGINE_GPUS, WORKERS, OUT
#               `vistarl up`'s GPUs of the trainer (default 0) and of the engine (default 1), rollout
#               workers (default 2) and run directory (default runs/up-<env>); empty GPUs: the CPU.
#   NPROC       `vistarl train` alone: processes for torchrun, one per GPU (default 1: a plain process).
#   PYTHON      the interpreter with vistarl installed (default .venv/bin/python, else python3).

if [ -x .venv/bin/python ]; then PYTHON=${PYTHON:-.venv/bin/python}; else PYTHON=${PYTHON:-python3}; fi
TINY_MODEL=runs/tiny-qwen2_5_vl
ENV_NAME=
CONFIG=
MODEL_ARGS=()
DATA_ARGS=()

vistarl() {
    "$PYTHON" -m vistarl.cli.main "$@"
}

# prepare_model ENV: pick configs/ENV.yaml on MODEL_PATH, or configs/ENV_tiny.yaml on the tiny checkpoint.
prepare_model() {
    ENV_NAME=$1
    if [ -n "${MODEL_PATH:-}" ]; then
        if [ ! -d "$MODEL_PATH" ]; then
            echo "MODEL_PATH=$MODEL_PATH is not a checkpoint directory (nothing is downloaded)" >&2
            exit 1
        fi
        CONFIG=configs/$1.yaml
        MODEL_ARGS=(--set "model.path=$MODEL_PATH")
    else
        if [ ! -d "$TINY_MODEL" ]; then
            vistarl model tiny --out "$TINY_MODEL"
        fi
        CONFIG=configs/$1_tiny.yaml
        MODEL_ARGS=(--set "model.path=$TINY_MODEL")
    fi
}

# real_data ENV FILE: convert a real data set with `vistarl data ENV --from FILE` and train on its rows.
real_data() {
    local out=runs/data/$1
    vistarl data "$1" --from "$2" --out "$out"
    DATA_ARGS=(--set "env.dataset=$out/train.parquet")
}

# launch ARGS...: train CONFIG with the model and data chosen above: with MODEL_PATH and no ENGINE_URL,
# the whole system under `vistarl up`; else `vistarl train` alone. ARGS go to that command.
launch() {
    if [ -n "${MODEL_PATH:-}" ] && [ -z "${ENGINE_URL:-}" ]; then
        exec "$PYTHON" -m vistarl.cli.main up --config "$CONFIG" --out "${OUT:-runs/up-$ENV_NAME}" \
            --trainer-gpus "${TRAINER_GPUS-0}" --engine-gpus "${ENGINE_GPUS-1}" --workers "${WORKERS:-2}" \
            "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "$@"
    fi
    local engine=()
    if [ -n "${ENGINE_URL:-}" ]; then
        engine=(--set "rollout.engine=sglang:$ENGINE_URL")
    fi
    local train=(-m vistarl.cli.main train --config "$CONFIG" "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${engine[@]}" "$@")
    if [ "${NPROC:-1}" -gt 1 ]; then
        exec "$PYTHON" -m torch.distributed.run --nproc_per_node "$NPROC" "${train[@]}"
    fi
    exec "$PYTHON" "${train[@]}"
}
