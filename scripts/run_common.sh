# shellcheck shell=bash
# Shared by scripts/run_sokoban.sh, run_geo3k.sh and run_vsi.sh (sourced, not run): prepare the model
# and the data, then launch `vistarl train` (docs/deploy.md, "Run scripts"). Settings, from the shell:
#   MODEL_PATH  a local checkpoint directory: train configs/<env>.yaml on it. Unset: write the tiny
#               random-init checkpoint (vistarl model tiny) and train configs/<env>_tiny.yaml on CPU.
#   NPROC       processes for torchrun, one per GPU (default 1: a plain process).
#   PYTHON      the interpreter with vistarl installed (default .venv/bin/python, else python3).

if [ -x .venv/bin/python ]; then PYTHON=${PYTHON:-.venv/bin/python}; else PYTHON=${PYTHON:-python3}; fi
TINY_MODEL=runs/tiny-qwen2_5_vl
CONFIG=
MODEL_ARGS=()
DATA_ARGS=()

vistarl() {
    "$PYTHON" -m cli.main "$@"
}

# prepare_model ENV: pick configs/ENV.yaml on MODEL_PATH, or configs/ENV_tiny.yaml on the tiny checkpoint.
prepare_model() {
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

# launch ARGS...: train CONFIG with the model and data chosen above; ARGS go to `vistarl train`.
launch() {
    local train=(-m cli.main train --config "$CONFIG" "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "$@")
    if [ "${NPROC:-1}" -gt 1 ]; then
        exec "$PYTHON" -m torch.distributed.run --nproc_per_node "$NPROC" "${train[@]}"
    fi
    exec "$PYTHON" "${train[@]}"
}
