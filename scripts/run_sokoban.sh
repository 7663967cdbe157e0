#!/usr/bin/env bash
# Sokoban with GRPO, like the seed's run script: prepare the model and the levels, then train.
#   scripts/run_sokoban.sh                                            # tiny checkpoint, CPU
#   MODEL_PATH=/models/Qwen3-VL-2B-Instruct TRAINER_GPUS=0,1,2 ENGINE_GPUS=3 scripts/run_sokoban.sh
#                                                                     # the seed's run on 4 GPUs, vistarl up
#   scripts/run_sokoban.sh --set train.steps=2                        # arguments go to the run's command
# With MODEL_PATH the levels are the seed's: 1000 train and 100 test levels written once to
# runs/data/sokoban by `vistarl data sokoban`. The tiny run draws levels from seeds as `make demo`
# does, with its 96-pixel boards. See scripts/run_common.sh and docs/deploy.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/run_common.sh
source scripts/run_common.sh

prepare_model sokoban
if [ -n "${MODEL_PATH:-}" ]; then
    levels=runs/data/sokoban
    if [ ! -f "$levels/train.parquet" ]; then
        vistarl data sokoban --out "$levels" --n-train 1000 --n-test 100
    fi
    DATA_ARGS=(--set "env.dataset=$levels/train.parquet")
fi
launch "$@"
