"""A plainly correct, slow reference of the YouTube-8M metrics: what the
yt8m benchmark times `yt8m.metrics` against and tests/yt8m/test_metrics.py
checks it with; on no evaluation path. Small inputs only."""
import math
from typing import Dict

import numpy as np

from official_ext.core import average_precision


def _average_precision(pairs, num_positives: int, top_n=None) -> float:
  """`core.average_precision` (AP@top_n) of (score, is_positive) pairs; 0.0
  without a positive (num_positives counts positives outside `pairs` too)."""
  if num_positives == 0:
    return 0.0
  return average_precision.average_precision(
      [score for score, _ in pairs], [bool(p) for _, p in pairs],
      num_positives=num_positives, top_n=top_n)


def evaluate_reference(predictions, labels, top_k: int = 20,
                       label_weights=None, top_n=None) -> Dict[str, object]:
  """Per-video / per-class loops computing what `metrics.evaluate` does.

  Raises:
    ValueError: shape mismatch, C == 0, top_k < 1 or NaN predictions.
  """
  predictions = np.asarray(predictions, dtype=np.float64)
  labels = np.asarray(labels)
  if (predictions.ndim != 2 or labels.ndim != 2 or
      predictions.shape != labels.shape):
    raise ValueError(
        'predictions and labels must both be 2-D [N, C] arrays of equal '
        f'shape; got predictions shape {predictions.shape} and labels shape '
        f'{labels.shape}.')
  num_videos, num_classes = predictions.shape
  if label_weights is None:
    label_weights = np.ones(predictions.shape)
  label_weights = np.asarray(label_weights)
  if label_weights.shape != predictions.shape:
    raise ValueError(
        f'label_weights shape {label_weights.shape} must equal predictions '
        f'shape {predictions.shape}.')
  if num_classes < 1:
    raise ValueError(f'num_classes must be positive, got {num_classes}.')
  if top_k < 1:
    raise ValueError(f'top_k must be positive, got {top_k}.')

  class_positives = [0] * num_classes
  pooled = []  # (score, is_positive, class_id) of every video's top-k
  hits_at_one = 0
  perr_sum = 0.0
  for v in range(num_videos):
    scores = []
    positives = set()
    for c in range(num_classes):
      score = float(predictions[v, c])
      if math.isnan(score):
        raise ValueError('predictions contain NaN.')
      if label_weights[v, c] == 0:  # not rated: masked out
        scores.append(-math.inf)
      else:
        scores.append(score)
        if labels[v, c] > 0:
          positives.add(c)
    for c in positives:
      class_positives[c] += 1

    # Best first; ties -> lower class id.
    ranked = sorted(range(num_classes), key=lambda c: (-scores[c], c))

    if ranked[0] in positives:
      hits_at_one += 1

    k_v = len(positives)
    if k_v > 0:
      hits = sum(1 for c in ranked[:k_v] if scores[c] > 0 and c in positives)
      perr_sum += hits / k_v

    for c in ranked[:top_k]:
      if scores[c] != -math.inf:
        pooled.append((scores[c], c in positives, c))

  total_positives = sum(class_positives)
  gap = _average_precision([(s, p) for s, p, _ in pooled], total_positives)

  pairs_by_class = {c: [] for c in range(num_classes)}
  for s, p, c in pooled:
    pairs_by_class[c].append((s, p))
  per_class_ap = [
      _average_precision(pairs_by_class[c], class_positives[c])
      for c in range(num_classes)
  ]
  rated_classes = [c for c in range(num_classes) if class_positives[c] > 0]
  if rated_classes:
    mean_ap = sum(per_class_ap[c] for c in rated_classes) / len(rated_classes)
  else:
    mean_ap = 0.0

  out = {
      'hit_at_one': hits_at_one / num_videos if num_videos else 0.0,
      'perr': perr_sum / num_videos if num_videos else 0.0,
      'gap': float(gap),
      'map': float(mean_ap),
      'map_all_classes': float(sum(per_class_ap) / num_classes),
      'num_videos': int(num_videos),
  }
  if top_n is not None:
    out[f'gap_at_{top_n}'] = float(_average_precision(
        [(s, p) for s, p, _ in pooled], total_positives, top_n))
    out[f'map_at_{top_n}'] = float(np.mean([
        _average_precision(pairs_by_class[c], class_positives[c], top_n)
        for c in rated_classes])) if rated_classes else 0.0
  return out
