"""Tests of the YouTube-8M metrics (vectorized vs. hand-computed and oracle)."""
import numpy as np
import pytest

from official_ext.benchmarks import yt8m_metrics_reference as metrics_reference
from official_ext.yt8m import metrics

KEYS = ('hit_at_one', 'perr', 'gap', 'map', 'map_all_classes')


def _check(result, expected, tol=1e-12):
  for key, value in expected.items():
    assert result[key] == pytest.approx(value, abs=tol), key


def _check_both(predictions, labels, expected, **kwargs):
  """Checks evaluate and the reference against hand-computed numbers."""
  _check(metrics.evaluate(predictions, labels, **kwargs), expected)
  _check(metrics_reference.evaluate_reference(predictions, labels, **kwargs),
         expected)


def test_three_videos_four_classes():
  predictions = np.array([[0.9, 0.8, 0.1, 0.3],
                          [0.2, 0.7, 0.6, 0.1],
                          [0.5, 0.4, 0.3, 0.05]], np.float32)
  labels = np.array([[1, 0, 0, 1],
                     [0, 1, 1, 0],
                     [0, 0, 0, 1]])
  # top_k=2: v0 -> c0 0.9 P, c1 0.8 N; v1 -> c1 0.7 P, c2 0.6 P;
  #          v2 -> c0 0.5 N, c1 0.4 N.
  # hit@1: v0 1, v1 1, v2 0 -> 2/3.
  # perr: v0 k=2 {c0 P, c1 N} 1/2; v1 k=2 2/2; v2 k=1 {c0 N} 0 -> 1.5/3.
  # gap: pooled 0.9P 0.8N 0.7P 0.6P 0.5N 0.4N; precisions at the positives
  #   1/1, 2/3, 3/4 -> (29/12) / 5 positives = 29/60.
  # per class: c0 {0.9P, 0.5N} / 1 pos = 1; c1 {0.8N, 0.7P} / 1 pos = 1/2;
  #   c2 {0.6P} / 1 = 1; c3 no pooled pair, 2 positives -> 0.
  # map = map_all = (1 + 1/2 + 1 + 0) / 4 = 0.625.
  expected = dict(hit_at_one=2 / 3, perr=0.5, gap=29 / 60, map=0.625,
                  map_all_classes=0.625)
  _check_both(predictions, labels, expected, top_k=2)
  result = metrics.evaluate(predictions, labels, top_k=2)
  assert result['num_videos'] == 3
  assert all(type(result[k]) is float for k in KEYS)  # pylint: disable=unidiomatic-typecheck
  assert type(result['num_videos']) is int  # pylint: disable=unidiomatic-typecheck


def _tie_case():
  predictions = np.array([[0.5, 0.9, 0.5, 0.5],
                          [0.5, 0.5, 0.2, 0.9],
                          [0.3, 0.7, 0.7, 0.1],
                          [0.3, 0.7, 0.7, 0.1]])
  labels = np.array([[0, 0, 0, 1],
                     [1, 0, 0, 0],
                     [0, 0, 1, 0],
                     [0, 1, 0, 0]])
  # top_k=2, ties -> lower class id:
  #   v0: c1 0.9 N, c0 0.5 N (c2, c3 tie at 0.5 and are cut; c3 is positive).
  #   v1: c3 0.9 N, c0 0.5 P (c1 ties at 0.5 and is cut).
  #   v2: c1 0.7 N, c2 0.7 P.   v3: c1 0.7 P, c2 0.7 N.
  # hit@1: only v3 -> 1/4. perr: each has k=1; only v3's top-1 is P -> 1/4.
  # gap, 4 positives in total: groups 0.9 {N, N} ends at rank 2, 0 pos;
  #   0.7 {N, P, P, N} ends at rank 6, cum 2 -> 2 * 2/6 = 2/3;
  #   0.5 {N, P} ends at rank 8, cum 3 -> 3/8.  gap = (2/3 + 3/8) / 4 = 25/96.
  # per class (1 positive each):
  #   c0 {0.5N, 0.5P}: one group, 1/2.     c1 {0.9N, 0.7N, 0.7P}: 1/3.
  #   c2 {0.7P, 0.7N}: 1/2.                c3 {0.9N}: 0 (its positive cut).
  # map = map_all = (1/2 + 1/3 + 1/2 + 0) / 4 = 1/3.
  expected = dict(hit_at_one=0.25, perr=0.25, gap=25 / 96, map=1 / 3,
                  map_all_classes=1 / 3)
  return predictions, labels, expected


