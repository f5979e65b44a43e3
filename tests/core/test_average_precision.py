"""The one average-precision implementation (`official_ext.core`)."""
import math

import numpy as np
import pytest

from official_ext.core import average_precision as ap

try:  # The hand-computed tests run without scikit-learn.
  from sklearn import metrics as sk_metrics  # pylint: disable=g-import-not-at-top
except ImportError:
  sk_metrics = None

needs_sklearn = pytest.mark.skipif(sk_metrics is None,
                                   reason='scikit-learn is not installed')


def test_hand_computed_without_ties():
  # Ranked P N P N P: precisions at the positives 1/1, 2/3, 3/5.
  assert ap.average_precision([0.9, 0.8, 0.7, 0.6, 0.5],
                              [1, 0, 1, 0, 1]) == pytest.approx(
                                  (1 + 2 / 3 + 3 / 5) / 3)
  # Input order is irrelevant: the same pairs listed backwards.
  assert ap.average_precision([0.5, 0.6, 0.7, 0.8, 0.9],
                              [1, 0, 1, 0, 1]) == pytest.approx(
                                  (1 + 2 / 3 + 3 / 5) / 3)


def test_hand_computed_ties():
  # Scores 3 | 2 2 2 | 1 with labels P | N P P | N. Tie groups:
  #   {3: P}        ends at rank 1, 1 positive so far: precision 1/1;
  #   {2: N, P, P}  ends at rank 4, 3 positives so far: precision 3/4, given
  #                 to both positives of the group;
  #   {1: N}        no positive.
  # AP = (1 + 2 * 3/4) / 3 = 5/6. Ranking the tie by input order instead
  # would give (1 + 2/3 + 3/4) / 3 = 29/36 for N P P and 1 for P P N.
  assert ap.average_precision([3, 2, 2, 2, 1], [1, 0, 1, 1, 0]) == (
      pytest.approx(5 / 6))
  assert ap.average_precision([3, 2, 2, 2, 1], [1, 1, 1, 0, 0]) == (
      pytest.approx(5 / 6))
  # Everything tied: one group, precision = prevalence 2/4 for both.
  assert ap.average_precision([0.5] * 4, [1, 0, 0, 1]) == 0.5
  # A tie between a positive and a negative at the top, then a positive:
  # {0.9: P, N} precision 1/2; {0.1: P} precision 2/3 -> (1/2 + 2/3) / 2.
  assert ap.average_precision([0.9, 0.9, 0.1], [1, 0, 1]) == pytest.approx(
      (1 / 2 + 2 / 3) / 2)


def test_hand_computed_weights():
  # Scores 0.8 | 0.5 0.5 | 0.2, labels P | P N | P, weights 2 | 1 3 | 0.5;
  # positive weight 3.5.
  #   {0.8: P w2}        TP 2,   seen 2:   precision 1;
  #   {0.5: P w1, N w3}  TP 3,   seen 6:   precision 1/2;
  #   {0.2: P w0.5}      TP 3.5, seen 6.5: precision 7/13.
  # AP = (2 * 1 + 1 * 1/2 + 0.5 * 7/13) / 3.5 = (36/13) / 3.5 = 72/91.
  scores = [0.8, 0.5, 0.5, 0.2]
  labels = [1, 1, 0, 1]
  weights = [2, 1, 3, 0.5]
  assert ap.average_precision(scores, labels, weights) == pytest.approx(
      72 / 91)
  # A pair of weight 0 is dropped, whatever its score and label.
  assert ap.average_precision(scores + [0.9, 0.5], labels + [0, 1],
                              weights + [0, 0]) == pytest.approx(72 / 91)
  # Integer weights are repetitions: weight 2 == the pair listed twice.
  assert ap.average_precision([0.8, 0.5, 0.2], [1, 0, 1], [2, 1, 1]) == (
      pytest.approx(ap.average_precision([0.8, 0.8, 0.5, 0.2], [1, 1, 0, 1])))


def test_cut_counts_missing_positives_in_the_denominator():
  # Only the top-2 pairs were kept (a cut); the data has 3 positives.
  # Kept: 0.9 P (precision 1), 0.4 N. AP = 1 / 3.
  assert ap.average_precision([0.9, 0.4], [1, 0], num_positives=3) == (
      pytest.approx(1 / 3))
  # Weighted: num_positives is in weight units.
  # {0.9: P w2} precision 1 -> 2 / 8.
  assert ap.average_precision([0.9, 0.4], [1, 0], [2, 5],
                              num_positives=8) == pytest.approx(0.25)
  # A list whose positives were all cut away scores 0; no positive: NaN.
  assert ap.average_precision([0.9], [0], num_positives=2) == 0.0
  assert math.isnan(ap.average_precision([0.9], [0]))
  assert math.isnan(ap.average_precision([], []))


