"""`MultitaskReadout`: one linear head per task, routed by an integer id.

Heads are the dict `projections`, so checkpoints hold
`.../projections/<task>/kernel|bias` (how a head is grafted out).
"""
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf, tf_keras

from official_ext.readout import configs

SpecsArg = Union[Mapping[str, Any], Sequence[Any]]

_NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.\-]*$')


def _as_spec(name: Optional[str], spec: Any) -> configs.ReadoutSpec:
  if isinstance(spec, configs.ReadoutSpec):
    out = spec
  elif isinstance(spec, Mapping) or hasattr(spec, 'keys'):
    out = configs.ReadoutSpec()
    out.override(dict(spec), is_strict=True)
  else:
    raise TypeError(f'Readout spec {name!r}: expected a ReadoutSpec or a '
                    f'dict, got {type(spec).__name__}.')
  if name is not None and out.name and out.name != name:
    raise ValueError(f'readout_specs key {name!r} differs from its spec name '
                     f'{out.name!r}.')
  if name is not None and not out.name:
    out = out.replace(name=name)
  return out


def normalize_specs(readout_specs: SpecsArg
                    ) -> Dict[str, configs.ReadoutSpec]:
  """{name: ReadoutSpec} from a mapping or a sequence of specs (or dicts)."""
  if isinstance(readout_specs, Mapping):
    items = [_as_spec(k, v) for k, v in readout_specs.items()]
  else:
    items = [_as_spec(None, v) for v in readout_specs]
  specs = {}
  for spec in items:
    if spec.name in specs:
      raise ValueError(f'readout_specs repeats the task {spec.name!r}.')
    specs[spec.name] = spec
  return specs


