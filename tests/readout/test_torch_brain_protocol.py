"""`task.evaluation.protocol: torch_brain` against a numpy port of
torch_brain's multitask stitching evaluator.

The port (`_torch_brain_port`) follows torch_brain's
`MultiTaskDecodingStitchEvaluator` with torchmetrics' `Accuracy(task=
'multiclass')` (micro) and `R2Score()` (uniform average over channels):
per session and task, the queries of its eval mask (unweighted), stitched
by timestamp (predictions and float targets mean-pooled, class targets
mode-pooled), one metric per (session, task); `average_val_metric` the mean
over every (session, task) value, `average_<task>_val_metric` the mean over
sessions. The protocol must equal it exactly, on host rows and through the
task's evaluation of records; the default protocol must not.
"""
import collections

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import metrics
from official_ext.readout import task as task_lib

# ---------------------------------------------------------------------------
# The port.
# ---------------------------------------------------------------------------


def _tb_stitch(timestamps, values, categorical):
  """torch_brain's `stitch`: sorted unique timestamps; mean or mode."""
  unique, inverse = np.unique(timestamps, return_inverse=True)
  inverse = inverse.reshape([-1])
  if categorical:
    votes = np.zeros([unique.size, int(values.max()) + 1])
    np.add.at(votes, (inverse, values), 1)
    return votes.argmax(-1)
  sums = np.zeros((unique.size,) + values.shape[1:])
  np.add.at(sums, inverse, values)
  counts = np.bincount(inverse).astype(np.float64)
  return sums / counts.reshape((-1,) + (1,) * (values.ndim - 1))


def _tm_accuracy(logits, labels):
  """torchmetrics Accuracy(task='multiclass'), average 'micro'."""
  return float(np.mean(np.argmax(logits, -1) == labels))


def _tm_r2(pred, target):
  """torchmetrics R2Score(), multioutput 'uniform_average'."""
  n = target.shape[0]
  assert n >= 2, 'torchmetrics needs two samples'
  sum_obs, sum_sq = target.sum(0), (target * target).sum(0)
  rss = ((target - pred) ** 2).sum(0)
  tss = sum_sq - sum_obs * (sum_obs / n)
  cond_rss = ~np.isclose(rss, 0.0, atol=1e-4)
  cond_tss = ~np.isclose(tss, 0.0, atol=1e-4)
  raw = np.ones_like(rss)
  both = cond_rss & cond_tss
  raw[both] = 1 - rss[both] / tss[both]
  raw[cond_rss & ~cond_tss] = 0.0
  return float(np.mean(raw))


def _torch_brain_port(data, task_metric):
  """data: {session: {task: [(timestamps [n], preds [n, d], targets, eval
  mask bool [n]), ...] one per window}}; class targets int [n], continuous
  float [n, c]. task_metric: {task: 'accuracy' | 'r2'}. Returns the logged
  dict (`<session>/<task>/<metric>/val`, `average_val_metric`,
  `average_<task>_val_metric`)."""
  logged, per_task = {}, collections.defaultdict(list)
  for session, tasks in data.items():
    for task, windows in tasks.items():
      ts, p, y = (np.concatenate([w[i][w[3]] for w in windows])
                  for i in range(3))
      categorical = task_metric[task] == 'accuracy'
      stitched_p = _tb_stitch(ts, p, False)
      stitched_y = _tb_stitch(ts, y, categorical)
      value = (_tm_accuracy(stitched_p, stitched_y) if categorical else
               _tm_r2(stitched_p, stitched_y))
      logged[f'{session}/{task}/{task_metric[task]}/val'] = value
      per_task[task].append(value)
  logged['average_val_metric'] = float(np.mean(list(logged.values())))
  for task, values in per_task.items():
    logged[f'average_{task}_val_metric'] = float(np.mean(values))
  return logged


# ---------------------------------------------------------------------------
# Host rows.
# ---------------------------------------------------------------------------

