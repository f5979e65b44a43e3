"""The readout-type registry and the von Mises type it ships as an example.

The built-in types' losses, metrics, record checks and served outputs are
tested by the other readout tests, unmodified; here: the lookups, a type
registered by a test (the registration alone is enough), and `von_mises`
(NLL against numpy's `np.i0`, its gradient, training, served output).
"""
import ast
import math
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import config_definitions as cfg
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import export
from official_ext.readout import losses
from official_ext.readout import metrics
from official_ext.readout import readout_types
from official_ext.readout import task as task_lib
from official_ext.readout import von_mises

INPUT_DIM = 3


def test_lookups_give_the_original_types():
  assert configs.READOUT_TYPES == ('continuous', 'binary', 'multinomial',
                                   'multilabel', 'event_rate', 'von_mises')
  assert configs.METRICS_BY_TYPE == {
      'continuous': ('r2', 'pearson'),
      'binary': ('balanced_accuracy', 'macro_f1'),
      'multinomial': ('balanced_accuracy', 'macro_f1'),
      'multilabel': ('map',),
      'event_rate': ('poisson_d2',),
      'von_mises': ('mean_cosine', 'angular_error_deg')}
  sizes = {t: readout_types.target_size(
      configs.ReadoutSpec(name='x', type=t, dim=3))
      for t in configs.READOUT_TYPES}
  assert sizes == {'continuous': 3, 'binary': 3, 'multinomial': 1,
                   'multilabel': 3, 'event_rate': 3, 'von_mises': 1}
  with pytest.raises(ValueError, match=r"readouts `s`: dim 1; expected >= 2 "
                     r"for type 'multinomial' \(the number of classes\)"):
    configs.validate_readouts(
        [configs.ReadoutSpec(name='s', type='multinomial', dim=1)], ['s'])
  with pytest.raises(ValueError, match=r"readouts `a`: dim 3; expected 2 for "
                     "type 'von_mises'"):
    configs.validate_readouts(
        [configs.ReadoutSpec(name='a', type='von_mises', dim=3)], ['a'])


def test_the_registry_imports_no_type():
  """`readout_types` is the registry alone: the family's types register when
  `configs` imports their modules (no import back into the registry's
  users, no import by name at run time)."""
  with open(readout_types.__file__) as f:
    tree = ast.parse(f.read())
  imported = [ast.unparse(n) for n in ast.walk(tree)
              if isinstance(n, (ast.Import, ast.ImportFrom))]
  assert not [i for i in imported if 'official_ext' in i or 'importlib' in i]
  with open(configs.__file__) as f:
    tree = ast.parse(f.read())
  imported = {(n.module, a.name) for n in tree.body
              if isinstance(n, ast.ImportFrom) for a in n.names}
  assert {('official_ext.readout', 'builtin_types'),
          ('official_ext.readout', 'von_mises')} <= imported


def test_unknown_type_names_the_spec_and_lists_the_types():
  spec = configs.ReadoutSpec(name='gaze', type='gaussian', dim=2)
  listed = re.escape(str(configs.READOUT_TYPES))
  with pytest.raises(ValueError, match=r"task.readouts `gaze`: type "
                     r"'gaussian'; expected one of the registered readout "
                     rf'types {listed}'):
    configs.validate_readouts([spec], ['gaze'])
  with pytest.raises(ValueError, match=r"readouts `gaze`: type 'gaussian'.*"
                     "'von_mises'"):
    losses.per_query_loss(spec, tf.zeros([1, 2]), tf.zeros([1, 2]))
  with pytest.raises(ValueError, match=r"readouts `gaze`: type 'gaussian'"):
    metrics.task_metrics(spec, np.zeros([1, 2]), np.zeros([1, 2]))


def _huber(spec, p, y):
  del spec
  return tf_keras.losses.huber(y, p)


def test_a_registration_alone_adds_a_type():
  """A type the family does not know: config check, record check, loss,
  metrics and `average/score`, served output, all from one registration."""
  readout_types.register_readout_type(readout_types.ReadoutType(
      name='test_huber', loss=_huber, metrics=('neg_max_error',),
      compute_metrics=lambda spec, p, y, w: {
          'neg_max_error': -float(np.max(np.abs(p - y), initial=0.0))},
      invalid_targets=(('a value above 10', lambda v, dims: v > 10),),
      serve=lambda spec, outputs: 2.0 * outputs))
  try:
    spec = configs.ReadoutSpec(name='pos', type='test_huber', dim=2)
    configs.validate_readouts([spec], ['pos'])
    assert 'test_huber' in configs.READOUT_TYPES
    p, y = [[0.0, 3.0]], [[0.5, 0.0]]
    sums = losses.loss_sums({'pos': spec}, {'pos': tf.constant(p)},
                            {'pos': tf.constant(y)},
                            {'pos': tf.constant([1.0])})
    # Huber (delta 1): (0.5 * 0.5^2 + (3 - 0.5)) / 2.
    assert float(sums['pos'][0]) == pytest.approx((0.125 + 2.5) / 2)
    acc = metrics.ReadoutMetrics({'pos': spec})
    acc.accumulate('pos', p, y)
    assert acc.result() == {'pos/neg_max_error': -3.0,
                            'average/neg_max_error': -3.0,
                            'average/score': -3.0}
    parser = dataloader.Parser(configs.DataConfig(input_dim=1), [spec],
                               ['pos'])
    record = dataloader.make_example('r7', np.zeros([1, 1]), [0.0], [1],
                                     [0.0], [[1.0, 11.0]])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match='Record `r7` in file `f`: query 0 of task `pos` '
                       'has a value above 10: 11'):
      parser.parse(tf.constant(record.SerializeToString()), tf.constant('f'))
    record = dataloader.make_example('r8', np.zeros([1, 1]), [0.0], [1],
                                     [0.0], [[1.0]])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r'target of 1 values; expected 2 \(test_huber: '
                       r'the ReadoutSpec dim\)'):
      parser.parse(tf.constant(record.SerializeToString()), tf.constant('f'))
    served, heads = _served(spec, 'pos')
    np.testing.assert_allclose(served, 2.0 * heads, rtol=1e-5)
  finally:
    readout_types.unregister_readout_type('test_huber')
  assert 'test_huber' not in configs.READOUT_TYPES
  with pytest.raises(ValueError, match="type 'test_huber'; expected one of"):
    configs.validate_readouts([spec], ['pos'])


