"""Readout evaluation metrics, numpy, accumulated on the host.

Every metric takes per-query weights as sample weights: a query of weight w
counts w times, a query of weight 0 not at all. Per-channel metrics (a head
with dim > 1 of type continuous, binary, multilabel or event_rate) are
averaged over the channels (multilabel: over the labels that have a
positive). The metric functions return NaN for a metric with nothing to
measure (no query of positive weight, or no positive label for mAP);
`ReadoutMetrics.result()` never reports such a value: it leaves the key out
(and out of the averages) and `unmeasured()` says which and why.

* `r2` (continuous): 1 - sum w (y - p)^2 / sum w (y - ybar_w)^2 per channel;
  a constant target scores 1.0 if predicted exactly, else 0.0 (scikit-learn's
  convention).
* `pearson` (continuous): weighted Pearson correlation per channel (0.0 when
  either side is constant).
* `balanced_accuracy` (binary: logit > 0 predicts 1; multinomial: argmax):
  mean recall over the classes present in the targets.
* `macro_f1` (binary, multinomial): mean F1 over the classes present in the
  targets or the predictions; F1 = 2 TP / (2 TP + FP + FN).
* `map` (multilabel): mean over labels with a positive of the average
  precision sum_k (R_k - R_{k-1}) P_k over distinct score thresholds
  (scikit-learn's `average_precision_score`; tied scores are one threshold),
  computed by `official_ext.core.average_precision`.
* `poisson_d2` (event_rate, predictions are log-rates): 1 - D(y, exp(p)) /
  D(y, ybar_w) with the Poisson deviance D(y, mu) = 2 sum w (y log(y / mu) -
  y + mu) (0 log 0 = 0).

* `mean_cosine`, `angular_error_deg` (von_mises): see `von_mises`.

A task's metrics are computed by its readout type (`readout_types`:
`task_metrics`); the ones above are those of the shipped types.

`ReadoutMetrics.result()` reports `<task>/<metric>` for each task's metrics
that has a value, `average/<metric>` (mean over the tasks reporting it) and
`average/score` (mean of each task's primary metric, the first of its type's
metrics, always "higher is better": r2, balanced_accuracy, map, poisson_d2,
mean_cosine), each only when at least one task gives it a value.
"""
import math
from typing import Dict, List, Mapping, Optional

import numpy as np

from official_ext.core import average_precision as core_ap
from official_ext.readout import configs
from official_ext.readout import readout_types


def _prep(pred, target, weights):
  pred = np.asarray(pred, np.float64)
  target = np.asarray(target, np.float64)
  n = pred.shape[0]
  w = (np.ones([n]) if weights is None else
       np.asarray(weights, np.float64).reshape([n]))
  keep = w > 0
  return pred[keep], target[keep], w[keep]


def r2_score(pred, target, weights=None) -> float:
  """Weighted R^2 averaged over channels; pred, target [n, c]; weights [n]."""
  p, y, w = _prep(pred, target, weights)
  if w.size == 0:
    return float('nan')
  mean = np.sum(w[:, None] * y, 0) / w.sum()
  num = np.sum(w[:, None] * (y - p) ** 2, 0)
  den = np.sum(w[:, None] * (y - mean) ** 2, 0)
  scores = np.where(den > 0, 1.0 - num / np.where(den > 0, den, 1.0),
                    np.where(num == 0, 1.0, 0.0))
  return float(np.mean(scores))


def pearson(pred, target, weights=None) -> float:
  """Weighted Pearson correlation averaged over channels."""
  p, y, w = _prep(pred, target, weights)
  if w.size == 0:
    return float('nan')
  w = w[:, None] / w.sum()
  dp = p - np.sum(w * p, 0)
  dy = y - np.sum(w * y, 0)
  cov = np.sum(w * dp * dy, 0)
  var = np.sum(w * dp * dp, 0) * np.sum(w * dy * dy, 0)
  scores = np.where(var > 0, cov / np.sqrt(np.where(var > 0, var, 1.0)), 0.0)
  return float(np.mean(scores))


