"""Average precision: the project's one implementation (vectorized numpy; the
definition: docs/architecture.md, "Average precision")."""
from typing import Optional, Tuple, Union

import numpy as np

# Group ids up to this many sort with numpy's radix sort (uint16).
_RADIX_GROUPS = 1 << 16


def _validate(scores, labels, weights, groups=None, num_groups=None):
  """Checked 1-D (scores, positive, weights, groups); weight 0 dropped."""
  scores = np.asarray(scores)
  labels = np.asarray(labels)
  if scores.ndim != 1 or labels.shape != scores.shape:
    raise ValueError(
        'scores and labels must be 1-D arrays of equal length; got scores '
        f'shape {scores.shape} and labels shape {labels.shape}.')
  if not np.issubdtype(scores.dtype, np.floating):
    scores = scores.astype(np.float64)
  if np.isnan(scores).any():
    raise ValueError('scores contain NaN.')
  positive = labels if labels.dtype == bool else labels > 0
  if groups is not None:
    if (isinstance(num_groups, bool) or
        not isinstance(num_groups, (int, np.integer)) or num_groups < 1):
      raise ValueError(
          f'num_groups must be a positive int, got {num_groups!r}.')
    groups = np.asarray(groups)
    if groups.shape != scores.shape:
      raise ValueError(f'groups shape {groups.shape} must equal scores '
                       f'shape {scores.shape}.')
    if not np.issubdtype(groups.dtype, np.integer):
      raise ValueError(f'groups must be integers, got dtype {groups.dtype}.')
    if groups.size and (groups.min() < 0 or groups.max() >= num_groups):
      raise ValueError(
          f'group ids must lie in [0, {num_groups}); got ids from '
          f'{groups.min()} to {groups.max()}.')
  if weights is not None:
    weights = np.asarray(weights, np.float64)
    if weights.shape != scores.shape:
      raise ValueError(f'weights shape {weights.shape} must equal scores '
                       f'shape {scores.shape}.')
    if not (weights >= 0).all():  # Also rejects NaN.
      raise ValueError('weights must be >= 0 and not NaN.')
    if not (weights > 0).all():
      keep = weights > 0
      scores, positive, weights = scores[keep], positive[keep], weights[keep]
      if groups is not None:
        groups = groups[keep]
  return scores, positive, weights, groups


def _denominators(num_positives, listed: np.ndarray) -> np.ndarray:
  if num_positives is None:
    return listed
  num_positives = np.asarray(num_positives, np.float64)
  if num_positives.shape != listed.shape:
    raise ValueError(f'num_positives must have shape {listed.shape}, got '
                     f'{num_positives.shape}.')
  short = ~(num_positives >= listed * (1 - 1e-12) - 1e-12)  # Also NaN.
  if short.any():
    i = int(np.flatnonzero(short.reshape(-1))[0])
    where = f' of group {i}' if listed.ndim else ''
    raise ValueError(
        f'num_positives{where} ({num_positives.reshape(-1)[i]:g}) is less '
        f'than the positive weight in the list ({listed.reshape(-1)[i]:g}).')
  return num_positives


def _divide(sums: np.ndarray, num_positives: np.ndarray) -> np.ndarray:
  has = num_positives > 0
  return np.where(has, sums / np.where(has, num_positives, 1.0), np.nan)