def test_ties_within_topk_and_across_videos():
  predictions, labels, expected = _tie_case()
  _check_both(predictions, labels, expected, top_k=2)


def test_ties_with_large_class_count_use_lowest_ids():
  # Many classes so argpartition (not the small-C full sort) is exercised:
  # 50 classes all at 0.5, top_k=3 must keep classes 0, 1, 2.
  predictions = np.full((2, 50), 0.5, np.float32)
  labels = np.zeros((2, 50))
  labels[0, 2] = 1   # kept (3rd lowest id of the tie)
  labels[1, 3] = 1   # cut
  # Pooled: 6 pairs at 0.5, 1 positive -> one group ending at rank 6:
  # gap = (1/6) / 2. perr: k=1, top-1 is class 0 -> 0 for both; hit 0.
  # c2: pairs {0.5P, 0.5N} -> 1/2; c3: nothing pooled, 1 positive -> 0.
  expected = dict(hit_at_one=0.0, perr=0.0, gap=1 / 12, map=0.25,
                  map_all_classes=0.5 / 50)
  _check_both(predictions, labels, expected, top_k=3)


def test_zero_label_videos_and_classes_without_positives():
  predictions = np.array([[0.8, 0.1, 0.4],
                          [0.9, 0.2, 0.3],
                          [0.3, 0.6, 0.2]])
  labels = np.array([[1, 0, 0],
                     [0, 0, 0],
                     [0, 1, 0]])
  # hit@1: v0 c0 P, v1 (no labels) 0, v2 c1 P -> 2/3. perr: 1, 0, 1 -> 2/3.
  # gap, all 9 pairs pooled: 0.9N 0.8P(2/2... rank 2 -> 1/2) 0.6P(2/3) 0.4N
  #   0.3{N,N} 0.2{N,N} 0.1N -> (1/2 + 2/3) / 2 = 7/12.
  # c0 {0.9N, 0.8P, 0.3N} -> 1/2; c1 {0.6P, 0.2N, 0.1N} -> 1; c2 no positives.
  # map = (1/2 + 1) / 2 = 0.75; map_all = 1.5 / 3 = 0.5.
  expected = dict(hit_at_one=2 / 3, perr=2 / 3, gap=7 / 12, map=0.75,
                  map_all_classes=0.5)
  _check_both(predictions, labels, expected, top_k=3)


def test_top_k_smaller_than_label_count():
  predictions = np.array([[0.9, 0.8, 0.7, 0.6, 0.5],
                          [0.1, 0.2, 0.3, 0.4, 0.5]])
  labels = np.array([[1, 0, 1, 1, 0],
                     [1, 1, 1, 1, 0]])
  # top_k=2 but k_v = 3 and 4; perr uses the exact top-k_v:
  #   v0 top-3 c0 P, c1 N, c2 P -> 2/3; v1 top-4 c4 N, c3 P, c2 P, c1 P -> 3/4.
  # perr = (2/3 + 3/4) / 2 = 17/24. hit@1: v0 1, v1 0 -> 1/2.
  # gap: pooled 0.9P 0.8N (v0), 0.5N 0.4P (v1); 7 positives:
  #   (1/1 + 2/4) / 7 = 3/14.
  # c0 {0.9P}, 2 pos -> 1/2; c1 {0.8N}, 1 pos -> 0; c2 nothing, 2 pos -> 0;
  # c3 {0.4P}, 2 pos -> 1/2; c4 {0.5N}, no positives.
  # map = 1 / 4 classes; map_all = 1 / 5.
  expected = dict(hit_at_one=0.5, perr=17 / 24, gap=3 / 14, map=0.25,
                  map_all_classes=0.2)
  _check_both(predictions, labels, expected, top_k=2)


