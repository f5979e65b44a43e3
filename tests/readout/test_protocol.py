"""The evaluation protocol of neural decoding, against numpy by hand.

Target normalisation (training, evaluation, serving), evaluation masks
separate from loss weights, stitching of overlapping windows with per-session
metrics, and the 'sample_share' task weighting (one device and two replicas).
"""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import config_definitions as cfg
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import export
from official_ext.readout import losses
from official_ext.readout import metrics
from official_ext.readout import task as task_lib

INPUT_DIM = 2
MEAN, STD = 2.0, 0.5
READOUTS = (
    configs.ReadoutSpec(name='speed', dim=1, type='continuous',
                        normalize_mean=(MEAN,), normalize_std=(STD,)),
    configs.ReadoutSpec(name='choice', dim=1, type='binary'),
)
VOCAB = ('speed', 'choice')
SPEED, CHOICE = 1, 2
TIMES = (0.0, 0.25, 0.5, 0.75)  # Query times within a window.


def _speed(t):  # The target at session time t.
  return 1.0 + t


def _choice(t):
  return float(int(round(t * 4)) % 2)


def _window(rng, name, session, start, eval_mask=None, weights=None,
            stored=True):
  """A record: both tasks queried at TIMES, targets on the session clock
  (`stored` False: session and start not written)."""
  queries = [(task, t) for t in TIMES for task in (SPEED, CHOICE)]
  targets = [[_speed(start + t)] if task == SPEED else [_choice(start + t)]
             for task, t in queries]
  return dataloader.make_example(
      name, rng.normal(size=[3, INPUT_DIM]), [0.0, 0.4, 0.8],
      [q[0] for q in queries], [q[1] for q in queries], targets,
      output_weights=weights, session_id=session if stored else None,
      window_start=start if stored else None, output_eval_mask=eval_mask)


# Two sessions, two overlapping windows each (shared session times 0.5 and
# 0.75 after the start). Window a2 scores only some of its queries
# (eval mask: its choice query at 0.75 is trained, not scored) and has
# weight 0 on its first query (scored, not trained).
_A2_MASK = [1, 1, 1, 0, 1, 1, 0, 0]
_A2_WEIGHTS = [0.0] + [1.0] * 7
_WINDOWS = (('a1', 'A', 0.0, None, None), ('a2', 'A', 0.5, _A2_MASK,
                                           _A2_WEIGHTS),
            ('b1', 'B', 10.0, None, None), ('b2', 'B', 10.5, None, None))


def _task_config(**changes):
  config = configs.ReadoutTaskConfig(
      readouts=READOUTS, task_vocabulary=VOCAB,
      train_data=configs.DataConfig(input_dim=INPUT_DIM),
      validation_data=configs.DataConfig(input_dim=INPUT_DIM,
                                         global_batch_size=4,
                                         pad_multiple=16))
  config.model.encoder.override({'hidden_size': 4, 'num_heads': 1,
                                 'num_layers': 1, 'intermediate_size': 4})
  config.evaluation.print_table = False
  return config.replace(**changes)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  """(records with sessions and masks, the same records without the new
  features, the shared tiny model)."""
  root = tmp_path_factory.mktemp('protocol')
  rng = np.random.default_rng(0)
  new, old = str(root / 'new.tfrecord'), str(root / 'old.tfrecord')
  dataloader.write_records(new, [
      _window(rng, name, session, start, mask, weights)
      for name, session, start, mask, weights in _WINDOWS])
  rng = np.random.default_rng(0)  # The same inputs, no new feature.
  dataloader.write_records(old, [
      _window(rng, name, session, start, None, weights, stored=False)
      for name, session, start, _, weights in _WINDOWS])
  tf_keras.utils.set_random_seed(0)
  model = task_lib.ReadoutTask(_task_config()).build_model()
  return new, old, model


def _batches(task, path):
  """The evaluation batches of `task`'s pipeline (one: 4 records)."""
  return list(task.build_inputs(
      task.task_config.validation_data.replace(input_path=path)))


def _evaluate(task, model, batches):
  """One evaluation in-process: the logs of `reduce_aggregated_logs`."""
  metric_objects = task.build_metrics(training=False)
  state = None
  for batch in batches:
    state = task.aggregate_logs(
        state, task.validation_step(batch, model, metric_objects))
  return task.reduce_aggregated_logs(state)


