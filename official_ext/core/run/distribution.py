"""The run's distribution strategy: its devices present, its batches split."""
import os
from typing import Any, List, Optional, Tuple

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.common import distribute_utils
from official_ext.core.kernels import kernel_policy


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
  """ValueError naming a global batch that does not split over the replicas."""
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


class DevicesUnavailableError(ValueError):
  """The runtime config names devices this machine does not have."""


def _seen() -> str:
  """What TensorFlow sees: its physical devices, and CUDA_VISIBLE_DEVICES."""
  devices = [d.name.replace('/physical_device:', '')
             for d in tf.config.list_physical_devices()]
  visible = os.environ.get('CUDA_VISIBLE_DEVICES')
  return (f'physical devices: {", ".join(devices) or "none"}'
          + (f'; CUDA_VISIBLE_DEVICES={visible!r}' if visible is not None
             else ''))


def check_devices(runtime) -> None:
  """`DevicesUnavailableError` when `runtime` names GPUs not visible here."""
  name = str(runtime.distribution_strategy).lower()
  num_gpus = runtime.num_gpus or 0
  if name == 'tpu' or num_gpus <= 0:
    return
  gpus = kernel_policy.physical_gpus()
  if num_gpus <= gpus:
    return
  fix = (f'--params_override=runtime.num_gpus={gpus}' if gpus else
         '--params_override=runtime.num_gpus=0 to train on the CPU')
  raise DevicesUnavailableError(
      f'runtime.distribution_strategy={runtime.distribution_strategy!r} with '
      f'runtime.num_gpus={num_gpus} asks for {num_gpus} GPUs; TensorFlow '
      f'sees {gpus} ({_seen()}). Make the GPUs visible (driver, '
      f'CUDA_VISIBLE_DEVICES), or run on what is here: {fix}. Nothing was '
      'written.')


def _build(runtime) -> tf.distribute.Strategy:
  """Model Garden's strategy; an unreachable TPU: `DevicesUnavailableError`."""
  try:
    return distribute_utils.get_distribution_strategy(
        distribution_strategy=runtime.distribution_strategy,
        all_reduce_alg=runtime.all_reduce_alg,
        num_gpus=runtime.num_gpus,
        tpu_address=runtime.tpu)
  except (ValueError, RuntimeError, tf.errors.OpError) as e:
    if str(runtime.distribution_strategy).lower() != 'tpu':
      raise
    raise DevicesUnavailableError(
        f"runtime.distribution_strategy='tpu' with runtime.tpu="
        f'{runtime.tpu!r} asks for a TPU; TensorFlow sees none it can reach '
        f'({_seen()}; {type(e).__name__}: {e}). Pass --tpu=NAME (or '
        'runtime.tpu) of a Cloud TPU, run on a TPU VM, or use another '
        'strategy: --params_override=runtime.distribution_strategy='
        'one_device. Nothing was written.') from e


def distribution_strategy(params, strategy: Optional[tf.distribute.Strategy]
                          = None) -> tf.distribute.Strategy:
  """The run's strategy (or `strategy`), its devices and batches checked."""
  if strategy is None:
    check_devices(params.runtime)
    strategy = _build(params.runtime)
  check_batch_sizes(params, strategy)
  return strategy