def test_label_weights_exclude_classes():
  predictions = np.array([[0.9, 0.8, 0.7, 0.1],
                          [0.3, 0.6, 0.2, 0.4],
                          [0.9, 0.8, 0.7, 0.6]])
  labels = np.array([[1, 0, 1, 0],
                     [0, 1, 0, 1],
                     [1, 1, 1, 1]])
  weights = np.array([[0, 1, 1, 1],
                      [1, 0, 1, 1],
                      [0, 0, 0, 0]])
  # v0 without c0: top-2 c1 0.8 N, c2 0.7 P; positives {c2}: hit 0, perr 0.
  # v1 without c1: top-2 c3 0.4 P, c0 0.3 N; positives {c3}: hit 1, perr 1.
  # v2 fully excluded: no positives, nothing pooled: hit 0, perr 0.
  # hit = perr = 1/3.
  # gap: 0.8N 0.7P(1/2) 0.4P(2/3) 0.3N, 2 positives -> (7/6) / 2 = 7/12.
  # c0, c1: no rated positives. c2 {0.7P} -> 1; c3 {0.4P} -> 1.
  # map = 1; map_all = 2/4.
  expected = dict(hit_at_one=1 / 3, perr=1 / 3, gap=7 / 12, map=1.0,
                  map_all_classes=0.5)
  _check_both(predictions, labels, expected, top_k=2, label_weights=weights)
  # Without weights the numbers differ (c0 of v0 would be a top-1 hit).
  assert metrics.evaluate(predictions, labels, top_k=2)['hit_at_one'] > 1 / 3


def test_non_positive_scores_never_count_for_perr():
  predictions = np.array([[0.0, 0.0, 0.0],
                          [0.2, 0.0, 0.0]])
  labels = np.array([[1, 0, 0],
                     [1, 1, 0]])
  # v0: k=1, top-1 is c0 (tie -> lowest id), positive but score 0 -> perr 0;
  #     hit@1 does not look at the score -> 1.
  # v1: k=2, top-2 c0 0.2 P (hit), c1 0.0 P (not a hit) -> 1/2; hit@1 1.
  # perr = 1/4, hit = 1.
  # gap: 0.2P (1/1), then one group of five 0.0 pairs {P,N,N,P,N} ending at
  #   rank 6 with 3 positives so far: 2 * 3/6 -> (1 + 1) / 3 = 2/3.
  # c0 {0.2P, 0.0P} 2 pos -> (1 + 2/2) / 2 = 1; c1 {0.0N, 0.0P} -> 1/2;
  # c2 no positives. map = 3/4, map_all = 1.5/3.
  expected = dict(hit_at_one=1.0, perr=0.25, gap=2 / 3, map=0.75,
                  map_all_classes=0.5)
  _check_both(predictions, labels, expected, top_k=3)


def test_empty_and_no_positive_inputs_give_zeros():
  for preds, labs in [(np.zeros((0, 5), np.float32), np.zeros((0, 5))),
                      (np.random.default_rng(0).random((7, 5)),
                       np.zeros((7, 5)))]:
    for fn in (metrics.evaluate, metrics_reference.evaluate_reference):
      result = fn(preds, labs, top_k=3)
      assert result['num_videos'] == preds.shape[0]
      for key in KEYS:
        assert result[key] == 0.0 and not np.isnan(result[key]), key
  acc = metrics.AveragePrecisionAccumulator(5, top_k=3)
  result = acc.result(return_per_class_ap=True)
  assert result['gap'] == 0.0 and result['num_videos'] == 0
  np.testing.assert_array_equal(result['per_class_ap'], np.zeros(5))


def _random_case(seed, n=200, c=30, round_scores=False, weights=False,
                 label_density=0.08):
  rng = np.random.default_rng(seed)
  predictions = rng.random((n, c)).astype(np.float32)
  if round_scores:
    predictions = np.round(predictions, 1)  # many ties, also at 0.0
  labels = (rng.random((n, c)) < label_density).astype(np.float32)
  labels[rng.random(n) < 0.1] = 0  # some videos without labels
  label_weights = None
  if weights:
    label_weights = (rng.random((n, c)) > 0.2).astype(np.float32)
    label_weights[0] = 0  # a fully excluded video
  return predictions, labels, label_weights


CASES = [
    dict(seed=0, top_k=20),
    dict(seed=1, top_k=5, label_density=0.3),  # many k_v > top_k rows
    dict(seed=2, top_k=20, round_scores=True),
    dict(seed=3, top_k=3, round_scores=True, label_density=0.2),
    dict(seed=4, top_k=40),  # top_k > C
    dict(seed=5, top_k=7, weights=True),
    dict(seed=6, top_k=4, round_scores=True, weights=True),
]


