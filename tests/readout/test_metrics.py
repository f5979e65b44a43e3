"""Readout metrics against hand-computed values and scikit-learn."""
import math

import numpy as np
import pytest

from official_ext.readout import configs
from official_ext.readout import metrics

try:  # The hand-computed tests run without scikit-learn.
  from sklearn import metrics as sk_metrics  # pylint: disable=g-import-not-at-top
except ImportError:
  sk_metrics = None

needs_sklearn = pytest.mark.skipif(sk_metrics is None,
                                   reason='scikit-learn is not installed')


def test_r2_and_pearson_by_hand():
  y = np.array([[1.0], [2.0], [3.0], [4.0]])
  p = np.array([[1.0], [2.0], [2.0], [5.0]])
  # ybar = 2.5; SS_res = 0 + 0 + 1 + 1 = 2; SS_tot = 5.
  assert metrics.r2_score(p, y) == pytest.approx(1 - 2 / 5)
  # A zero weight removes the last query: y 1,2,3; p 1,2,2.
  assert metrics.r2_score(p, y, [1, 1, 1, 0]) == pytest.approx(1 - 1 / 2)
  # Pearson of (1,2,3,4) and (1,2,2,5): cov / (sx sy).
  dp, dy = p[:, 0] - p.mean(), y[:, 0] - y.mean()
  r = np.sum(dp * dy) / math.sqrt(np.sum(dp**2) * np.sum(dy**2))
  assert metrics.pearson(p, y) == pytest.approx(r)
  # Constant target predicted exactly / not.
  assert metrics.r2_score([[1.0], [1.0]], [[1.0], [1.0]]) == 1.0
  assert metrics.r2_score([[0.0], [1.0]], [[1.0], [1.0]]) == 0.0


def test_binary_scores_by_hand():
  # targets 1,1,1,0; predictions (logit>0) 1,0,1,1.
  logits = np.array([[2.0], [-1.0], [0.5], [3.0]])
  y = np.array([[1.0], [1.0], [1.0], [0.0]])
  s = metrics.binary_scores(logits, y)
  # recall(1) = 2/3, recall(0) = 0 -> 1/3. F1(1) = 4/(4+1+1) = 2/3, F1(0) = 0.
  assert s['balanced_accuracy'] == pytest.approx(1 / 3)
  assert s['macro_f1'] == pytest.approx(1 / 3)
  # Weight 0 on the false positive: recall(1) = 2/3 only class -> 2/3.
  s = metrics.binary_scores(logits, y, [1, 1, 1, 0])
  assert s['balanced_accuracy'] == pytest.approx(2 / 3)


def test_multinomial_scores_by_hand():
  logits = np.eye(3)[[0, 1, 1, 2, 0]] * 5
  y = np.array([[0], [1], [2], [2], [1]], float)
  s = metrics.multinomial_scores(logits, y)
  # recalls: c0 1/1, c1 1/2, c2 1/2 -> 2/3.
  assert s['balanced_accuracy'] == pytest.approx(2 / 3)
  # F1: c0 2/(2+1)=2/3, c1 2/(2+1+1)=1/2, c2 2/(2+1)=2/3.
  assert s['macro_f1'] == pytest.approx((2 / 3 + 1 / 2 + 2 / 3) / 3)


def test_average_precision_by_hand():
  # Ranked: pos, neg, pos -> AP = (1/1 + 2/3) / 2.
  assert metrics.average_precision([0.9, 0.5, 0.1], [1, 0, 1]) == (
      pytest.approx((1 + 2 / 3) / 2))
  # A tie of a positive and a negative at the top counts as one threshold.
  assert metrics.average_precision([0.9, 0.9, 0.1], [1, 0, 1]) == (
      pytest.approx(0.5 * 0.5 + 0.5 * 2 / 3))
  assert math.isnan(metrics.average_precision([0.3], [0]))


