"""Named evaluation sets (`task.evaluation.eval_sets`) of the readout task.

Two tiny generated sets (held-out trials of the training sessions, and a
held-out session) are evaluated in one validation pass; each set's metrics
must equal an evaluation of that set alone. The evaluations here run the
task's evaluation steps eagerly on one model trained a step (what Model
Garden's trainer does, without tracing); one `train.run(..., 'eval', ...)` shows the
names through the runner.
"""
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official_ext.core.input import eval_padding
from official_ext.readout import configs
from official_ext.readout import demo_data
from official_ext.readout import task as task_lib
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train

_SETS = ('held_out_trials', 'held_out_sessions')
_DATA = {'global_batch_size': 16, 'batching': 'padded',
         'drop_remainder': False}


def _params(cache_dir):
  params = exp_factory.get_exp_config('readout_demo_named_eval')
  eval_data = dict(_DATA, num_examples=-1)
  params.override({
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': {
          'model': {'encoder': {'hidden_size': 8, 'num_heads': 2,
                                'num_layers': 1, 'intermediate_size': 8}},
          'train_data': dict(_DATA, drop_remainder=True),
          'validation_data': eval_data,
          'demo_data': {'cache_dir': str(cache_dir), 'num_train_trials': 8,
                        'num_validation_trials': 11, 'num_sessions': 2,
                        'num_held_out_sessions': 1,
                        'num_held_out_session_trials': 10},
          'evaluation': {'print_table': False, 'eval_sets': [
              {'name': _SETS[0], 'data': eval_data,
               'demo_split': 'validation'},
              {'name': _SETS[1], 'data': eval_data,
               'demo_split': 'held_out_sessions'}]},
      },
      'trainer': {'train_steps': 1, 'validation_steps': -1,
                  'eval_tf_function': False},
  }, is_strict=True)
  params.validate()
  return params


def _with(task_config, **evaluation):
  return task_config.replace(
      evaluation=task_config.evaluation.replace(**evaluation))


def _evaluate(task_config, model):
  """One evaluation as Model Garden's trainer runs it, eagerly: the
  validation metrics' results, then `reduce_aggregated_logs`."""
  task = task_lib.ReadoutTask(task_config)
  metrics = task.build_metrics(training=False)
  state = None
  for batch in task.build_inputs(task_config.validation_data):
    state = task.aggregate_logs(state, task.validation_step(batch, model,
                                                            metrics))
  logs = {m.name: float(m.result()) for m in metrics}
  logs.update(task.reduce_aggregated_logs(state))
  return logs


@pytest.fixture(scope='module')
def both(tmp_path_factory):
  """(params, model, logs): `train.run(params, 'eval', ...)` of a model
  trained one step (`--mode=eval` needs a checkpoint) on both sets (eagerly:
  `trainer.eval_tf_function` false; the step too, as tracing it would cost
  ~10x running it)."""
  root = tmp_path_factory.mktemp('named_eval')
  params = _params(root / 'cache')
  tf_keras.utils.set_random_seed(1)
  eager = params.replace()
  eager.override({'trainer': {'train_tf_function': False,
                              'train_tf_while_loop': False}}, is_strict=True)
  train.run(eager, 'train', str(root / 'model'))
  model, logs = train.run(params, 'eval', str(root / 'model'))
  return params, model, logs


def test_eval_reports_every_metric_under_its_set(both):
  _, _, logs = both
  assert int(logs['held_out_trials/num_examples']) == 11
  assert int(logs['held_out_sessions/num_examples']) == 10
  for name in _SETS:
    assert {'average/score', 'choice/balanced_accuracy', 'wheel_speed/r2',
            'total_loss', 'stimulus_loss'} <= {
                k[len(name) + 1:] for k in logs if k.startswith(name + '/')}
  assert not {'total_loss', 'num_examples', 'choice/r2',
              'average/score'} & set(logs)
  # Different sessions, different scores.
  assert (logs['held_out_trials/average/score'] !=
          logs['held_out_sessions/average/score'])


def test_each_set_alone_equals_its_part_of_the_pass_over_both(both):
  params, model, logs = both
  part = lambda prefix: {k[len(prefix):]: float(v) for k, v in logs.items()
                         if k.startswith(prefix)}
  # As --params_override='task.evaluation.eval_set=held_out_trials': only
  # that set is evaluated, with the values it has in the pass over both.
  selected = params.replace()
  selected.override({'task': {'evaluation': {'eval_set': 'held_out_trials'}}},
                    is_strict=True)
  alone = _evaluate(selected.task, model)
  assert all(k.startswith('held_out_trials/') for k in alone), sorted(alone)
  assert alone == pytest.approx({k: float(v) for k, v in logs.items()
                                 if k.startswith('held_out_trials/')},
                                rel=1e-6)
  # No named sets: the held-out session as `task.validation_data`, under
  # today's names and with the values it has as a set.
  plain_config = _with(params.task, eval_sets=()).replace(
      validation_data=params.task.validation_data.replace(
          input_path=demo_data.demo_split_pattern(params.task,
                                                  'held_out_sessions')))
  plain = _evaluate(plain_config, model)
  assert plain == pytest.approx(part('held_out_sessions/'), rel=1e-6)