def _class_scores(y_true, y_pred, w):
  """(balanced accuracy, macro F1) of integer labels with sample weights."""
  if w.size == 0:
    return float('nan'), float('nan')
  present = np.unique(y_true)
  recalls = [np.sum(w[(y_true == c) & (y_pred == c)]) /
             np.sum(w[y_true == c]) for c in present]
  f1s = []
  for c in np.union1d(y_true, y_pred):
    tp = np.sum(w[(y_true == c) & (y_pred == c)])
    fp = np.sum(w[(y_true != c) & (y_pred == c)])
    fn = np.sum(w[(y_true == c) & (y_pred != c)])
    f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 0.0)
  return float(np.mean(recalls)), float(np.mean(f1s))


def binary_scores(logits, target, weights=None) -> Dict[str, float]:
  """balanced_accuracy and macro_f1 of logits > 0, averaged over channels."""
  p, y, w = _prep(logits, target, weights)
  if w.size == 0:
    return {'balanced_accuracy': float('nan'), 'macro_f1': float('nan')}
  per = [_class_scores((y[:, c] > 0.5).astype(int), (p[:, c] > 0).astype(int),
                       w) for c in range(p.shape[1])]
  return {'balanced_accuracy': float(np.mean([s[0] for s in per])),
          'macro_f1': float(np.mean([s[1] for s in per]))}


def multinomial_scores(logits, target, weights=None) -> Dict[str, float]:
  """balanced_accuracy and macro_f1 of argmax(logits) vs class ids [n, 1]."""
  p, y, w = _prep(logits, target, weights)
  bal, f1 = _class_scores(np.rint(y[:, 0]).astype(int), np.argmax(p, 1), w)
  return {'balanced_accuracy': bal, 'macro_f1': f1}


def average_precision(scores, labels, weights=None) -> float:
  """Weighted AP of one label: `core.average_precision` of [n] scores and
  [n] 0/1 labels (> 0.5 is a positive), weights [n] as sample weights; NaN
  if no positive of positive weight."""
  return core_ap.average_precision(
      scores, np.asarray(labels, np.float64) > 0.5,
      None if weights is None else np.asarray(weights, np.float64))


def mean_average_precision(logits, target, weights=None) -> float:
  """mAP over the labels (columns) that have a positive (core AP)."""
  p, y, w = _prep(logits, target, weights)
  return core_ap.mean_average_precision(p, y > 0.5, w)


def poisson_d2(log_rate, target, weights=None) -> float:
  """Poisson D^2 of log-rate predictions, averaged over channels."""
  p, y, w = _prep(log_rate, target, weights)
  if w.size == 0:
    return float('nan')
  mu = np.exp(p)
  mean = np.sum(w[:, None] * y, 0) / w.sum()

  def deviance(m):
    ylogy = np.where(y > 0, y * np.log(np.where(y > 0, y, 1.0) / m), 0.0)
    return 2 * np.sum(w[:, None] * (ylogy - y + m), 0)

  num, den = deviance(mu), deviance(np.broadcast_to(mean, y.shape))
  scores = np.where(den > 0, 1.0 - num / np.where(den > 0, den, 1.0),
                    np.where(num == 0, 1.0, 0.0))
  return float(np.mean(scores))


def task_metrics(spec: configs.ReadoutSpec, predictions, targets,
                 weights=None) -> Dict[str, float]:
  """The metrics of one task ({metric: value}, those of `spec.metrics`),
  computed by its readout type (`readout_types`).

  Args:
    spec: the task's ReadoutSpec.
    predictions: [n, dim] head outputs.
    targets: [n, >= target_size]; extra columns are ignored.
    weights: [n] (None: all 1).
  """
  readout_type = readout_types.get_readout_type(spec)
  targets = np.asarray(targets)[:, :configs.target_size(spec)]
  p, y, w = _prep(predictions, targets, weights)
  values = readout_type.compute_metrics(spec, p, y, w)
  return {m: values[m] for m in configs.spec_metrics(spec)}


