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
# the VM. It prints each command as it runs it (quoted for a POSIX shell: a
# user can paste it), and before the ssh the command each host's shell runs;
# with --dry_run it prints them and runs none of them.
#
# Every value reaches the TPU hosts as data: each word of the remote command is
# quoted for the host's shell, so a model_dir, data pattern, params_override or
# config file name reaches official_ext.train as exactly one argument whatever
# characters it holds. Names are checked before anything runs: --tpu_name (a GCP
# resource name), --zone, --project, --accelerator_type, --runtime_version,
# --experiment (letters, digits, underscores) and --mode (train, eval,
# train_and_eval, continuous_eval).
#
# Flags (all --name=value):
#   --tpu_name, --zone, --accelerator_type (v2-8, v3-8, v3-32, v4-8, ...),
#   --experiment, --config_file (a *_tpu.yaml), --model_dir (gs://...)  required
#   --train_data, --validation_data  input file patterns (gs://...), optional
#     (a '$' in a bucket name is refused: a variable the shell left unexpanded)
#   --mode (train_and_eval), --params_override (extra, appended)
#   --project (gcloud's default), --runtime_version (tpu-vm-tf-2.20.0-pjrt;
#     -pod-pjrt for slices of more than 8 cores), --delete_after, --dry_run
set -euo pipefail

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
die() { echo "launch_cloud_tpu.sh: $*" >&2; exit 2; }

# $1 as one word of any POSIX shell (sh, bash, dash, zsh): as it is when it
# holds only characters no shell treats specially, else in single quotes, each
# ' written '\''. Nothing inside single quotes is special, newlines included.
sq() {
  case "$1" in
    '') printf "''" ;;
    *[!A-Za-z0-9_./:=,@%+-]*) local q="'\\''"; printf "'%s'" "${1//\'/$q}" ;;
    *) printf '%s' "$1" ;;
  esac
}
# The arguments as a command line of any POSIX shell: each one word.
words() {
  local out= w
  for w in "$@"; do out+="${out:+ }$(sq "$w")"; done
  printf '%s' "$out"
}
# Dies unless --$1's value $2 (the named flag) matches the regex $3; $4 says
# what was expected.
check() {
  [[ "$2" =~ $3 ]] || die "--$1=$(sq "$2"): expected $4"
}

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
# Names: what gcloud and official_ext.train accept, so that a typo or a
# pasted command fails here, naming the flag, before anything runs.
check tpu_name "$TPU_NAME" '^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$' \
  "a TPU name (GCP resource name): lowercase letters, digits and hyphens, starting with a letter, not ending with a hyphen, at most 63 characters"
check zone "$ZONE" '^[a-z]+(-[a-z]+[0-9]+)+-[a-z]$' "a zone, e.g. us-central2-b, europe-west4-a"
[ -z "$PROJECT" ] || check project "$PROJECT" \
  '^([a-z0-9][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$' \
  "a project id: 6 to 30 lowercase letters, digits and hyphens, starting with a letter, not ending with a hyphen (optionally after DOMAIN:)"
check accelerator_type "$ACCEL" '^v[0-9]+[a-z]*-[0-9]+$' "e.g. v3-8, v3-32, v4-8, v5litepod-8"
[ -z "$RUNTIME" ] || check runtime_version "$RUNTIME" '^[a-z][-a-z0-9._]*$' \
  "a TPU VM runtime version, e.g. tpu-vm-tf-2.20.0-pjrt"
check experiment "$EXPERIMENT" '^[A-Za-z][A-Za-z0-9_]*$' \
  "an experiment name (letters, digits, underscores), e.g. yt8m, assemblenet_plus_lite_kinetics"
case "$MODE" in
  train|eval|train_and_eval|continuous_eval) ;;
  *) die "--mode=$(sq "$MODE"): expected one of train, eval, train_and_eval, continuous_eval (the modes of official_ext.train)" ;;
esac
case "$MODEL_DIR" in
  gs://*) ;;
  *) die "--model_dir=$(sq "$MODEL_DIR"): TPU hosts write checkpoints to Cloud Storage; expected gs://BUCKET/PATH" ;;
esac
# A bucket name has no '$': one there is a variable the shell did not expand
# (written inside single quotes), which every host would then read literally.
for pair in model_dir:MODEL_DIR train_data:TRAIN_DATA validation_data:VAL_DATA; do
  var="${pair#*:}"; value="${!var}"; bucket="${value#gs://}"; bucket="${bucket%%/*}"
  case "$value" in
    gs://*\$*) [[ "$bucket" != *\$* ]] || die "--${pair%%:*}=$(sq "$value"): bucket $(sq "$bucket") holds '\$', a shell variable left unexpanded (the shell expands none inside single quotes): write it in double quotes, e.g. --${pair%%:*}=\"gs://\$BUCKET/...\"" ;;
  esac