def test_grouped_hand_computed_with_pooled():
  # Group 0: 0.9 P, 0.5 N, 0.5 P; group 1: 0.7 N, 0.5 P; group 2 nothing.
  scores = [0.9, 0.5, 0.7, 0.5, 0.5]
  labels = [1, 0, 0, 1, 1]
  groups = [0, 0, 1, 1, 0]
  # Group 0: {0.9 P} 1/1, {0.5 N P} 2/3 -> (1 + 2/3) / 2 = 5/6.
  # Group 1: {0.7 N}, {0.5 P} 1/2 -> 1/2 (2 positives in the data: 1/4).
  # Group 2: no positive -> NaN.
  per_group = ap.grouped_average_precision(scores, labels, groups, 3)
  np.testing.assert_allclose(per_group, [5 / 6, 1 / 2, np.nan])
  # Pooled: {0.9 P} 1/1, {0.7 N}, {0.5 N P P} ends at rank 5 with 3
  # positives: 3/5 for two positives -> (1 + 6/5) / 3 = 11/15; with
  # num_positives [2, 2, 1] (5 in all) -> (11/5) / 5 = 11/25.
  per_group, pooled = ap.grouped_average_precision(
      scores, labels, groups, 3, num_positives=[2, 2, 1], return_pooled=True)
  np.testing.assert_allclose(per_group, [5 / 6, 1 / 4, 0.0])
  assert pooled == pytest.approx(11 / 25)
  _, pooled = ap.grouped_average_precision(scores, labels, groups, 3,
                                           return_pooled=True)
  assert pooled == pytest.approx(11 / 15)


def _random_pairs(seed, n=400, decimals=None, weighted=False):
  rng = np.random.default_rng(seed)
  labels = (rng.random(n) < 0.3).astype(np.int64)
  scores = rng.random(n) + 0.3 * labels
  if decimals is not None:
    scores = np.round(scores, decimals)  # Ties.
  weights = rng.integers(0, 4, n).astype(float) if weighted else None
  if weighted:
    weights[rng.random(n) < 0.5] *= rng.random()  # Non-integer weights too.
  return scores, labels, weights


@needs_sklearn
@pytest.mark.parametrize('decimals', [None, 2, 1, 0])
@pytest.mark.parametrize('weighted', [False, True])
def test_matches_sklearn(decimals, weighted):
  scores, labels, weights = _random_pairs(3, decimals=decimals,
                                          weighted=weighted)
  if decimals is not None:
    assert np.unique(scores).size < scores.size  # There are ties.
  assert ap.average_precision(scores, labels, weights) == pytest.approx(
      sk_metrics.average_precision_score(labels, scores,
                                         sample_weight=weights), abs=1e-12)


@needs_sklearn
@pytest.mark.parametrize('decimals', [None, 1])
def test_per_class_matches_sklearn(decimals):
  rng = np.random.default_rng(5)
  labels = (rng.random((300, 6)) < 0.2).astype(np.float32)
  scores = rng.random((300, 6)).astype(np.float32) + 0.5 * labels
  if decimals is not None:
    scores = np.round(scores, decimals)
  weights = rng.integers(0, 3, 300).astype(float)
  for w in (None, weights):
    want = sk_metrics.average_precision_score(labels, scores, average=None,
                                              sample_weight=w)
    np.testing.assert_allclose(ap.per_class_average_precision(
        scores, labels, w), want, rtol=0, atol=1e-12)
    assert ap.mean_average_precision(scores, labels, w) == pytest.approx(
        sk_metrics.average_precision_score(labels, scores, average='macro',
                                           sample_weight=w), abs=1e-12)


def test_permutation_invariance_with_many_ties():
  rng = np.random.default_rng(11)
  n = 500
  scores = rng.integers(0, 5, n).astype(np.float32)  # 5 values: many ties.
  labels = (rng.random(n) < 0.4).astype(np.int64)
  groups = rng.integers(0, 4, n)
  weights = rng.integers(0, 4, n).astype(float)  # Integer: exact sums.
  base = (ap.average_precision(scores, labels),
          ap.average_precision(scores, labels, weights),
          ap.grouped_average_precision(scores, labels, groups, 4,
                                       return_pooled=True),
          ap.grouped_average_precision(scores, labels, groups, 4, weights))
  for seed in range(3):
    p = np.random.default_rng(seed).permutation(n)
    got = (ap.average_precision(scores[p], labels[p]),
           ap.average_precision(scores[p], labels[p], weights[p]),
           ap.grouped_average_precision(scores[p], labels[p], groups[p], 4,
                                        return_pooled=True),
           ap.grouped_average_precision(scores[p], labels[p], groups[p], 4,
                                        weights[p]))
    assert got[0] == base[0] and got[1] == base[1]  # Bit-identical.
    np.testing.assert_array_equal(got[2][0], base[2][0])
    assert got[2][1] == base[2][1]
    np.testing.assert_array_equal(got[3], base[3])
  # Rows of a [N, C] matrix shuffled.
  matrix = rng.integers(0, 3, (200, 5)).astype(np.float32)
  truth = (rng.random((200, 5)) < 0.3).astype(np.float32)
  p = rng.permutation(200)
  np.testing.assert_array_equal(
      ap.per_class_average_precision(matrix[p], truth[p]),
      ap.per_class_average_precision(matrix, truth))