SPECS = {
    'stimulus': configs.ReadoutSpec(name='stimulus', dim=3,
                                    type='multinomial'),
    'speed': configs.ReadoutSpec(name='speed', dim=2, type='continuous'),
}
TASK_METRIC = {'stimulus': 'accuracy', 'speed': 'r2'}
SESSIONS = ('A', 'B', 'C')
# (session, window start) of each window; windows of a session overlap.
WINDOWS = (('A', 0.0), ('A', 0.5), ('B', 10.0), ('B', 10.5), ('B', 11.0),
           ('C', 3.0))
TIMES = np.arange(8) * 0.125  # Query times within a window.


def _targets(session, t):
  """(class id, speed [2]) at session time t (agreeing across windows)."""
  tick = int(round(t * 8))
  label = 0 if tick % 5 else (1 + tick % 2)
  offset = {'A': 0.0, 'B': 5.0, 'C': -3.0}[session]
  return label, np.array([offset + np.sin(t), offset * 0.5 + tick % 3])


def _host_windows(seed=0):
  """[(session, start, {task: (times, preds, targets, eval mask,
  weights)})]: random predictions, some queries masked, random positive
  metric weights on the others."""
  rng = np.random.default_rng(seed)
  out = []
  for session, start in WINDOWS:
    times = start + TIMES
    labels, speeds = zip(*(_targets(session, t) for t in times))
    speeds = np.stack(speeds)
    rows = {}
    for task, preds, targets in (
        ('stimulus', rng.normal(size=[8, 3]) + [1.0, 0, 0],
         np.asarray(labels)),
        ('speed', speeds + rng.normal(size=[8, 2]) * 1.5, speeds)):
      mask = rng.random(8) > 0.2
      weights = mask * rng.uniform(0.2, 3.0, size=8)
      rows[task] = (times, preds, targets, mask, weights)
    out.append((session, start, rows))
  return out


def _accumulate(windows, protocol):
  acc = metrics.ReadoutMetrics(SPECS, stitch_resolution=1e-6,
                               protocol=protocol)
  acc.set_session_names(SESSIONS)
  for session, _, rows in windows:
    for task, (times, preds, targets, _, weights) in rows.items():
      n = times.size
      acc.accumulate(task, preds, np.reshape(targets, [n, -1]), weights,
                     sessions=np.full([n], SESSIONS.index(session)),
                     times=times)
  return acc.result()


def _port_of(windows):
  data = collections.defaultdict(lambda: collections.defaultdict(list))
  for session, _, rows in windows:
    for task, (times, preds, targets, mask, _) in rows.items():
      data[session][task].append((times, preds, targets, mask))
  return _torch_brain_port(data, TASK_METRIC)


def test_host_metrics_equal_the_port():
  windows = _host_windows()
  port = _port_of(windows)
  logs = _accumulate(windows, 'torch_brain')
  for session in SESSIONS:
    for task, metric in TASK_METRIC.items():
      assert logs[f'sessions/{session}/{task}/{metric}'] == pytest.approx(
          port[f'{session}/{task}/{metric}/val'], abs=1e-12)
  for task, metric in TASK_METRIC.items():
    assert logs[f'{task}/{metric}'] == pytest.approx(
        port[f'average_{task}_val_metric'], abs=1e-12)
  assert logs['average/score'] == pytest.approx(port['average_val_metric'],
                                                abs=1e-12)
  # The default protocol reports other numbers: balanced accuracy, pooled,
  # weighted, and no plain accuracy.
  default = _accumulate(windows, 'official_ext')
  assert 'stimulus/accuracy' not in default
  assert default['speed/r2'] != pytest.approx(logs['speed/r2'], abs=1e-3)
  assert default['average/score'] != pytest.approx(logs['average/score'],
                                                   abs=1e-3)


