"""Readout evaluation metrics (numpy, on the host): weighted per-task metrics,
stitching of overlapping windows and the evaluation protocols
(docs/readout.md#metrics)."""
import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from official_ext.core import average_precision as core_ap
from official_ext.readout import readout_types

# A `configs.ReadoutSpec`: `configs` imports this module (through the readout
# types it registers), so this module does not import it.
ReadoutSpec = Any

# `Evaluation.protocol` values.
PROTOCOLS = ('official_ext', 'torch_brain')


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


def _class_scores(y_true, y_pred, w) -> Dict[str, float]:
  """balanced_accuracy, macro_f1 and accuracy of integer labels, weighted."""
  if w.size == 0:
    return {'balanced_accuracy': float('nan'), 'macro_f1': float('nan'),
            'accuracy': float('nan')}
  present = np.unique(y_true)
  recalls = [np.sum(w[(y_true == c) & (y_pred == c)]) /
             np.sum(w[y_true == c]) for c in present]
  f1s = []
  for c in np.union1d(y_true, y_pred):
    tp = np.sum(w[(y_true == c) & (y_pred == c)])
    fp = np.sum(w[(y_true != c) & (y_pred == c)])
    fn = np.sum(w[(y_true == c) & (y_pred != c)])
    f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 0.0)
  return {'balanced_accuracy': float(np.mean(recalls)),
          'macro_f1': float(np.mean(f1s)),
          'accuracy': float(np.sum(w[y_true == y_pred]) / np.sum(w))}


def _class_keys(accuracy: bool) -> Tuple[str, ...]:
  return ('balanced_accuracy', 'macro_f1') + (('accuracy',) if accuracy
                                              else ())


def binary_scores(logits, target, weights=None,
                  accuracy: bool = False) -> Dict[str, float]:
  """balanced_accuracy, macro_f1 (and `accuracy`) of logits > 0, per channel."""
  p, y, w = _prep(logits, target, weights)
  per = [_class_scores((y[:, c] > 0.5).astype(int), (p[:, c] > 0).astype(int),
                       w) for c in range(p.shape[1])]
  return {k: float(np.mean([s[k] for s in per])) if per else float('nan')
          for k in _class_keys(accuracy)}


def multinomial_scores(logits, target, weights=None,
                       accuracy: bool = False) -> Dict[str, float]:
  """balanced_accuracy, macro_f1 (and `accuracy`) of argmax(logits)."""
  p, y, w = _prep(logits, target, weights)
  scores = _class_scores(np.rint(y[:, 0]).astype(int), np.argmax(p, 1), w)
  return {k: scores[k] for k in _class_keys(accuracy)}


def average_precision(scores, labels, weights=None) -> float:
  """Weighted AP of one label (> 0.5 is a positive); NaN without a positive."""
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


def stitch(predictions, targets, weights, sessions, times,
           resolution: float, task: str = '',
           session_names: Optional[Mapping[int, str]] = None):
  """Averages the predictions and weights of queries at one session and time.

  Rows of weight 0 are dropped; times are compared as round(time /
  resolution). Returns (predictions [m, dim], targets [m, T], weights [m],
  sessions [m]), one row per (session, time) in that order; a ValueError
  (naming `task`, the session and the time) if a group's targets differ.
  """
  p, y, w = (np.asarray(a, np.float64) for a in (predictions, targets,
                                                  weights))
  sessions = np.asarray(sessions, np.int64)
  times = np.asarray(times, np.float64)
  keep = w > 0
  p, y, w, sessions, times = (a[keep] for a in (p, y, w, sessions, times))
  ticks = np.round(times / float(resolution)).astype(np.int64)
  keys = np.stack([sessions, ticks], axis=1).reshape([-1, 2])
  unique, first, inverse = np.unique(keys, axis=0, return_index=True,
                                     return_inverse=True)
  inverse = inverse.reshape([-1])
  same = np.all(y == y[first][inverse], axis=1)
  if not np.all(same):
    bad = int(np.argmin(same))
    session = int(sessions[bad])
    name = (session_names or {}).get(session, f'<record {-session - 1}>'
                                     if session < 0 else str(session))
    raise ValueError(
        f'Stitching task `{task}`: session `{name}` at session time '
        f'{times[first[inverse[bad]]]:.9g} s has two queries with different '
        'targets '
        f'({y[first[inverse[bad]]].tolist()} and {y[bad].tolist()}); '
        'overlapping windows must agree on the target of a shared time.')
  m = unique.shape[0]
  counts = np.bincount(inverse, minlength=m).astype(np.float64)
  sum_p = np.zeros([m, p.shape[1]])
  np.add.at(sum_p, inverse, p)
  sum_w = np.bincount(inverse, weights=w, minlength=m)
  return sum_p / counts[:, None], y[first], sum_w / counts, unique[:, 0]


