"""YouTube-8M challenge metrics (hit@1, PERR, GAP, mAP) in vectorized numpy.

The definitions, ties included: docs/yt8m.md#metrics.
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
  """(predictions, labels, label_weights) as [N, C] numpy arrays.

  Raises:
    ValueError: predictions and labels are not 2-D of one shape, or
      label_weights has another shape.
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
  """Top-k class ids per row by (score desc, class id asc)."""
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
  """[r] hits (positive, score > 0) in each row's first num_pos of `order`."""
  hit = (np.take_along_axis(positive, order, axis=1) &
         (np.take_along_axis(scores, order, axis=1) > 0))
  cum = np.cumsum(hit, axis=1)
  return cum[np.arange(order.shape[0]), num_pos - 1]


class AveragePrecisionAccumulator:
  """Streaming YouTube-8M metrics in O(N * top_k) memory.

    acc = AveragePrecisionAccumulator(num_classes=3862, top_k=20)
    for predictions, labels in batches:  # numpy [n, C] each
      acc.accumulate(predictions, labels)
    metrics = acc.result()
  """

  def __init__(self, num_classes: int, top_k: int = 20,
               top_n: Optional[int] = None):
    """Creates an empty accumulator; `top_n` adds AP@n.

    Raises:
      ValueError: num_classes or top_k is not a positive int, or top_n is
        neither None nor a positive int.
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
    """[C] int64 positives of each class so far (a copy)."""
    return self._class_positives.copy()

  @property
  def num_videos(self) -> int:
    """Rows (videos or segments) accumulated since the last reset."""
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
    """Adds one batch of rows.

    Args:
      predictions: [n, C] float scores, no NaN.
      labels: [n, C]; a value > 0 is a positive.
      label_weights: optional [n, C]; weight 0 leaves (row, class) unrated.
      example_mask: optional [n] bool; rows marked False are dropped.

    Raises:
      ValueError: wrong shapes, C != num_classes, or NaN predictions; the
        accumulator is then unchanged.
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
    """The metrics (floats) and `num_videos` since the last reset.

    With `return_per_class_ap` also `per_class_ap` [C] (and with top_n
    `per_class_ap_at_n`), 0 for classes without positives.
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
  """The YouTube-8M metrics of a whole evaluation set in one call.

  Raises:
    ValueError: predictions and labels are not 2-D of one shape,
      label_weights has another shape, C == 0, or NaN predictions.
  """
  predictions, labels, label_weights = _as_2d_inputs(predictions, labels,
                                                     label_weights)
  acc = AveragePrecisionAccumulator(predictions.shape[1], top_k, top_n)
  acc.accumulate(predictions, labels, label_weights)
  return acc.result()
