#!/usr/bin/env bash
# Trains an official_ext experiment on a Cloud TPU VM (single host or pod).
#
#   scripts/launch_cloud_tpu.sh --tpu_name=my-tpu --zone=europe-west4-a \
#     --accelerator_type=v3-8 --experiment=yt8m \
#     --config_file=configs/yt8m/yt8m_tpu.yaml --model_dir=gs://BUCKET/yt8m \
#     --train_data='gs://BUCKET/yt8m/frame/train*.tfrecord' \
#     --validation_data='gs://BUCKET/yt8m/frame/validate*.tfrecord' [--dry_run]
#
# Steps: build a wheel of this checkout; create the TPU VM (gcloud compute tpus
# tpu-vm create); copy the wheel and the config to every host; check the
# image's TensorFlow is 2.20 and pip-install the wheel on every host; run
# `python3 -m official_ext.train --tpu=...` on every host; optionally delete
# the VM. With --dry_run it prints the commands and runs none of them.
#
# Flags (all --name=value):
#   --tpu_name, --zone, --accelerator_type (v2-8, v3-8, v3-32, v4-8, ...),
#   --experiment, --config_file (a *_tpu.yaml), --model_dir (gs://...)  required
#   --train_data, --validation_data  input file patterns (gs://...), optional
#   --mode (train_and_eval), --params_override (extra, appended)
#   --project (gcloud's default), --runtime_version (tpu-vm-tf-2.20.0-pjrt;
#     -pod-pjrt for slices of more than 8 cores), --delete_after, --dry_run
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "launch_cloud_tpu.sh: $*" >&2; exit 2; }

TPU_NAME= ZONE= ACCEL= EXPERIMENT= CONFIG= MODEL_DIR= TRAIN_DATA= VAL_DATA=
MODE=train_and_eval OVERRIDE= PROJECT= RUNTIME= DELETE_AFTER=0 DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --tpu_name=*) TPU_NAME="${arg#*=}" ;;
    --zone=*) ZONE="${arg#*=}" ;;
    --accelerator_type=*) ACCEL="${arg#*=}" ;;
    --experiment=*) EXPERIMENT="${arg#*=}" ;;
    --config_file=*) CONFIG="${arg#*=}" ;;
    --model_dir=*) MODEL_DIR="${arg#*=}" ;;
    --train_data=*) TRAIN_DATA="${arg#*=}" ;;
    --validation_data=*) VAL_DATA="${arg#*=}" ;;
    --mode=*) MODE="${arg#*=}" ;;
    --params_override=*) OVERRIDE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;;
    --runtime_version=*) RUNTIME="${arg#*=}" ;;
    --delete_after) DELETE_AFTER=1 ;;
    --dry_run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done

for pair in tpu_name:TPU_NAME zone:ZONE accelerator_type:ACCEL \
            experiment:EXPERIMENT config_file:CONFIG model_dir:MODEL_DIR; do
  var="${pair#*:}"
  [ -n "${!var}" ] || die "--${pair%%:*} is required"
done
case "$MODEL_DIR" in
  gs://*) ;;
  *) die "--model_dir=$MODEL_DIR: TPU hosts write checkpoints to Cloud Storage; expected gs://BUCKET/PATH" ;;
esac
[ -f "$CONFIG" ] || die "--config_file=$CONFIG does not exist"
grep -Eq '^\s*distribution_strategy:\s*tpu\b' "$CONFIG" || \
  die "--config_file=$CONFIG does not set runtime.distribution_strategy: tpu (use a *_tpu.yaml)"
for data in "$TRAIN_DATA" "$VAL_DATA"; do
  case "$data" in ""|gs://*) ;; *) die "data pattern '$data': TPU hosts read from Cloud Storage; expected gs://..." ;; esac
done

# Cores in the slice: the number after the dash (v3-32 -> 32). More than 8
# cores means several hosts: a pod runtime, and the resolver finds the slice
# by name instead of 'local'.
CORES="${ACCEL##*-}"
[[ "$CORES" =~ ^[0-9]+$ ]] || die "--accelerator_type=$ACCEL: expected e.g. v3-8, v3-32"
if [ "$CORES" -gt 8 ]; then
  TPU_FLAG="$TPU_NAME"; RUNTIME="${RUNTIME:-tpu-vm-tf-2.20.0-pod-pjrt}"
else
  TPU_FLAG=local; RUNTIME="${RUNTIME:-tpu-vm-tf-2.20.0-pjrt}"
fi

OVERRIDES=()
[ -n "$TRAIN_DATA" ] && OVERRIDES+=("task.train_data.input_path=$TRAIN_DATA")
[ -n "$VAL_DATA" ] && OVERRIDES+=("task.validation_data.input_path=$VAL_DATA")
[ -n "$OVERRIDE" ] && OVERRIDES+=("$OVERRIDE")
JOINED=$(IFS=,; echo "${OVERRIDES[*]:-}")

REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIST="${TMPDIR:-/tmp}/official_ext_dist"
VERSION=$(sed -n "s/^ *version=['\"]\([^'\"]*\)['\"].*/\1/p" "$REPO/setup.py" | head -1)
WHEEL="official_ext-${VERSION}-py3-none-any.whl"
GC=(gcloud compute tpus tpu-vm)
WHERE=(--zone="$ZONE")
[ -n "$PROJECT" ] && WHERE+=(--project="$PROJECT")

TRAIN_CMD="python3 -m official_ext.train --tpu=$TPU_FLAG --experiment=$EXPERIMENT --mode=$MODE --model_dir=$MODEL_DIR --config_file=\$HOME/$(basename "$CONFIG")"
[ -n "$JOINED" ] && TRAIN_CMD+=" --params_override='$JOINED'"
REMOTE="python3 -c 'import tensorflow as tf; v = tf.__version__; assert v.startswith(\"2.20\"), \"the image has TensorFlow \" + v + \", official_ext needs 2.20: pick a tpu-vm-tf-2.20 runtime\"' && pip install --quiet \$HOME/$WHEEL && $TRAIN_CMD"

run() {
  # Prints the command (shell-quoted, as it would run); runs it unless --dry_run.
  printf '%q ' "$@" | sed 's/ $//'; echo
  [ "$DRY_RUN" = 1 ] || "$@"
}

run pip wheel --no-deps --quiet --wheel-dir "$DIST" "$REPO"
run "${GC[@]}" create "$TPU_NAME" "${WHERE[@]}" --accelerator-type="$ACCEL" --version="$RUNTIME"
run "${GC[@]}" scp "$DIST/$WHEEL" "$CONFIG" "$TPU_NAME:~/" "${WHERE[@]}" --worker=all
run "${GC[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --worker=all --command="$REMOTE"
if [ "$DELETE_AFTER" = 1 ]; then
  run "${GC[@]}" delete "$TPU_NAME" "${WHERE[@]}" --quiet
fi