def task_metrics(spec: ReadoutSpec, predictions, targets,
                 weights=None, protocol: str = 'official_ext'
                 ) -> Dict[str, float]:
  """{metric: value} of one task: `spec.metrics`, or its type's under
  `protocol`; targets' extra columns are ignored, weights None: all 1."""
  readout_type = readout_types.get_readout_type(spec)
  targets = np.asarray(targets)[:, :readout_types.target_size(spec)]
  p, y, w = _prep(predictions, targets, weights)
  values = readout_type.compute_metrics(spec, p, y, w)
  return {m: values[m] for m in readout_types.spec_metrics(spec, protocol)}


def _score_tasks(specs: Mapping[str, ReadoutSpec],
                 rows: Mapping[str, tuple], protocol: str = 'official_ext'
                 ) -> Dict[str, Dict[str, float]]:
  """{task: {metric: value}} of (predictions, targets, weights) per task."""
  return {name: task_metrics(spec, *rows[name], protocol=protocol)
          for name, spec in specs.items()}


def _summarize(specs: Mapping[str, ReadoutSpec],
               values: Mapping[str, Mapping[str, float]],
               protocol: str = 'official_ext') -> Dict[str, float]:
  """The summary keys (`<task>/...`, `average/...`) of non-NaN values."""
  out = {}
  by_metric: Dict[str, List[float]] = {}
  primaries = []
  for name, spec in specs.items():
    measured = {m: v for m, v in values[name].items() if not math.isnan(v)}
    for metric, value in measured.items():
      out[f'{name}/{metric}'] = value
      by_metric.setdefault(metric, []).append(value)
    primary = readout_types.primary_metric(spec, protocol)
    if primary in measured:
      primaries.append(measured[primary])
  for metric, metric_values in by_metric.items():
    out[f'average/{metric}'] = float(np.mean(metric_values))
  if primaries:
    out['average/score'] = float(np.mean(primaries))
  return out