def test_grouped_equals_one_list_per_group():
  scores, labels, weights = _random_pairs(7, decimals=1, weighted=True)
  rng = np.random.default_rng(8)
  groups = rng.integers(0, 5, scores.size)
  num_positives = np.array([
      np.sum(weights[(groups == g) & (labels > 0)]) + g for g in range(5)])
  per_group, pooled = ap.grouped_average_precision(
      scores, labels, groups, 6, weights, np.append(num_positives, 0.0),
      return_pooled=True)
  for g in range(5):
    sel = groups == g
    assert per_group[g] == pytest.approx(ap.average_precision(
        scores[sel], labels[sel], weights[sel], num_positives[g]), abs=1e-12)
  assert math.isnan(per_group[5])
  assert pooled == pytest.approx(ap.average_precision(
      scores, labels, weights, num_positives.sum()), abs=1e-12)
  # More than 2**16 group ids (no 16-bit radix sort): same values.
  many = ap.grouped_average_precision(scores, labels, groups + 70_000,
                                      70_006, weights)
  np.testing.assert_array_equal(
      many[70_000:70_005],
      ap.grouped_average_precision(scores, labels, groups, 5, weights))


def test_mean_average_precision_skips_classes_without_positive():
  scores = np.array([[0.9, 0.1, 0.3], [0.8, 0.7, 0.2], [0.1, 0.2, 0.1]])
  labels = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 0]])
  per_class = []
  # Class 0: positives at ranks 1 and 3 -> (1/1 + 2/3) / 2 = 5/6; class 1:
  # rank 1 -> 1; class 2: no positive (NaN, left out).
  assert ap.mean_average_precision(scores, labels, per_class=per_class) == (
      pytest.approx((5 / 6 + 1) / 2))
  assert per_class[:2] == pytest.approx([5 / 6, 1.0])
  assert math.isnan(per_class[2])
  assert math.isnan(ap.mean_average_precision(scores, np.zeros((3, 3))))
  # Per-row weights: weight 0 on row 2 removes class 0's second positive.
  assert ap.per_class_average_precision(scores, labels, [1, 1, 0])[0] == 1.0


def test_bad_inputs_are_named():
  with pytest.raises(ValueError, match='NaN'):
    ap.average_precision([0.1, np.nan], [1, 0])
  with pytest.raises(ValueError, match=r'\(3,\).*\(2,\)'):
    ap.average_precision([0.1, 0.2, 0.3], [1, 0])
  with pytest.raises(ValueError, match='weights must be >= 0'):
    ap.average_precision([0.1, 0.2], [1, 0], [1, -1])
  with pytest.raises(ValueError, match='weights must be >= 0'):
    ap.average_precision([0.1, 0.2], [1, 0], [1, np.nan])
  with pytest.raises(ValueError, match=r'num_positives \(1\) is less.*\(2\)'):
    ap.average_precision([0.1, 0.2], [1, 1], num_positives=1)
  with pytest.raises(ValueError, match=r'\[0, 2\).*0 to 2'):
    ap.grouped_average_precision([0.1, 0.2], [1, 1], [0, 2], 2)
  with pytest.raises(ValueError, match='num_positives of group 1'):
    ap.grouped_average_precision([0.1, 0.2], [1, 1], [0, 1], 2,
                                 num_positives=[1, 0])
  with pytest.raises(ValueError, match='num_groups'):
    ap.grouped_average_precision([0.1], [1], [0], 0)
  with pytest.raises(ValueError, match=r'weights shape \(3,\)'):
    ap.per_class_average_precision(np.zeros((2, 2)), np.zeros((2, 2)),
                                   [1, 1, 1])
  with pytest.raises(ValueError, match=r'\(2, 2\).*\(2, 3\)'):
    ap.per_class_average_precision(np.zeros((2, 2)), np.zeros((2, 3)))