def _numpy_nll(xy, theta):
  xy = np.asarray(xy, np.float64)
  kappa = np.hypot(xy[:, 0], xy[:, 1])
  mu = np.arctan2(xy[:, 1], xy[:, 0])
  return -kappa * np.cos(theta - mu) + np.log(2 * np.pi * np.i0(kappa))


def test_von_mises_nll_against_numpy():
  xy = np.array([[1.0, 0.0], [0.3, -0.4], [-2.0, 1.0], [0.0, 0.0],
                 [30.0, 40.0], [-400.0, 300.0]])
  theta = np.array([0.0, 2.5, -1.0, 0.7, 0.9, 7.0])
  got = von_mises.negative_log_likelihood(
      None, tf.constant(xy, tf.float32), tf.constant(theta[:, None],
                                                     tf.float32)).numpy()
  # kappa = 50 and 500: float32 I0 overflows at ~89; i0e keeps it finite.
  np.testing.assert_allclose(got, _numpy_nll(xy, theta), rtol=1e-5,
                             atol=2e-4)
  assert got[3] == pytest.approx(math.log(2 * math.pi))


def test_von_mises_gradient():
  """The gradient equals numpy's finite differences, is finite at the
  origin, and a step against it turns the mean direction to the target."""
  xy = np.array([[1.0, 0.0], [0.5, -2.0], [0.0, 0.0]])
  theta = np.array([math.pi / 2, 0.3, 1.0])
  p = tf.Variable(xy, dtype=tf.float32)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(von_mises.negative_log_likelihood(
        None, p, tf.constant(theta[:, None], tf.float32)))
  grad = tape.gradient(loss, p).numpy()
  h = 1e-6
  numeric = np.zeros_like(xy)
  for i in range(2):  # Central differences, away from the origin.
    for j in range(2):
      up, down = xy[i:i + 1].copy(), xy[i:i + 1].copy()
      up[0, j] += h
      down[0, j] -= h
      numeric[i, j] = (_numpy_nll(up, theta[i:i + 1]) -
                       _numpy_nll(down, theta[i:i + 1]))[0] / (2 * h)
  np.testing.assert_allclose(grad[:2], numeric[:2], rtol=1e-4, atol=1e-5)
  # At the origin (uniform): -(cos theta, sin theta), pointing away.
  np.testing.assert_allclose(grad[2], [-math.cos(1.0), -math.sin(1.0)],
                             atol=1e-5)
  stepped = xy - 0.1 * grad
  before = np.abs(von_mises.angular_difference(xy[:2], theta[:2, None]))
  after = np.abs(von_mises.angular_difference(stepped[:2], theta[:2, None]))
  assert (after < before).all(), (before, after)