done
[ -f "$CONFIG" ] || die "--config_file=$(sq "$CONFIG") does not exist"
grep -Eq '^\s*distribution_strategy:\s*tpu\b' "$CONFIG" || \
  die "--config_file=$(sq "$CONFIG") does not set runtime.distribution_strategy: tpu (use a *_tpu.yaml)"
for data in "$TRAIN_DATA" "$VAL_DATA"; do
  case "$data" in ""|gs://*) ;; *) die "data pattern $(sq "$data"): TPU hosts read from Cloud Storage; expected gs://..." ;; esac
done

# Cores in the slice: the number after the dash (v3-32 -> 32). More than 8
# cores means several hosts: a pod runtime, and the resolver finds the slice
# by name instead of 'local'.
CORES="${ACCEL##*-}"
if [ "$CORES" -gt 8 ]; then
  TPU_FLAG="$TPU_NAME"; RUNTIME="${RUNTIME:-tpu-vm-tf-2.20.0-pod-pjrt}"
else
  TPU_FLAG=local; RUNTIME="${RUNTIME:-tpu-vm-tf-2.20.0-pjrt}"
fi

OVERRIDES=()
[ -n "$TRAIN_DATA" ] && OVERRIDES+=("task.train_data.input_path=$TRAIN_DATA")
[ -n "$VAL_DATA" ] && OVERRIDES+=("task.validation_data.input_path=$VAL_DATA")
[ -n "$OVERRIDE" ] && OVERRIDES+=("$OVERRIDE")
JOINED=
for o in ${OVERRIDES[@]+"${OVERRIDES[@]}"}; do JOINED+="${JOINED:+,}$o"; done

REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIST="${TMPDIR:-/tmp}/official_ext_dist"
VERSION=$(sed -n "s/^ *version=['\"]\([^'\"]*\)['\"].*/\1/p" "$REPO/setup.py" | head -1)
WHEEL="official_ext-${VERSION}-py3-none-any.whl"
GC=(gcloud compute tpus tpu-vm)
WHERE=(--zone="$ZONE")
[ -n "$PROJECT" ] && WHERE+=(--project="$PROJECT")

# The command each host's shell runs (gcloud passes it to ssh, whose server
# hands it to the login shell): every word quoted by sq, so each value is one
# argument there; only "$HOME" is left for that shell to expand.
TF_CHECK='import tensorflow as tf; v = tf.__version__; assert v.startswith("2.20"), "the image has TensorFlow " + v + ", official_ext needs 2.20: pick a tpu-vm-tf-2.20 runtime"'
REMOTE="$(words python3 -c "$TF_CHECK") && pip install --quiet \"\$HOME\"/$(sq "$WHEEL")"
REMOTE+=" && $(words python3 -m official_ext.train --tpu="$TPU_FLAG" \
  --experiment="$EXPERIMENT" --mode="$MODE" --model_dir="$MODEL_DIR")"
REMOTE+=" --config_file=\"\$HOME\"/$(sq "${CONFIG##*/}")"
[ -n "$JOINED" ] && REMOTE+=" $(sq "--params_override=$JOINED")"

run() {
  # Prints the command as it runs (a line of any POSIX shell, every word as
  # sq writes it: pasted, it makes the same call); runs it unless --dry_run.
  printf '%s\n' "$(words "$@")"
  [ "$DRY_RUN" = 1 ] || "$@"
}

run pip wheel --no-deps --quiet --wheel-dir "$DIST" "$REPO"
run "${GC[@]}" create "$TPU_NAME" "${WHERE[@]}" --accelerator-type="$ACCEL" --version="$RUNTIME"
run "${GC[@]}" scp "$DIST/$WHEEL" "$CONFIG" "$TPU_NAME:~/" "${WHERE[@]}" --worker=all
# What each host's shell runs, verbatim (the --command value below).
printf '%s\n' "$REMOTE" | sed 's/^/# on every host: /'
run "${GC[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --worker=all --command="$REMOTE"
if [ "$DELETE_AFTER" = 1 ]; then
  run "${GC[@]}" delete "$TPU_NAME" "${WHERE[@]}" --quiet
fi
