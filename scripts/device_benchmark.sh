#!/usr/bin/env bash
# The accelerator run of the exported steps, on a machine with jax and no
# TensorFlow (docs/distributed.md#figures-through-xla-on-any-accelerator):
#
#   python -m official_ext.benchmark accelerator --export_xla=.xla_export/published  # here
#   bash scripts/device_benchmark.sh [EXPORT_DIR]                                   # there
#
# Writes $OUT/accelerator_xla.json (every case as it finishes), $OUT/run.log
# and $OUT/gpu.txt; OUT defaults to ./device_out. The runner stops after
# DEVICE_SECONDS (default 450), keeping the cases it measured. It resumes
# benchmarks/results/accelerator_xla.json: the cases recorded there on this
# device kind are kept and the others run (DEVICE_FRESH=1: all of them).
set -uo pipefail
cd "$(dirname "$0")/.."
export_dir="${1:-.xla_export/published}"
out="${OUT:-device_out}"
seconds="${DEVICE_SECONDS:-450}"
mkdir -p "$out"
python=""
for candidate in python3 python3.12 python; do
  if "$candidate" -c 'import jax' >/dev/null 2>&1; then
    python="$candidate"
    break
  fi
done
if [ -z "$python" ]; then
  echo "device_benchmark: no python with jax found" | tee "$out/run.log"
  exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader > "$out/gpu.txt" 2>&1 || true
"$python" -c 'import jax; print("jax", jax.__version__, jax.devices())' \
  2>&1 | tee "$out/run.log"
resume=""
recorded=benchmarks/results/accelerator_xla.json
if [ -z "${DEVICE_FRESH:-}" ] && [ -f "$recorded" ]; then
  cp "$recorded" "$out/accelerator_xla.json"
  resume=--resume
fi
PYTHONUNBUFFERED=1 timeout --kill-after=20 "$seconds" \
  "$python" scripts/run_xla_steps.py "$export_dir" \
  --json "$out/accelerator_xla.json" --warmup 3 --steps 10 --rounds 5 \
  --case_seconds 8 $resume 2>&1 | tee -a "$out/run.log"
rc=${PIPESTATUS[0]}
echo "device_benchmark: runner exit $rc (124: stopped after ${seconds} s)" \
  | tee -a "$out/run.log"
exit "$rc"