class MultitaskReadout(tf_keras.layers.Layer):
  """Linear readout with one head per task, routed by integer id."""

  def __init__(self, readout_specs: SpecsArg, task_index: Mapping[str, int],
               **kwargs):
    """Builds one head of `spec.dim` outputs per spec.

    Args:
      readout_specs: task name -> ReadoutSpec (or dict), or a sequence.
      task_index: task name -> positive routing id, distinct among heads;
        may name tasks without a head (their ids are skipped).
      **kwargs: `tf_keras.layers.Layer` arguments.
    """
    super().__init__(**kwargs)
    specs = normalize_specs(readout_specs)
    if not specs:
      raise ValueError('MultitaskReadout needs at least one readout spec.')
    missing = sorted(set(specs) - set(task_index))
    if missing:
      raise ValueError(f'No routing index for readouts: {missing} '
                       f'(task_index has {sorted(task_index)}).')
    ids = {}
    for name in specs:
      if not _NAME_RE.match(name):
        raise ValueError(f'Readout name {name!r} cannot name a variable; use '
                         "letters, digits, '_', '.' and '-'.")
      value = task_index[name]
      if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f'task_index[{name!r}] is {value!r}; expected an int '
                         f'>= 1 ({configs.PADDING_ID} is padding).')
      if int(value) in ids.values():
        other = [k for k, v in ids.items() if v == int(value)][0]
        raise ValueError(f'task_index gives {name!r} and {other!r} the same '
                         f'id {value}.')
      ids[name] = int(value)
    self._specs = specs
    self._task_index = {k: int(v) for k, v in task_index.items()}
    self._names = list(specs)
    self._ids = ids
    self._readout_id_to_name = {v: k for k, v in ids.items()}
    # id -> partition: head position, or len(heads) ("skip") for any other
    # id. Ids outside [0, max_id] are clipped onto the skip slot below.
    max_id = max(ids.values())
    table = np.full([max_id + 2], len(self._names), np.int32)
    for position, name in enumerate(self._names):
      table[ids[name]] = position
    self._partition_table = table
    self.projections = {
        name: tf_keras.layers.Dense(spec.dim, name=name)
        for name, spec in specs.items()
    }

  # -- introspection ---------------------------------------------------------
  @property
  def readout_specs(self) -> Dict[str, configs.ReadoutSpec]:
    return dict(self._specs)

  @property
  def task_names(self) -> List[str]:
    """Head names, in output order."""
    return list(self._names)

  @property
  def readout_ids(self) -> Dict[str, int]:
    """{head name: routing id}."""
    return dict(self._ids)

  # -- routing ---------------------------------------------------------------
  def _partitions(self, index: tf.Tensor) -> tf.Tensor:
    """int32 [M] partition of each id: head position, or len(heads)."""
    index = tf.cast(index, tf.int32)
    skip = len(self._names)
    table = tf.constant(self._partition_table)
    size = self._partition_table.shape[0]
    in_range = tf.logical_and(index >= 0, index < size)
    return tf.where(in_range, tf.gather(table, tf.clip_by_value(
        index, 0, size - 1)), skip)

  def route(self, values: tf.Tensor, index: tf.Tensor) -> Dict[str, tf.Tensor]:
    """{head name: the rows of `values` [M, ...] whose `index` [M] is its."""
    parts = tf.dynamic_partition(values, self._partitions(index),
                                 len(self._names) + 1)
    return dict(zip(self._names, parts[:-1]))

  def _project(self, rows: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    with tf.name_scope('projections'):
      return {name: self.projections[name](rows[name]) for name in self._names}

  def _unpack(self, outputs: Dict[str, tf.Tensor],
              batch_rows: Dict[str, tf.Tensor],
              num_samples: int) -> List[Dict[str, tf.Tensor]]:
    samples = [{} for _ in range(num_samples)]
    for name in self._names:
      pieces = tf.dynamic_partition(outputs[name], batch_rows[name],
                                    num_samples)
      for i, piece in enumerate(pieces):
        samples[i][name] = piece
    return samples

  def call(self, output_embs: tf.Tensor, output_readout_index: tf.Tensor,
           unpack_output: bool = False
           ) -> Union[Dict[str, tf.Tensor], List[Dict[str, tf.Tensor]]]:
    """Padded output embeddings [B, n_out, dim] through their tasks' heads.

    Returns:
      {task: [queries_of_task, task_dim]}, every head (maybe 0 rows), rows
      in row-major (sample, query) order; with `unpack_output` a list of B
      per-sample dicts.
    """
    dim = output_embs.shape[-1]
    flat = tf.reshape(output_embs, [-1, dim])
    index = tf.reshape(output_readout_index, [-1])
    outputs = self._project(self.route(flat, index))
    if not unpack_output:
      return outputs
    num_samples = output_embs.shape[0]
    if num_samples is None:
      raise ValueError('unpack_output=True needs a static batch size; got '
                       f'output_embs of shape {output_embs.shape}.')
    n_out = tf.shape(output_readout_index)[1]
    sample = tf.range(tf.size(index)) // n_out
    return self._unpack(outputs, self.route(sample, index), int(num_samples))

  def call_varlen(self, output_embs: tf.Tensor,
                  output_readout_index: tf.Tensor,
                  output_batch_index: tf.Tensor,
                  unpack_output: bool = False,
                  num_samples: Optional[int] = None
                  ) -> Union[Dict[str, tf.Tensor], List[Dict[str, tf.Tensor]]]:
    """As `call`, for chained output embeddings [N, dim] with the sample of
    each query, `output_batch_index` [N] (`num_samples` for `unpack_output`
    in a tf.function)."""
    outputs = self._project(self.route(output_embs, output_readout_index))
    if not unpack_output:
      return outputs
    if num_samples is None:
      if not tf.executing_eagerly():
        raise ValueError('call_varlen(unpack_output=True) under tf.function '
                         'needs num_samples.')
      num_samples = int(tf.reduce_max(output_batch_index)) + 1
    batch_index = tf.cast(output_batch_index, tf.int32)
    return self._unpack(outputs, self.route(batch_index, output_readout_index),
                        int(num_samples))

  def call_static(self, output_embs: tf.Tensor,
                  output_readout_index: tf.Tensor) -> Dict[str, Any]:
    """Every head on every query, with masks: static shapes (XLA, TPU).

    Returns:
      {task: (outputs [..., task_dim], mask bool [...])}; the masked rows
      are `call`'s rows for the task, in its order.
    """
    index = tf.cast(output_readout_index, tf.int32)
    with tf.name_scope('projections'):
      return {
          name: (self.projections[name](output_embs),
                 tf.equal(index, self._ids[name])) for name in self._names
      }

  def get_config(self) -> Dict[str, Any]:
    config = super().get_config()
    config.update(
        readout_specs={k: v.as_dict() for k, v in self._specs.items()},
        task_index=dict(self._task_index))
    return config