def _starter_ap_at_n(scores, labels, n, num_positives=None):
  """AP@n as the YouTube-8M starter defines it (`ap_at_n`), for lists
  without ties: sum of precision@i over the positives among the first n
  ranks, divided by min(positives, n). Written independently of `ap`."""
  ranked = np.asarray(labels)[np.argsort(-np.asarray(scores))] > 0
  total = ranked.sum() if num_positives is None else num_positives
  if total == 0:
    return float('nan')
  hits = np.cumsum(ranked[:n])
  at_hits = hits[ranked[:n]] / (np.flatnonzero(ranked[:n]) + 1)
  return float(at_hits.sum() / min(total, n))


def test_ap_at_n_hand_computed_with_ties_and_n_below_the_positives():
  # Scores 0.9 | 0.8 0.8 0.8 | 0.5 | 0.3, labels P | N P P | P | N:
  # 4 positives, n = 3. The tie group {0.8} spans ranks 2-4: 2 of its 3
  # ranks lie within the first 3, so it is kept at 2/3 of its weight:
  # positive weight 2 * 2/3 = 4/3, and it ends at rank 3 with
  # 1 + 4/3 = 7/3 positives: precision 7/9.
  # AP@3 = (1 * 1 + 4/3 * 7/9) / min(4, 3) = (1 + 28/27) / 3 = 55/81.
  scores = [0.9, 0.8, 0.8, 0.8, 0.5, 0.3]
  labels = [1, 0, 1, 1, 1, 0]
  assert ap.average_precision(scores, labels, top_n=3) == pytest.approx(
      55 / 81, abs=1e-15)
  # n = 4 ends the tie group: (1 + 2 * 3/4) / 4 = 5/8; n = 1: 1 / 1.
  assert ap.average_precision(scores, labels, top_n=4) == pytest.approx(
      5 / 8, abs=1e-15)
  assert ap.average_precision(scores, labels, top_n=1) == 1.0
  # n beyond the list: the whole list over min(num_positives, n).
  whole = ap.average_precision(scores, labels)
  assert ap.average_precision(scores, labels, top_n=100) == whole
  assert ap.average_precision(scores, labels, top_n=6) == whole
  # A cut list (num_positives 10): n = 3 divides by 3, not 10.
  assert ap.average_precision(scores, labels, num_positives=10,
                              top_n=3) == pytest.approx(55 / 81, abs=1e-15)
  # Without ties: the starter's formula, n below and above the positives.
  rng = np.random.default_rng(21)
  for _ in range(20):
    size = int(rng.integers(1, 40))
    s = rng.permutation(size) / size  # Distinct scores.
    y = (rng.random(size) < 0.4).astype(np.int64)
    for n in (1, 2, 5, 50):
      got = ap.average_precision(s, y, top_n=n)
      want = _starter_ap_at_n(s, y, n)
      assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(
          want, abs=1e-12), (size, n)
      extra = int(y.sum()) + 3
      assert ap.average_precision(s, y, num_positives=extra, top_n=n) == (
          pytest.approx(_starter_ap_at_n(s, y, n, extra), abs=1e-12))


def test_ap_at_n_grouped_pooled_and_order_independent():
  rng = np.random.default_rng(12)
  size = 300
  scores = rng.integers(0, 6, size).astype(np.float32)  # Many ties.
  labels = (rng.random(size) < 0.4).astype(np.int64)
  groups = rng.integers(0, 4, size)
  num_positives = np.bincount(groups, labels, 4) + np.arange(4)
  for n in (7, 40):
    per_group, pooled = ap.grouped_average_precision(
        scores, labels, groups, 4, num_positives=num_positives,
        return_pooled=True, top_n=n)
    # Each group is its own AP@n list; the pooled list is cut as a whole.
    for g in range(4):
      sel = groups == g
      assert per_group[g] == pytest.approx(ap.average_precision(
          scores[sel], labels[sel], num_positives=num_positives[g],
          top_n=n), abs=1e-15)
    assert pooled == ap.average_precision(
        scores, labels, num_positives=num_positives.sum(), top_n=n)
    # Any input order: bit-identical.
    for seed in range(2):
      p = np.random.default_rng(seed).permutation(size)
      again = ap.grouped_average_precision(
          scores[p], labels[p], groups[p], 4, num_positives=num_positives,
          return_pooled=True, top_n=n)
      np.testing.assert_array_equal(again[0], per_group)
      assert again[1] == pooled
  # Integer weights are repetitions, under the cut too.
  assert ap.average_precision([0.8, 0.5, 0.5, 0.2], [1, 1, 0, 1],
                              [2, 1, 1, 1], top_n=3) == pytest.approx(
                                  ap.average_precision(
                                      [0.8, 0.8, 0.5, 0.5, 0.2],
                                      [1, 1, 1, 0, 1], top_n=3), abs=1e-15)
  for bad in (0, -1, 2.5, True):
    with pytest.raises(ValueError, match='top_n must be None'):
      ap.average_precision([0.1], [1], top_n=bad)
