"""Host-side evaluation metrics under several workers: every replica's rows."""
from typing import Any, List, Optional, TypeVar

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

T = TypeVar('T')


def num_workers(strategy: Optional[tf.distribute.Strategy] = None) -> int:
  """Worker processes of `strategy`'s (default current) cluster."""
  strategy = strategy or tf.distribute.get_strategy()
  resolver = getattr(strategy, 'cluster_resolver', None)
  if resolver is None:
    return 1
  jobs = resolver.cluster_spec().as_dict()
  return max(1, len(jobs.get('chief', ())) + len(jobs.get('worker', ())))


def gather_for_host(tree: T) -> T:
  """Every replica's rows of `tree`, with several workers (else `tree`).

  Call in `validation_step` on what `aggregate_logs` accumulates (rank >= 1,
  rows first; counts may differ), then accumulate `host_parts`.
  """
  if num_workers() <= 1:
    return tree
  context = tf.distribute.get_replica_context()
  # tf.identity places each tensor on this replica's device: with one device
  # per worker the collective needs a device (input tensors have none).
  return tf.nest.map_structure(
      lambda t: context.all_gather(tf.identity(t), axis=0), tree)


def host_parts(values: Any) -> List[np.ndarray]:
  """A step output's local replica values as numpy (gathered: the first)."""
  if not isinstance(values, (tuple, list)):
    return [np.asarray(values)]
  if num_workers() > 1:
    return [np.asarray(values[0])]
  return [np.asarray(v) for v in values]
