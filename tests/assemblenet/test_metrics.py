"""AssembleNet multi-label mAP: the core AP, independent of gather order."""
import math

import numpy as np
import pytest

from official_ext.assemblenet import metrics as anet_metrics
from official_ext.core import average_precision as core_ap


def test_tied_probabilities_hand_computed():
  # Class 0 over 4 videos: probabilities 1.0 (saturated sigmoid) for a
  # negative and a positive, then 0.5 P, 0.2 N. The tie {1.0: N, P} ends at
  # rank 2 with 1 positive: precision 1/2; {0.5: P} rank 3, 2 positives:
  # 2/3. AP = (1/2 + 2/3) / 2 = 7/12 whatever order the tie arrives in
  # (ranking it by arrival order gave (1/2 + 2/3) / 2 = 7/12 for N P but
  # (1 + 2/3) / 2 = 5/6 for P N).
  # Class 1: all four tied at 0.3 with 1 positive: precision 1/4.
  probs = np.array([[1.0, 0.3], [1.0, 0.3], [0.5, 0.3], [0.2, 0.3]])
  labels = np.array([[0, 0], [1, 1], [1, 0], [0, 0]])
  per_class = []
  value = anet_metrics.mean_average_precision(probs, labels, per_class)
  assert per_class == pytest.approx([7 / 12, 1 / 4])
  assert value == pytest.approx((7 / 12 + 1 / 4) / 2)
  swapped = [1, 0, 2, 3]  # The two tied videos gathered the other way round.
  assert anet_metrics.mean_average_precision(
      probs[swapped], labels[swapped]) == pytest.approx(value)
  assert anet_metrics.average_precision(probs[swapped, 0],
                                        labels[swapped, 0]) == (
                                            pytest.approx(7 / 12))


def test_map_does_not_depend_on_gather_order():
  # Worker results arrive in any order (multi-worker gather): many ties from
  # saturated / quantized probabilities must not change the mAP.
  rng = np.random.default_rng(0)
  labels = (rng.random((64, 10)) < 0.3).astype(np.float32)
  probs = np.round(rng.random((64, 10)), 1).astype(np.float32)
  probs[:, :3] = np.where(labels[:, :3] > 0, 1.0, probs[:, :3])
  base = anet_metrics.mean_average_precision(probs, labels)
  for seed in range(4):
    order = np.random.default_rng(seed).permutation(64)
    assert anet_metrics.mean_average_precision(
        probs[order], labels[order]) == base
  # Two workers' halves concatenated either way round.
  assert anet_metrics.mean_average_precision(
      np.concatenate([probs[32:], probs[:32]]),
      np.concatenate([labels[32:], labels[:32]])) == base


def test_map_equals_core_average_precision():
  rng = np.random.default_rng(1)
  labels = (rng.random((50, 7)) < 0.2).astype(np.float32)
  labels[:, 6] = 0  # A class without positive: left out of the mean.
  probs = np.round(rng.random((50, 7)), 2).astype(np.float32)
  per_class = []
  value = anet_metrics.mean_average_precision(probs, labels, per_class)
  want = core_ap.per_class_average_precision(probs, labels)
  np.testing.assert_array_equal(np.asarray(per_class), want)
  assert value == core_ap.mean_average_precision(probs, labels)
  assert value == pytest.approx(float(np.mean(want[:6])))
  assert math.isnan(per_class[6])
  for k in range(6):
    assert anet_metrics.average_precision(probs[:, k], labels[:, k]) == (
        core_ap.average_precision(probs[:, k], labels[:, k]))
