"""Multi-worker training: what Model Garden and Orbit leave to the caller.

Under `MultiWorkerMirroredStrategy` every worker runs the same program; worker
0 is the chief (`strategy.extended.should_checkpoint`). What the libraries do
already, and what this module adds:

* Checkpoints. `train_lib.OrbitExperimentRunner` lets every worker save
  (saving reads sync-on-read variables, a collective that needs all workers),
  the chief to `model_dir` and the others to `tempfile.mkdtemp()`. That
  directory is never removed, and a restarted non-chief worker restores from
  it, i.e. from nothing: it would start at step 0 with fresh weights while the
  chief resumes at step N, and the job diverges or hangs. `worker_model_dir`
  gives each non-chief worker its own temporary model_dir (removed when the
  process exits) holding a copy of the chief's latest checkpoint, and the
  runner (`core.runner.OrbitExperimentRunner`) has the non-chief
  CheckpointManager restore from and save to it.
* Summaries, params.yaml, the operative gin config, best-checkpoint exports:
  Orbit writes summaries on every worker and Model Garden writes the others
  to whatever model_dir it is given; with `worker_model_dir` they land in the
  non-chief worker's temporary directory.
* Host-side evaluation metrics (AP, R², ...): Orbit hands `aggregate_logs`
  the outputs of this worker's replicas only. `gather_for_host` (in
  `validation_step`) and `host_parts` (in `aggregate_logs`) make every worker
  accumulate every replica's rows, so the chief reports the metrics of the
  whole validation set.

The runner every run uses, with preemption recovery, is `core.runner`.
"""
import atexit
import os
import shutil
import tempfile
from typing import Any, List, Optional, TypeVar

from absl import logging
import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

T = TypeVar('T')


def num_workers(strategy: Optional[tf.distribute.Strategy] = None) -> int:
  """Worker processes (hosts) of the strategy's cluster; 1 without a cluster.

  Args:
    strategy: a strategy; default: the current one.
  """
  strategy = strategy or tf.distribute.get_strategy()
  resolver = getattr(strategy, 'cluster_resolver', None)
  if resolver is None:
    return 1
  jobs = resolver.cluster_spec().as_dict()
  return max(1, len(jobs.get('chief', ())) + len(jobs.get('worker', ())))


def is_chief(strategy: Optional[tf.distribute.Strategy]) -> bool:
  """Whether this worker writes the job's checkpoints and summaries."""
  return strategy is None or bool(strategy.extended.should_checkpoint)


def _barrier(strategy: tf.distribute.Strategy) -> None:
  """Returns on every worker once every worker has called it (an all-reduce)."""

  @tf.function
  def all_reduce():
    return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.ones([], tf.float32)))

  all_reduce()


def any_worker(strategy: tf.distribute.Strategy, flag: bool) -> bool:
  """Whether `flag` is True on any worker (an all-reduce on a cluster).

  Every worker must call it at the same point (it is a collective); without
  a cluster it returns `flag`.
  """
  if num_workers(strategy) <= 1:
    return bool(flag)

  @tf.function
  def all_reduce(value):
    # Made on each replica's device (a host tensor has no destination).
    return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, value * tf.ones([], tf.float32)))

  total = strategy.experimental_local_results(
      all_reduce(tf.constant(1.0 if flag else 0.0)))[0]
  return float(total) > 0


def _copy_latest_checkpoint(source_dir: str, target_dir: str) -> Optional[str]:
  """Copies `source_dir`'s latest checkpoint and makes it `target_dir`'s."""
  latest = tf.train.latest_checkpoint(source_dir)
  if not latest:
    return None
  prefix = os.path.join(target_dir, os.path.basename(latest))
  for path in tf.io.gfile.glob(latest + '.*'):
    tf.io.gfile.copy(path, prefix + path[len(latest):], overwrite=True)
  tf.compat.v1.train.update_checkpoint_state(target_dir, prefix)
  return latest


def worker_model_dir(strategy: Optional[tf.distribute.Strategy],
                     model_dir: str) -> str:
  """The directory this worker writes to: `model_dir` on the chief.

  A non-chief worker gets a new temporary directory, removed when the process
  exits, into which the chief's latest checkpoint in `model_dir` is copied, so
  that its CheckpointManager resumes from the same step and weights as the
  chief's. All workers call this at the same point, after the chief has
  settled which checkpoint to resume from; it waits for every worker (one
  all-reduce) before the copy.

  Args:
    strategy: the job's strategy (None: a single process, the chief).
    model_dir: the job's model_dir (the chief's).

  Returns:
    `model_dir` (chief) or the worker's temporary directory.
  """
  if strategy is None or num_workers(strategy) <= 1:
    return model_dir
  _barrier(strategy)
  if is_chief(strategy):
    return model_dir
  task_id = strategy.cluster_resolver.task_id
  worker_dir = tempfile.mkdtemp(prefix=f'official_ext_worker{task_id}_')
  atexit.register(shutil.rmtree, worker_dir, ignore_errors=True)
  restored = _copy_latest_checkpoint(model_dir, worker_dir)
  logging.info(
      'Worker %s is not the chief: it writes checkpoints and summaries to %s '
      '(removed at exit); the chief writes to %s. Resuming from: %s.', task_id,
      worker_dir, model_dir, restored or 'no checkpoint')
  return worker_dir


def gather_for_host(tree: T) -> T:
  """Every replica's rows on every replica, when there are several workers.

  Call in replica context (`validation_step`) on the tensors that
  `aggregate_logs` accumulates on the host; then accumulate `host_parts`.

  Args:
    tree: a nest of tensors of rank >= 1 whose first axis is rows (examples,
      queries); the row counts may differ between replicas.

  Returns:
    With several workers, each tensor all-gathered along axis 0 (the rows of
    all replicas of all workers, in replica order); otherwise `tree`.
  """
  if num_workers() <= 1:
    return tree
  context = tf.distribute.get_replica_context()
  # tf.identity places each tensor on this replica's device: with one device
  # per worker the collective needs a device (input tensors have none).
  return tf.nest.map_structure(
      lambda t: context.all_gather(tf.identity(t), axis=0), tree)


def host_parts(values: Any) -> List[np.ndarray]:
  """The parts of one step output to accumulate on the host.

  Args:
    values: one output of `validation_step` as `aggregate_logs` receives it:
      a tuple with one value per local replica, or a single value.

  Returns:
    Every local replica's value as numpy; with several workers (where
    `gather_for_host` gave every replica all rows) the first one only.
  """
  if not isinstance(values, (tuple, list)):
    return [np.asarray(values)]
  if num_workers() > 1:
    return [np.asarray(values[0])]
  return [np.asarray(v) for v in values]
