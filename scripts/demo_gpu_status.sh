#!/usr/bin/env bash
# Where the runs of scripts/run_demo_gpu.sh stand: whether the detached driver still runs, and for each
# run its last logged step, its held-out success points so far (before SFT, after SFT, every
# train.eval_every RL steps), each SFT stage's steps and loss (the reading stage's first), its final line once there is one, and the paired comparisons of SFT and
# RL (both held-out sets) once they are written. With `--archive FILE` it also packs what to keep of the
# runs into FILE (tar.gz): logs, metrics, curves, the stage evaluations and the paired tests, without the
# checkpoints, the periodic evaluations' episodes and the SFT data (demos.jsonl, boards.jsonl). Copy it
# off at each call: a machine handed back between two calls then loses only the checkpoints.
#   bash scripts/demo_gpu_status.sh [OUT] [--archive FILE]    # OUT defaults to runs/demo-gpu
set -euo pipefail
cd "$(dirname "$0")/.."

out=runs/demo-gpu
archive=
while [ $# -gt 0 ]; do
    case $1 in
        --archive) archive=${2:?--archive needs a file}; shift 2 ;;
        *) out=$1; shift ;;
    esac
done
[ -d "$out" ] || { echo "no runs under $out" >&2; exit 1; }
if [ -f "$out/driver.pid" ]; then
    pid=$(cat "$out/driver.pid")
    if kill -0 "$pid" 2>/dev/null; then echo "driver $pid: running"; else echo "driver $pid: finished"; fi
fi
shopt -s nullglob
for log in "$out"/*.log; do
    name=$(basename "$log" .log)
    [ "$name" = driver ] && continue
    echo "== $name"
    last=$(grep -E '^step [0-9]+' "$log" | tail -n 1 || true)
    echo "last step: ${last:-none yet}"
    python3 - "$log" "$out/$name/rl/metrics.jsonl" "$out/$name/sft/metrics.jsonl" <<'PY'
import json, re, sys
from pathlib import Path

log, metrics, sft = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
points, stage = [], None
for line in log.read_text(errors="replace").splitlines():  # the stage evaluations, as the run prints them
    if m := re.search(r"held-out evaluation (before SFT|after SFT|after RL)", line):  # its path may wrap
        stage = m.group(1)
    elif stage and (m := re.search(r"success ([0-9.]+%)", line)):
        points.append(f"{stage} {m.group(1)}")
        stage = None
last = {}  # the policy's state at the last RL step: whether GRPO still has a gradient to follow
if metrics.is_file():  # the periodic evaluations during RL
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        last.update(record)
        if "eval/success_rate" in record:
            points.append(f"RL step {record['step']} {100 * record['eval/success_rate']:.1f}%")
print("held-out: " + (", ".join(points) if points else "none yet"))
if sft.is_file():  # the SFT stages' loss: whether the reading stage learnt to see
    steps = [json.loads(line) for line in sft.read_text().splitlines()]
    for number, stage in ((0, "reading"), (1, "demonstrations")):
        if nll := [s["train/nll"] for s in steps if s.get("sft/stage") == number]:
            print(f"SFT {stage}: {len(nll)} steps, nll {sum(nll[-20:]) / len(nll[-20:]):.3f} (last 20)")
names = ("train/entropy", "train/entropy_coef", "train/zero_variance_groups")
if shown := [f"{name.split('/')[1]} {last[name]:.3g}" for name in names if name in last]:
    print("last RL step: " + ", ".join(shown))
PY
    final=$(grep -F 'held-out success:' "$log" | tail -n 1 || true)
    if [ -n "$final" ]; then echo "$final"; fi
    if [ -f "$out/$name/paired.txt" ]; then grep -E '^(==|solved by|exact)' "$out/$name/paired.txt"; fi
done
if [ -n "$archive" ]; then
    # exit status 1: a file changed while it was read, as the runs' files do while they run
    tar czf "$archive" --exclude=checkpoints --exclude='*.safetensors' --exclude='step-*' \
        --exclude=demos.jsonl --exclude=boards.jsonl --warning=no-file-changed -C "$(dirname "$out")" "$(basename "$out")" || [ $? = 1 ]
    echo "archived to $archive ($(du -h "$archive" | cut -f1))"
fi