def test_poisson_d2_by_hand():
  y = np.array([[0.0], [2.0]])
  mu = np.array([[0.5], [1.0]])
  # D = 2 [(0 - 0 + 0.5) + (2 log 2 - 2 + 1)]; null mu = 1:
  # D0 = 2 [(0 - 0 + 1) + (2 log 2 - 2 + 1)].
  d = 0.5 + 2 * math.log(2) - 1
  d0 = 1 + 2 * math.log(2) - 1
  assert metrics.poisson_d2(np.log(mu), y) == pytest.approx(1 - d / d0)


@needs_sklearn
def test_against_sklearn_with_weights():
  rng = np.random.default_rng(0)
  n = 200
  w = rng.integers(0, 3, n).astype(float)  # Includes zero weights.
  y = rng.normal(size=[n, 2])
  p = y + rng.normal(size=[n, 2])
  assert metrics.r2_score(p, y, w) == pytest.approx(
      sk_metrics.r2_score(y, p, sample_weight=w))
  yb = rng.integers(0, 2, [n, 1]).astype(float)
  zb = rng.normal(size=[n, 1]) + (yb - 0.5)
  s = metrics.binary_scores(zb, yb, w)
  assert s['balanced_accuracy'] == pytest.approx(
      sk_metrics.balanced_accuracy_score(yb[:, 0], zb[:, 0] > 0,
                                         sample_weight=w))
  assert s['macro_f1'] == pytest.approx(
      sk_metrics.f1_score(yb[:, 0], zb[:, 0] > 0, average='macro',
                          sample_weight=w))
  ym = rng.integers(0, 5, n)
  zm = rng.normal(size=[n, 5]) + np.eye(5)[ym]
  s = metrics.multinomial_scores(zm, ym[:, None].astype(float), w)
  assert s['balanced_accuracy'] == pytest.approx(
      sk_metrics.balanced_accuracy_score(ym, zm.argmax(1), sample_weight=w))
  assert s['macro_f1'] == pytest.approx(
      sk_metrics.f1_score(ym, zm.argmax(1), average='macro', sample_weight=w))
  yl = rng.integers(0, 2, [n, 3]).astype(float)
  zl = np.round(rng.normal(size=[n, 3]) + yl, 1)  # Rounded: ties.
  assert metrics.mean_average_precision(zl, yl, w) == pytest.approx(
      sk_metrics.average_precision_score(yl, zl, average='macro',
                                         sample_weight=w))
  counts = rng.poisson(2.0, [n, 1]).astype(float)
  log_rate = np.log(counts + 0.5) + rng.normal(0, 0.3, [n, 1])
  assert metrics.poisson_d2(log_rate, counts, w) == pytest.approx(
      sk_metrics.d2_tweedie_score(counts[:, 0], np.exp(log_rate[:, 0]),
                                  power=1, sample_weight=w))


def test_readout_metrics_accumulates_and_averages():
  specs = {
      'speed': configs.ReadoutSpec(name='speed', dim=1, type='continuous'),
      'choice': configs.ReadoutSpec(name='choice', dim=1, type='binary',
                                    metrics=('balanced_accuracy',)),
      'absent': configs.ReadoutSpec(name='absent', dim=1, type='continuous'),
  }
  acc = metrics.ReadoutMetrics(specs)
  acc.accumulate('speed', [[1.0], [2.0]], [[1.0], [2.0]], [1, 1])
  acc.accumulate('speed', [[3.0]], [[3.0]])
  acc.accumulate('choice', [[1.0], [-1.0]], [[1.0], [1.0]], [1, 1])
  out = acc.result()
  assert out['speed/r2'] == pytest.approx(1.0)
  assert out['speed/pearson'] == pytest.approx(1.0)
  assert 'choice/macro_f1' not in out
  assert out['choice/balanced_accuracy'] == pytest.approx(0.5)
  # Nothing to measure: no value (neither NaN nor 0), and the reason.
  assert 'absent/r2' not in out and 'absent/pearson' not in out
  assert not any(math.isnan(v) for v in out.values())
  assert acc.unmeasured() == {'absent/r2': 'no query of positive weight',
                              'absent/pearson': 'no query of positive weight'}
  assert out['average/r2'] == pytest.approx(1.0)  # Left out of the mean.
  assert out['average/score'] == pytest.approx(0.75)
  table = metrics.format_table(out, specs, {'speed': 3, 'choice': 2})
  assert 'speed' in table and 'balanced_accuracy' in table
  acc.reset()
  assert acc.num_queries('speed') == 0


