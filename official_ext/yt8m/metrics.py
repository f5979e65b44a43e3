"""YouTube-8M challenge evaluation metrics, vectorized numpy (no TensorFlow).

Inputs are `predictions` [N, C] float scores and `labels` [N, C] (0/1; any
value > 0 counts as a positive) for N videos over C classes, optionally with
`label_weights` [N, C] (segment-level data).

Definitions (those of the YouTube-8M challenge):

* Top-k of a video: its `top_k` highest scores, ties broken by the lower class
  id (deterministic). If C < top_k, all C classes.
* `hit_at_one`: share of videos whose top-scoring class (ties -> lower class
  id) is a true label. Videos with no labels count as 0. The score value itself
  is not checked.
* `perr` (precision at equal recall rate): mean over videos of the precision
  among a video's top-k_v predictions, k_v = that video's number of true
  labels. A video without labels scores 0; a prediction with score <= 0 never
  counts as a hit. k_v may exceed `top_k`; such rows are handled exactly (a
  full stable sort of just those rows).
* `gap` (global average precision): non-interpolated average precision over
  the pooled (score, label) pairs of every video's top-`top_k` predictions,
  divided by the total number of true labels in the data (all positives, not
  only those that made a top-k), as the YouTube-8M starter code defines it.
  The AP and its tie rule are `official_ext.core.average_precision`'s: all
  pairs with equal score form one threshold, and every positive of that
  group gets the precision measured at the end of the group:
  AP = sum over positive pairs of precision@(last rank of its tie group)
  / total positives. The value therefore does not depend on input order.
* `map`: mean, over the classes with at least one true label in the data, of
  the per-class AP over the same pooled top-k pairs of that class (same
  function and tie rule), each divided by that class's total positives in
  the data.
* `map_all_classes`: the same per-class AP summed over all C classes and
  divided by C; classes without positives count 0 (Model Garden's
  convention).
* `label_weights`: a class with weight 0 in an example is not rated there: its
  score is masked to -inf and its label to 0, so it is never in the example's
  top-k, never its top-1 hit, never a positive and not counted in k_v. Pairs
  with score -inf are never pooled. Any non-zero weight means "rated"; weights
  do not otherwise scale anything.
* AP@n (`top_n`, the starter's `top_n`; off by default): `map_at_{n}` is
  the mean, over the classes with a positive, of each class's AP over only
  the first n of its ranked pooled top-k pairs, divided by min(the class's
  positives, n) (the starter's mAP with `top_n`); `gap_at_{n}` is the same
  cut applied to the GAP's pooled list (the starter's GAP ignores `top_n`:
  `gap` is that one). `core.average_precision` defines the cut, ties
  included. The starter's `top_k` is the other cut: how many predictions of
  each video enter the pooled lists at all. AP@n ranks the pooled pairs a
  second time: `result()` takes about 2.3x as long.
* Empty input (N = 0, or no positives at all) gives 0.0 for every metric
  here; an evaluation must not report those zeros as results: the task checks
  `num_videos` (`official_ext.core.input.eval_padding.check_examples_seen`) and
  fails naming the dataset.
* `example_mask` ([N] bool, `accumulate`): rows marked False (the padding of
  a static-shape last batch) are not videos and are ignored entirely.

`evaluate` is implemented by running `AveragePrecisionAccumulator` once, so the
one-shot and streaming results come from one code path. The accumulator keeps
O(N * top_k) memory: the pooled top-k (score, label, class) triples, per-class
positive counts and running sums for hit@1 / perr. Rows are processed in
chunks of `_CHUNK_ROWS`; the top-k is found from the k-th largest value per
row (`np.partition`, no full sort of [N, C]) and only those k are sorted, so
100,000 x 3,862 float32 predictions take a few seconds. `result()` hands
the pooled pairs to `core.average_precision.grouped_average_precision`, which
computes every class's AP and the GAP from one sort.
The straightforward per-video oracle lives in `metrics_reference.py`.
"""
from typing import Dict, Optional

import numpy as np

from official_ext.core import average_precision

# Rows processed at once; bounds the [rows, C] temporaries.
_CHUNK_ROWS = 8192

METRIC_KEYS = ('hit_at_one', 'perr', 'gap', 'map', 'map_all_classes')


def top_n_keys(top_n: int) -> tuple:
  """The keys of the AP@n metrics `result()` adds with top_n set."""
  return (f'gap_at_{top_n}', f'map_at_{top_n}')


