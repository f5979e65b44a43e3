"""The mixture of NeXtVLAD models with online distillation
(`modeling/mix_nextvlad.py`): the distillation term against a hand
computation, the published size's parameters counted by hand, a training
step's losses, and the demo trained and evaluated through
`official_ext.train`."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.yt8m.modeling import mix_nextvlad
from official_ext.yt8m.modeling import model as yt8m_model
from tests import shipped_configs

FEATURES = (8, 4)
TINY_BACKBONE = {'feature_sizes': list(FEATURES), 'cluster_sizes': [4, 2],
                 'groups': [2, 1], 'hidden_size': 8, 'num_branches': 2}


def tiny_demo_params(cache_dir, jit_compile=False, num_branches=2):
  """`yt8m_mix_nextvlad_demo` at tiny sizes (`num_branches` branches) on a
  tiny generated data set, 2 training steps and one evaluation batch."""
  params = exp_factory.get_exp_config('yt8m_mix_nextvlad_demo')
  data = shipped_configs._data_overrides(  # pylint: disable=protected-access
      'yt8m_mix_nextvlad_demo', str(cache_dir))
  params.override({
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': dict(data, model={'backbone': {'mix_nextvlad': {
          'cluster_sizes': [4, 2], 'groups': [2, 1], 'hidden_size': 8,
          'num_branches': num_branches}}},
                   jit_compile=jit_compile),
      'trainer': {'train_steps': 2, 'steps_per_loop': 1,
                  'summary_interval': 1, 'checkpoint_interval': 2,
                  'validation_interval': 2, 'validation_steps': 1}},
                  is_strict=True)
  params.validate()
  return params


def _softmax(x):
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def test_distillation_loss_against_hand_computation():
  mix = np.array([[2.0, -1.0, 0.5], [0.0, 1.0, -2.0]])
  branches = np.array([[[1.0, 0.0, 0.0], [2.0, -1.0, 0.4]],
                       [[-1.0, 2.0, 0.0], [0.5, 0.5, 0.5]]])
  temperature, weight = 3.0, 9.0
  # KL(mix || branch) per video and branch, at temperature 3, summed over
  # the branches, averaged over the videos, times 9 (eps 1e-8 inside logs).
  p = _softmax(mix / temperature)
  total = 0.0
  for b in range(2):
    for i in range(2):
      q = _softmax(branches[b, i] / temperature)
      total += np.sum(p[b] * (np.log(p[b] + 1e-8) - np.log(q + 1e-8)))
  hand = weight * total / 2
  got = mix_nextvlad.distillation_loss(
      tf.constant(mix, tf.float32), tf.constant(branches, tf.float32),
      temperature, weight)
  assert float(got) == pytest.approx(hand, rel=1e-5)
  # A branch that agrees with the mixture costs nothing.
  same = mix_nextvlad.distillation_loss(
      tf.constant(mix, tf.float32),
      tf.constant(np.stack([mix, mix], axis=1), tf.float32), 3.0, 9.0)
  assert abs(float(same)) < 1e-6
  assert hand > 0.01


def _nextvlad_branch(k, g, r, hidden=2048, expansion=2, classes=3862):
  """Trainable parameters of one published branch and its classifier."""
  total = 0
  for n, clusters, groups in ((1024, k, g), (128, k // 2, g // 2)):
    wide = expansion * n
    group = wide // groups
    total += n * wide + wide                 # expansion kernel + bias
    total += wide * groups + groups          # group attention
    total += wide * groups * clusters        # cluster assignment, no bias
    total += 2 * groups * clusters           # cluster_bn gamma, beta
    total += group * clusters                # cluster centers
    total += 2 * group * clusters            # vlad_bn gamma, beta
  vlad = (2048 // g) * k + (256 // (g // 2)) * (k // 2)
  total += vlad * hidden + 2 * hidden        # hidden (no bias) + bn
  total += 2 * hidden * (hidden // r) + 2 * (hidden // r)  # SE gate + bn
  total += hidden * classes + classes        # logistic classifier
  return total


def test_published_parameter_count():
  branch = _nextvlad_branch(k=112, g=8, r=16)
  # The 3-branch mixture: 3 branches, the gate's batch norm on the 1152
  # mean features (gamma, beta) and its dense 1152 -> 3 (+ bias).
  expected = 3 * branch + 2 * 1152 + 1152 * 3 + 3
  assert expected == 235_935_273
  config = exp_factory.get_exp_config('yt8m_mix_nextvlad').task
  assert config.model.backbone.mix_nextvlad.num_branches == 3
  with tf.Graph().as_default():  # Shapes only; no initial values drawn.
    model = yt8m_model.build_model(
        config.model, num_classes=config.train_data.num_classes,
        input_feature_size=sum(config.train_data.feature_sizes))
    count = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
  assert count == expected


def test_experiments_follow_the_authors():
  published = exp_factory.get_exp_config('yt8m_mix_nextvlad')
  published.validate()
  task = published.task
  mix = task.model.backbone.mix_nextvlad
  assert (mix.num_branches, mix.cluster_sizes, mix.groups, mix.expansion,
          mix.hidden_size, mix.gating_reduction, mix.dropout_rate,
          mix.distillation_weight, mix.distillation_temperature) == (
              3, (112, 56), (8, 4), 2, 2048, 16, 0.5, 9.0, 3.0)
  lr = published.trainer.optimizer_config.learning_rate.exponential
  assert (lr.initial_learning_rate, lr.decay_rate, lr.decay_steps,
          lr.staircase) == (2e-4, 0.8, 2_500_000 // 160, True)
  assert published.trainer.train_steps == 15 * (3_888_919 // 160)
  assert task.losses.class_reduction == 'sum'
  assert task.gradient_clip_per_variable
  assert task.train_data.reverse_whitening_feature == 'rgb'
  demo = exp_factory.get_exp_config('yt8m_mix_nextvlad_demo')
  nextvlad_demo = exp_factory.get_exp_config('yt8m_nextvlad_demo')
  for key in ('validation_data', 'demo_data'):
    assert demo.task.as_dict()[key] == nextvlad_demo.task.as_dict()[key], key
  assert demo.trainer.train_steps == nextvlad_demo.trainer.train_steps
  assert demo.task.train_data.reverse_whitening_feature == ''


def test_training_step_adds_branch_and_distillation_losses():
  params = exp_factory.get_exp_config('yt8m_mix_nextvlad_demo')
  params.override({'task': {
      'model': {'backbone': {'mix_nextvlad': TINY_BACKBONE}},
      'train_data': {'feature_sizes': list(FEATURES)},
      'validation_data': {'feature_sizes': list(FEATURES)},
      'jit_compile': False}}, is_strict=True)
  task = task_factory.get_task(params.task)
  tf_keras.utils.set_random_seed(2)
  model = task.build_model()
  rng = np.random.default_rng(3)
  batch = {'video_matrix': tf.constant(rng.normal(size=[4, 5, 12]),
                                       tf.float32),
           'num_frames': tf.constant([5, 3, 1, 5]),
           'labels': tf.one_hot([0, 1, 2, 3], 100)}
  outputs = model(batch['video_matrix'], num_frames=batch['num_frames'],
                  training=True)
  assert outputs['branch_predictions'].shape == (4, 2, 100)
  assert 'distillation_loss' not in model(batch['video_matrix'],
                                          training=False)
  metrics = task.build_metrics(training=True)
  optimizer = tf_keras.optimizers.legacy.Adam(1e-2)
  before = [v.numpy() for v in model.trainable_variables]
  logs = task.train_step(batch, model, optimizer, metrics)
  parts = {k: float(logs[k]) for k in
           ('model_loss', 'branch_loss', 'distillation_loss')}
  assert all(v > 0 for v in parts.values()), parts
  # Two branches' cross-entropies, each summed over 100 classes.
  assert parts['branch_loss'] > 2 * parts['model_loss'] * 0.5
  l2 = float(logs['total_loss']) - sum(parts.values())
  assert 0 < l2 < 1e-2, (logs, parts)
  changed = [not np.array_equal(b, v.numpy())
             for b, v in zip(before, model.trainable_variables)]
  assert all(changed)  # Every branch, the gate and the classifiers learn.


def test_demo_trains_and_evaluates(tmp_path):
  params = tiny_demo_params(tmp_path / 'cache')
  tf_keras.utils.set_random_seed(11)
  _, metrics = train.run(params, 'train_and_eval', str(tmp_path / 'model'),
                         strategy=tf.distribute.OneDeviceStrategy('/cpu:0'))
  assert tf.train.latest_checkpoint(str(tmp_path / 'model')).endswith(
      'ckpt-2')
  for key in ('validation_loss', 'gap'):
    assert np.isfinite(float(metrics[key])), metrics
