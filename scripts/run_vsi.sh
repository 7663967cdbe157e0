#!/usr/bin/env bash
# VSI (spatial questions answered by exploring VSI-Bench rooms), like the seed's run script: prepare
# the model and the data, then train.
#   scripts/run_vsi.sh                                                # tiny checkpoint, CPU
#   MODEL_PATH=/models/Qwen2.5-VL-3B-Instruct scripts/run_vsi.sh      # configs/vsi.yaml, vistarl up
#   VSI_PARQUET=/data/VSI-Bench/test.parquet scripts/run_vsi.sh       # the real VSI-Bench questions
# Without VSI_PARQUET the questions are generated from the scene layouts the env ships. Arguments go
# to `vistarl up` (`vistarl train` for the tiny run, or with ENGINE_URL). See scripts/run_common.sh and
# docs/deploy.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/run_common.sh
source scripts/run_common.sh

prepare_model vsi
if [ -n "${VSI_PARQUET:-}" ]; then
    real_data vsi "$VSI_PARQUET"
fi
launch "$@"