def test_von_mises_metrics_by_hand():
  # mu = 0, pi/2, pi; theta - mu = 0.5, -pi/2, pi (wrapped).
  p = np.array([[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
  theta = np.array([[0.5], [0.0], [0.0]])
  spec = configs.ReadoutSpec(name='a', type='von_mises', dim=2)
  got = metrics.task_metrics(spec, p, theta, [1.0, 1.0, 2.0])
  assert got['mean_cosine'] == pytest.approx(
      (math.cos(0.5) + 0.0 - 2.0) / 4)
  assert got['angular_error_deg'] == pytest.approx(
      math.degrees((0.5 + math.pi / 2 + 2 * math.pi) / 4))


def _config(readouts, vocab):
  config = configs.ReadoutTaskConfig(
      readouts=readouts, task_vocabulary=vocab,
      train_data=configs.DataConfig(input_dim=INPUT_DIM),
      validation_data=configs.DataConfig(input_dim=INPUT_DIM))
  config.model.encoder.override({'hidden_size': 8, 'num_heads': 2,
                                 'num_layers': 1, 'intermediate_size': 8})
  return config


_TOKEN_KEYS = ('input_values', 'input_timestamps', 'input_mask',
               'output_readout_index', 'output_timestamps')


def _angle_batch(num_trials=16):
  """A padded batch whose tokens carry (cos, sin) of the trial's angle and
  noise; two queries each: the angle (id 1) and its cosine (id 2)."""
  rng = np.random.default_rng(3)
  angle = rng.uniform(-math.pi, math.pi, num_trials)
  tokens = np.stack([np.repeat(np.cos(angle)[:, None], 4, 1),
                     np.repeat(np.sin(angle)[:, None], 4, 1),
                     rng.normal(size=[num_trials, 4])], axis=-1)
  batch = {
      'input_values': tokens,
      'input_timestamps': np.tile(np.arange(4) * 0.1, [num_trials, 1]),
      'input_mask': np.ones([num_trials, 4], bool),
      'output_readout_index': np.tile([[1, 2]], [num_trials, 1]),
      'output_timestamps': np.tile([[0.1, 0.2]], [num_trials, 1]),
      'output_weights': np.ones([num_trials, 2]),
      'output_metric_weights': np.ones([num_trials, 2]),
      'output_targets': np.stack([angle, np.cos(angle)], 1)[:, :, None]}
  return {k: tf.constant(v, tf.int32 if k == 'output_readout_index' else
                         tf.bool if k == 'input_mask' else tf.float32)
          for k, v in batch.items()}


def _served(spec, name):
  """`serve_tokens` of an untrained one-readout model's export module on
  the first two trials of `_angle_batch` (only query 0 kept: id 1), and the
  model's head outputs [2, dim] for those queries."""
  config = _config((spec,), (name,))
  model = task_lib.ReadoutTask(config).build_model()
  module = export.ReadoutExportModule(cfg.ExperimentConfig(task=config),
                                      model)
  batch = {k: v[:2] for k, v in _angle_batch().items()}
  batch['output_readout_index'] = tf.constant([[1, 0], [1, 0]])
  served = module.serve_tokens(**{k: batch[k] for k in _TOKEN_KEYS})
  assert served[name].shape[:2] == (2, 2)
  return served[name].numpy()[:, 0], model(batch, training=False)[name].numpy()


def test_von_mises_served_output_is_angle_and_kappa():
  spec = configs.ReadoutSpec(name='reach', type='von_mises', dim=2)
  served, xy = _served(spec, 'reach')
  np.testing.assert_allclose(served[:, 0], np.arctan2(xy[:, 1], xy[:, 0]),
                             atol=1e-5)
  np.testing.assert_allclose(served[:, 1], np.hypot(xy[:, 0], xy[:, 1]),
                             rtol=1e-5)


def test_von_mises_records():
  """The parser takes one angle per query and names the type otherwise."""
  spec = configs.ReadoutSpec(name='reach', type='von_mises', dim=2)
  parser = dataloader.Parser(configs.DataConfig(input_dim=1), [spec],
                             ['reach'])
  good = dataloader.make_example('g', np.zeros([1, 1]), [0.0], [1, 1],
                                 [0.0, 0.1], [[-3.0], [7.5]])
  parsed = parser.parse(tf.constant(good.SerializeToString()))
  np.testing.assert_allclose(parsed['output_targets'], [[-3.0], [7.5]])
  bad = dataloader.make_example('b', np.zeros([1, 1]), [0.0], [1], [0.0],
                                [[0.5, 1.0]])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'query 0 of task `reach` has a target of 2 '
                     r'values; expected 1 \(von_mises: 1 angle in radians\)'):
    parser.parse(tf.constant(bad.SerializeToString()))


def test_angular_readout_trains():
  """Four Adam steps (`task.train_step`) on one batch: the von Mises loss
  falls and the evaluation's `reach/mean_cosine` (the task's primary
  metric, averaged into `average/score`) rises."""
  config = _config(
      (configs.ReadoutSpec(name='reach', type='von_mises', dim=2),
       configs.ReadoutSpec(name='cos', type='continuous')), ('reach', 'cos'))
  batch = _angle_batch()
  task = task_lib.ReadoutTask(config)
  tf_keras.utils.set_random_seed(0)
  model = task.build_model()
  optimizer = tf_keras.optimizers.Adam(learning_rate=0.05)
  metrics_list = task.build_metrics(training=False)

  def evaluate():
    for m in metrics_list:
      m.reset_states()
    logs = task.validation_step(batch, model, metrics_list)
    results = task.reduce_aggregated_logs(task.aggregate_logs(None, logs))
    return results, float(logs['reach_loss'])

  first, first_loss = evaluate()
  for _ in range(4):  # Eagerly: tracing the step costs more than 4 steps.
    task.train_step(batch, model, optimizer)
  last, last_loss = evaluate()
  assert last_loss < first_loss - 0.2, (first_loss, last_loss)
  assert last['reach/mean_cosine'] > first['reach/mean_cosine'] + 0.1, (
      first, last)
  assert last['reach/angular_error_deg'] < first['reach/angular_error_deg']
  assert last['average/score'] == pytest.approx(
      (last['reach/mean_cosine'] + last['cos/r2']) / 2)