def _tie_group_sums(s, pos, w, groups, num_groups: int) -> np.ndarray:
  """[G] sums over positives of weight x precision at their tie's end.

  Pairs sorted by score within contiguous groups in id order.
  """
  if s.size == 0:
    return np.zeros(num_groups)
  boundary = s[1:] != s[:-1]
  if groups is not None:
    boundary |= groups[1:] != groups[:-1]
  ends = np.flatnonzero(np.append(boundary, True))  # Last pair of each tie.
  if w is None:
    tp = np.cumsum(pos, dtype=np.int64)  # Exact: order-independent sums.
    seen = None  # Weight seen so far = index + 1.
  else:
    tp = np.cumsum(np.where(pos, w, 0.0))
    seen = np.cumsum(w)
  tp_end = tp[ends]
  tie_pos = np.diff(tp_end, prepend=0)
  hit = np.flatnonzero(tie_pos)  # Tie groups holding a positive.
  ends, tp_end, tie_pos = ends[hit], tp_end[hit], tie_pos[hit]
  seen_end = ends + 1.0 if seen is None else seen[ends]
  if groups is None:
    return np.array([np.dot(tie_pos, tp_end / seen_end)])
  # The cumulative sums run over all groups: subtract what precedes a group.
  group_of = groups[ends].astype(np.intp)
  counts = np.bincount(groups, minlength=num_groups)
  first = (np.cumsum(counts) - counts)[group_of]  # Group's first index.
  tp_before = np.concatenate(([0], tp))[first]
  seen_before = (first.astype(np.float64) if seen is None else
                 np.concatenate(([0.0], seen))[first])
  precision = (tp_end - tp_before) / (seen_end - seen_before)
  return np.bincount(group_of, weights=tie_pos * precision,
                     minlength=num_groups)


def _check_top_n(top_n) -> Optional[int]:
  if top_n is None:
    return None
  if (isinstance(top_n, bool) or not isinstance(top_n, (int, np.integer)) or
      top_n < 1):
    raise ValueError(f'top_n must be None (the whole list) or a positive '
                     f'int, got {top_n!r}.')
  return int(top_n)


def _cut_top_n(s, pos, w, groups, top_n: int):
  """The pairs within the first `top_n` ranks of each group (a straddling tie
  kept in part)."""
  if s.size == 0:
    return s, pos, w, groups
  weight = np.ones(s.size) if w is None else w
  tie_starts = np.append(True, s[1:] != s[:-1])
  group_starts = np.zeros(s.size, bool)
  group_starts[0] = True
  if groups is not None:
    group_starts[1:] = groups[1:] != groups[:-1]
    tie_starts |= group_starts
  before = np.cumsum(weight) - weight  # Weight ranked before each pair.
  first = np.flatnonzero(tie_starts)
  group_first = np.flatnonzero(group_starts)
  group_of_tie = np.searchsorted(group_first, first, side='right') - 1
  # Weight ranked before each tie group within its group, and its weight.
  tie_before = before[first] - before[group_first][group_of_tie]
  tie_weight = np.add.reduceat(weight, first)
  kept = np.clip((top_n - tie_before) / tie_weight, 0.0, 1.0)
  kept = kept[np.cumsum(tie_starts) - 1]  # Per pair.
  keep = kept > 0
  if w is None and (kept[keep] == 1.0).all():
    w_out = None
  else:
    w_out = (weight * kept)[keep]
  return (s[keep], pos[keep], w_out,
          None if groups is None else groups[keep])


def _positive_weight(positive, weights, groups=None, num_groups=1):
  values = positive if weights is None else np.where(positive, weights, 0.0)
  if groups is None:
    return np.asarray(np.sum(values, dtype=np.float64))
  return np.bincount(groups, weights=values,
                     minlength=num_groups).astype(np.float64)


def average_precision(scores, labels, weights=None,
                      num_positives: Optional[float] = None,
                      top_n: Optional[int] = None) -> float:
  """AP of one ranked list; NaN when `num_positives` is 0.

  Args:
    scores: [P] float scores, any order.
    labels: [P]; > 0 (or True) is a positive.
    weights: optional [P] weights >= 0; 0 drops the pair.
    num_positives: the whole data's positive weight (default: the list's).
    top_n: AP@n; None: the whole list.

  Raises:
    ValueError: bad shapes, NaN scores, bad weights or top_n, or num_positives
      below the list's positive weight.
  """
  top_n = _check_top_n(top_n)
  scores, positive, weights, _ = _validate(scores, labels, weights)
  denominator = _denominators(num_positives,
                              _positive_weight(positive, weights))
  order = np.argsort(-scores)
  s, pos = scores[order], positive[order]
  w = None if weights is None else weights[order]
  if top_n is not None:
    s, pos, w, _ = _cut_top_n(s, pos, w, None, top_n)
    denominator = np.minimum(denominator, top_n)
  sums = _tie_group_sums(s, pos, w, None, 1)
  return float(_divide(sums[0], denominator))


