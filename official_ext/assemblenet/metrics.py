"""Mean average precision over classes (Charades-style mAP)."""
from typing import Optional

import numpy as np


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
  """AP of one class: mean over the positives of the precision at their rank.

  Args:
    scores: float [N] predicted scores.
    labels: {0, 1} [N] ground truth.

  Returns:
    The AP in [0, 1]; NaN when there is no positive. Ties are ranked by
    input order (a stable sort of the descending scores).
  """
  scores = np.asarray(scores, np.float64)
  labels = np.asarray(labels) > 0
  num_pos = int(labels.sum())
  if num_pos == 0:
    return float('nan')
  order = np.argsort(-scores, kind='stable')
  hits = labels[order]
  precision_at = np.cumsum(hits) / np.arange(1, len(hits) + 1)
  return float(precision_at[hits].sum() / num_pos)


def mean_average_precision(scores: np.ndarray, labels: np.ndarray,
                           per_class: Optional[list] = None) -> float:
  """mAP over the classes that have at least one positive.

  Args:
    scores: float [N, K]; labels: {0, 1} [N, K].
    per_class: if a list, receives the K per-class APs (NaN: no positive).

  Returns:
    The mean AP over classes with a positive (NaN if none has one).
  """
  scores = np.asarray(scores)
  labels = np.asarray(labels)
  if scores.shape != labels.shape or scores.ndim != 2:
    raise ValueError(f'scores {scores.shape} and labels {labels.shape} must '
                     'both be [N, K].')
  aps = [average_precision(scores[:, k], labels[:, k])
         for k in range(scores.shape[1])]
  if per_class is not None:
    per_class.extend(aps)
  valid = [a for a in aps if not np.isnan(a)]
  return float(np.mean(valid)) if valid else float('nan')
