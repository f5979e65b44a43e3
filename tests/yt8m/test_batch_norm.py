"""The YT8M layers with written-out gradients against tf_keras' own."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official_ext.core.kernels import kernel_policy
from official_ext.yt8m.modeling import batch_norm

CPU = kernel_policy.resolve('auto', 'CPU')


def _run(layer, x, **kwargs):
  """(output, gradients w.r.t. x and the trainable variables, moving
  averages) of one call of `layer` on `x`."""
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x, **kwargs)
    loss = tf.reduce_sum(y * tf.sin(tf.range(y.shape[-1], dtype=tf.float32)))
  grads = tape.gradient(loss, [x] + layer.trainable_variables)
  return y, grads, [tf.identity(v) for v in layer.non_trainable_variables]


@pytest.mark.parametrize('shape,masked,affine,jit', [
    ([3, 5, 6], False, True, False), ([3, 5, 6], True, True, False),
    ([3, 5, 6], True, False, False), ([7, 6], True, True, False),
    ([3, 5, 6], True, True, True)])
def test_batch_norm_training_matches_tf_keras(shape, masked, affine, jit):
  rng = np.random.default_rng(0)
  x = tf.constant(3 * rng.normal(size=shape).astype(np.float32) + 1)
  mask = (tf.constant(rng.random(shape[:-1]) > 0.3) if masked else None)
  ours = batch_norm.BatchNormalization(center=affine, scale=affine)
  theirs = tf_keras.layers.BatchNormalization(center=affine, scale=affine)
  ours(x)
  theirs(x)
  weights = [rng.normal(size=v.shape).astype(np.float32) ** 2
             for v in theirs.get_weights()]
  ours.set_weights(weights)
  theirs.set_weights(weights)
  results = []
  with kernel_policy.use(CPU):
    assert ours._written_out(x, True)
    for layer in (ours, theirs):
      call = lambda layer=layer: _run(layer, x, training=True, mask=mask)
      results.append(tf.function(call, jit_compile=True)() if jit else call())
  (y_a, g_a, m_a), (y_b, g_b, m_b) = tf.nest.map_structure(np.asarray,
                                                           results)
  np.testing.assert_allclose(y_a, y_b, rtol=1e-5, atol=1e-5)
  for a, b in zip(g_a, g_b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  for a, b in zip(m_a, m_b):  # The moving averages were updated alike.
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  assert not np.allclose(m_a[0], weights[-2])


@pytest.mark.parametrize('policy', [
    kernel_policy.resolve('auto', 'GPU'), kernel_policy.resolve('auto', 'TPU'),
    kernel_policy.resolve('stock', 'CPU')], ids=['gpu', 'tpu', 'stock'])
def test_accelerator_and_stock_policies_run_tf_keras_layers(policy):
  """Where the kernel policy takes no CPU fast path, the YT8M batch norm and
  dense layers trace to the very ops of tf_keras' own; on a CPU they do not
  (the column sums of the written-out gradients are matmuls)."""
  x = tf.constant(np.random.default_rng(2).normal(size=[2, 5, 3]),
                  tf.float32)

  def op_types(layer, policy):
    layer(x)
    def step():
      return _run(layer, x, training=True)[:2]
    with kernel_policy.use(policy):
      graph = tf.function(step).get_concrete_function().graph
    return sorted(op.type for op in graph.get_operations())

  for ours, theirs in (
      (batch_norm.BatchNormalization, tf_keras.layers.BatchNormalization),
      (lambda: batch_norm.Dense(4), lambda: tf_keras.layers.Dense(4))):
    assert op_types(ours(), policy) == op_types(theirs(), policy)
    assert op_types(ours(), CPU) != op_types(theirs(), CPU)


def test_batch_norm_written_out_only_where_it_is_the_same():
  x = tf.zeros([2, 3, 4])
  layer = batch_norm.BatchNormalization()
  layer(x)
  with kernel_policy.use(kernel_policy.resolve('auto', 'GPU')):
    assert not layer._written_out(x, True)
  assert layer._written_out(x, True)
  assert not layer._written_out(x, False)
  assert not layer._written_out(x, None)  # Keras' learning phase decides.
  assert not layer._written_out(tf.zeros([2, 3, 4], tf.float16), True)
  assert not batch_norm.BatchNormalization(axis=1)._written_out(x, True)
  assert not batch_norm.BatchNormalization(
      synchronized=True)._written_out(x, True)
  layer.trainable = False  # A frozen layer normalizes with its averages.
  assert not layer._written_out(x, True)


def test_dense_bias_gradient_matches_tf_keras():
  rng = np.random.default_rng(1)
  x = tf.constant(rng.normal(size=[2, 5, 3]).astype(np.float32))
  ours = batch_norm.Dense(4, activation='sigmoid')
  theirs = tf_keras.layers.Dense(4, activation='sigmoid')
  ours(x)
  theirs(x)
  theirs.set_weights([w + 0.5 for w in ours.get_weights()])
  ours.set_weights(theirs.get_weights())
  with kernel_policy.use(CPU):
    (y_a, g_a, _), (y_b, g_b, _) = tf.nest.map_structure(
        np.asarray, [_run(ours, x), _run(theirs, x)])
  assert y_a.shape == (2, 5, 4)
  np.testing.assert_allclose(y_a, y_b, rtol=1e-6, atol=1e-6)
  for a, b in zip(g_a, g_b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