def grouped_average_precision(
    scores, labels, groups, num_groups: int, weights=None,
    num_positives=None, return_pooled: bool = False,
    top_n: Optional[int] = None
) -> Union[np.ndarray, Tuple[np.ndarray, float]]:
  """[G] APs of every group of a pooled list of pairs, from one sort.

  Group g's AP is `average_precision` of its pairs and `num_positives[g]`;
  `return_pooled` also returns the AP of all pairs as one list (YouTube-8M's
  GAP). Other arguments and errors as `average_precision`.
  """
  top_n = _check_top_n(top_n)
  scores, positive, weights, groups = _validate(scores, labels, weights,
                                                groups, num_groups)
  num_groups = int(num_groups)
  denominators = _denominators(
      num_positives, _positive_weight(positive, weights, groups, num_groups))

  def ranked(order, list_groups):
    s, pos = scores[order], positive[order]
    w = None if weights is None else weights[order]
    g = None if list_groups is None else list_groups[order]
    if top_n is None:
      return s, pos, w, g
    return _cut_top_n(s, pos, w, g, top_n)

  by_score = np.argsort(-scores)
  key = groups[by_score]
  if num_groups <= _RADIX_GROUPS:
    key = key.astype(np.uint16)  # numpy radix-sorts 16-bit ints.
  order = by_score[np.argsort(key, kind='stable')]
  sums = _tie_group_sums(*ranked(order, groups), num_groups)
  cut = (lambda d: d) if top_n is None else (
      lambda d: np.minimum(d, top_n))
  per_group = _divide(sums, cut(denominators))
  if not return_pooled:
    return per_group
  pooled = _tie_group_sums(*ranked(by_score, None), 1)
  return per_group, float(_divide(pooled[0], cut(denominators.sum())))


def per_class_average_precision(scores, labels, weights=None) -> np.ndarray:
  """[C] AP of every column of [N, C] scores (weights [N] or [N, C])."""
  scores = np.asarray(scores)
  labels = np.asarray(labels)
  if scores.ndim != 2 or labels.shape != scores.shape:
    raise ValueError(
        'scores and labels must both be [N, C] arrays of equal shape; got '
        f'scores shape {scores.shape} and labels shape {labels.shape}.')
  n, c = scores.shape
  if weights is not None:
    weights = np.asarray(weights, np.float64)
    if weights.shape == (n,):
      weights = np.broadcast_to(weights[:, None], (n, c))
    elif weights.shape != (n, c):
      raise ValueError(f'weights shape {weights.shape} must be [N] = ({n},) '
                       f'or [N, C] = {(n, c)}.')
  # Column-major flattening: class c's rows are the c-th block of N.
  groups = np.repeat(np.arange(c, dtype=np.int64), n)
  return grouped_average_precision(
      scores.T.reshape(-1), labels.T.reshape(-1), groups, max(c, 1),
      None if weights is None else weights.T.reshape(-1))[:c]


def mean_average_precision(scores, labels, weights=None,
                           per_class: Optional[list] = None) -> float:
  """Mean AP over the classes with a positive; fills the list `per_class`."""
  aps = per_class_average_precision(scores, labels, weights)
  if per_class is not None:
    per_class.extend(float(a) for a in aps)
  valid = aps[~np.isnan(aps)]
  return float(valid.mean()) if valid.size else float('nan')