@pytest.mark.parametrize('case', CASES)
def test_random_matches_reference(case):
  case = dict(case)
  top_k = case.pop('top_k')
  predictions, labels, weights = _random_case(**case)
  got = metrics.evaluate(predictions, labels, top_k=top_k,
                         label_weights=weights)
  want = metrics_reference.evaluate_reference(predictions, labels, top_k=top_k,
                                              label_weights=weights)
  assert got['num_videos'] == want['num_videos'] == 200
  _check(got, {k: want[k] for k in KEYS}, tol=1e-9)


@pytest.mark.parametrize('case', [CASES[1], CASES[3], CASES[6]])
def test_uneven_batches_match_one_shot(case):
  case = dict(case)
  top_k = case.pop('top_k')
  predictions, labels, weights = _random_case(**case)
  one_shot = metrics.evaluate(predictions, labels, top_k=top_k,
                              label_weights=weights)
  acc = metrics.AveragePrecisionAccumulator(30, top_k=top_k)
  acc.accumulate(np.zeros((5, 30)), np.ones((5, 30)))  # dropped by reset()
  acc.reset()
  bounds = [0, 1, 1, 38, 120, 121, 200]  # includes an empty batch
  for lo, hi in zip(bounds[:-1], bounds[1:]):
    acc.accumulate(predictions[lo:hi], labels[lo:hi],
                   None if weights is None else weights[lo:hi])
  streamed = acc.result(return_per_class_ap=True)
  assert streamed['num_videos'] == 200
  _check(streamed, {k: one_shot[k] for k in KEYS}, tol=1e-12)
  per_class = streamed['per_class_ap']
  assert per_class.shape == (30,)
  assert per_class.sum() / 30 == pytest.approx(one_shot['map_all_classes'])


def test_internal_row_chunking(monkeypatch):
  predictions, labels, weights = _random_case(seed=7, round_scores=True,
                                              weights=True)
  whole = metrics.evaluate(predictions, labels, top_k=6, label_weights=weights)
  monkeypatch.setattr(metrics, '_CHUNK_ROWS', 7)
  chunked = metrics.evaluate(predictions, labels, top_k=6,
                             label_weights=weights)
  _check(chunked, {k: whole[k] for k in KEYS}, tol=1e-12)


def test_row_order_invariance():
  predictions, labels, _ = _tie_case()
  base = metrics.evaluate(predictions, labels, top_k=2)
  for perm in ([3, 2, 1, 0], [2, 0, 3, 1]):
    permuted = metrics.evaluate(predictions[perm], labels[perm], top_k=2)
    _check(permuted, {k: base[k] for k in KEYS}, tol=1e-12)
  predictions, labels, _ = _random_case(seed=8, round_scores=True)
  base = metrics.evaluate(predictions, labels, top_k=5)
  perm = np.random.default_rng(9).permutation(200)
  permuted = metrics.evaluate(predictions[perm], labels[perm], top_k=5)
  _check(permuted, {k: base[k] for k in KEYS}, tol=1e-12)


def test_shape_errors():
  with pytest.raises(ValueError, match=r'\(3, 4\).*\(3, 5\)'):
    metrics.evaluate(np.zeros((3, 4)), np.zeros((3, 5)))
  with pytest.raises(ValueError, match=r'\(12,\).*\(12,\)'):
    metrics.evaluate(np.zeros(12), np.zeros(12))
  with pytest.raises(ValueError, match='label_weights'):
    metrics.evaluate(np.zeros((3, 4)), np.zeros((3, 4)),
                     label_weights=np.ones((3, 5)))
  with pytest.raises(ValueError, match=r'\(3, 4\).*\(4, 3\)'):
    metrics_reference.evaluate_reference(np.zeros((3, 4)), np.zeros((4, 3)))
  acc = metrics.AveragePrecisionAccumulator(num_classes=5)
  with pytest.raises(ValueError, match='num_classes=5'):
    acc.accumulate(np.zeros((2, 4)), np.zeros((2, 4)))
  with pytest.raises(ValueError, match='predictions.*labels'):
    acc.accumulate(np.zeros((2, 5)), np.zeros((2, 5, 1)))
  with pytest.raises(ValueError, match='num_classes'):
    metrics.AveragePrecisionAccumulator(num_classes=0)
  with pytest.raises(ValueError, match='top_k'):
    metrics.AveragePrecisionAccumulator(num_classes=3, top_k=0)