def test_majority_classifier_and_pooled_r2():
  """An always-majority classifier on an 80/15/5 split: 0.80 plain accuracy
  (torch_brain) vs 0.333 balanced accuracy (default); two sessions whose
  pooled R^2 is far above their mean R^2."""
  rng = np.random.default_rng(1)
  labels = np.array([0] * 16 + [1] * 3 + [2] * 1)
  rng.shuffle(labels)
  logits = np.tile([[3.0, 0.0, -1.0]], [20, 1]) + rng.normal(size=[20, 3]) * .1
  speeds = {s: rng.normal(size=[20, 2]) + (0.0 if s == 'A' else 10.0)
            for s in ('A', 'B')}
  windows = []
  for session in ('A', 'B'):
    times = np.arange(20) * 0.25 + (0.0 if session == 'A' else 100.0)
    preds = speeds[session] + rng.normal(size=[20, 2]) * 0.8
    windows.append((session, 0.0, {
        'stimulus': (times, logits, labels, np.ones(20, bool), np.ones(20)),
        'speed': (times, preds, speeds[session], np.ones(20, bool),
                  np.ones(20))}))
  port = _port_of(windows)
  logs = _accumulate(windows, 'torch_brain')
  default = _accumulate(windows, 'official_ext')
  assert logs['stimulus/accuracy'] == pytest.approx(0.80, abs=1e-12)
  assert port['average_stimulus_val_metric'] == pytest.approx(0.80)
  assert default['stimulus/balanced_accuracy'] == pytest.approx(1 / 3)
  assert logs['speed/r2'] == pytest.approx(port['average_speed_val_metric'],
                                           abs=1e-12)
  pooled_r2 = _tm_r2(np.concatenate([w[2]['speed'][1] for w in windows]),
                     np.concatenate([speeds['A'], speeds['B']]))
  assert default['speed/r2'] == pytest.approx(pooled_r2, abs=1e-12)
  assert default['speed/r2/session_mean'] == pytest.approx(logs['speed/r2'])
  assert pooled_r2 > logs['speed/r2'] + 0.3
  assert logs['average/score'] == pytest.approx(port['average_val_metric'],
                                                abs=1e-12)


def test_protocol_errors_name_the_setting():
  with pytest.raises(ValueError, match='task.evaluation.protocol'):
    metrics.ReadoutMetrics(SPECS, 1e-6, protocol='poyo')
  with pytest.raises(ValueError, match='stitch_resolution'):
    metrics.ReadoutMetrics(SPECS, None, protocol='torch_brain')
  acc = metrics.ReadoutMetrics(SPECS, 1e-6, protocol='torch_brain')
  acc.accumulate('speed', np.zeros([2, 2]), np.ones([2, 2]),
                 sessions=np.array([-1, -2]), times=np.zeros(2))
  with pytest.raises(ValueError, match='2 evaluated records have no '
                     'session_id'):
    acc.result()
  with pytest.raises(ValueError, match="task.evaluation.protocol is 'poyo'"):
    task_lib.ReadoutTask(_task_config('poyo'))


# ---------------------------------------------------------------------------
# Through the task: records -> pipeline -> step -> host metrics.
# ---------------------------------------------------------------------------

E2E_SPECS = (configs.ReadoutSpec(name='stimulus', dim=3, type='multinomial'),
             configs.ReadoutSpec(name='speed', dim=1, type='continuous'))
VOCAB = ('stimulus', 'speed')
STIM_BIAS = (2.0, 0.0, -1.0)  # Always class 0: the majority classifier.
SPEED_BIAS = 0.7
# (name, session, start, eval mask, loss weights) of each record; b2 has
# queries of loss weight 0 (at a time no other window covers) and no eval
# mask: torch_brain scores them, the default protocol does not.
E2E_WINDOWS = (
    ('a1', 'A', 0.0, None, None),
    ('a2', 'A', 0.5, [1, 1, 0, 1, 1, 1, 1, 0], None),
    ('b1', 'B', 10.0, None, None),
    ('b2', 'B', 10.5, None, [1, 1, 1, 1, 1, 1, 0, 0]),
)
E2E_TIMES = (0.0, 0.25, 0.5, 0.75)


