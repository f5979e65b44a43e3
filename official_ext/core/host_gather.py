"""Host-side evaluation metrics under several workers: every replica's rows on the chief.

Call `gather_for_host` in `validation_step` and accumulate `host_parts` in
`aggregate_logs` (docs/distributed.md).
"""
from typing import Any, List, Optional, TypeVar

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
