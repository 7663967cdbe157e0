#!/usr/bin/env bash
# The GPU runs of docs/results.md, on one GPU: a `medium` random-init Qwen2.5-VL trains on 6x6 one-box
# Sokoban, SFT on DEMOS solver demonstrations (default 2000: 375 SFT steps; with 600 the runs levelled off
# near 25%, docs/results.md) then GRPO (`vistarl demo learn`), three curricula side by side:
#   3moves    levels of up to 3 moves, one reply of up to 3 moves (configs/sokoban_demo_gpu.yaml as it is);
#   3turns    the same levels, one move a turn, up to 3 turns: the board seen again after every move (each
#             demonstration a move a turn; with up to 3 moves a reply, as before 2026-11-29, the demonstrations
#             never showed a second turn and the policy wrote garbage in it, docs/results.md);
#   1move     levels one move from solved.
# Each run's GRPO stage stops after the step that passes train.max_time_s (240 s), so the whole script
# fits one 10-minute command.
#   bash scripts/run_demo_gpu.sh [OUT]            # OUT defaults to runs/demo-gpu
#   bash scripts/run_demo_gpu.sh --detach [OUT]   # start them in their own process session and return
#   bash scripts/demo_gpu_status.sh [OUT]         # each run's last step, held-out points, final line
#   SEEDS="0 1 2" CURRICULA=3moves bash scripts/run_demo_gpu.sh --detach runs/seeds   # 3 seeds of 3moves
# Every (curriculum, seed) pair runs at once (train.seed; the held-out levels stay the same 200), run k
# on the k-th GPU of GPUS (default: every GPU there is) modulo their number: one run a GPU on a machine
# with as many, all on one GPU otherwise (a run of the medium model takes about 17 GiB). Extra arguments
# after OUT are `--set` overrides for every run (`train.max_time_s=1200` for 20 minutes of RL).
# Each run leaves OUT/<name>/ (eval-before, sft, eval-sft, rl, eval-rl) and OUT/<name>.log, whose last
# line is `held-out success: before X% -> after SFT Y% -> after RL Z% (200 levels)`; <name> is the
# curriculum, with `-seed<N>` when SEEDS names more than one. The SFT and RL checkpoints are then
# evaluated again on CONFIRM_SEEDS (default 200000-200199, a second held-out set, not watched while
# choosing the recipe; training plays neither its seeds nor their levels, `env.confirm_seeds`) into
# OUT/<name>/confirm-sft and confirm-rl, and both pairs are compared level by level
# (benchmarks/paired_eval.py) into OUT/<name>/paired.txt; CONFIRM_SEEDS="" skips it.
# Detached, the script's own output goes to OUT/driver.log and its process id to OUT/driver.pid; the
# runs outlive the shell (and the command) that started them.
set -euo pipefail
cd "$(dirname "$0")/.."

detach=0
if [ "${1:-}" = "--detach" ]; then detach=1; shift; fi
out=${1:-runs/demo-gpu}
mkdir -p "$out"
if [ "$detach" = 1 ]; then
    setsid nohup bash "$0" "$out" "${@:2}" > "$out/driver.log" 2>&1 < /dev/null &
    echo $! > "$out/driver.pid"
    echo "started in the background (pid $(cat "$out/driver.pid")); follow with: bash scripts/demo_gpu_status.sh $out"
    exit 0
fi
shift || true
common=("$@")

vistarl() { python3 -m vistarl.cli.main "$@"; }
read -r -a seeds <<< "${SEEDS:-0}"
read -r -a curricula <<< "${CURRICULA:-3moves 3turns 1move}"
read -r -a gpus <<< "${GPUS:-$(python3 -c "import torch; print(*range(max(torch.cuda.device_count(), 1)))")}"
read -r -a confirm <<< "${CONFIRM_SEEDS-200000 200200}"
demos=${DEMOS:-2000}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-3}   # the runs share the machine's cores

mkdir -p runs
{ flock 9  # two scripts started side by side write the model once, and neither reads it half-written
  [ -d runs/demo-model-gpu ] || vistarl model tiny --shape medium --out runs/demo-model-gpu; } 9> runs/.demo-model-gpu.lock
overrides() {  # a curriculum's --set overrides of configs/sokoban_demo_gpu.yaml
    case $1 in
        3moves) ;;
        3turns) echo rollout.max_turns=3 env.options.max_actions_per_turn=1 ;;
        1move) echo env.options.max_solution_len=1 ;;
        *) echo "unknown curriculum $1 (3moves, 3turns, 1move)" >&2; exit 2 ;;
    esac
}
checkpoint() { echo "$1/checkpoints/$(cat "$1/checkpoints/latest")/actor"; }
confirm_run() {  # the run's SFT and RL checkpoints on the second held-out set, and both paired tests
    local dir=$1; shift
    [ "${#confirm[@]}" = 2 ] || return 0
    for stage in sft rl; do
        vistarl eval --config configs/sokoban_demo_gpu.yaml --checkpoint "$(checkpoint "$dir/$stage")" \
            --out "$dir/confirm-$stage" "$@" --set "env.eval_seeds=[${confirm[0]},${confirm[1]}]"
    done
    { echo "== held-out levels of the curve (env.eval_seeds)"
      python3 -m benchmarks.paired_eval "$dir/eval-sft" "$dir/eval-rl"
      echo "== second held-out set, seeds ${confirm[0]}-$((confirm[1] - 1))"
      python3 -m benchmarks.paired_eval "$dir/confirm-sft" "$dir/confirm-rl"; } > "$dir/paired.txt"
}
run=0
for curriculum in "${curricula[@]}"; do
    for seed in "${seeds[@]}"; do
        name=$curriculum; [ "${#seeds[@]}" -gt 1 ] && name=$curriculum-seed$seed
        sets=(--set "train.seed=$seed")
        [ "${#confirm[@]}" != 2 ] || sets+=(--set "env.confirm_seeds=[${confirm[0]},${confirm[1]}]")
        for value in $(overrides "$curriculum") "${common[@]}"; do sets+=(--set "$value"); done
        export CUDA_VISIBLE_DEVICES=${gpus[run % ${#gpus[@]}]}
        { vistarl demo learn --config configs/sokoban_demo_gpu.yaml --out "$out/$name" --demos "$demos" "${sets[@]}" \
              && confirm_run "$out/$name" "${sets[@]}"; } > "$out/$name.log" 2>&1 &
        run=$((run + 1))
    done
done
wait
grep -H -F "held-out success:" "$out"/*.log || true