def _e2e_targets(start, t):
  tick = int(round((start + t) * 4))
  return (0 if tick % 4 else 1 + (tick // 4) % 2), np.sin(start + t) + tick % 2


def _task_config(protocol):
  config = configs.ReadoutTaskConfig(
      readouts=E2E_SPECS, task_vocabulary=VOCAB,
      train_data=configs.DataConfig(input_dim=2),
      validation_data=configs.DataConfig(input_dim=2, global_batch_size=4,
                                         pad_multiple=8),
      evaluation=configs.Evaluation(print_table=False, protocol=protocol))
  config.model.encoder.override({'hidden_size': 4, 'num_heads': 1,
                                 'num_layers': 1, 'intermediate_size': 4})
  return config


@pytest.fixture(scope='module')
def records(tmp_path_factory):
  """(the records' path, the constant-head model)."""
  path = str(tmp_path_factory.mktemp('tb_protocol') / 'eval.tfrecord')
  rng = np.random.default_rng(0)
  examples = []
  for name, session, start, mask, weights in E2E_WINDOWS:
    ids, times, targets = [], [], []
    for t in E2E_TIMES:
      label, speed = _e2e_targets(start, t)
      ids += [1, 2]
      times += [t, t]
      targets += [[label], [speed]]
    examples.append(dataloader.make_example(
        name, rng.normal(size=[3, 2]), [0.0, 0.4, 0.8], ids, times, targets,
        output_weights=weights, session_id=session, window_start=start,
        output_eval_mask=mask))
  dataloader.write_records(path, examples)
  tf_keras.utils.set_random_seed(0)
  # Built on the batches of the torch_brain evaluation (its parser is then
  # traced once for both).
  task = task_lib.ReadoutTask(_task_config('torch_brain'))
  model = task.build_model()
  model(next(iter(task.build_inputs(
      task.task_config.validation_data.replace(input_path=path)))))
  heads = {'stimulus': STIM_BIAS, 'speed': (SPEED_BIAS,)}
  for var in model.variables:
    for head, bias in heads.items():
      if f'projections/{head}/kernel' in var.name:
        var.assign(tf.zeros_like(var))
      elif f'projections/{head}/bias' in var.name:
        var.assign(tf.constant(bias, var.dtype))
  return path, model


def _evaluate(config, model, path):
  task = task_lib.ReadoutTask(config)
  metric_objects = task.build_metrics(training=False)
  state = None
  for batch in task.build_inputs(
      config.validation_data.replace(input_path=path)):
    state = task.aggregate_logs(
        state, task.validation_step(batch, model, metric_objects))
  return task.reduce_aggregated_logs(state)


def test_task_evaluation_equals_the_port(records):
  path, model = records
  data = collections.defaultdict(lambda: collections.defaultdict(list))
  for _, session, start, mask, _ in E2E_WINDOWS:
    times = start + np.asarray(E2E_TIMES)
    labels, speeds = zip(*(_e2e_targets(start, t) for t in E2E_TIMES))
    # The record's own queries, two per time (stimulus, speed): eval mask
    # entries 0, 2, ... are stimulus, 1, 3, ... speed; no mask: all scored.
    mask = np.ones(8, bool) if mask is None else np.asarray(mask, bool)
    data[session]['stimulus'].append(
        (times, np.tile([STIM_BIAS], [4, 1]), np.asarray(labels), mask[0::2]))
    data[session]['speed'].append(
        (times, np.full([4, 1], SPEED_BIAS),
         np.asarray(speeds).reshape([4, 1]), mask[1::2]))
  port = _torch_brain_port(data, TASK_METRIC)
  logs = _evaluate(_task_config('torch_brain'), model, path)
  for session in ('A', 'B'):
    for task, metric in TASK_METRIC.items():
      assert logs[f'sessions/{session}/{task}/{metric}'] == pytest.approx(
          port[f'{session}/{task}/{metric}/val'], abs=1e-6)
  for task, metric in TASK_METRIC.items():
    assert logs[f'{task}/{metric}'] == pytest.approx(
        port[f'average_{task}_val_metric'], abs=1e-6)
  assert logs['average/score'] == pytest.approx(port['average_val_metric'],
                                                abs=1e-6)
  # The majority classifier: plain accuracy well above the 1/3 of balanced
  # accuracy.
  assert logs['stimulus/accuracy'] > 0.6
  assert logs['stimulus/balanced_accuracy'] == pytest.approx(1 / 3)