def test_nan_predictions_rejected_without_changing_state():
  acc = metrics.AveragePrecisionAccumulator(num_classes=3)
  bad = np.array([[0.1, np.nan, 0.3]])
  with pytest.raises(ValueError, match='NaN'):
    acc.accumulate(bad, np.ones((1, 3)))
  assert acc.result()['num_videos'] == 0


def _pooled_top_k(predictions, labels, top_k, label_weights=None):
  """Every video's top-k (score, positive, class), ties -> lower class id;
  unrated classes (weight 0) are never pooled. Also the class positives."""
  scores = np.asarray(predictions, np.float64)
  positive = np.asarray(labels) > 0
  if label_weights is not None:
    rated = np.asarray(label_weights) != 0
    scores = np.where(rated, scores, -np.inf)
    positive &= rated
  idx = np.argsort(-scores, axis=1, kind='stable')[:, :top_k]
  s = np.take_along_axis(scores, idx, axis=1).reshape(-1)
  p = np.take_along_axis(positive, idx, axis=1).reshape(-1)
  c = idx.reshape(-1)
  keep = s != -np.inf
  return s[keep], p[keep], c[keep], positive.sum(axis=0)


@pytest.mark.parametrize('case', CASES)
def test_gap_and_map_are_the_core_average_precision(case):
  """GAP / mAP = `core.average_precision` over the pooled top-k pairs."""
  from official_ext.core import average_precision as core_ap  # pylint: disable=g-import-not-at-top
  case = dict(case)
  top_k = case.pop('top_k')
  predictions, labels, weights = _random_case(**case)
  got = metrics.AveragePrecisionAccumulator(30, top_k)
  got.accumulate(predictions, labels, weights)
  got = got.result(return_per_class_ap=True)
  s, p, c, class_pos = _pooled_top_k(predictions, labels, top_k, weights)
  per_class, gap = core_ap.grouped_average_precision(
      s, p, c, 30, num_positives=class_pos, return_pooled=True)
  assert got['gap'] == pytest.approx(gap, abs=1e-12)
  assert got['gap'] == pytest.approx(core_ap.average_precision(
      s, p, num_positives=class_pos.sum()), abs=1e-12)
  has = class_pos > 0
  np.testing.assert_allclose(got['per_class_ap'][has], per_class[has],
                             rtol=0, atol=1e-12)
  np.testing.assert_array_equal(got['per_class_ap'][~has], 0.0)
  assert got['map'] == pytest.approx(np.mean(per_class[has]), abs=1e-12)
  assert got['map_all_classes'] == pytest.approx(
      np.sum(per_class[has]) / 30, abs=1e-12)


def test_gap_depends_on_scores_not_order_of_tied_pairs():
  # Integer scores: nearly every pooled pair is tied with others; the rows
  # shuffled (another batching / worker order) give bit-identical metrics.
  rng = np.random.default_rng(12)
  predictions = rng.integers(0, 4, (300, 25)).astype(np.float32)
  labels = (rng.random((300, 25)) < 0.15).astype(np.float32)
  base = metrics.evaluate(predictions, labels, top_k=6)
  perm = rng.permutation(300)
  acc = metrics.AveragePrecisionAccumulator(25, top_k=6)
  for lo in range(0, 300, 70):
    rows = perm[lo:lo + 70]
    acc.accumulate(predictions[rows], labels[rows])
  shuffled = acc.result()
  for key in KEYS:
    assert shuffled[key] == base[key], key


def test_segment_eval_ap_is_the_core_average_precision(tmp_path):
  """The challenge's per-class AP@K = `core.average_precision` of the kept
  rated entries, earlier position = higher score, over all positives."""
  from official_ext.core import average_precision as core_ap  # pylint: disable=g-import-not-at-top
  from official_ext.yt8m import segment_eval  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(4)
  segments = [f'v{v}:{5 * s}' for v in range(12) for s in range(4)]
  scores, lines = {}, ['Class,Segments']
  for cls in range(3):
    rated = rng.choice(len(segments), 20, replace=False)
    for i in rated:
      scores[(segments[i], cls)] = float(rng.random() < 0.4)
    scores[(segments[rated[0]], cls)] = 1.0  # At least one positive.
    listed = rng.permutation(len(segments))[:30]  # Some unrated, some cut.
    lines.append(f'{cls},' + ' '.join(segments[i] for i in listed))
  positives = {}
  for (_, cls), value in scores.items():
    positives[cls] = positives.get(cls, 0) + int(value > 0)
  ratings = segment_eval.SegmentRatings(scores, positives, 12)
  sub = tmp_path / 'sub.csv'
  sub.write_text('\n'.join(lines) + '\n')
  result = segment_eval.mean_average_precision(str(sub), ratings, top_k=25)
  want = []
  for cls, line in enumerate(lines[1:]):
    kept = [s for s in line.split(',')[1].split()[:25]
            if (s, cls) in scores]
    labels = [scores[(s, cls)] > 0 for s in kept]
    want.append(core_ap.average_precision(
        -np.arange(len(kept), dtype=float), labels,
        num_positives=positives[cls]))
    assert result['per_class_ap'][cls] == pytest.approx(want[-1], abs=1e-15)
  assert 0 < result['map'] == pytest.approx(np.mean(want))