def test_unknown_set_name_is_an_error_naming_the_key_and_the_sets(both):
  params, _, _ = both
  with pytest.raises(ValueError, match=re.escape(
      "task.evaluation.eval_set='held_out_animals' names no evaluation set; "
      "known names (task.evaluation.eval_sets): ['held_out_trials', "
      "'held_out_sessions']")):
    task_lib.ReadoutTask(_with(params.task, eval_set='held_out_animals'))


def test_an_empty_set_is_an_error_naming_that_set(both, tmp_path):
  params, model, _ = both
  path = str(tmp_path / 'empty.tfrecord')
  with tf.io.TFRecordWriter(path):
    pass  # Zero records.
  sets = params.task.evaluation.eval_sets
  empty = sets[1].replace(data=sets[1].data.replace(input_path=path))
  config = _with(params.task, eval_sets=(sets[0], empty),
                 eval_set='held_out_sessions')
  with pytest.raises(eval_padding.EmptyEvaluationError, match=re.escape(
      "evaluation set 'held_out_sessions': task.evaluation.eval_sets[1].data."
      f"input_path='{path}' gave 0 records to evaluate (task.evaluation."
      'eval_sets[1].data.global_batch_size=16, task.evaluation.eval_sets[1].'
      'data.drop_remainder=False)')):
    _evaluate(config, model)


def test_demo_data_has_sessions(both):
  params, _, _ = both
  records = {}
  for split in ('train', 'validation', 'held_out_sessions'):
    pattern = demo_data.demo_split_pattern(params.task, split)
    files = sorted(tf.io.gfile.glob(pattern))
    records[split] = [tf.train.Example.FromString(r.numpy())
                      for r in tf.data.TFRecordDataset(files)]
  session = lambda r: r.features.feature['session_id'].bytes_list.value[0]
  start = lambda r: r.features.feature['window_start'].float_list.value[0]
  assert {session(r) for r in records['validation']} == {
      b'session-000', b'session-001'}
  assert {session(r) for r in records['held_out_sessions']} == {
      b'session-002'}
  # A session's trials follow each other on its clock, its train trials
  # first, then its validation trials.
  starts = [start(r) for split in ('train', 'validation')
            for r in records[split] if session(r) == b'session-000']
  assert starts[0] == 0.0 and np.all(np.diff(starts) > 1.0)
  # No two trials of one session overlap on its clock, in any split: each
  # trial spans [window_start, window_start + its last input or query time].
  spans = {}
  for split_records in records.values():
    for r in split_records:
      f = r.features.feature
      end = max(max(f['input_timestamps'].float_list.value),
                max(f['output_timestamps'].float_list.value))
      spans.setdefault(session(r), []).append((start(r), start(r) + end))
  assert set(spans) == {b'session-000', b'session-001', b'session-002'}
  for session_spans in spans.values():
    session_spans.sort()
    for (_, end), (next_start, _) in zip(session_spans, session_spans[1:]):
      assert next_start > end, session_spans
  # Session 0 keeps the shared mixing; another session has its own gains.
  mixing = np.ones([3, 4])
  assert demo_data.session_mixing(mixing, 0, 0, 0.5) is mixing
  gains = demo_data.session_mixing(mixing, 0, 2, 0.5)[0]
  assert not np.allclose(gains, 1.0)
  assert not np.allclose(gains, demo_data.session_mixing(mixing, 0, 3,
                                                         0.5)[0])



def test_rows_carry_their_trials_set_in_every_batch_layout(both):
  """`route_eval_sets` puts each routed query row in its trial's set, for
  chained (varlen) and padded queries, and with static shapes."""
  params, model, _ = both
  task = task_lib.ReadoutTask(params.task)
  ids = configs.task_index(params.task.task_vocabulary)
  trial_sets = tf.constant([1, 0, 1], tf.int32)
  # Chained: queries of trials 0, 0, 1, 2 (choice, wheel, choice, wheel).
  index = tf.constant([ids['choice'], ids['wheel_speed'], ids['choice'],
                       ids['wheel_speed']], tf.int32)
  chained = {task_lib.SET_KEY: trial_sets, 'output_readout_index': index,
             'output_batch_index': tf.constant([0, 0, 1, 2], tf.int32),
             'output_weights': tf.ones([4])}
  rows = task.route_eval_sets(model, chained)
  assert rows['choice'].numpy().tolist() == [1, 0]
  assert rows['wheel_speed'].numpy().tolist() == [1, 1]
  assert rows['reward'].numpy().tolist() == []
  # Padded [3 trials, 2 queries], 0 = padding.
  padded = {task_lib.SET_KEY: trial_sets,
            'output_readout_index': tf.reshape(
                tf.concat([index[:2], [ids['choice'], 0],
                           [ids['wheel_speed'], 0]], 0), [3, 2]),
            'output_weights': tf.ones([3, 2])}
  rows = task.route_eval_sets(model, padded)
  assert rows['choice'].numpy().tolist() == [1, 0]
  assert rows['wheel_speed'].numpy().tolist() == [1, 1]

  class Static:
    static_shapes = True

  rows = task.route_eval_sets(Static(), padded)
  assert rows['reward'].numpy().tolist() == [1, 1, 0, 0, 1, 1]
