"""The training-recipe knobs of the yt8m family, each against the behaviour
without it, and `yt8m_nextvlad` set to its authors' recipe: the loss summed
over the classes, per-variable gradient clipping, batch-norm momentum, Adam
epsilon, the classifier's initializer and the rgb input's reverse PCA
whitening."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.core import gradients
from official_ext.yt8m import configs
from official_ext.yt8m import dataloader
from official_ext.yt8m import demo_data
from official_ext.yt8m.modeling import heads

RGB, AUDIO = 8, 4
NUM_CLASSES = 5


def _tiny_nextvlad(experiment='yt8m_nextvlad'):
  params = exp_factory.get_exp_config(experiment)
  params.override({'task': {
      'model': {'backbone': {'nextvlad': {
          'feature_sizes': [RGB, AUDIO], 'cluster_sizes': [4, 2],
          'groups': [2, 1], 'hidden_size': 8}}},
      'train_data': {'feature_sizes': [RGB, AUDIO],
                     'num_classes': NUM_CLASSES,
                     'reverse_whitening_feature': ''},
      'validation_data': {'feature_sizes': [RGB, AUDIO],
                          'num_classes': NUM_CLASSES,
                          'reverse_whitening_feature': ''},
      'jit_compile': False}}, is_strict=True)
  return params


# -- loss reduction over the classes -----------------------------------------
def test_class_reduction_sum_is_the_starters_cross_entropy():
  params = _tiny_nextvlad()
  labels = tf.constant([[1., 0., 0., 1., 0.], [0., 1., 0., 0., 0.]])
  probs = tf.constant([[.9, .2, .1, .6, .3], [.5, .7, .2, .1, .4]])
  # The starter's CrossEntropyLoss: sum over classes, mean over examples.
  p, y = probs.numpy(), labels.numpy()
  hand = -np.mean(np.sum(y * np.log(p) + (1 - y) * np.log(1 - p), axis=1))
  losses = {}
  for reduction in ('mean', 'sum'):
    params.task.losses.class_reduction = reduction
    task = task_factory.get_task(params.task)
    losses[reduction] = float(task.build_losses(labels, probs)['model_loss'])
  assert losses['sum'] == pytest.approx(hand, rel=1e-5)
  assert losses['mean'] == pytest.approx(hand / NUM_CLASSES, rel=1e-5)
  # Weighted (segment ratings, padding rows): the weighted entries' sum over
  # the rows with a rated class.
  weights = tf.constant([[1., 0., 0., 1., 0.], [0., 0., 0., 0., 0.]])
  entries = -(y * np.log(p) + (1 - y) * np.log(1 - p))
  weighted = float(task.build_losses(labels, probs, label_weights=weights)[
      'model_loss'])
  assert weighted == pytest.approx(entries[0, 0] + entries[0, 3], rel=1e-5)
  params.task.losses.class_reduction = 'max'
  with pytest.raises(ValueError, match=r'task.losses.class_reduction=.max'):
    task_factory.get_task(params.task)


# -- per-variable gradient clipping ------------------------------------------
def test_clip_by_norm_per_variable_against_global():
  grads = [tf.constant([3.0, 0.0]), None, tf.constant([[0.0, 4.0]])]
  per_variable = gradients.clip_by_norm_per_variable(grads, 1.0)
  np.testing.assert_allclose(per_variable[0].numpy(), [1.0, 0.0])
  assert per_variable[1] is None
  np.testing.assert_allclose(per_variable[2].numpy(), [[0.0, 1.0]])
  global_ = gradients.clip_by_global_norm(grads, 1.0)  # norm 5
  np.testing.assert_allclose(global_[0].numpy(), [0.6, 0.0], rtol=1e-6)


@pytest.mark.parametrize('per_variable', [False, True])
def test_task_clips_each_variable_or_the_global_norm(per_variable):
  params = _tiny_nextvlad()
  params.task.gradient_clip_norm = 1e-3
  params.task.gradient_clip_per_variable = per_variable
  params.task.losses.l2_weight_decay = 0.0
  task = task_factory.get_task(params.task)
  model = task.build_model()
  rng = np.random.default_rng(0)
  batch = {'video_matrix': tf.constant(rng.normal(size=[4, 3, RGB + AUDIO]),
                                       tf.float32),
           'num_frames': tf.constant([3, 2, 3, 1]),
           'labels': tf.one_hot([0, 1, 2, 3], NUM_CLASSES)}
  optimizer = tf_keras.optimizers.legacy.SGD(1.0)
  before = [v.numpy() for v in model.trainable_variables]
  task.train_step(batch, model, optimizer, task.build_metrics())
  steps = [np.linalg.norm(b - v.numpy())
           for b, v in zip(before, model.trainable_variables)]
  moved = [s for s in steps if s > 0]
  assert len(moved) > 3
  if per_variable:
    # No variable's step is above the clip norm; those whose gradient was
    # larger (most, at this tiny norm) have it exactly, so the whole step
    # is longer than a global clip would allow.
    assert max(moved) <= 1e-3 * (1 + 1e-3), moved
    assert sum(s == pytest.approx(1e-3, rel=1e-3) for s in moved) > 3, moved
    assert np.sqrt(np.sum(np.square(steps))) > 2e-3
  else:  # The whole step has it.
    assert np.sqrt(np.sum(np.square(steps))) == pytest.approx(1e-3, rel=1e-3)
    assert max(moved) < 0.9e-3


# -- batch norm, Adam, classifier --------------------------------------------
def test_nextvlad_recipe_settings_reach_the_model_and_optimizer():
  params = _tiny_nextvlad()
  task = task_factory.get_task(params.task)
  model = task.build_model()
  norms = [l for l in model._flatten_layers()  # pylint: disable=protected-access
           if isinstance(l, tf_keras.layers.BatchNormalization)]
  assert len(norms) == 6  # cluster_bn, vlad_bn x 2, hidden_bn, squeeze_bn
  assert {n.momentum for n in norms} == {0.999}
  assert {n.epsilon for n in norms} == {1e-3}
  optimizer = task.create_optimizer(params.trainer.optimizer_config,
                                    params.runtime)
  assert optimizer.epsilon == 1e-8
  demo = exp_factory.get_exp_config('yt8m_nextvlad_demo')
  demo_task = task_factory.get_task(demo.task)
  assert demo_task.create_optimizer(demo.trainer.optimizer_config,
                                    demo.runtime).epsilon == 1e-7
  kernel = model.head._dense.kernel_initializer  # pylint: disable=protected-access
  assert isinstance(kernel, tf_keras.initializers.HeNormal)


def test_classifier_initializer():
  tf_keras.utils.set_random_seed(1)
  fan_in = 400
  stds = {}
  for name in ('glorot_uniform', 'he_normal'):
    head = heads.LogisticHead(num_classes=300, kernel_initializer=name)
    head(tf.zeros([1, fan_in]))
    stds[name] = float(np.std(head.weights[0].numpy()))
  assert stds['glorot_uniform'] == pytest.approx(
      np.sqrt(2.0 / (fan_in + 300)), rel=0.05)
  assert stds['he_normal'] == pytest.approx(np.sqrt(2.0 / fan_in), rel=0.05)
  with pytest.raises(ValueError, match='kernel_initializer=.he_nrmal'):
    heads.LogisticHead(num_classes=3, kernel_initializer='he_nrmal')


# -- reverse whitening -------------------------------------------------------
def _record_file(tmp_path):
  rgb = (np.arange(3 * RGB).reshape(3, RGB) * 11 % 256).astype(np.uint8)
  audio = (np.arange(3 * AUDIO).reshape(3, AUDIO) * 5 % 256).astype(np.uint8)
  path = str(tmp_path / 'v.tfrecord')
  with tf.io.TFRecordWriter(path) as writer:
    writer.write(demo_data.make_sequence_example(
        'v0', [1], rgb, audio).SerializeToString())
  return path, rgb, audio


def _data(path, **kwargs):
  return configs.DataConfig(
      input_path=path, is_training=False, drop_remainder=False,
      global_batch_size=1, feature_sizes=(RGB, AUDIO),
      num_classes=NUM_CLASSES, max_frames=3, num_sample_frames=None,
      **kwargs)


def _matrix(params):
  """The parsed video's frames (decoded and parsed eagerly)."""
  serialized = next(iter(tf.data.TFRecordDataset(params.input_path)))
  decoded = dataloader.Decoder(params).decode(serialized)
  return dataloader.Parser(params).parse_fn(False)(decoded)[
      'video_matrix'].numpy()


