"""Average precision: the project's one implementation (vectorized numpy).

Every family's AP-based metric calls this module: YouTube-8M GAP and mAP
(`yt8m/metrics.py`), the segment-level challenge mAP@K
(`yt8m/segment_eval.py`), AssembleNet multi-label mAP
(`assemblenet/metrics.py`) and readout multilabel mAP (`readout/metrics.py`).

What is computed
----------------
The input is a list of pairs (score s_i, label y_i), optionally with sample
weights w_i >= 0 (default 1). A pair is positive when y_i > 0 (bool labels:
True). Pairs of weight 0 are dropped before anything else.

Tie rule (the only one): pairs with equal score form one rank group, i.e. one
threshold. Ranking is evaluated once per distinct score, from the highest
down; the precision at group g is measured after the whole group,

    P_g = TP_g / (TP_g + FP_g),

TP_g / FP_g the positive / negative weight of every pair with score >= s_g.
Every positive of the group gets P_g:

    AP = sum_g  POS_g * P_g  /  num_positives,

POS_g the positive weight inside group g. With `num_positives` = the
positive weight in the list (the default) this is scikit-learn's
`average_precision_score` = sum_g (R_g - R_{g-1}) P_g (non-interpolated,
recall R measured over distinct thresholds). Without ties it is the mean,
over the positives, of the precision at their rank. The value depends only
on the multiset of (score, label, weight) triples, never on the order they
are given in (rows shuffled, results gathered from workers in any order):
with unit (or any integer) weights it is even bit-identical, since every
partial sum is an integer.

Cuts and denominators: a metric that ranks only part of the data (the
YouTube-8M top-k predictions of each video; the first K submitted segments of
each class) makes the cut itself and passes only the kept pairs, with
`num_positives` = the positive weight of the whole data (in the units of the
weights, counts when unweighted). Positives that were cut away then count as
never retrieved: they lower AP by their share of `num_positives` and change
no precision. Precisions are measured over the kept pairs only. A cut that
falls inside a tie group is the caller's to resolve deterministically (YT8M
keeps the lower class ids).

AP@n (the YouTube-8M starter's `top_n`): only the first n ranks of the
list count, and the denominator is min(num_positives, n):

    AP@n = sum over positives ranked within the first n of P(rank)
           / min(num_positives, n),

the starter's `average_precision_calculator.ap_at_n` (which the starter's
mAP uses per class; its GAP is the AP of the whole pooled top-k list).
Ranks are weight units (n unit-weight pairs). With the tie rule, a tie group
that straddles rank n is kept in part: if r of its W weight lie within the
first n, each of its pairs keeps weight w * r / W, so the group ends exactly
at rank n with its positive weight scaled by r / W, and every positive of it
gets the precision measured there. Without ties this is the starter's value;
it stays independent of the input order (the starter shuffles ties with a
fixed seed instead).

No positive: AP is undefined (0/0) when `num_positives` is 0; these functions
return NaN for it and each metric decides what such a class / list
contributes (YT8M `map` and AssembleNet / readout mAP leave it out of the
mean, YT8M `map_all_classes` counts it as 0, YT8M `gap` reports 0.0).

Bad input fails loudly: NaN scores, negative or NaN weights, mismatched
shapes, group ids out of range and a `num_positives` smaller than the
positive weight that is in the list are ValueErrors.

Cost: one O(P log P) sort of the scores (plus a stable sort of the group
ids for grouped lists: a radix sort for up to 2**16 groups) and O(P) passes; the grouped form computes every group's
AP, and optionally the AP of all pairs ranked together, from that one sort.
"""
from typing import Optional, Tuple, Union

import numpy as np

# Group ids up to this many sort with numpy's radix sort (uint16).
_RADIX_GROUPS = 1 << 16


def _validate(scores, labels, weights, groups=None, num_groups=None):
  """Checked 1-D inputs with the pairs of weight 0 dropped.

  Returns:
    (scores [P] floating, positive [P] bool, weights [P] float64 or None,
    groups [P] int or None).
  """
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
  """num_positives (default: `listed`) as float64, checked >= listed."""
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
  """sums / num_positives, NaN where num_positives is 0."""
  has = num_positives > 0
  return np.where(has, sums / np.where(has, num_positives, 1.0), np.nan)


