#!/usr/bin/env bash
# The GPU run of docs/results.md, on one GPU: a `medium` random-init Qwen2.5-VL learns 6x6 Sokoban from
# images. SFT on 1,500 solver demonstrations, then GRPO from the SFT checkpoint at two learning rates side
# by side, with greedy success on the same 200 held-out levels before SFT, after SFT and after each RL run.
#   bash scripts/run_demo_gpu.sh [OUT]          # OUT defaults to runs/demo-gpu
# Every stage's metrics, curves and saved episodes land under OUT; each eval leaves OUT/<stage>/summary.json.
set -euo pipefail
cd "$(dirname "$0")/.."

vistarl() { python3 -m cli.main "$@"; }
config=configs/sokoban_demo_gpu.yaml
out=${1:-runs/demo-gpu}
demos=${DEMOS:-$out/demos.jsonl}
options='{"grid_size": 6, "num_boxes": 1, "cell_size": 28, "max_steps": 30}'
mkdir -p "$out"

[ -d runs/demo-model-gpu ] || vistarl model tiny --shape medium --out runs/demo-model-gpu
[ -f "$demos" ] || vistarl sokoban demos --n 1500 --out "$demos" --options "$options"
vistarl eval --config "$config" --out "$out/eval-before"
vistarl sft --config "$config" --set "sft.data=$demos" --set "train.run_dir=$out/sft"
sft=$(find "$out/sft/checkpoints" -maxdepth 2 -name actor -type d | sort | tail -n 1)
vistarl eval --config "$config" --checkpoint "$sft" --out "$out/eval-sft"
for lr in 2e-5 5e-5; do
    vistarl train --config "$config" --set "model.path=$sft" --set "optim.lr=$lr" \
        --set "train.run_dir=$out/rl-lr$lr" > "$out/rl-lr$lr.log" 2>&1 &
done
wait
for lr in 2e-5 5e-5; do
    rl=$(find "$out/rl-lr$lr/checkpoints" -maxdepth 2 -name actor -type d | sort | tail -n 1)
    vistarl eval --config "$config" --checkpoint "$rl" --out "$out/eval-rl-lr$lr"
done
