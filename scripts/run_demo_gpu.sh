#!/usr/bin/env bash
# The GPU runs of docs/results.md, on one GPU: a `medium` random-init Qwen2.5-VL trains on 6x6 one-box
# Sokoban, SFT on 600 solver demonstrations then GRPO (`vistarl demo learn`), three curricula side by side:
#   3moves    levels of up to 3 moves, one reply of up to 3 moves (configs/sokoban_demo_gpu.yaml as it is);
#   3turns    the same levels, up to 3 turns to solve them;
#   1move     levels one move from solved.
# Each run's GRPO stage stops after the step that passes train.max_time_s (240 s), so the whole script
# fits one 10-minute command.
#   bash scripts/run_demo_gpu.sh [OUT]            # OUT defaults to runs/demo-gpu
#   bash scripts/run_demo_gpu.sh --detach [OUT]   # start them in their own process session and return
#   bash scripts/demo_gpu_status.sh [OUT]         # each run's last step, held-out points, final line
# Each run leaves OUT/<name>/ (eval-before, sft, eval-sft, rl, eval-rl) and OUT/<name>.log, whose last
# line is `held-out success: before X% -> after SFT Y% -> after RL Z% (200 levels)`. Detached, the
# script's own output goes to OUT/driver.log and its process id to OUT/driver.pid; the runs outlive the
# shell (and the command) that started them.
set -euo pipefail
cd "$(dirname "$0")/.."

detach=0
if [ "${1:-}" = "--detach" ]; then detach=1; shift; fi
out=${1:-runs/demo-gpu}
mkdir -p "$out"
if [ "$detach" = 1 ]; then
    setsid nohup bash "$0" "$out" > "$out/driver.log" 2>&1 < /dev/null &
    echo $! > "$out/driver.pid"
    echo "started in the background (pid $(cat "$out/driver.pid")); follow with: bash scripts/demo_gpu_status.sh $out"
    exit 0
fi

vistarl() { python3 -m cli.main "$@"; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-3}   # three runs share the machine's cores

[ -d runs/demo-model-gpu ] || vistarl model tiny --shape medium --out runs/demo-model-gpu
learn() {  # name, then --set overrides of configs/sokoban_demo_gpu.yaml
    local name=$1; shift
    local sets=(); for value in "$@"; do sets+=(--set "$value"); done
    vistarl demo learn --config configs/sokoban_demo_gpu.yaml --out "$out/$name" "${sets[@]}" \
        > "$out/$name.log" 2>&1
}
learn 3moves &
learn 3turns rollout.max_turns=3 &
learn 1move env.options.max_solution_len=1 &
wait
tail -n 1 "$out"/*.log
