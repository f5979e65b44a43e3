"""The run's distribution strategy, every global batch checked against it.

The strategy is built, and every global batch checked against its replicas,
in one place: `distribution_strategy` (`official_ext.train`, every attempt of
the preemption-recovery loop).
"""
from typing import Any, List, Optional, Tuple

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.common import distribute_utils


def _data_configs(params) -> List[Tuple[str, Any]]:
  """(config key, DataConfig) of every train/validation input of `params`."""
  out = []
  routines = getattr(params.task, 'task_routines', None)
  if routines is not None:
    tasks = [(f'task.task_routines[{i}].task_config', r.task_config)
             for i, r in enumerate(routines)]
  else:
    tasks = [('task', params.task)]
  for prefix, task in tasks:
    for name in ('train_data', 'validation_data'):
      data = getattr(task, name, None)
      if data is not None:
        out.append((f'{prefix}.{name}', data))
  return out


def check_batch_sizes(params, strategy: tf.distribute.Strategy) -> None:
  """Every global batch must split evenly over the strategy's replicas.

  Model Garden divides `global_batch_size` by the number of replicas; an
  uneven split fails later with a message that names neither the key nor
  the strategy. Checks `task.train_data` and `task.validation_data`, or of
  a multitask config every `task.task_routines[i].task_config`'s.

  Raises:
    ValueError: naming the key, the strategy and the nearest valid sizes.
  """
  replicas = strategy.num_replicas_in_sync
  for key, data in _data_configs(params):
    batch = getattr(data, 'global_batch_size', None)
    if batch is None or batch % replicas == 0:
      continue
    lower = max(batch // replicas * replicas, replicas)
    raise ValueError(
        f'{key}.global_batch_size={batch} does not divide evenly over '
        f'the {replicas} replicas of runtime.distribution_strategy='
        f'{params.runtime.distribution_strategy!r}: expected a multiple of '
        f'{replicas} (e.g. {lower} or {lower + replicas}).')


def distribution_strategy(params, strategy: Optional[tf.distribute.Strategy]
                          = None) -> tf.distribute.Strategy:
  """The run's strategy, its batch sizes checked (`check_batch_sizes`).

  Args:
    params: the experiment config.
    strategy: a strategy to use instead of the one `runtime` names (tests
      use a MirroredStrategy over logical CPU devices).

  Returns:
    `strategy`, or the one `runtime.distribution_strategy` names (built with
    `runtime.all_reduce_alg`, `num_gpus`, `tpu`).
  """
  if strategy is None:
    runtime = params.runtime
    strategy = distribute_utils.get_distribution_strategy(
        distribution_strategy=runtime.distribution_strategy,
        all_reduce_alg=runtime.all_reduce_alg,
        num_gpus=runtime.num_gpus,
        tpu_address=runtime.tpu)
  check_batch_sizes(params, strategy)
  return strategy