def _head_outputs(model, batch):
  """Every head's raw output at the 8 queries of each of the batch's 4
  records: {task: [4, 8]}."""
  embs = model.output_embeddings(batch, training=False)
  out = model.readout.call_static(embs, batch['output_readout_index'])
  n_q = len(TIMES) * 2
  return {k: v[0].numpy()[:, :n_q, 0] for k, v in out.items()}


def _stitching_task():
  return task_lib.ReadoutTask(_task_config(
      evaluation=configs.Evaluation(print_table=False, stitch=True)))


@pytest.fixture(scope='module')
def stitched(data):
  """(batches, logs): the stitched evaluation of the records with sessions
  (no named sets)."""
  new, _, model = data
  task = _stitching_task()
  batches = _batches(task, new)
  return batches, _evaluate(task, model, batches)


def test_stitched_per_session_metrics_equal_numpy(data, stitched):
  _, _, model = data
  batches, logs = stitched
  (batch,) = batches
  # No string in the batch: the sessions are integers (names on the host);
  # padding queries (pad_multiple 16) have metric weight 0.
  np.testing.assert_array_equal(batch['session_index'], [0, 0, 1, 1])
  np.testing.assert_array_equal(batch['window_start'], [0, 0.5, 10, 10.5])
  assert not any(v.dtype == tf.string for v in batch.values())
  np.testing.assert_array_equal(batch['output_metric_weights'][:, 8:], 0)
  raw = _head_outputs(model, batch)
  # By hand: queries scored (eval mask, else weight > 0), de-normalised
  # speed predictions, then one point per (session, session time) with the
  # mean prediction.
  points = {}  # (task, session, time) -> [predictions], target
  for r, (_, session, start, mask, weights) in enumerate(_WINDOWS):
    for q in range(len(TIMES) * 2):
      scored = mask[q] if mask is not None else (
          1 if weights is None else weights[q] > 0)
      if not scored:
        continue
      task = 'speed' if q % 2 == 0 else 'choice'
      t = start + TIMES[q // 2]
      p = raw[task][r, q]
      y = _speed(t) if task == 'speed' else _choice(t)
      if task == 'speed':
        p = p * STD + MEAN
      points.setdefault((task, session, round(t, 6)), ([], y))[0].append(p)
  # Overlaps: A at 0.5 (both tasks) and 0.75 (speed only: a2's mask), B at
  # 10.5 and 10.75.
  assert len(points[('speed', 'A', 0.5)][0]) == 2
  assert len(points[('choice', 'A', 0.75)][0]) == 1
  assert len(points[('speed', 'B', 10.75)][0]) == 2

  def scores(session=None):
    out = {}
    for task in ('speed', 'choice'):
      keys = sorted(k for k in points if k[0] == task and
                    session in (None, k[1]))
      p = np.array([[np.mean(points[k][0])] for k in keys])
      y = np.array([[points[k][1]] for k in keys])
      if task == 'speed':
        out['speed/r2'] = metrics.r2_score(p, y)
        out['speed/pearson'] = metrics.pearson(p, y)
      else:
        out.update({f'choice/{m}': v for m, v in
                    metrics.binary_scores(p, y).items()})
    out['average/score'] = (out['speed/r2'] +
                            out['choice/balanced_accuracy']) / 2
    return out

  pooled, per = scores(), {s: scores(s) for s in 'AB'}
  for key, value in pooled.items():
    assert logs[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    for s in 'AB':
      assert logs[f'sessions/{s}/{key}'] == pytest.approx(
          per[s][key], rel=1e-5, abs=1e-6), (s, key)
    assert logs[f'{key}/session_mean'] == pytest.approx(
        (per['A'][key] + per['B'][key]) / 2, rel=1e-5, abs=1e-6), key
  # Stitching changed the pooled value (the test can fail): the same
  # queries scored one by one give another r2.
  unstitched = metrics.r2_score(
      np.array([[p] for k in points if k[0] == 'speed'
                for p in points[k][0]]),
      np.array([[points[k][1]] for k in points if k[0] == 'speed'
                for _ in points[k][0]]))
  assert abs(unstitched - pooled['speed/r2']) > 1e-4


def test_old_records_give_todays_numbers(data):
  """Records without session, window start and eval mask: the metrics use
  the loss weights, and stitching (each record its own session) changes
  nothing."""
  _, old, model = data
  task = _stitching_task()
  batches = _batches(task, old)  # session_index -1: no session_id.
  (batch,) = batches
  np.testing.assert_array_equal(batch['session_index'], [-1] * 4)
  np.testing.assert_array_equal(batch['output_metric_weights'],
                                batch['output_weights'])
  # Today's path (it reads no session key) and the stitched one.
  plain = _evaluate(task_lib.ReadoutTask(_task_config()), model, batches)
  stitched = _evaluate(task, model, batches)
  raw = _head_outputs(model, batch)
  w = batch['output_weights'].numpy()[:, :len(TIMES) * 2]
  y = batch['output_targets'].numpy()[:, :len(TIMES) * 2, 0]
  speed = np.s_[:, 0::2]
  expected = metrics.r2_score((raw['speed'][speed] * STD + MEAN).reshape(
      [-1, 1]), y[speed].reshape([-1, 1]), w[speed].reshape([-1]))
  assert plain['speed/r2'] == pytest.approx(expected, rel=1e-5)
  assert not any(k.startswith('sessions/') or k.endswith('/session_mean')
                 for k in stitched)
  assert sorted(plain) == sorted(stitched)
  for key in plain:
    assert float(stitched[key]) == pytest.approx(float(plain[key]),
                                                 rel=1e-6), key


def test_eval_mask_is_parsed_apart_from_the_weights():
  rng = np.random.default_rng(1)
  parser = dataloader.Parser(_task_config().validation_data, READOUTS, VOCAB)
  parse = lambda example: parser.parse(tf.constant(
      example.SerializeToString()))
  masked = parse(_window(rng, 'masked', None, 0.0, eval_mask=_A2_MASK,
                         weights=_A2_WEIGHTS))
  np.testing.assert_array_equal(masked['output_metric_weights'], _A2_MASK)
  np.testing.assert_array_equal(masked['output_weights'], _A2_WEIGHTS)
  plain = parse(_window(rng, 'plain', None, 0.0, weights=[0.5] * 8))
  np.testing.assert_array_equal(plain['output_metric_weights'], [0.5] * 8)
  bad = _window(rng, 'bad', None, 0.0, eval_mask=[2] + [1] * 7)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='Record `bad`.*query 0 has output_eval_mask 2; '
                     'expected 0 or 1'):
    parse(bad)


def test_stitch_refuses_disagreeing_targets():
  with pytest.raises(ValueError, match='task `speed`: session `A` at session '
                     'time 0.5 s has two queries with different targets'):
    metrics.stitch([[1.0], [2.0]], [[1.0], [1.5]], [1.0, 1.0], [0, 0],
                   [0.5, 0.5 + 1e-8], 1e-6, task='speed',
                   session_names={0: 'A'})


def test_normalised_loss_and_served_output(data, tmp_path):
  _, _, model = data
  spec = READOUTS[0]
  p, y = np.array([[0.5], [-1.0]], np.float32), np.array([[3.0], [1.0]],
                                                          np.float32)
  sums = losses.loss_sums({'speed': spec}, {'speed': tf.constant(p)},
                          {'speed': tf.constant(y)},
                          {'speed': tf.constant([1.0, 1.0])})
  assert float(losses.task_losses({'speed': spec}, sums)['speed']) == (
      pytest.approx(np.mean((p - (y - MEAN) / STD) ** 2)))
  params = cfg.ExperimentConfig(task=_task_config())
  module = export.ReadoutExportModule(params, model)
  index = tf.constant([[SPEED, CHOICE]], tf.int32)
  served = module.serve_tokens(
      tf.ones([1, 3, INPUT_DIM]), tf.constant([[0.0, 0.4, 0.8]]),
      tf.ones([1, 3], tf.bool), index, tf.constant([[0.1, 0.2]]))
  raw = model.readout.call_static(model.output_embeddings({
      'input_values': tf.ones([1, 3, INPUT_DIM]),
      'input_timestamps': tf.constant([[0.0, 0.4, 0.8]]),
      'input_mask': tf.ones([1, 3], tf.bool), 'output_readout_index': index,
      'output_timestamps': tf.constant([[0.1, 0.2]])}), index)
  np.testing.assert_allclose(served['speed'].numpy(),
                             raw['speed'][0].numpy() * STD + MEAN, rtol=1e-6)
  np.testing.assert_allclose(served['choice'].numpy(),
                             raw['choice'][0].numpy(), rtol=1e-6)


@pytest.mark.parametrize('changes,match', [
    (dict(type='binary'), 'normalize_mean / normalize_std are set but its '
     "type is 'binary'; target normalisation applies to continuous"),
    (dict(normalize_std=(0.0,)), 'normalize_std .0.0.; expected every value '
     '> 0'),
    (dict(normalize_std=()), r'normalize_mean \[0.0\] and normalize_std '
     r'\[\]; set both or neither'),
    (dict(normalize_mean=(1.0, 2.0, 3.0)), 'normalize_mean has 3 values; '
     'expected 1 or dim = 2'),
])
def test_normalisation_errors_name_the_spec(changes, match):
  spec = configs.ReadoutSpec(name='paw', dim=2, type='continuous',
                             normalize_mean=(0.0,), normalize_std=(1.0, 2.0))
  with pytest.raises(ValueError, match='task.readouts `paw`: ' + match):
    configs.validate_readouts([spec.replace(**changes)], ['paw'])


# Padded queries [B=4, n_out=3]: speed in samples 0, 1, 2 (weight 0 in 2),
# choice in sample 3 only; sample 1 also has a weight-0 choice query.
_INDEX = np.array([[1, 1, 0], [1, 2, 0], [1, 0, 0], [2, 0, 0]], np.int32)
_WEIGHTS = np.array([[1, 2, 0], [1, 0, 0], [0, 0, 0], [1, 0, 0]], np.float32)
_SPECS = {'speed': configs.ReadoutSpec(name='speed', loss_weight=2.0),
          'choice': configs.ReadoutSpec(name='choice', type='binary',
                                        loss_weight=0.5)}


def _rows(index, weights, values):
  mask = {'speed': index == SPEED, 'choice': index == CHOICE}
  return ({k: tf.constant(values[m][:, None], tf.float32)
           for k, m in mask.items()},
          {k: tf.constant(np.ones([m.sum(), 1]), tf.float32)
           for k, m in mask.items()},
          {k: tf.constant(weights[m]) for k, m in mask.items()})


def test_sample_share_weighting_equals_numpy(mirrored):
  values = np.arange(12, dtype=np.float32).reshape([4, 3]) / 10
  p, y, w = _rows(_INDEX, _WEIGHTS, values)
  task_index = {'speed': SPEED, 'choice': CHOICE}
  sums = losses.loss_sums(_SPECS, p, y, w)
  counts = losses.sample_counts(_SPECS, task_index, _INDEX, _WEIGHTS, None,
                                tf.ones([4], tf.bool))
  # By hand: speed in 2 of 4 samples (weight > 0), choice in 1 of 4.
  assert float(counts[0]['speed']) == 2 and float(counts[0]['choice']) == 1
  speed = (1 * (0.0 - 1) ** 2 + 2 * (0.1 - 1) ** 2 + 1 * (0.3 - 1) ** 2) / 4
  choice = np.log1p(np.exp(-0.9))  # Sigmoid cross-entropy of 0.9, label 1.
  out = losses.task_losses(_SPECS, sums, counts=counts)
  assert float(out['total_loss']) == pytest.approx(
      2.0 * 2 / 4 * speed + 0.5 * 1 / 4 * choice, rel=1e-6)
  assert float(losses.task_losses(_SPECS, sums)['total_loss']) == (
      pytest.approx(2.0 * speed + 0.5 * choice, rel=1e-6))
  # Chained queries count the same samples.
  valid = _INDEX != 0
  chained = losses.sample_counts(
      _SPECS, task_index, _INDEX[valid], _WEIGHTS[valid],
      np.nonzero(valid)[0].astype(np.int32), tf.ones([4], tf.bool))
  assert {k: float(v) for k, v in chained[0].items()} == {'speed': 2.0,
                                                          'choice': 1.0}
  # Two replicas (samples 0-1 and 2-3): the shares add up to the global
  # value, the counts taken over the global batch.
  strategy = mirrored
  halves = [(_INDEX[2 * i:2 * i + 2], _WEIGHTS[2 * i:2 * i + 2],
             values[2 * i:2 * i + 2]) for i in range(2)]

  def replica_fn(ctx):
    i = ctx.replica_id_in_sync_group
    index, weights, vals = halves[i]
    return {'index': tf.constant(index), 'weights': tf.constant(weights),
            'values': tf.constant(vals)}

  def step(inputs):
    index, weights = inputs['index'], inputs['weights']
    routed = {}
    for name, task_id in task_index.items():
      keep = tf.equal(index, task_id)
      routed[name] = (tf.boolean_mask(inputs['values'], keep)[:, None],
                      tf.boolean_mask(weights, keep))
    sums = losses.loss_sums(
        _SPECS, {k: v[0] for k, v in routed.items()},
        {k: tf.ones_like(v[0]) for k, v in routed.items()},
        {k: v[1] for k, v in routed.items()})
    share, total = losses.global_task_losses(_SPECS, sums, losses.sample_counts(
        _SPECS, task_index, index, weights, None, tf.ones([2], tf.bool)))
    return share['total_loss'], total['total_loss']

  inputs = strategy.experimental_distribute_values_from_function(replica_fn)
  share, total = strategy.run(step, args=(inputs,))
  shares = [float(s) for s in strategy.experimental_local_results(share)]
  expected = float(out['total_loss'])
  assert sum(shares) == pytest.approx(expected, rel=1e-6)
  assert [float(t) for t in strategy.experimental_local_results(total)] == (
      pytest.approx([expected] * 2, rel=1e-6))


def test_task_config_chooses_the_weighting(data):
  """`task.loss_weighting` reaches the task's loss (and the joint path's
  `global_losses`): sample_share total = sum_t w_t n_t / n loss_t."""
  _, _, model = data
  rng = np.random.default_rng(2)
  batch = {
      'input_values': rng.normal(size=[4, 3, INPUT_DIM]).astype(np.float32),
      'input_timestamps': np.tile(np.float32([0.0, 0.4, 0.8]), [4, 1]),
      'input_mask': np.ones([4, 3], bool),
      'output_readout_index': _INDEX,
      'output_timestamps': np.full([4, 3], 0.1, np.float32),
      'output_weights': _WEIGHTS,
      'output_targets': np.ones([4, 3, 1], np.float32),
  }
  outputs = model(batch)
  plain = task_lib.ReadoutTask(_task_config())
  shared = task_lib.ReadoutTask(_task_config(loss_weighting='sample_share'))
  per_task = losses.task_losses(
      plain.readout_specs, losses.loss_sums(
          plain.readout_specs, *plain.route(model, batch, outputs)))
  # speed (loss_weight 1): 2 of 4 samples; choice: 1 of 4.
  expected = per_task['speed'] * 2 / 4 + per_task['choice'] * 1 / 4
  assert float(shared.build_losses(batch, outputs, model=model)) == (
      pytest.approx(float(expected), rel=1e-6))
  assert float(shared.global_losses(batch, shared.route(
      model, batch, outputs))[1]['total_loss']) == pytest.approx(
          float(expected), rel=1e-6)
  assert float(plain.build_losses(batch, outputs, model=model)) == (
      pytest.approx(float(per_task['speed'] + per_task['choice']), rel=1e-6))
  with pytest.raises(ValueError, match="task.loss_weighting is 'mean'"):
    task_lib.ReadoutTask(_task_config(loss_weighting='mean'))


def test_named_sets_are_stitched_each_on_its_own(data, stitched, tmp_path):
  """Two named evaluation sets with stitching, in one pass: set `x` (the
  records with sessions A, B) reports under `x/` exactly the pooled,
  per-session and session-mean keys of its stitched evaluation alone, so
  set `y` (a window of session A that overlaps x's A windows on the session
  clock, and a session C that x lacks) was neither stitched with it nor
  named with x's sessions; y has its own per-session keys."""
  new, _, model = data
  _, alone = stitched
  other = str(tmp_path / 'other.tfrecord')
  rng = np.random.default_rng(1)
  dataloader.write_records(other, [
      _window(rng, name, session, start)
      for name, session, start in (('a3', 'A', 0.25), ('c1', 'C', 3.0),
                                   ('c2', 'C', 3.5))])
  base = _task_config()
  set_data = lambda path: base.validation_data.replace(  # No padding batch.
      input_path=path, is_training=False, drop_remainder=False)
  evaluation = configs.Evaluation(print_table=False, stitch=True, eval_sets=(
      configs.EvalSet(name='x', data=set_data(new)),
      configs.EvalSet(name='y', data=set_data(other))))
  task = task_lib.ReadoutTask(base.replace(evaluation=evaluation))
  logs = _evaluate(task, model,
                   list(task.build_inputs(task.task_config.validation_data)))
  assert {'sessions/A/speed/r2', 'sessions/B/choice/balanced_accuracy',
          'speed/r2/session_mean', 'average/score/session_mean'} <= set(alone)
  assert {k[len('x/'):]: v for k, v in logs.items()
          if k.startswith('x/')} == pytest.approx(alone, rel=1e-6)
  y = {k[len('y/'):] for k in logs if k.startswith('y/')}
  assert {k.replace('sessions/B/', 'sessions/C/') for k in alone} == y
  assert logs['x/sessions/A/speed/r2'] != logs['y/sessions/A/speed/r2']