class ReadoutMetrics:
  """Accumulates every task's (predictions, targets, weights) and scores them.

  Keeps every evaluated query in memory; `result()` computes the metrics.
  Also counts the evaluated samples (`add_examples`).
  """

  def __init__(self, specs: Mapping[str, ReadoutSpec],
               stitch_resolution: Optional[float] = None,
               protocol: str = 'official_ext'):
    """Args:
      specs: {task: ReadoutSpec}.
      stitch_resolution: seconds; given, queries are stitched and `accumulate`
        needs their sessions and times. None: no stitching.
      protocol: one of `PROTOCOLS`; 'torch_brain' needs `stitch_resolution`."""
    if protocol not in PROTOCOLS:
      raise ValueError(f'task.evaluation.protocol is {protocol!r}; expected '
                       f'one of {PROTOCOLS}.')
    if stitch_resolution is not None and not stitch_resolution > 0:
      raise ValueError('task.evaluation.stitch_resolution is '
                       f'{stitch_resolution}; expected seconds > 0.')
    if protocol == 'torch_brain' and stitch_resolution is None:
      raise ValueError("The 'torch_brain' evaluation protocol stitches: "
                       'give ReadoutMetrics a stitch_resolution.')
    self._specs = dict(specs)
    self._resolution = stitch_resolution
    self._protocol = protocol
    self._session_names: Dict[int, str] = {}
    self.reset()

  def reset(self) -> None:
    self._chunks: Dict[str, List[tuple]] = {n: [] for n in self._specs}
    self._num_examples = 0
    self._unmeasured: Dict[str, str] = {}

  def set_session_names(self, names) -> None:
    """Names of the session keys >= 0 (key i: names[i]); keys < 0 are
    records without a session_id."""
    self._session_names = {i: str(n) for i, n in enumerate(names)}

  def add_examples(self, n: int) -> None:
    """Counts `n` more evaluated samples (real trials, not padding)."""
    self._num_examples += int(n)

  @property
  def num_examples(self) -> int:
    """Samples counted by `add_examples` since the last `reset`."""
    return self._num_examples

  def accumulate(self, task: str, predictions, targets,
                 weights: Optional[np.ndarray] = None,
                 sessions: Optional[np.ndarray] = None,
                 times: Optional[np.ndarray] = None) -> None:
    """Adds queries of one task; stitching, with their sessions int [n] (keys
    of `set_session_names`, < 0: records without one) and session times."""
    predictions = np.asarray(predictions, np.float64)
    n = predictions.shape[0]
    targets = np.asarray(targets, np.float64).reshape([n, -1])
    weights = (np.ones([n]) if weights is None else
               np.asarray(weights, np.float64).reshape([n]))
    if self._protocol == 'torch_brain':  # Scored or not, never weighted.
      weights = (weights > 0).astype(np.float64)
    chunk = (predictions.reshape([n, -1]), targets, weights)
    if self._resolution is not None:
      if sessions is None or times is None:
        raise ValueError(f'ReadoutMetrics.accumulate({task!r}): stitching '
                         'needs the sessions and times of the queries.')
      chunk += (np.asarray(sessions, np.int64).reshape([n]),
                np.asarray(times, np.float64).reshape([n]))
    self._chunks[task].append(chunk)

  def num_queries(self, task: str) -> int:
    return int(sum(np.sum(c[2] > 0) for c in self._chunks[task]))

  def unmeasured(self) -> Dict[str, str]:
    """{`<task>/<metric>`: why the last `result()` left it out}."""
    return dict(self._unmeasured)

  def _rows(self, name: str) -> tuple:
    """The task's accumulated rows, stitched when stitching."""
    spec = self._specs[name]
    chunks = self._chunks[name]
    stitching = self._resolution is not None
    if chunks:
      parts = [np.concatenate(c, 0) for c in zip(*chunks)]
    else:
      size = readout_types.target_size(spec)
      parts = [np.zeros([0, spec.dim]), np.zeros([0, size]), np.zeros([0])]
      parts += [np.zeros([0], np.int64), np.zeros([0])] if stitching else []
    if not stitching:
      return tuple(parts)
    return stitch(*parts, resolution=self._resolution, task=name,
                  session_names=self._session_names)

  def result(self) -> Dict[str, float]:
    """The metrics with a value (the others: `unmeasured`)."""
    rows = {name: self._rows(name) for name in self._specs}
    self._unmeasured = {}
    if self._protocol == 'torch_brain':
      return self._torch_brain_results(rows)
    values = _score_tasks(self._specs, {n: r[:3] for n, r in rows.items()})
    for name, task_values in values.items():
      for metric, value in task_values.items():
        if math.isnan(value):
          self._unmeasured[f'{name}/{metric}'] = (
              'no query of positive weight' if not self.num_queries(name)
              else 'no positive label' if metric == 'map' else
              'nothing to measure')
    out = _summarize(self._specs, values)
    if self._resolution is not None:
      out.update(self._session_results(rows))
    return out

  def _session_values(self, rows: Mapping[str, tuple], key: int
                      ) -> Dict[str, Dict[str, float]]:
    """{task: {metric: value}} of the stitched rows of session `key`."""
    sub = {task: tuple(a[r[3] == key] for a in r[:3])
           for task, r in rows.items()}
    return _score_tasks(self._specs, sub, self._protocol)

  def _torch_brain_results(self, rows: Mapping[str, tuple]
                           ) -> Dict[str, float]:
    """The 'torch_brain' keys: per session, then means over sessions."""
    keys = np.unique(np.concatenate([r[3] for r in rows.values()]))
    if np.any(keys < 0):
      raise ValueError(
          "The 'torch_brain' evaluation protocol scores each session: "
          f'{int(np.sum(keys < 0))} evaluated records have no session_id; '
          'give every record of the evaluation a session_id.')
    out = {}
    by_task: Dict[Tuple[str, str], List[float]] = {}
    by_metric: Dict[str, List[float]] = {}
    primaries = []
    for key in keys.tolist():
      name = self._session_names.get(key, str(key))
      values = self._session_values(rows, key)
      for k, v in _summarize(self._specs, values, self._protocol).items():
        out[f'sessions/{name}/{k}'] = v
      for task, task_values in values.items():
        primary = readout_types.primary_metric(self._specs[task],
                                               self._protocol)
        for metric, value in task_values.items():
          if math.isnan(value):
            continue
          by_task.setdefault((task, metric), []).append(value)
          by_metric.setdefault(metric, []).append(value)
          if metric == primary:
            primaries.append(value)
    for name, spec in self._specs.items():
      for metric in readout_types.spec_metrics(spec, self._protocol):
        if (name, metric) in by_task:
          out[f'{name}/{metric}'] = float(np.mean(by_task[name, metric]))
        else:
          self._unmeasured[f'{name}/{metric}'] = (
              'no query of positive weight' if not self.num_queries(name)
              else 'no positive label' if metric == 'map' else
              'nothing to measure in any session')
    for metric, values in by_metric.items():
      out[f'average/{metric}'] = float(np.mean(values))
    if primaries:
      out['average/score'] = float(np.mean(primaries))
    return out

  def _session_results(self, rows: Mapping[str, tuple]) -> Dict[str, float]:
    """`sessions/<session>/<key>` and `<key>/session_mean` of stitched rows;
    {} with fewer than two named sessions."""
    keys = np.unique(np.concatenate([r[3] for r in rows.values()]))
    named = keys[keys >= 0]
    if named.size and named.size < keys.size:
      raise ValueError(
          f'Stitched evaluation: {named.size} sessions have a session_id but '
          f'{keys.size - named.size} records have none; give every record of '
          'the evaluation a session_id, or none.')
    if named.size < 2:
      return {}
    out = {}
    by_key: Dict[str, List[float]] = {}
    for key in named.tolist():
      name = self._session_names.get(key, str(key))
      for k, v in _summarize(self._specs,
                             self._session_values(rows, key)).items():
        out[f'sessions/{name}/{k}'] = v
        by_key.setdefault(k, []).append(v)
    for k, session_values in by_key.items():
      out[f'{k}/session_mean'] = float(np.mean(session_values))
    return out


def format_table(results: Mapping[str, float],
                 specs: Mapping[str, ReadoutSpec],
                 counts: Optional[Mapping[str, int]] = None,
                 protocol: str = 'official_ext') -> str:
  """The per-task table: a row per task, a column per metric of `protocol`."""
  columns = []
  for spec in specs.values():
    for m in readout_types.spec_metrics(spec, protocol):
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
  lines.append(('average/score (mean primary metric over sessions and '
                'tasks): ' if protocol == 'torch_brain' else
                'average/score (mean primary metric): ') +
               ('n/a (no task has a value)' if score is None else
                f'{score:.4f}'))
  sessions = [k[len('sessions/'):-len('/average/score')] for k in results
              if k.startswith('sessions/') and k.endswith('/average/score')]
  for session in sessions:
    lines.append(f'  session {session}: average/score '
                 f"{results[f'sessions/{session}/average/score']:.4f}")
  if 'average/score/session_mean' in results:
    lines.append('average/score/session_mean (mean over sessions): '
                 f"{results['average/score/session_mean']:.4f}")
  return '\n'.join(lines)
