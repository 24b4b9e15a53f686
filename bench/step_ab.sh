#!/bin/bash
# The in-process training step of two (or more) trees against each other, interleaved round by
# round so that a machine's changing load falls on each alike:
#
#     bench/step_ab.sh ROUNDS STEPS TREE... [-- bench.step_profile options, e.g. --dataset game]
#
# Each round runs, in every tree in turn, this checkout's bench/step_profile.py --no-profile --warmup
# 10 --steps STEPS on that tree's code, with this checkout's .venv; prints one line per tree and round, then per tree the
# median ms/step. A tree is a checkout (e.g. `git worktree add /tmp/base <commit>`).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
rounds=$1 steps=$2; shift 2
trees=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do trees+=("$1"); shift; done
[ $# -gt 0 ] && shift
log=$(mktemp) script=$(mktemp -d)
cp "$here/bench/step_profile.py" "$script/"
for r in $(seq "$rounds"); do
  for t in "${trees[@]}"; do
    # this checkout's bench script, from a folder of its own (bench/ holds modules that would
    # shadow packages), on the tree's code
    ms=$(cd "$t" && PYTHONPATH="$t" "$here/.venv/bin/python" "$script/step_profile.py" --no-profile --warmup 10 \
      --steps "$steps" "$@" 2>/dev/null |
      sed -n 's/.*(\([0-9.]*\) ms\/step).*/\1/p')
    echo "round $r $t ($(git -C "$t" rev-parse --short HEAD)): $ms ms/step" | tee -a "$log"
  done
done
for t in "${trees[@]}"; do
  grep " $t (" "$log" | sed 's/.*: \([0-9.]*\) ms\/step/\1/' | sort -n |
    awk -v t="$t" '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%s: median %.1f ms/step over %d rounds\n", t, m, NR}'
done
rm -rf "$log" "$script"
