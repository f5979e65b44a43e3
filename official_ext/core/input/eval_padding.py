"""Evaluation over every record: a padded final batch, and no empty evaluation.
"""
from typing import Any, Callable, Mapping, Optional, Tuple

import tensorflow as tf, tf_keras

# Key of the boolean [batch] mask in padded evaluation batches: True for a
# real example, False for padding.
MASK_KEY = 'eval_mask'


class EmptyEvaluationError(ValueError):
  """An evaluation saw zero examples, so no metric has a value."""


# ---------------------------------------------------------------------------
# Padding.
# ---------------------------------------------------------------------------


def add_mask_to_dict(element: Mapping[str, Any], valid: tf.Tensor
                     ) -> Mapping[str, Any]:
  """The default `attach_mask`: `element` (a dict) plus `MASK_KEY: valid`."""
  if not isinstance(element, Mapping):
    raise TypeError('pad_final_batches: examples are not dicts (got '
                    f'{type(element).__name__}); pass `attach_mask`.')
  out = dict(element)
  out[MASK_KEY] = valid
  return out


def replicas_per_pipeline(
    input_context: Optional[tf.distribute.InputContext]) -> int:
  """Replicas fed by one input pipeline (1 without an input context)."""
  if input_context is None:
    return 1
  return max(1, input_context.num_replicas_in_sync //
             max(1, input_context.num_input_pipelines))


def empty_like(spec: tf.TensorSpec, user: str) -> tf.Tensor:
  """Zeros of a dense `spec` (unknown dims 0); TypeError naming `user`."""
  if not isinstance(spec, tf.TensorSpec):
    raise TypeError(f'{user} needs (nests of) dense tensors; got '
                    f'{type(spec).__name__} {spec}.')
  shape = [0 if d is None else d for d in spec.shape.as_list()]
  return tf.zeros(shape, spec.dtype)


def pad_final_batches(
    ds: tf.data.Dataset,
    batch_fn: Callable[[tf.data.Dataset], tf.data.Dataset],
    batch_size: int,
    input_context: Optional[tf.distribute.InputContext] = None,
    attach_mask: Callable[[Any, tf.Tensor], Any] = add_mask_to_dict,
) -> tf.data.Dataset:
  """`batch_fn` of every example of `ds`, the end padded to whole batches.

  N examples give ceil(N / (R * batch_size)) * R batches (R:
  `replicas_per_pipeline`), padded with copies of the first example whose mask
  (`MASK_KEY`, added by `attach_mask`) is False. `batch_fn` batches with
  `drop_remainder=True`.
  """
  batch_size = int(batch_size)
  if batch_size < 1:
    raise ValueError(f'pad_final_batches: batch_size is {batch_size}; '
                     'expected a positive int.')
  group = batch_size * replicas_per_pipeline(input_context)
  marker = tf.nest.map_structure(
      lambda spec: empty_like(spec, 'pad_final_batches'), ds.element_spec)

  def mark(*example):
    example = example[0] if len(example) == 1 else example
    return False, example

  marked = ds.map(mark).concatenate(
      tf.data.Dataset.from_tensors((True, marker)))

  def step(state, item):
    # state: (real examples so far, the first real example, or the marker).
    count, first = state
    is_end, example = item
    have_first = count > 0
    first = tf.nest.map_structure(
        lambda f, e: tf.cond(have_first, lambda: f, lambda: e), first,
        example)
    count = count + tf.where(is_end, tf.constant(0, tf.int64), 1)
    pad = tf.math.floormod(-count, group)  # 0 when count == 0.
    out = tf.nest.map_structure(
        lambda f, e: tf.cond(is_end, lambda: f, lambda: e), first, example)
    repeats = tf.where(is_end, pad, tf.constant(1, tf.int64))
    return (count, first), (tf.logical_not(is_end), repeats, out)

  scanned = marked.scan((tf.constant(0, tf.int64), marker), step)

  def expand(valid, repeats, example):
    return tf.data.Dataset.from_tensors(
        attach_mask(example, valid)).repeat(repeats)

  return batch_fn(scanned.flat_map(expand))


def example_mask(inputs: Any, batch_size: tf.Tensor) -> tf.Tensor:
  """The batch's bool [batch] mask: `inputs[MASK_KEY]`, else all True."""
  if isinstance(inputs, Mapping) and MASK_KEY in inputs:
    return tf.reshape(tf.cast(inputs[MASK_KEY], tf.bool), [-1])
  return tf.ones(tf.reshape(batch_size, [1]), tf.bool)


# ---------------------------------------------------------------------------
# No empty evaluation.
# ---------------------------------------------------------------------------


def empty_evaluation_message(dataset: str,
                             settings: Mapping[str, Any]) -> str:
  keys = ', '.join(f'{k}={v!r}' for k, v in settings.items())
  return (f'Evaluation saw no example: {dataset} gave 0 records to evaluate '
          f'({keys}), so no metric has a value. Point the validation input '
          'at non-empty data (or set trainer.validation_steps != 0); with '
          'skip_bad_records every record may have been skipped.')


def describe_split(data: Any, key: str = 'task.validation_data',
                   resolved_input_path: Optional[str] = None
                   ) -> Tuple[str, Mapping[str, Any]]:
  """(dataset, {key: value}) naming a split's data and batching keys."""
  input_path = getattr(data, 'input_path', '')
  tfds_name = getattr(data, 'tfds_name', '')
  if input_path:
    dataset = f'{key}.input_path={input_path!r}'
  elif resolved_input_path:
    dataset = (f'the generated demo data {resolved_input_path!r} ({key}.'
               'input_path is empty, task.demo_data.enabled)')
  elif tfds_name:
    dataset = (f'{key}.tfds_name={tfds_name!r} (tfds_split='
               f'{getattr(data, "tfds_split", "")!r}, tfds_data_dir='
               f'{getattr(data, "tfds_data_dir", "")!r})')
  else:
    dataset = f'{key} (input_path is empty)'
  settings = {
      f'{key}.global_batch_size': getattr(data, 'global_batch_size', None),
      f'{key}.drop_remainder': getattr(data, 'drop_remainder', None),
  }
  if getattr(data, 'skip_bad_records', False):
    settings[f'{key}.skip_bad_records'] = True
  return dataset, settings


def check_examples_seen(num_examples: int, dataset: str,
                        settings: Mapping[str, Any]) -> None:
  """`EmptyEvaluationError` naming `dataset` when `num_examples` is 0."""
  if int(num_examples) > 0:
    return
  raise EmptyEvaluationError(empty_evaluation_message(dataset, settings))


class EvaluatedExamples(tf_keras.metrics.Metric):
  """Validation metric `num_examples`: real examples evaluated.

  Read eagerly at 0, `result()` raises `EmptyEvaluationError` (`describe()`).
  """

  def __init__(self,
               describe: Callable[[], Tuple[str, Mapping[str, Any]]],
               name: str = 'num_examples'):
    super().__init__(name=name, dtype=tf.int64)
    self._describe = describe
    self.count = self.add_weight('count', shape=(), dtype=tf.int64,
                                 initializer='zeros')

  def update_state(self, mask, sample_weight=None):
    del sample_weight
    n = tf.reduce_sum(tf.cast(tf.reshape(mask, [-1]), tf.int64))
    return self.count.assign_add(n)

  @tf.autograph.experimental.do_not_convert  # Keras would wrap the error.
  def result(self):
    value = tf.identity(self.count)
    if tf.executing_eagerly() and int(value.numpy()) == 0:
      dataset, settings = self._describe()
      check_examples_seen(0, dataset, settings)
    return value

  def reset_state(self):
    self.count.assign(0)
