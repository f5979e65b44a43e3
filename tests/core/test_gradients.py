"""official_ext.core.gradients: clipping equals TF's, global over replicas."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official_ext.core import gradients


@pytest.mark.parametrize('clip_norm', [0.5, 100.0])
def test_clip_by_global_norm_matches_tensorflow(clip_norm):
  grads = [tf.constant([3.0, 4.0]), None, tf.constant([[1.0, 2.0]])]
  ours = gradients.clip_by_global_norm(grads, clip_norm)
  present = [grads[0], grads[2]]
  expected = tf.clip_by_global_norm(present, clip_norm)[0]
  assert ours[1] is None
  np.testing.assert_allclose(ours[0], expected[0], rtol=1e-6)
  np.testing.assert_allclose(ours[2], expected[1], rtol=1e-6)


def test_clip_by_global_norm_non_finite_is_nan():
  out = gradients.clip_by_global_norm([tf.constant([np.inf, 1.0])], 1.0)
  assert np.all(np.isnan(out[0].numpy()))


def _step(strategy, clip_norm):
  """One SGD step of a linear model on a fixed global batch of 8."""
  x = np.arange(32, dtype=np.float32).reshape(8, 4) / 10.0
  y = np.linspace(-1.0, 1.0, 8, dtype=np.float32)[:, None]
  with strategy.scope():
    kernel = tf.Variable(np.full([4, 1], 0.5, np.float32))
    optimizer = tf_keras.optimizers.legacy.SGD(0.1)
  dataset = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensor_slices((x, y)).batch(8))

  @tf.function
  def step(batch):
    def replica_fn(bx, by):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean((bx @ kernel - by) ** 2)
        loss /= strategy.num_replicas_in_sync
      grads = tape.gradient(loss, [kernel])
      gradients.clip_and_apply_gradients(optimizer, grads, [kernel],
                                         clip_norm)
    strategy.run(replica_fn, args=batch)

  step(next(iter(dataset)))
  return kernel.numpy()


@pytest.mark.parametrize('clip_norm', [0.05, 100.0])
def test_two_replica_update_equals_one_replica(clip_norm, mirrored):
  one = _step(tf.distribute.OneDeviceStrategy('/cpu:0'), clip_norm)
  two = _step(mirrored, clip_norm)
  np.testing.assert_allclose(two, one, rtol=1e-5)
  assert not np.allclose(one, 0.5)  # The step did update the weights.
