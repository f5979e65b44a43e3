"""Mean average precision over classes (Charades-style multi-label mAP).

The AP is `official_ext.core.average_precision`'s, with its one tie rule:
videos with equal probability for a class form one rank group and every
positive of the group gets the precision measured after the whole group
(scikit-learn's `average_precision_score`). The mAP therefore depends only
on the (probabilities, labels) rows, not on the order the evaluation
gathered them in (replicas, workers).
"""
from typing import Optional

import numpy as np

from official_ext.core import average_precision as core_ap


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
  """AP of one class over N videos.

  Args:
    scores: float [N] predicted scores (NaN rejected).
    labels: {0, 1} [N] ground truth (> 0 is a positive).

  Returns:
    The AP in [0, 1]; NaN when there is no positive. Ties count as one
    threshold (module docstring); the input order does not matter.
  """
  return core_ap.average_precision(scores, labels)


def mean_average_precision(scores: np.ndarray, labels: np.ndarray,
                           per_class: Optional[list] = None) -> float:
  """mAP over the classes that have at least one positive.

  Args:
    scores: float [N, K]; labels: {0, 1} [N, K].
    per_class: if a list, receives the K per-class APs (NaN: no positive).

  Returns:
    The mean AP over classes with a positive (NaN if none has one).

  Raises:
    ValueError: if scores and labels are not both [N, K] of one shape, or
      scores contain NaN.
  """
  return core_ap.mean_average_precision(scores, labels, per_class=per_class)
