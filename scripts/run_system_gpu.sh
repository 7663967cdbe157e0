#!/usr/bin/env bash
# The whole system on a 2-GPU host, as docs/benchmarks.md measures it ("The whole system on GPUs"):
# `vistarl up` with the trainer on GPU 0 and `vistarl engine serve` on GPU 1, on a random-init
# checkpoint of the real shape (written once under MODELS by `vistarl model tiny --shape ...`), each run
# sized to play its 20 steps in about 6 minutes. It starts detached and returns at once (FOREGROUND=1: it
# runs in the foreground and returns when the run ends, as scripts/run_system_4gpu.sh runs them).
# The same GPUs for both (TRAINER_GPUS=0 ENGINE_GPUS=0, or 0,1,2,3 for both) run colocated: no engine
# server and no worker process; each trainer rank generates on its own GPU, with two workers in process
# of its own (docs/deploy.md, "Placement"). Several engine GPUs (ENGINE_GPUS=1,2,3) start an
# engine each. Colocated on one H200, Geo3k and Sokoban hold the trainer's 72-82 GiB plus the engine's
# weights (4 GiB) and KV cache (28 and 14 GiB); VSI's trainer is estimated at 93.2 GiB with the sizing
# below (docs/fsdp.md, "Memory").
#   scripts/run_system_gpu.sh RUN OUT [ARGS...]   RUN: geo3k, sokoban, sokoban-async or vsi; ARGS go to
#                                                 vistarl up (more --set overrides, say)
#   vistarl status OUT                            the processes, the last step, the step breakdown
#   vistarl status OUT --json                     every step's figures, each GPU's idle time and memory
# Settings: TRAINER_GPUS and ENGINE_GPUS (default 0 and 1), MODELS (default runs/models), PYTHON (default
# .venv/bin/python, else python3). What each run keeps of its config, and what it changes:
#   geo3k          configs/geo3k.yaml on qwen3_vl_2b: 8 prompts x 8 samples (64 episodes) a step
#   sokoban        configs/sokoban.yaml on qwen3_vl_2b: 4 x 4 episodes of up to 8 turns, as configured
#   sokoban-async  the same with rollout.async_mode and rollout.max_staleness=1
#   vsi            configs/vsi.yaml on qwen2_5_vl_3b (PPO, critic, GAE): 8 questions a step, 8 turns;
#                  whole-layer checkpointing, 12k-token micro-batches (one whole episode's context),
#                  two a vision pass, AdamW's moments in bfloat16 and expandable allocator segments: the
#                  trainer's estimated peak is 93.2 GiB (docs/fsdp.md, "Memory"), which leaves one H200
#                  room for the engine beside it (TRAINER_GPUS=0 ENGINE_GPUS=0). With float32 moments
#                  and MLP-scope checkpointing step 1 peaked at 126.5 GiB and step 2 ran out of memory
#                  on an H200 (docs/benchmarks.md)
# The two workers run as many episodes at once as a step has (rollout.concurrency), and so the engines
# batch them all, each its share. Every run: no torch.compile (its start-up would take minutes of the six),
# 20 steps, no evaluation, no checkpoint at the end, 128 new tokens a turn at most, and replies ending at a '.': a
# random-init model writes no <|im_end|>, and a turn cut by max_new_tokens ends its episode, so without a
# stop string no episode would take a second turn (a uniform draw over Qwen's vocabulary hits a '.' about
# once in 23 tokens). A random model writes no tool call either: Geo3k's episodes end after one turn.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PYTHON=${PYTHON:-.venv/bin/python}; else PYTHON=${PYTHON:-python3}; fi

run=${1:?usage: scripts/run_system_gpu.sh geo3k|sokoban|sokoban-async|vsi OUT [ARGS...]}
out=${2:?usage: scripts/run_system_gpu.sh geo3k|sokoban|sokoban-async|vsi OUT [ARGS...]}
shift 2
every_run=(
    --set model.compile=false --set train.steps=20 --set train.eval_every=0 --set train.save_every=0
    --set train.save_last=false --set train.resume=false --set rollout.max_new_tokens=128
    --set 'rollout.stop=["."]'
)
case "$run" in
    geo3k)
        shape=qwen3_vl_2b arch=qwen3_vl config=configs/geo3k.yaml
        sized=(--set rollout.rollout_batch_size=8 --set train.global_batch_size=64 --set rollout.concurrency=32)
        ;;
    sokoban)
        shape=qwen3_vl_2b arch=qwen3_vl config=configs/sokoban.yaml
        sized=(--set rollout.concurrency=8)
        ;;
    sokoban-async)
        shape=qwen3_vl_2b arch=qwen3_vl config=configs/sokoban.yaml
        sized=(--set rollout.concurrency=8 --set rollout.async_mode=true --set rollout.max_staleness=1)
        ;;
    vsi)
        shape=qwen2_5_vl_3b arch=qwen2_5_vl config=configs/vsi.yaml
        sized=(
            --set rollout.rollout_batch_size=8 --set train.global_batch_size=8 --set rollout.concurrency=4
            --set rollout.max_turns=8 --set env.options.max_turns=8
            --set model.checkpoint_scope=layer --set train.micro_batch_tokens=12288
            --set train.vision_pass_micro_batches=2 --set train.optimizer_state_dtype=bfloat16
        )
        export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
        ;;
    *)
        echo "unknown run $run: geo3k, sokoban, sokoban-async or vsi" >&2
        exit 2
        ;;
esac
model=${MODELS:-runs/models}/$shape
if [ ! -f "$model/config.json" ]; then
    "$PYTHON" -m vistarl.cli.main model tiny --shape "$shape" --arch "$arch" --out "$model"
fi
detach=(--detach)
if [ "${FOREGROUND:-0}" = 1 ]; then detach=(); fi
exec "$PYTHON" -m vistarl.cli.main up --config "$config" --out "$out" "${detach[@]}" \
    --trainer-gpus "${TRAINER_GPUS-0}" --engine-gpus "${ENGINE_GPUS-1}" --workers 2 \
    --set "model.path=$model" "${every_run[@]}" "${sized[@]}" "$@"