def _tie_group_sums(s, pos, w, groups, num_groups: int) -> np.ndarray:
  """Per group: sum over positives of weight x precision at its tie's end.

  Args:
    s: [P] scores, descending within each group.
    pos: [P] bool, same order.
    w: [P] float64 weights, same order, or None (all 1).
    groups: [P] group ids, same order, each group's pairs contiguous and the
      groups in ascending id order; or None (one group).
    num_groups: G (1 when groups is None).

  Returns:
    [G] float64, not yet divided by num_positives.
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
  """top_n as an int, or None (the whole list)."""
  if top_n is None:
    return None
  if (isinstance(top_n, bool) or not isinstance(top_n, (int, np.integer)) or
      top_n < 1):
    raise ValueError(f'top_n must be None (the whole list) or a positive '
                     f'int, got {top_n!r}.')
  return int(top_n)


def _cut_top_n(s, pos, w, groups, top_n: int):
  """The pairs within the first top_n ranks of each group (module docstring).

  Args:
    s: [P] scores, descending within each group.
    pos: [P] bool, same order.
    w: [P] float64 weights, same order, or None (all 1).
    groups: [P] group ids, same order, each group's pairs contiguous; or
      None (one group).
    top_n: n >= 1, in weight units.

  Returns:
    (s, pos, w, groups) of the kept pairs, in the same order; w is None when
    it was None and no tie group straddles rank n (every kept pair whole).
  """
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
  """Positive weight in the list: [G] float64 (scalar array without groups)."""
  values = positive if weights is None else np.where(positive, weights, 0.0)
  if groups is None:
    return np.asarray(np.sum(values, dtype=np.float64))
  return np.bincount(groups, weights=values,
                     minlength=num_groups).astype(np.float64)


def average_precision(scores, labels, weights=None,
                      num_positives: Optional[float] = None,
                      top_n: Optional[int] = None) -> float:
  """AP of one ranked list (module docstring's definition and tie rule).

  Args:
    scores: [P] float scores, any order (NaN rejected; +-inf allowed).
    labels: [P] labels; > 0 (or True) is a positive.
    weights: optional [P] sample weights >= 0; 0 drops the pair.
    num_positives: the denominator: positive weight of the whole data
      (>= the positive weight in the list; larger after a cut). Default:
      the positive weight in the list (then equal to scikit-learn's
      `average_precision_score`).
    top_n: AP@n: only the first n ranks count and the denominator is
      min(num_positives, n) (module docstring). None: the whole list.

  Returns:
    AP in [0, 1] as a python float; NaN when num_positives is 0 (no
    positive).

  Raises:
    ValueError: on bad shapes, NaN scores, bad weights, a num_positives
      below the positive weight in the list or a top_n that is not None or
      a positive int.
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
  """AP of every group of a pooled list of pairs, from one sort.

  Each group (e.g. a class) is ranked on its own, with the module
  docstring's definition and tie rule: the result for group g equals
  `average_precision` of g's pairs with g's num_positives.

  Args:
    scores: [P] float scores, any order (NaN rejected; +-inf allowed).
    labels: [P] labels; > 0 (or True) is a positive.
    groups: [P] int group ids in [0, num_groups).
    num_groups: G >= 1.
    weights: optional [P] sample weights >= 0; 0 drops the pair.
    num_positives: optional [G] denominators, each group's positive weight
      in the whole data (>= what the list holds; see "Cuts"). Default: the
      positive weight of the group's pairs in the list.
    return_pooled: also return the AP of all P pairs ranked together as one
      list (groups ignored) over sum(num_positives): YouTube-8M's GAP.
    top_n: AP@n of every group (and of the pooled list): only the first n
      ranks of a list count and its denominator is min(its num_positives,
      n) (module docstring). None: whole lists.

  Returns:
    [G] float64 APs, NaN for a group whose num_positives is 0. With
    return_pooled: (that array, the pooled AP as a python float, NaN when
    there is no positive at all).

  Raises:
    ValueError: on bad shapes, NaN scores, bad weights, group ids out of
      range, a num_positives below the positive weight in the list or a
      top_n that is not None or a positive int.
  """
  top_n = _check_top_n(top_n)
  scores, positive, weights, groups = _validate(scores, labels, weights,
                                                groups, num_groups)
  num_groups = int(num_groups)
  denominators = _denominators(
      num_positives, _positive_weight(positive, weights, groups, num_groups))

  def ranked(order, list_groups):
    """The pairs in `order`, cut to each list's first top_n ranks."""
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
  """AP of every column of a [N, C] score matrix (multi-label, per class).

  Class c ranks the N rows by scores[:, c] (module docstring's definition
  and tie rule; no cut: the denominator is the class's positive weight).

  Args:
    scores: [N, C] float scores (NaN rejected).
    labels: [N, C] labels; > 0 (or True) is a positive.
    weights: optional sample weights >= 0, [N] (per row) or [N, C]; 0 drops
      the row (for that class).

  Returns:
    [C] float64 APs; NaN for a class without a positive of positive weight.

  Raises:
    ValueError: if scores / labels are not [N, C] of one shape, weights are
      neither [N] nor [N, C], scores contain NaN or weights are < 0 or NaN.
  """
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
  """Mean over the classes with a positive of `per_class_average_precision`.

  The multi-label mAP of AssembleNet (Charades) and readout: a class without
  a positive (of positive weight) has no AP and is left out of the mean.

  Args:
    scores: [N, C] float scores.
    labels: [N, C] labels; > 0 (or True) is a positive.
    weights: optional sample weights, [N] or [N, C].
    per_class: if a list, receives the C per-class APs (NaN: no positive).

  Returns:
    The mean AP as a python float; NaN when no class has a positive.
  """
  aps = per_class_average_precision(scores, labels, weights)
  if per_class is not None:
    per_class.extend(float(a) for a in aps)
  valid = aps[~np.isnan(aps)]
  return float(valid.mean()) if valid.size else float('nan')
