"""Readout losses against hand-computed values; weights; replica sums."""
import math

import numpy as np
import pytest
import tensorflow as tf

from official_ext.readout import configs
from official_ext.readout import losses


def _spec(type_, dim, weight=1.0, name='t'):
  return configs.ReadoutSpec(name=name, type=type_, dim=dim,
                             loss_weight=weight)


def _task_loss(spec, p, y, w):
  sums = losses.loss_sums({spec.name: spec}, {spec.name: tf.constant(p)},
                          {spec.name: tf.constant(y)},
                          {spec.name: tf.constant(w)})
  return float(losses.task_losses({spec.name: spec}, sums)[spec.name])


def _sigmoid_ce(z, y):
  return math.log1p(math.exp(-z)) + (1 - y) * z


def test_mse_weighted():
  p = [[1.0, 2.0], [0.0, 0.0], [5.0, 5.0]]
  y = [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
  # Per query: (1 + 4) / 2 = 2.5, (1 + 1) / 2 = 1; third has weight 0.
  expected = (2 * 2.5 + 1 * 1.0) / 3
  assert _task_loss(_spec('continuous', 2), p, y, [2.0, 1.0, 0.0]) == (
      pytest.approx(expected))


@pytest.mark.parametrize('type_', ['binary', 'multilabel'])
def test_sigmoid_cross_entropy(type_):
  p = [[0.0, 2.0], [-1.0, 3.0]]
  y = [[1.0, 0.0], [0.0, 1.0]]
  q0 = (math.log(2) + _sigmoid_ce(2.0, 0)) / 2
  q1 = (_sigmoid_ce(-1.0, 0) + _sigmoid_ce(3.0, 1)) / 2
  assert _task_loss(_spec(type_, 2), p, y, [1.0, 3.0]) == pytest.approx(
      (q0 + 3 * q1) / 4, rel=1e-6)


def test_softmax_cross_entropy_with_class_ids():
  p = [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]
  y = [[2.0, 0.0], [0.0, 0.0]]  # Extra padding column is ignored.
  lse = math.log(math.exp(1) + math.exp(2) + math.exp(3))
  expected = ((lse - 3.0) + math.log(3.0)) / 2
  assert _task_loss(_spec('multinomial', 3), p, y, [1.0, 1.0]) == (
      pytest.approx(expected, rel=1e-6))


def test_poisson_nll_with_log_rate():
  p = [[math.log(2.0)], [0.0]]
  y = [[3.0], [0.0]]
  # exp(p) - y p: 2 - 3 log 2, 1 - 0.
  expected = ((2 - 3 * math.log(2)) + 1.0) / 2
  assert _task_loss(_spec('event_rate', 1), p, y, [1.0, 1.0]) == (
      pytest.approx(expected, rel=1e-6))


def test_zero_weights_contribute_nothing_even_if_not_finite():
  spec = _spec('event_rate', 1)
  base = _task_loss(spec, [[0.0]], [[1.0]], [1.0])
  with_junk = _task_loss(spec, [[0.0], [1e6]], [[1.0], [5.0]], [1.0, 0.0])
  assert with_junk == pytest.approx(base)
  assert _task_loss(spec, [[3.0]], [[1.0]], [0.0]) == 0.0  # All weights 0.


def test_total_is_weighted_sum_over_tasks():
  specs = {'a': _spec('continuous', 1, 2.0, 'a'),
           'b': _spec('binary', 1, 0.5, 'b'),
           'c': _spec('continuous', 1, 7.0, 'c')}
  preds = {'a': tf.constant([[1.0]]), 'b': tf.constant([[0.0]]),
           'c': tf.zeros([0, 1])}  # 'c' absent from the batch.
  targets = {'a': tf.constant([[0.0]]), 'b': tf.constant([[1.0]]),
             'c': tf.zeros([0, 1])}
  weights = {'a': tf.constant([1.0]), 'b': tf.constant([1.0]),
             'c': tf.zeros([0])}
  out = losses.task_losses(specs, losses.loss_sums(specs, preds, targets,
                                                   weights))
  assert float(out['c']) == 0.0
  assert float(out['total_loss']) == pytest.approx(2.0 * 1.0 +
                                                   0.5 * math.log(2))


def test_replica_shares_add_up_to_the_global_loss(mirrored):
  spec = _spec('continuous', 1)
  specs = {'t': spec}
  # Replica 0 holds 1 query, replica 1 holds 3 with other weights.
  local = [([[1.0]], [[0.0]], [1.0]),
           ([[2.0], [0.0], [1.0]], [[0.0], [0.0], [0.0]], [2.0, 1.0, 1.0])]
  p_all = [[1.0], [2.0], [0.0], [1.0]]
  expected = _task_loss(spec, p_all, [[0.0]] * 4, [1.0, 2.0, 1.0, 1.0])
  strategy = mirrored

  def value_fn(ctx):
    p, y, w = local[ctx.replica_id_in_sync_group]
    return tf.constant(p), tf.constant(y), tf.constant(w)

  inputs = strategy.experimental_distribute_values_from_function(value_fn)

  @tf.function
  def step(inputs):
    def fn(p, y, w):
      sums = losses.loss_sums(specs, {'t': p}, {'t': y}, {'t': w})
      share, total = losses.global_task_losses(specs, sums)
      return share['total_loss'], total['total_loss']
    return strategy.run(fn, args=inputs)

  shares, totals = step(inputs)
  shares = [float(s) for s in strategy.experimental_local_results(shares)]
  totals = [float(t) for t in strategy.experimental_local_results(totals)]
  assert sum(shares) == pytest.approx(expected, rel=1e-6)
  assert totals == pytest.approx([expected, expected], rel=1e-6)
  # Replica 0 alone would have a loss of 1.0; its share is 1 / 5.
  assert shares[0] == pytest.approx(1.0 / 5.0)


@pytest.mark.parametrize('type_, bad_p, bad_y', [
    ('event_rate', 200.0, 5.0),            # exp(200) overflows float32.
    ('continuous', 1e30, float('nan')),
    ('binary', float('inf'), 0.0),
    ('multinomial', float('nan'), 7.0),    # Class id out of range.
])
def test_zero_weight_rows_give_finite_gradients(type_, bad_p, bad_y):
  """A weight-0 row with a non-finite loss adds nothing to the gradient."""
  dim = 2 if type_ == 'multinomial' else 1
  spec = _spec(type_, dim)
  good_p, good_y = [0.5] * dim, [1.0]
  p = tf.Variable([good_p, [bad_p] * dim])
  with tf.GradientTape() as tape:
    sums = losses.loss_sums({'t': spec}, {'t': p},
                            {'t': tf.constant([good_y, [bad_y]])},
                            {'t': tf.constant([2.0, 0.0])})
    loss = losses.task_losses({'t': spec}, sums)['total_loss']
  grad = tape.gradient(loss, p).numpy()
  assert np.isfinite(float(loss)) and np.isfinite(grad).all(), grad
  assert not grad[1].any()
  # The same as the good row alone.
  q = tf.Variable([good_p])
  with tf.GradientTape() as tape:
    alone = losses.task_losses({'t': spec}, losses.loss_sums(
        {'t': spec}, {'t': q}, {'t': tf.constant([good_y])},
        {'t': tf.constant([2.0])}))['total_loss']
  np.testing.assert_allclose(grad[:1], tape.gradient(alone, q).numpy(),
                             rtol=1e-6)
  assert float(loss) == pytest.approx(float(alone))
