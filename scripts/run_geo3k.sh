#!/usr/bin/env bash
# Geo3k (geometry problems answered through the calc_score tool), like the seed's run script:
# prepare the model and the data, then train.
#   scripts/run_geo3k.sh                                              # tiny checkpoint, CPU
#   MODEL_PATH=/models/Qwen3-VL-2B-Instruct scripts/run_geo3k.sh      # configs/geo3k.yaml, vistarl up
#   GEO3K_PARQUET=/data/geometry3k/train.parquet scripts/run_geo3k.sh # the real Geometry3K rows
# Without GEO3K_PARQUET the env's built-in generator makes the problems. Arguments go to `vistarl up`
# (`vistarl train` for the tiny run, or with ENGINE_URL). See scripts/run_common.sh and docs/deploy.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/run_common.sh
source scripts/run_common.sh

prepare_model geo3k
if [ -n "${GEO3K_PARQUET:-}" ]; then
    real_data geo3k "$GEO3K_PARQUET"
fi
launch "$@"
