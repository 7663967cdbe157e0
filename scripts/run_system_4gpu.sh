#!/usr/bin/env bash
# The source systems' runs on one 4-GPU host (docs/benchmarks.md, "The whole system on 4 GPUs"), one after
# another, each a colocated `scripts/run_system_gpu.sh` run in the foreground, on random weights of the
# released shapes:
#   geo3k-4      Geo3k, Qwen3-VL-2B, GRPO, the seed's 64 prompts x 8 samples, on GPUs 0-3, 20 steps
#   geo3k-1      the same step on GPU 0 alone, 6 steps (the scaling's first point)
#   sokoban-4    Sokoban, 2B, 4 x 4 episodes of up to 8 turns, on GPUs 0-3, 20 steps
#   vsi-4        VSI, Qwen2.5-VL-3B, PPO with its critic and GAE, actor and critic sharded over GPUs 0-3,
#                20 steps
#   geo3k-2      the Geo3k step on GPUs 0 and 1, 6 steps (the scaling's middle point)
#   sokoban16-4  Sokoban at 16 x 4 episodes, on GPUs 0-3, 20 steps
# Every engine batches 64 Geo3k episodes at once whatever the GPUs (2 workers x 32 episodes per GPU), so
# the scaling compares GPUs, not batch sizes.
#   scripts/run_system_4gpu.sh OUT [RUN...]   the runs named (default: all, in the order above); each
#                                             leaves OUT/RUN/ (the `vistarl up` directory), and
#                                             OUT/RUN/status.json and status.txt when it ends
#   bash scripts/run_system_4gpu.sh OUT >OUT.log 2>&1 &   as the device runs it, detached (setsid)
# Settings: those of scripts/run_system_gpu.sh (MODELS, PYTHON); RUN_TIMEOUT_S (default 1500): a run still
# going then is stopped as `vistarl down` stops it (SIGTERM), and the next one starts; PROFILE_S (default 0):
# from each run's third step on, profile its host time for that many seconds (scripts/profile_up.sh, into
# OUT/RUN.profile.txt, the samples in OUT/RUN/profile-*.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PYTHON=${PYTHON:-.venv/bin/python}; else PYTHON=${PYTHON:-python3}; fi
export PYTHON

out=${1:?usage: scripts/run_system_4gpu.sh OUT [geo3k-4 geo3k-1 sokoban-4 vsi-4 geo3k-2 sokoban16-4]}
shift
runs=("$@")
if [ ${#runs[@]} -eq 0 ]; then runs=(geo3k-4 geo3k-1 sokoban-4 vsi-4 geo3k-2 sokoban16-4); fi
geo3k=(--set rollout.rollout_batch_size=64 --set train.global_batch_size=512)
mkdir -p "$out"

for name in "${runs[@]}"; do
    case "$name" in
        geo3k-4) gpus=0,1,2,3 run=geo3k args=("${geo3k[@]}" --set rollout.concurrency=128) ;;
        geo3k-2) gpus=0,1 run=geo3k args=("${geo3k[@]}" --set rollout.concurrency=64 --set train.steps=6) ;;
        geo3k-1) gpus=0 run=geo3k args=("${geo3k[@]}" --set rollout.concurrency=32 --set train.steps=6) ;;
        sokoban-4) gpus=0,1,2,3 run=sokoban args=() ;;
        sokoban16-4)
            gpus=0,1,2,3 run=sokoban
            args=(--set rollout.rollout_batch_size=16 --set train.global_batch_size=64 --set rollout.concurrency=32)
            ;;
        vsi-4) gpus=0,1,2,3 run=vsi args=() ;;
        *)
            echo "unknown run $name: geo3k-4, geo3k-2, geo3k-1, sokoban-4, sokoban16-4 or vsi-4" >&2
            exit 2
            ;;
    esac
    echo "$(date +%T) $name: scripts/run_system_gpu.sh $run on GPUs $gpus ${args[*]}"
    code=0 profiler=
    if [ "${PROFILE_S:-0}" -gt 0 ]; then
        bash scripts/profile_up.sh "$out/$name" "$PROFILE_S" 3 >"$out/$name.profile.txt" 2>&1 &
        profiler=$!
    fi
    FOREGROUND=1 TRAINER_GPUS=$gpus ENGINE_GPUS=$gpus timeout --signal=TERM --kill-after=120 \
        "${RUN_TIMEOUT_S:-1500}" bash scripts/run_system_gpu.sh "$run" "$out/$name" "${args[@]}" || code=$?
    if [ -n "$profiler" ]; then kill "$profiler" 2>/dev/null || true; fi  # a run that ended before its third step
    "$PYTHON" -m vistarl.cli.main status "$out/$name" --json >"$out/$name/status.json" || true
    "$PYTHON" -m vistarl.cli.main status "$out/$name" >"$out/$name/status.txt" || true
    echo "$(date +%T) $name: ended with exit code $code"
done
