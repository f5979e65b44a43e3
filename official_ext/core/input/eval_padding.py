"""Evaluation over every record: a padded final batch, and no empty evaluation.

Two pieces used by the evaluators of every family (readout, yt8m,
assemblenet):

* `pad_final_batches`: evaluation batches of a static size (TPUs, or any
  `drop_remainder: true` validation split) without losing records. The last
  partial batch is filled with copies of a real example of the same input
  pipeline, marked `False` in a boolean mask (`MASK_KEY`, [batch]); real
  examples are marked `True`. The number of batches of a pipeline is rounded
  up to a multiple of its replicas (`replicas_per_pipeline`), so that under a
  strategy every replica gets a batch at every step and the last global step
  is never dropped. Evaluators drop the masked rows from their losses and
  metrics (`example_mask`). Every record is read once: the filler is the
  pipeline's first example, remembered on the way (no second read, so skip
  mode counts a skipped record once).
* `EvaluatedExamples` and `check_examples_seen`: an evaluation that saw no
  example is an `EmptyEvaluationError` naming the dataset and the config keys
  involved, never metrics of NaN or 0. `EvaluatedExamples` is a validation
  metric (`num_examples`, the real examples evaluated, summed over replicas);
  Model Garden's trainers read every validation metric at the end of an
  evaluation even when no step ran (`aggregate_logs` / `reduce_aggregated_logs`
  are then never called), so its `result()` is where a zero count raises.
  `check_examples_seen` is the same check for the tasks' reduce paths.

Not covered: with several input pipelines (multi-worker, TPU pods) each
pipeline is padded on its own; pipelines whose shards hold different numbers
of records still end at different steps, as without padding.
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
  """Zeros of `spec`'s dtype and shape, 0 where a dimension is unknown.

  Args:
    spec: a dataset element's `tf.TensorSpec`.
    user: who needs it, for the error (e.g. 'skip_bad_records').

  Raises:
    TypeError: `spec` is not a dense tensor's (a ragged or sparse one).
  """
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
  """Batches every example of `ds`, padding the end to whole batches.

  With N examples and R = `replicas_per_pipeline(input_context)` the result
  has ceil(N / (R * batch_size)) * R batches of exactly `batch_size`
  examples: the N examples in order, then copies of the first example with
  the mask False. N = 0 gives no batch (and no error here: the evaluation's
  `EvaluatedExamples` reports it).

  Args:
    ds: unbatched examples (dense tensors; dicts unless `attach_mask` says
      how to add the mask).
    batch_fn: Dataset -> Dataset that groups consecutive examples into
      batches of `batch_size` with `drop_remainder=True` (e.g. `batch`,
      `padded_batch`, plus any per-batch map). It sees the examples with the
      mask attached: bool scalar per example, [batch] per batch.
    batch_size: examples per batch (per replica).
    input_context: the pipeline's `tf.distribute.InputContext`, if any.
    attach_mask: (example, bool scalar) -> example with the mask added.

  Returns:
    `batch_fn` applied to the padded examples.
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
  """The batch's bool [batch] mask: `inputs[MASK_KEY]`, else all True.

  Args:
    inputs: a batch dict (or any object; only a dict can hold the mask).
    batch_size: int scalar, the batch's number of rows.
  """
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
  """(dataset, settings) naming a split's data and its batching keys.

  Args:
    data: the split's DataConfig (`input_path`, `global_batch_size`,
      `drop_remainder`; optionally `tfds_name`, `tfds_split`,
      `tfds_data_dir`, `skip_bad_records`).
    key: the config path of `data`.
    resolved_input_path: the files actually read when `input_path` is empty
      (generated demo data).

  Returns:
    For `check_examples_seen`: e.g. ("task.validation_data.input_path=
    '/data/valid*.tfrecord'", {'task.validation_data.global_batch_size': 1024,
    'task.validation_data.drop_remainder': True}).
  """
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
  """Raises `EmptyEvaluationError` when `num_examples` is 0.

  Args:
    num_examples: examples (videos, trials, ...) the evaluation aggregated.
    dataset: names the dataset, e.g. "task.validation_data.input_path=
      '/data/valid*.tfrecord'".
    settings: the config keys involved and their values, e.g.
      {'task.validation_data.global_batch_size': 1024,
       'task.validation_data.drop_remainder': True}.
  """
  if int(num_examples) > 0:
    return
  raise EmptyEvaluationError(empty_evaluation_message(dataset, settings))


class EvaluatedExamples(tf_keras.metrics.Metric):
  """Validation metric `num_examples`: real examples evaluated (int64).

  `update_state(mask)` adds the True entries of a bool [batch] mask
  (`example_mask`). Read eagerly (as Model Garden's trainers do at the end of
  every evaluation) with a count of 0, `result()` raises
  `EmptyEvaluationError` naming what `describe()` returns; inside a traced
  step it only returns the count.
  """

  def __init__(self,
               describe: Callable[[], Tuple[str, Mapping[str, Any]]],
               name: str = 'num_examples'):
    """Args:
      describe: () -> (dataset, settings) for `check_examples_seen`; called
        only when the count is 0 (the dataset path may be resolved late).
      name: the metric's name.
    """
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
