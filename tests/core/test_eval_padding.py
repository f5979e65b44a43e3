"""core.input.eval_padding: padded evaluation batches and the empty-evaluation
check."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official_ext.core.input import eval_padding


def _examples(n):
  # Variable-length examples: padded_batch pads them; ids 1..n.
  return tf.data.Dataset.range(1, n + 1).map(lambda i: {
      'id': i, 'values': tf.fill([tf.cast(i % 3 + 1, tf.int32)], i)})


def _padded(n, batch_size, input_context=None):
  ds = eval_padding.pad_final_batches(
      _examples(n), lambda d: d.padded_batch(batch_size, drop_remainder=True),
      batch_size, input_context)
  return list(ds.as_numpy_iterator())


@pytest.mark.parametrize('n, batch_size, replicas, batches', [
    (5, 4, 1, 2), (8, 4, 1, 2), (1, 4, 1, 1), (5, 2, 2, 4), (9, 2, 2, 6),
    (3, 8, 1, 1)])
def test_every_example_once_then_masked_copies(n, batch_size, replicas,
                                               batches):
  context = tf.distribute.InputContext(
      num_input_pipelines=1, input_pipeline_id=0,
      num_replicas_in_sync=replicas)
  out = _padded(n, batch_size, context if replicas > 1 else None)
  assert len(out) == batches
  ids = np.concatenate([b['id'] for b in out])
  mask = np.concatenate([b[eval_padding.MASK_KEY] for b in out])
  assert all(b['id'].shape == (batch_size,) for b in out)  # Static size.
  np.testing.assert_array_equal(ids[mask], np.arange(1, n + 1))
  assert mask[:n].all() and not mask[n:].any()
  assert (ids[~mask] == 1).all()  # Copies of the first example.
  values = np.concatenate([b['values'][:, 0] for b in out])
  np.testing.assert_array_equal(values, ids)


def test_empty_dataset_gives_no_batch():
  assert _padded(0, 4) == []


def test_tuple_examples_with_attach_mask():
  ds = tf.data.Dataset.range(3).map(lambda i: ({'x': i}, i * 10))
  out = list(eval_padding.pad_final_batches(
      ds, lambda d: d.batch(2, drop_remainder=True), 2,
      attach_mask=lambda e, valid: (dict(e[0], m=valid), e[1])
  ).as_numpy_iterator())
  assert [list(f['m']) for f, _ in out] == [[True, True], [True, False]]
  assert [list(l) for _, l in out] == [[0, 10], [20, 0]]


def test_evaluated_examples_counts_and_raises_on_zero():
  metric = eval_padding.EvaluatedExamples(lambda: (
      "task.validation_data.input_path='/data/empty.tfrecord'",
      {'task.validation_data.global_batch_size': 64,
       'task.validation_data.drop_remainder': True}))
  metric.update_state(tf.constant([True, False, True]))
  assert int(metric.result()) == 2
  metric.reset_state()
  with pytest.raises(eval_padding.EmptyEvaluationError,
                     match=r"(?s)/data/empty\.tfrecord.*global_batch_size=64"
                     r".*drop_remainder=True"):
    metric.result()
  with pytest.raises(eval_padding.EmptyEvaluationError, match='d1'):
    eval_padding.check_examples_seen(0, 'd1', {})
  eval_padding.check_examples_seen(1, 'd1', {})
  mask = eval_padding.example_mask({'x': 1}, tf.constant(3))
  np.testing.assert_array_equal(mask, [True, True, True])
