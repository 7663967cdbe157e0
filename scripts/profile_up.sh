#!/usr/bin/env bash
# Where the host time of a running `vistarl up` run goes: py-spy samples, for SECONDS, trainer rank 0 (the
# threads holding the GIL: the loop that drives every episode, its engine's model thread, the update) and
# the env server with its env workers, once the run has logged its first AFTER steps (default 2).
#   bash scripts/profile_up.sh DIR SECONDS [AFTER]
# Writes DIR/profile-rank0.txt (its first frame the thread) and DIR/profile-env.txt, collapsed stacks (one
# line a stack, its samples last). Prints how often rank 0's GIL was held, in all and by thread (near 100%:
# its Python is the limit), and each profile's 25 functions (all their lines together) with the most
# samples of their own.
# py-spy comes with the wheels of scripts/gpu_host_packages.sh; the samples need ptrace (root, or a relaxed
# ptrace_scope).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PYTHON=${PYTHON:-.venv/bin/python}; else PYTHON=${PYTHON:-python3}; fi
dir=${1:?usage: scripts/profile_up.sh DIR SECONDS [AFTER]}
seconds=${2:?usage: scripts/profile_up.sh DIR SECONDS [AFTER]}
after=${3:-2}
pyspy=$(command -v py-spy || echo /tmp/site/bin/py-spy)

for _ in $(seq 1800); do  # the run's first steps, 30 minutes at most
    [ "$(cat "$dir/run/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$after" ] && break
    sleep 1
done
pid_of() {  # the pid of the process of `vistarl up`'s role $1
    "$PYTHON" -c "import json, sys; print(next(p['pid'] for p in json.load(open(sys.argv[1]))['processes'].values() if p['role'] == sys.argv[2]))" \
        "$dir/processes.json" "$1"
}
rank0=$(pid_of trainer)  # the trainer itself, on the CPU; under torchrun, its worker of RANK 0
for child in $(pgrep -P "$rank0"); do
    if tr '\0' '\n' <"/proc/$child/environ" | grep -qx RANK=0; then rank0=$child; fi
done
"$pyspy" record --nonblocking --gil --threads --rate 200 --duration "$seconds" --format raw \
    --output "$dir/profile-rank0.txt" --pid "$rank0" >/dev/null 2>&1 &
"$pyspy" record --nonblocking --subprocesses --rate 200 --duration "$seconds" --format raw \
    --output "$dir/profile-env.txt" --pid "$(pid_of env)" >/dev/null 2>&1 &
wait
echo "== $dir/profile-rank0.txt: the GIL held in this share of the $((seconds * 200)) samples, by thread"
awk -v want="$((seconds * 200))" '{n = $NF; split($0, f, ";"); held[f[1]] += n; all += n}
    END {printf "%6.1f%%  all threads\n", 100 * all / want; for (t in held) printf "%6.1f%%  %s\n", 100 * held[t] / want, t}' \
    "$dir/profile-rank0.txt" | sort -rn | head -8
for profile in "$dir"/profile-rank0.txt "$dir"/profile-env.txt; do
    echo "== $profile: functions by samples of their own"
    awk '{n = $NF; sub(/ [0-9]+$/, ""); k = split($0, f, ";"); sub(/:[0-9]+\)$/, ")", f[k]); own[f[k]] += n; all += n}
        END {for (x in own) printf "%6.1f%%  %s\n", 100 * own[x] / all, x}' "$profile" | sort -rn | head -25
done