class ReadoutMetrics:
  """Accumulates every task's (predictions, targets, weights) and scores them.

  Keeps all evaluated queries in memory (O(queries x dim)); the metrics are
  computed once in `result()`. Also counts the evaluated samples (trials,
  `add_examples`), which the task checks is not zero.
  """

  def __init__(self, specs: Mapping[str, configs.ReadoutSpec]):
    self._specs = dict(specs)
    self.reset()

  def reset(self) -> None:
    self._chunks: Dict[str, List[tuple]] = {n: [] for n in self._specs}
    self._num_examples = 0
    self._unmeasured: Dict[str, str] = {}

  def add_examples(self, n: int) -> None:
    """Counts `n` more evaluated samples (real trials, not padding)."""
    self._num_examples += int(n)

  @property
  def num_examples(self) -> int:
    """Samples counted by `add_examples` since the last `reset`."""
    return self._num_examples

  def accumulate(self, task: str, predictions, targets,
                 weights: Optional[np.ndarray] = None) -> None:
    """Adds queries of one task: predictions [n, dim], targets [n, >=size],
    weights [n] (None: all 1)."""
    predictions = np.asarray(predictions, np.float64)
    n = predictions.shape[0]
    targets = np.asarray(targets, np.float64).reshape([n, -1])
    weights = (np.ones([n]) if weights is None else
               np.asarray(weights, np.float64).reshape([n]))
    self._chunks[task].append((predictions.reshape([n, -1]), targets, weights))

  def num_queries(self, task: str) -> int:
    return int(sum(np.sum(c[2] > 0) for c in self._chunks[task]))

  def unmeasured(self) -> Dict[str, str]:
    """{`<task>/<metric>`: why it has no value} for the metrics the last
    `result()` left out (no query of positive weight; mAP: no positive
    label)."""
    return dict(self._unmeasured)

  def _task_values(self, name: str) -> Dict[str, float]:
    spec = self._specs[name]
    chunks = self._chunks[name]
    if chunks:
      p, y, w = (np.concatenate(parts, 0) for parts in zip(*chunks))
    else:
      size = configs.target_size(spec)
      p, y, w = np.zeros([0, spec.dim]), np.zeros([0, size]), np.zeros([0])
    return task_metrics(spec, p, y, w)

  def result(self) -> Dict[str, float]:
    """The metrics with a value (module docstring); no NaN."""
    out = {}
    by_metric: Dict[str, List[float]] = {}
    primaries = []
    self._unmeasured = {}
    for name, spec in self._specs.items():
      values = {}
      for metric, value in self._task_values(name).items():
        if not math.isnan(value):
          values[metric] = value
        else:
          self._unmeasured[f'{name}/{metric}'] = (
              'no query of positive weight' if not self.num_queries(name)
              else 'no positive label' if metric == 'map' else
              'nothing to measure')
      for metric, value in values.items():
        out[f'{name}/{metric}'] = value
        by_metric.setdefault(metric, []).append(value)
      primary = readout_types.get_readout_type(spec).metrics[0]
      if primary in values:
        primaries.append(values[primary])
    for metric, values in by_metric.items():
      out[f'average/{metric}'] = float(np.mean(values))
    if primaries:
      out['average/score'] = float(np.mean(primaries))
    return out


def format_table(results: Mapping[str, float],
                 specs: Mapping[str, configs.ReadoutSpec],
                 counts: Optional[Mapping[str, int]] = None) -> str:
  """The per-task table: one row per task, one column per metric."""
  columns = []
  for spec in specs.values():
    for m in configs.spec_metrics(spec):
      if m not in columns:
        columns.append(m)
  header = f"{'task':<16s} {'type':<12s} {'queries':>8s} " + ' '.join(
      f'{c:>17s}' for c in columns)
  lines = [header, '-' * len(header)]
  for name, spec in specs.items():
    cells = []
    for c in columns:
      key = f'{name}/{c}'
      cells.append(f'{results[key]:>17.4f}' if key in results else
                   f"{'':>17s}")
    n = '' if counts is None else str(counts.get(name, ''))
    lines.append(f'{name:<16s} {spec.type:<12s} {n:>8s} ' + ' '.join(cells))
  lines.append('-' * len(header))
  avg = [f"{results[f'average/{c}']:>17.4f}" if f'average/{c}' in results
         else f"{'':>17s}" for c in columns]
  lines.append(f"{'average':<16s} {'':<12s} {'':>8s} " + ' '.join(avg))
  score = results.get('average/score')
  lines.append('average/score (mean primary metric): ' +
               ('n/a (no task has a value)' if score is None else
                f'{score:.4f}'))
  return '\n'.join(lines)
