"""Multi-worker training: each worker's model_dir and the collectives the runner
needs (docs/distributed.md, "On several workers")."""
import atexit
import os
import shutil
import tempfile
from typing import Optional

from absl import logging
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.core.host_gather import num_workers  # pylint: disable=unused-import


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
  """Whether `flag` is True on any worker; a collective every worker calls."""
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
  """The directory this worker writes: `model_dir` on the chief.

  Elsewhere a temporary copy of the chief's latest checkpoint; every worker
  calls it at the same point.
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
