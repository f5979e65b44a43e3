"""YT8MTask.train_step: the L2 regularization computed outside XLA is exact."""
import numpy as np
import tensorflow as tf, tf_keras

from official.core import task_factory
from official_ext.core import gradients
from official_ext.benchmarks import yt8m as benchmark


def _tiny_task():
  # A large decay, so that a missing or doubled L2 term changes the update
  # well beyond the tolerances below.
  config = benchmark.build_task(benchmark.TINY).task_config
  return task_factory.get_task(config.replace(losses={'l2_weight_decay': 0.1}))


def _step(task, analytic_l2_gradient):
  # False: the generic `model.losses` path.
  task.analytic_l2_gradient = analytic_l2_gradient
  tf_keras.utils.set_random_seed(4)
  model = task.build_model()
  optimizer = tf_keras.optimizers.legacy.SGD(1.0)
  batch = benchmark.make_batch(benchmark.TINY, seed=3)
  metrics = task.build_metrics(training=True)
  logs = tf.function(
      lambda: task.train_step(batch, model, optimizer, metrics))()
  return float(logs['loss']), [v.numpy() for v in model.trainable_variables]


def test_analytic_l2_gradient_gives_the_same_loss_and_update():
  task = _tiny_task()
  model = task.build_model()
  pairs = gradients.l2_regularized_kernels(model)
  # Every regularization loss is a plain L2 on a kernel, so the fast path is
  # taken (otherwise this test would compare the generic path with itself).
  assert pairs is not None and len(pairs) == len(model.losses) > 0
  np.testing.assert_allclose(gradients.l2_loss(pairs),
                             tf.add_n(model.losses), rtol=1e-6)
  loss_fast, weights_fast = _step(_tiny_task(), True)
  loss_ref, weights_ref = _step(_tiny_task(), False)
  np.testing.assert_allclose(loss_fast, loss_ref, rtol=1e-6)
  for a, b in zip(weights_fast, weights_ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_other_regularizers_keep_the_generic_path():
  model = tf_keras.Sequential([
      tf_keras.layers.Dense(3, kernel_regularizer=tf_keras.regularizers.L1(
          0.1))])
  model.build([None, 2])
  assert gradients.l2_regularized_kernels(model) is None


def _segment_task():
  """Segment mode, with num_sample_frames set (as the yt8m configs have it)."""
  config = benchmark.build_task(benchmark.TINY).task_config
  return task_factory.get_task(config.replace(train_data={
      'segment_labels': True, 'segment_size': benchmark.TINY.frames,
      'num_sample_frames': 4}))


def _segment_step(padding_value):
  """One segment-mode train step on a batch whose segments end in padding
  (frames past num_frames hold `padding_value`); returns the loss and the
  moving statistics of every batch norm."""
  task = _segment_task()
  tf_keras.utils.set_random_seed(4)
  model = task.build_model()
  batch = dict(benchmark.make_batch(benchmark.TINY, seed=3))
  frames = benchmark.TINY.frames
  num_frames = np.array([frames, 3, 1, 5, frames, 2, 4, 6], np.int32)
  valid = np.arange(frames)[None, :] < num_frames[:, None]
  batch['video_matrix'] = tf.where(valid[:, :, None], batch['video_matrix'],
                                   padding_value)
  batch['num_frames'] = tf.constant(num_frames)
  batch['label_weights'] = tf.ones_like(batch['labels'])
  optimizer = tf_keras.optimizers.legacy.SGD(0.0)
  metrics = task.build_metrics(training=True)
  logs = tf.function(
      lambda: task.train_step(batch, model, optimizer, metrics))()
  moving = [v.numpy() for v in model.non_trainable_variables
            if 'moving' in v.name]
  assert moving
  return float(logs['loss']), moving


def test_segment_mode_training_masks_padded_frames():
  """Segment mode never samples frames, so the frames past a segment's
  video end are padding: they must not be pooled or enter the batch-norm
  statistics, whatever they hold, even with num_sample_frames set."""
  loss_zeros, moving_zeros = _segment_step(0.0)
  loss_other, moving_other = _segment_step(3.0)
  np.testing.assert_allclose(loss_zeros, loss_other, rtol=1e-6)
  for a, b in zip(moving_zeros, moving_other):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