def _as_2d_inputs(predictions, labels, label_weights):
  """Validates and converts inputs.

  Returns:
    (predictions [N, C] floating, labels [N, C], label_weights [N, C] or None)
    as numpy arrays (no copies when already numpy).

  Raises:
    ValueError: if predictions/labels are not 2-D with equal shape, or
      label_weights has a different shape.
  """
  predictions = np.asarray(predictions)
  labels = np.asarray(labels)
  if (predictions.ndim != 2 or labels.ndim != 2 or
      predictions.shape != labels.shape):
    raise ValueError(
        'predictions and labels must both be 2-D [N, C] arrays of equal '
        f'shape; got predictions shape {predictions.shape} and labels shape '
        f'{labels.shape}.')
  if label_weights is not None:
    label_weights = np.asarray(label_weights)
    if label_weights.shape != predictions.shape:
      raise ValueError(
          f'label_weights shape {label_weights.shape} must equal predictions '
          f'shape {predictions.shape}.')
  if not np.issubdtype(predictions.dtype, np.floating):
    predictions = predictions.astype(np.float64)
  return predictions, labels, label_weights


def _top_k_indices(scores: np.ndarray, k: int) -> np.ndarray:
  """Top-k class ids per row ordered by (score desc, class id asc).

  Args:
    scores: [n, C] floating array without NaN.
    k: 1 <= k <= C.

  Returns:
    [n, k] int64 class ids; row i lists the k best classes of row i, best
    first, ties broken by the lower class id.
  """
  n, c = scores.shape
  if k >= c:
    return np.argsort(-scores, axis=1, kind='stable')
  # The k-th largest value per row; np.partition is much faster than
  # np.argpartition here.
  kth = np.partition(scores, c - k, axis=1)[:, c - k]
  # Flat positions of every score >= the k-th largest, row-major: per row the
  # class ids ascend. A row has more than k of them only on a tie at the k-th
  # value; there keep just the lowest class ids of the tie. Work stays
  # O(selected) rather than O(rows * C).
  sel = np.flatnonzero(scores >= kth[:, None])
  if sel.size != n * k:
    row = sel // c
    tied = np.flatnonzero(scores.reshape(-1)[sel] == kth[row])
    tied_row = row[tied]
    n_tied = np.bincount(tied_row, minlength=n)
    n_sel = np.bincount(row, minlength=n)
    need = k - (n_sel - n_tied)  # tied entries each row may keep (>= 1)
    rank = np.arange(tied.size) - (np.cumsum(n_tied) - n_tied)[tied_row]
    keep = np.ones(sel.size, dtype=bool)
    keep[tied[rank >= need[tied_row]]] = False
    sel = sel[keep]
  # Exactly k per row now; class ids ascend within a row, so the stable sort
  # below breaks score ties by the lower class id.
  idx = (sel % c).reshape(n, k)
  vals = np.take_along_axis(scores, idx, axis=1)
  order = np.argsort(-vals, axis=1, kind='stable')
  return np.take_along_axis(idx, order, axis=1)


def _hits_at(scores: np.ndarray, positive: np.ndarray, order: np.ndarray,
             num_pos: np.ndarray) -> np.ndarray:
  """Hits (positive and score > 0) among the first num_pos of `order`.

  Args:
    scores: [r, C] floating.
    positive: [r, C] bool.
    order: [r, m] int class ids, best first.
    num_pos: [r] int, 1 <= num_pos <= m.

  Returns:
    [r] int64 number of hits among each row's first num_pos classes.
  """
  hit = (np.take_along_axis(positive, order, axis=1) &
         (np.take_along_axis(scores, order, axis=1) > 0))
  cum = np.cumsum(hit, axis=1)
  return cum[np.arange(order.shape[0]), num_pos - 1]


