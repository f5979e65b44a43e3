"""Mean average precision over classes (Charades-style multi-label mAP), by
`core.average_precision` (ties: one rank group, as scikit-learn's
`average_precision_score`; independent of the rows' order)."""
from typing import Optional

import numpy as np

from official_ext.core import average_precision as core_ap


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
  """AP of one class over N videos, `scores` float [N] (NaN rejected) and
  `labels` {0, 1} [N]: in [0, 1], NaN without a positive."""
  return core_ap.average_precision(scores, labels)


def mean_average_precision(scores: np.ndarray, labels: np.ndarray,
                           per_class: Optional[list] = None) -> float:
  """mAP over the classes with a positive (NaN if none) of `scores` float
  [N, K] and `labels` {0, 1} [N, K]; `per_class`, if a list, receives the K
  per-class APs.

  Raises:
    ValueError: shapes that differ or are not [N, K], or a NaN score."""
  return core_ap.mean_average_precision(scores, labels, per_class=per_class)