def test_reverse_whitening_of_rgb(tmp_path):
  path, rgb, audio = _record_file(tmp_path)
  eigenvalues = np.linspace(0.5, 4.0, RGB + 3)[:, None]  # [n, 1], n > 8
  eig_path = str(tmp_path / 'eigenvals.npy')
  np.save(eig_path, eigenvalues)
  plain = _matrix(_data(path))
  scaled = _matrix(_data(path, reverse_whitening_feature='rgb',
                         pca_eigenvalues_path=eig_path))
  def deq(x):
    return x.astype(np.float32) * (4 / 255) + 4 / 512 - 2

  np.testing.assert_allclose(plain[:, :RGB], deq(rgb), atol=1e-6)
  # (x - 4/512) * (sqrt(eigenvalue) + 1e-4), the NeXtVLAD authors' train.py.
  np.testing.assert_allclose(
      scaled[:, :RGB],
      (deq(rgb) - 4 / 512) * (np.sqrt(eigenvalues[:RGB, 0]) + 1e-4),
      rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(scaled[:, RGB:], plain[:, RGB:])  # audio


def test_reverse_whitening_errors_name_the_file(tmp_path):
  path, _, _ = _record_file(tmp_path)
  missing = str(tmp_path / 'nowhere.npy')
  with pytest.raises(ValueError, match='pca_eigenvalues_path=.*nowhere.npy'):
    dataloader.Parser(_data(path, reverse_whitening_feature='rgb',
                                   pca_eigenvalues_path=missing))
  with pytest.raises(ValueError, match='pca_eigenvalues_path is empty'):
    dataloader.Parser(_data(path, reverse_whitening_feature='rgb'))
  short = str(tmp_path / 'short.npy')
  np.save(short, np.ones([RGB - 1]))
  with pytest.raises(ValueError, match=r'short.npy.*shape \(7,\).*n >= 8'):
    dataloader.Parser(_data(path, reverse_whitening_feature='rgb',
                                   pca_eigenvalues_path=short))
  negative = str(tmp_path / 'negative.npy')
  np.save(negative, -np.ones([RGB]))
  with pytest.raises(ValueError, match="negative.npy': eigenvalue 0 is -1.0"):
    dataloader.Parser(_data(path, reverse_whitening_feature='rgb',
                                   pca_eigenvalues_path=negative))
  with pytest.raises(ValueError, match="reverse_whitening_feature='video'"):
    dataloader.Parser(_data(path, reverse_whitening_feature='video'))


def test_published_nextvlad_undoes_the_whitening_in_both_splits():
  published = exp_factory.get_exp_config('yt8m_nextvlad')
  for data in (published.task.train_data, published.task.validation_data):
    assert data.reverse_whitening_feature == 'rgb'
    assert data.pca_eigenvalues_path == ''  # The user's file.
  task = published.task
  assert task.losses.class_reduction == 'sum'
  assert task.losses.l2_weight_decay == 1e-5
  assert task.gradient_clip_per_variable and task.gradient_clip_norm == 1.0
  assert task.model.norm_activation.norm_momentum == 0.999
  assert task.model.head.logistic.kernel_initializer == 'he_normal'
  # Existing experiments keep Model Garden's choices.
  for name in ('yt8m', 'yt8m_demo', 'yt8m_nextvlad_demo'):
    other = exp_factory.get_exp_config(name)
    assert other.task.losses.class_reduction == 'mean', name
    assert not other.task.gradient_clip_per_variable, name
    assert other.task.model.norm_activation.norm_momentum == 0.99, name
    assert other.task.train_data.reverse_whitening_feature == '', name
  # A model evaluated on another input scale than it trained on: an error.
  params = _tiny_nextvlad()
  params.task.train_data.reverse_whitening_feature = 'rgb'
  params.task.train_data.pca_eigenvalues_path = '/data/eigenvals.npy'
  with pytest.raises(ValueError, match='task.validation_data.reverse_whit'):
    task_factory.get_task(params.task).build_model()