class AveragePrecisionAccumulator:
  """Streaming YouTube-8M metrics (see the module docstring for definitions).

  Memory is O(N * top_k): per video only its pooled top-k (score, label,
  class) triples are kept, plus per-class positive counts [C] and running sums
  for hit@1 / perr.

  Usage:
    acc = AveragePrecisionAccumulator(num_classes=3862, top_k=20, top_n=None)
    for preds, labels in batches:   # numpy [n, C] each
      acc.accumulate(preds, labels)
    metrics = acc.result()
  """

  def __init__(self, num_classes: int, top_k: int = 20,
               top_n: Optional[int] = None):
    """Creates an empty accumulator.

    Args:
      num_classes: C, number of classes (positive int).
      top_k: predictions per video pooled into gap / map (positive int).
      top_n: also report AP@n (`gap_at_{n}`, `map_at_{n}`; module
        docstring): a positive int, or None (no AP@n).

    Raises:
      ValueError: if num_classes or top_k is not a positive integer, or
        top_n is neither None nor a positive integer.
    """
    if isinstance(num_classes, bool) or not isinstance(
        num_classes, (int, np.integer)) or num_classes < 1:
      raise ValueError(
          f'num_classes must be a positive int, got {num_classes!r}.')
    if isinstance(top_k, bool) or not isinstance(
        top_k, (int, np.integer)) or top_k < 1:
      raise ValueError(f'top_k must be a positive int, got {top_k!r}.')
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(
        top_n, (int, np.integer)) or top_n < 1):
      raise ValueError(
          f'top_n must be None or a positive int, got {top_n!r}.')
    self._num_classes = int(num_classes)
    self._top_k = int(top_k)
    self._top_n = None if top_n is None else int(top_n)
    self.reset()

  @property
  def num_classes(self) -> int:
    return self._num_classes

  @property
  def top_k(self) -> int:
    return self._top_k

  @property
  def top_n(self) -> Optional[int]:
    return self._top_n

  @property
  def class_positives(self) -> np.ndarray:
    """[C] int64: positives of each class accumulated so far (a copy)."""
    return self._class_positives.copy()

  @property
  def num_videos(self) -> int:
    """Rows (videos or segments) accumulated since construction / reset()."""
    return self._num_videos

  def reset(self) -> None:
    """Forgets everything accumulated so far."""
    self._num_videos = 0
    self._hit_at_one_sum = 0
    self._perr_sum = 0.0
    self._class_positives = np.zeros(self._num_classes, dtype=np.int64)
    self._scores = []   # list of [P_i] float64
    self._positive = []  # list of [P_i] bool
    self._classes = []   # list of [P_i] int32

  def accumulate(self, predictions, labels, label_weights=None,
                 example_mask=None) -> None:
    """Adds one batch of videos.

    Args:
      predictions: [n, C] float scores (n may be 0). NaN is rejected.
      labels: [n, C] ground truth; a value > 0 is a positive.
      label_weights: optional [n, C]; weight 0 excludes that (video, class).
      example_mask: optional [n] bool; rows marked False (padding) are
        dropped before anything else.

    Raises:
      ValueError: on wrong shapes, C != num_classes, or NaN predictions. The
        accumulator is left unchanged in that case.
    """
    predictions, labels, label_weights = _as_2d_inputs(
        predictions, labels, label_weights)
    if example_mask is not None:
      keep = np.asarray(example_mask).astype(bool)
      if keep.shape != (predictions.shape[0],):
        raise ValueError(
            f'example_mask shape {keep.shape} must be [n] with n = '
            f'{predictions.shape[0]} rows of predictions.')
      if not keep.all():
        predictions, labels = predictions[keep], labels[keep]
        if label_weights is not None:
          label_weights = label_weights[keep]
    n, c = predictions.shape
    if c != self._num_classes:
      raise ValueError(
          f'predictions have {c} classes (shape {predictions.shape}) but the '
          f'accumulator was built for num_classes={self._num_classes}.')
    k = min(self._top_k, c)
    hit_sum = 0
    perr_sum = 0.0
    class_pos = np.zeros(c, dtype=np.int64)
    pooled_s, pooled_p, pooled_c = [], [], []
    for start in range(0, n, _CHUNK_ROWS):
      stop = min(start + _CHUNK_ROWS, n)
      scores = np.ascontiguousarray(predictions[start:stop])
      if np.isnan(scores).any():
        raise ValueError('predictions contain NaN.')
      positive = np.asarray(labels[start:stop] > 0)
      if label_weights is not None:
        rated = label_weights[start:stop] != 0
        scores = np.where(rated, scores, np.array(-np.inf, scores.dtype))
        positive &= rated
      # Labels are sparse: count positives per row / class from their flat
      # positions (cheaper than two dense reductions).
      pos_flat = np.flatnonzero(positive)
      num_pos = np.bincount(pos_flat // c, minlength=stop - start)
      class_pos += np.bincount(pos_flat % c, minlength=c)

      idx = _top_k_indices(scores, k)  # [rows, k]
      top_scores = np.take_along_axis(scores, idx, axis=1).astype(np.float64)
      top_pos = np.take_along_axis(positive, idx, axis=1)
      hit_sum += int(np.count_nonzero(top_pos[:, 0]))

      # perr: rows with 1 <= k_v <= k use the sorted top-k; k_v > k rows get
      # an exact full stable sort.
      hits = np.zeros(stop - start, dtype=np.int64)
      small = np.flatnonzero((num_pos >= 1) & (num_pos <= k))
      if small.size:
        cum_hits = np.cumsum(top_pos & (top_scores > 0), axis=1)
        hits[small] = cum_hits[small, num_pos[small] - 1]
      big = np.flatnonzero(num_pos > k)
      if big.size:
        big_scores = scores[big]
        full = np.argsort(-big_scores, axis=1, kind='stable')
        hits[big] = _hits_at(big_scores, positive[big], full, num_pos[big])
      has = num_pos > 0
      perr_sum += float(np.sum(hits[has] / num_pos[has]))

      keep = top_scores != -np.inf
      pooled_s.append(top_scores[keep])
      pooled_p.append(top_pos[keep])
      pooled_c.append(idx[keep].astype(np.int32))

    # Commit only after the whole batch validated.
    self._num_videos += n
    self._hit_at_one_sum += hit_sum
    self._perr_sum += perr_sum
    self._class_positives += class_pos
    self._scores.extend(pooled_s)
    self._positive.extend(pooled_p)
    self._classes.extend(pooled_c)

  def result(self, return_per_class_ap: bool = False) -> Dict[str, object]:
    """Metrics over everything accumulated since construction / reset().

    Args:
      return_per_class_ap: also return `per_class_ap`, [C] float64 array of
        per-class AP (0 for classes without positives), and with top_n
        `per_class_ap_at_n`, the same for AP@n.

    Returns:
      dict with python floats `hit_at_one`, `perr`, `gap`, `map`,
      `map_all_classes`, with top_n also `gap_at_{n}` and `map_at_{n}`,
      python int `num_videos`, and optionally the per-class arrays. All
      metrics are 0.0 when there are no videos or no positives.
    """
    def cat(parts, dtype):
      return np.concatenate(parts) if parts else np.zeros(0, dtype)

    scores = cat(self._scores, np.float64)
    positive = cat(self._positive, bool)
    classes = cat(self._classes, np.int32)
    class_pos = self._class_positives
    # Positives outside every top-k still count in the denominators.
    per_class_ap, gap = average_precision.grouped_average_precision(
        scores, positive, classes, self._num_classes,
        num_positives=class_pos, return_pooled=True)
    has_pos = class_pos > 0
    per_class_ap[~has_pos] = 0.0  # NaN (no positive) counts 0 here.
    n = self._num_videos
    out = {
        'hit_at_one': self._hit_at_one_sum / n if n else 0.0,
        'perr': self._perr_sum / n if n else 0.0,
        'gap': gap if has_pos.any() else 0.0,
        'map': float(per_class_ap[has_pos].mean()) if has_pos.any() else 0.0,
        'map_all_classes': float(per_class_ap.sum() / self._num_classes),
        'num_videos': int(n),
    }
    for key in METRIC_KEYS:
      out[key] = float(out[key])
    if return_per_class_ap:
      out['per_class_ap'] = per_class_ap
    if self._top_n is not None:
      per_class_at_n, gap_at_n = average_precision.grouped_average_precision(
          scores, positive, classes, self._num_classes,
          num_positives=class_pos, return_pooled=True, top_n=self._top_n)
      per_class_at_n[~has_pos] = 0.0
      gap_key, map_key = top_n_keys(self._top_n)
      out[gap_key] = float(gap_at_n) if has_pos.any() else 0.0
      out[map_key] = (float(per_class_at_n[has_pos].mean()) if has_pos.any()
                      else 0.0)
      if return_per_class_ap:
        out['per_class_ap_at_n'] = per_class_at_n
    return out


def evaluate(predictions, labels, top_k: int = 20,
             label_weights=None, top_n: Optional[int] = None
             ) -> Dict[str, object]:
  """YouTube-8M metrics of a whole evaluation set in one call.

  Args:
    predictions: [N, C] float scores.
    labels: [N, C] ground truth; a value > 0 is a positive.
    top_k: predictions per video pooled into gap / map.
    label_weights: optional [N, C]; weight 0 excludes that (video, class).
    top_n: also AP@n, `gap_at_{n}` and `map_at_{n}` (None: not reported).

  Returns:
    dict of python floats `hit_at_one`, `perr`, `gap`, `map`,
    `map_all_classes` (with top_n the AP@n keys) and python int
    `num_videos` (see module docstring).

  Raises:
    ValueError: if predictions and labels are not 2-D with equal shape (the
      message names both), label_weights has another shape, C == 0, or
      predictions contain NaN.
  """
  predictions, labels, label_weights = _as_2d_inputs(predictions, labels,
                                                     label_weights)
  acc = AveragePrecisionAccumulator(predictions.shape[1], top_k, top_n)
  acc.accumulate(predictions, labels, label_weights)
  return acc.result()