def test_classes_never_present():
  """A class in neither targets nor predictions counts nowhere; a class only
  predicted counts in macro-F1 (F1 0) but not in balanced accuracy."""
  logits = np.eye(4)[[0, 0, 1, 2, 1]] * 3.0  # Class 3 never appears.
  y = np.array([[0], [1], [1], [1], [0]], float)
  s = metrics.multinomial_scores(logits, y)
  # Recall: class 0 1/2, class 1 1/3. F1: class 0 2/(2+1+1), class 1
  # 2/(2+1+2), class 2 (only predicted) 0.
  assert s['balanced_accuracy'] == pytest.approx((1 / 2 + 1 / 3) / 2)
  assert s['macro_f1'] == pytest.approx((1 / 2 + 2 / 5 + 0.0) / 3)
  if sk_metrics is not None:
    with pytest.warns(UserWarning):  # "y_pred contains classes not in y_true"
      assert s['balanced_accuracy'] == pytest.approx(
          sk_metrics.balanced_accuracy_score(y[:, 0], logits.argmax(1)))
    assert s['macro_f1'] == pytest.approx(
        sk_metrics.f1_score(y[:, 0], logits.argmax(1), average='macro'))
  # Binary targets of one class: balanced accuracy is that class's recall.
  s = metrics.binary_scores([[1.0], [-1.0], [2.0]], [[1.0], [1.0], [1.0]])
  assert s['balanced_accuracy'] == pytest.approx(2 / 3)
  assert s['macro_f1'] == pytest.approx((2 * 2 / (2 * 2 + 1) + 0.0) / 2)


def test_constant_sides_and_empty_inputs():
  # Pearson is 0 when either side is constant; R^2 / D^2 of a constant
  # target: 1 if predicted exactly, else 0.
  assert metrics.pearson([[1.0], [1.0]], [[0.0], [2.0]]) == 0.0
  assert metrics.pearson([[0.0], [2.0]], [[1.0], [1.0]]) == 0.0
  assert metrics.poisson_d2(np.log([[2.0], [2.0]]), [[2.0], [2.0]]) == (
      pytest.approx(1.0))
  assert metrics.poisson_d2([[0.0], [0.0]], [[2.0], [2.0]]) == 0.0
  # Weights all 0: nothing to measure, NaN (left out of the averages).
  for fn in (metrics.r2_score, metrics.pearson, metrics.poisson_d2,
             metrics.mean_average_precision):
    assert math.isnan(fn([[1.0]], [[1.0]], [0.0])), fn.__name__
  assert math.isnan(metrics.binary_scores([[1.0]], [[1.0]],
                                          [0.0])['balanced_accuracy'])
  assert math.isnan(metrics.multinomial_scores(
      [[1.0, 0.0]], [[0.0]], [0.0])['macro_f1'])


def test_map_is_the_core_average_precision():
  """Readout mAP is `core.average_precision`'s, weights as sample weights,
  independent of the order of the queries (integer scores: many ties)."""
  from official_ext.core import average_precision as core_ap  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(3)
  n = 120
  logits = rng.integers(-2, 3, [n, 4]).astype(float)
  target = (rng.random([n, 4]) < 0.3).astype(float)
  target[:, 3] = 0.0  # No positive: left out of the mean.
  w = rng.integers(0, 3, n).astype(float)
  value = metrics.mean_average_precision(logits, target, w)
  per_class = core_ap.per_class_average_precision(logits, target > 0.5, w)
  assert value == core_ap.mean_average_precision(logits, target > 0.5, w)
  assert value == pytest.approx(float(np.mean(per_class[:3])))
  for c in range(3):
    assert metrics.average_precision(logits[:, c], target[:, c], w) == (
        pytest.approx(per_class[c], abs=1e-15))
  order = rng.permutation(n)
  assert metrics.mean_average_precision(logits[order], target[order],
                                        w[order]) == value