def test_ap_at_n_hand_computed():
  """`top_n` (the starter's AP@n): each class's ranked pooled list, and the
  GAP's pooled list, cut to n ranks, over min(positives, n)."""
  predictions, labels, _ = _tie_case()
  # Pooled lists of _tie_case with top_k=2 (see there). n = 1:
  #   gap: the first rank is half of the tie {0.9: N, N}: no positive -> 0.
  #   c0 {0.5: N, P}: half the tie kept, positive weight 1/2 at precision
  #     (1/2) / 1 -> 1/4 over min(1, 1).   c1 {0.9 N, ...}: 0.
  #   c2 {0.7: P, N}: 1/4.                 c3: 0.   map@1 = 1/2 / 4 = 1/8.
  # The other metrics are _tie_case's, unchanged.
  expected = dict(gap_at_1=0.0, map_at_1=1 / 8, hit_at_one=0.25, perr=0.25,
                  gap=25 / 96, map=1 / 3)
  _check_both(predictions, labels, expected, top_k=2, top_n=1)
  # n = 3: gap: {0.9: N, N} then 1 of the 4 ranks of {0.7: N, P, P, N}:
  #   positive weight 2/4 at precision (1/2) / 3 -> (1/12) / min(4, 3) =
  #   1/36. Per class, n = 3 covers every list: map@3 = map = 1/3.
  _check_both(predictions, labels, dict(gap_at_3=1 / 36, map_at_3=1 / 3),
              top_k=2, top_n=3)
  # Three videos of test_three_videos_four_classes, top_k=2, n = 2:
  # gap {0.9 P, 0.8 N} -> 1 / min(5, 2) = 1/2; per class c0 1, c1 1/2, c2 1,
  # c3 0 -> map@2 = 0.625.
  predictions = np.array([[0.9, 0.8, 0.1, 0.3], [0.2, 0.7, 0.6, 0.1],
                          [0.5, 0.4, 0.3, 0.05]])
  labels = np.array([[1, 0, 0, 1], [0, 1, 1, 0], [0, 0, 0, 1]])
  _check_both(predictions, labels, dict(gap_at_2=0.5, map_at_2=0.625),
              top_k=2, top_n=2)
  # Without top_n no AP@n key; with it, per-class AP@n on request.
  assert not any('_at_' in k and k != 'hit_at_one'
                 for k in metrics.evaluate(predictions, labels))
  acc = metrics.AveragePrecisionAccumulator(4, top_k=2, top_n=2)
  acc.accumulate(predictions, labels)
  np.testing.assert_allclose(
      acc.result(return_per_class_ap=True)['per_class_ap_at_n'],
      [1, 0.5, 1, 0])
  np.testing.assert_array_equal(acc.class_positives, [1, 1, 1, 2])
  with pytest.raises(ValueError, match='top_n must be None or a positive'):
    metrics.AveragePrecisionAccumulator(4, top_n=0)


@pytest.mark.parametrize('case', [CASES[3], CASES[6]])
def test_ap_at_n_random_matches_reference(case):
  case = dict(case)
  top_k = case.pop('top_k')
  predictions, labels, weights = _random_case(**case)
  for top_n in (5, 60):
    got = metrics.evaluate(predictions, labels, top_k=top_k,
                           label_weights=weights, top_n=top_n)
    want = metrics_reference.evaluate_reference(
        predictions, labels, top_k=top_k, label_weights=weights, top_n=top_n)
    _check(got, {k: want[k] for k in metrics.top_n_keys(top_n)}, tol=1e-9)
