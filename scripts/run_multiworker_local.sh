#!/usr/bin/env bash
# Runs one official_ext experiment on N worker processes of this machine with
# MultiWorkerMirroredStrategy (collective all-reduce over 127.0.0.1).
#
#   scripts/run_multiworker_local.sh N EXPERIMENT MODEL_DIR [ARGS...]
#   scripts/run_multiworker_local.sh 2 yt8m_demo /tmp/yt8m_mw --mode=train_and_eval
#
# ARGS go to every `python -m official_ext.train` unchanged (`--mode` is
# required, as for train.py; `--config_file`, `--params_override`, ...).
# What the script adds:
#   * TF_CONFIG per worker: a cluster of N workers on 127.0.0.1 with free
#     ports, task index i (worker 0 is the chief).
#   * --config_file=<LOG_DIR>/multi_worker.yaml setting
#     `runtime.distribution_strategy: multi_worker_mirrored` (applied after
#     the config files in ARGS; a --params_override in ARGS still wins).
#   * --model_dir=MODEL_DIR for every worker: the chief writes checkpoints,
#     summaries and params.yaml there; the other workers write theirs to a
#     temporary directory of their own, removed when they exit
#     (official_ext.core.run.multiworker).
#   * Worker i's stdout and stderr go to LOG_DIR/worker_i.log, LOG_DIR being
#     $MULTIWORKER_LOG_DIR or MODEL_DIR/logs.
#
# Waits for every worker. Exits 0 when all of them succeed; as soon as one
# fails, stops the others (SIGTERM, then SIGKILL after
# $MULTIWORKER_KILL_GRACE_S seconds, default 10), prints the failed worker's
# log tail and exits with that worker's status. Ctrl-C stops all workers.
set -u -o pipefail

if [[ $# -lt 3 ]]; then
  sed -n '2,8p' "$0" >&2
  exit 2
fi
num_workers=$1
experiment=$2
model_dir=$3
shift 3
if ! [[ "$num_workers" =~ ^[1-9][0-9]*$ ]]; then
  echo "run_multiworker_local.sh: N must be a positive integer, got '$num_workers'." >&2
  exit 2
fi

python=${PYTHON:-python}
log_dir=${MULTIWORKER_LOG_DIR:-$model_dir/logs}
grace=${MULTIWORKER_KILL_GRACE_S:-10}
mkdir -p "$log_dir" "$model_dir"

strategy_config="$log_dir/multi_worker.yaml"
printf 'runtime:\n  distribution_strategy: multi_worker_mirrored\n' \
  > "$strategy_config"

# N distinct free ports: all sockets are held open until every port is picked.
ports=$("$python" - "$num_workers" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
  s = socket.socket()
  s.bind(('127.0.0.1', 0))
  socks.append(s)
print(' '.join(str(s.getsockname()[1]) for s in socks))
for s in socks:
  s.close()
EOF
) || { echo "run_multiworker_local.sh: could not pick free ports." >&2; exit 2; }
read -r -a ports <<< "$ports"
cluster=""
for port in "${ports[@]}"; do
  cluster+="${cluster:+,}\"127.0.0.1:$port\""
done

pids=()
stop_workers() {
  local pid alive=()
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null && alive+=("$pid")
  done
  [[ ${#alive[@]} -eq 0 ]] && return
  kill -TERM "${alive[@]}" 2>/dev/null
  # A worker ends its train loop and saves a checkpoint at SIGTERM, which may
  # never come while it waits on the failed worker: escalate after the grace
  # period.
  local waited=0
  while [[ $waited -lt $grace ]]; do
    local any=0
    for pid in "${alive[@]}"; do
      kill -0 "$pid" 2>/dev/null && any=1
    done
    [[ $any -eq 0 ]] && break
    sleep 1
    waited=$((waited + 1))
  done
  kill -KILL "${alive[@]}" 2>/dev/null
  wait "${alive[@]}" 2>/dev/null
}
trap 'echo "run_multiworker_local.sh: interrupted; stopping workers." >&2; stop_workers; exit 130' INT TERM

for ((i = 0; i < num_workers; i++)); do
  tf_config="{\"cluster\":{\"worker\":[$cluster]},\"task\":{\"type\":\"worker\",\"index\":$i}}"
  TF_CONFIG="$tf_config" "$python" -m official_ext.train \
    --experiment="$experiment" --model_dir="$model_dir" \
    "$@" --config_file="$strategy_config" \
    > "$log_dir/worker_$i.log" 2>&1 &
  pids+=($!)
done
echo "run_multiworker_local.sh: $num_workers workers (pids ${pids[*]}), TF_CONFIG cluster [$cluster], logs in $log_dir" >&2

running=("${pids[@]}")
while [[ ${#running[@]} -gt 0 ]]; do
  finished=""
  wait -n -p finished "${running[@]}"
  status=$?
  if [[ -z "$finished" ]]; then  # No child left (should not happen).
    break
  fi
  index=-1
  for ((i = 0; i < num_workers; i++)); do
    [[ "${pids[$i]}" == "$finished" ]] && index=$i
  done
  still=()
  for pid in "${running[@]}"; do
    [[ "$pid" != "$finished" ]] && still+=("$pid")
  done
  running=("${still[@]}")
  if [[ $status -ne 0 ]]; then
    echo "run_multiworker_local.sh: worker $index (pid $finished) failed with status $status; stopping the others. Its log ($log_dir/worker_$index.log) ends:" >&2
    tail -n 40 "$log_dir/worker_$index.log" >&2
    stop_workers
    exit "$status"
  fi
done
echo "run_multiworker_local.sh: all $num_workers workers finished." >&2
exit 0
