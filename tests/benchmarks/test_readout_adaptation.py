"""The adaptation curves' driver: what each arm trains, and its figures.

The driver runs at tiny sizes here (a few steps): the tests check the
figures' structure and that the two arms differ in what they train, never
the scores (`python -m official_ext.benchmark readout_adaptation` measures
them).
"""
import io
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from official_ext.benchmarks import readout_adaptation as adaptation

# One trial count; the pretrained arm identifies units for all its steps
# (identification_steps == adaptation_steps), so nothing but the held-out
# session's embedding rows may change in it.
TINY = adaptation.QUICK._replace(trial_counts=(4,), pretrain_steps=2,
                                 identification_steps=2, adaptation_steps=2)


def _figures():
  """Hand-made figures of two tasks at two counts."""
  tasks = [['choice', 'balanced_accuracy'], ['wheel_speed', 'r2']]
  arm = lambda base: {str(n): {'choice/balanced_accuracy': base + n / 100,
                               'wheel_speed/r2': base + n / 200,
                               'average/score': base + n / 150}
                      for n in (16, 64)}
  return {'trial_counts': [16, 64], 'tasks': tasks, 'pretrain_sessions': 6,
          'held_out_session': 'session-006', 'held_out_units': 37,
          'test_trials': 128, 'batch_size': 32,
          'steps': {'pretrain': 600, 'identification': 100,
                    'adaptation': 300},
          'pretrained': arm(0.5), 'scratch': arm(0.25)}


def test_tables_and_plot_show_both_arms_at_every_count():
  figures = _figures()
  summary = adaptation.summary_table(figures)
  lines = summary.splitlines()
  assert lines[0] == ('| held-out session: `average/score` | 16 trials | '
                      '64 trials |')
  assert lines[2] == ('| (a) pretrained, unit identification then '
                      'fine-tuning | 0.607 | 0.927 |')
  assert lines[3] == '| (b) the same model from scratch | 0.357 | 0.677 |'
  table = adaptation.table(figures)
  assert ('| choice (balanced accuracy) | 0.660 | 0.410 | 1.140 | 0.890 |'
          in table)
  assert '| wheel_speed (r2) | 0.580 | 0.330 | 0.820 | 0.570 |' in table
  assert ('| **average/score** | **0.607** | **0.357** | **0.927** | '
          '**0.677** |') in table
  assert '6 sessions' in table and '`session-006` (37 units)' in table
  stream = io.BytesIO()
  adaptation.plot(figures, stream)
  assert stream.getvalue().startswith(b'\x89PNG')


def test_a_score_the_run_did_not_report_is_named():
  with pytest.raises(ValueError, match=r"dir: the evaluation reported no "
                     r"\['wheel_speed/r2'\]"):
    adaptation._scores({'choice/balanced_accuracy': 0.5,  # pylint: disable=protected-access
                        'average/score': 0.5},
                       [('choice', 'balanced_accuracy'), ('wheel_speed', 'r2')],
                       'dir')


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  """(figures, work_dir) of a tiny run: pretraining, then both arms at one
  trial count, 2 steps each."""
  work_dir = str(tmp_path_factory.mktemp('adaptation'))
  cache = str(tmp_path_factory.mktemp('cache'))
  size = TINY._replace(overrides=TINY.overrides + (
      ('task.demo_data.cache_dir', cache),))
  return adaptation.run(size=size, work_dir=work_dir), work_dir


def _variables(model_dir):
  """{name: value} of a model_dir's latest checkpoint (model variables and
  their Adam `m` slots; the step counters left out)."""
  path = tf.train.latest_checkpoint(model_dir)
  return {n: tf.train.load_variable(path, n)
          for n, _ in tf.train.list_variables(path)
          if n.endswith('VARIABLE_VALUE') and '/v/' not in n and
          'iter' not in n and 'save_counter' not in n and
          'global_step' not in n}


_TABLES = ('unit_embedding', 'session_embedding')


def test_figures_hold_every_arm_count_and_task(tiny_run):
  figures, _ = tiny_run
  assert figures['trial_counts'] == [4]
  assert figures['steps'] == {'pretrain': 2, 'identification': 2,
                              'adaptation': 2}
  names = {f'{t}/{m}' for t, m in figures['tasks']} | {'average/score'}
  assert len(names) == 9  # The demo's eight readouts and their mean.
  for arm in adaptation.ARMS:
    assert set(figures[arm]) == {'4'}
    assert set(figures[arm]['4']) == names
    assert all(np.isfinite(v) for v in figures[arm]['4'].values())
  assert figures['pretrain_sessions'] == 2
  assert figures['held_out_session'] == 'session-002'
  assert 1 <= figures['held_out_units'] <= 8


def test_identification_trains_only_the_new_sessions_rows(tiny_run):
  """Every pretrained variable stays bit-identical, the tables' old rows
  too; only the held-out session's rows have gradient moments."""
  _, work_dir = tiny_run
  pretrained = _variables(os.path.join(work_dir, 'pretrain'))
  adapted = _variables(os.path.join(work_dir, 'pretrained_4'))
  values = [n for n in pretrained if '.OPTIMIZER_SLOT' not in n]
  assert len(values) > 20
  for name in values:
    old, new = pretrained[name], adapted[name]
    if 'unit_vocabulary' in name:  # The stored vocabulary, extended.
      old, new = json.loads(old), json.loads(new)
      assert new['sessions'] == old['sessions'] + ['session-002']
      assert new['units'][:len(old['units'])] == old['units']
    elif any(t in name for t in _TABLES):
      np.testing.assert_array_equal(new[:old.shape[0]], old, err_msg=name)
      moment = adapted[name.replace(
          '.ATTRIBUTES', '.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES')]
      assert not np.any(moment[:old.shape[0]]), name
      assert np.any(moment[old.shape[0]:]), name  # The new rows trained.
      assert new.shape[0] > old.shape[0], name
    else:
      np.testing.assert_array_equal(new, old, err_msg=name)


def test_from_scratch_every_module_trains(tiny_run):
  _, work_dir = tiny_run
  scratch = _variables(os.path.join(work_dir, 'scratch_4'))
  moved = {module: False for module in ('encoder', 'decoder', 'readout')
           + _TABLES}
  for name, value in scratch.items():
    if '/m/' in name and np.any(value):
      for module in moved:
        if name.startswith((module + '/', 'model/' + module + '/')):
          moved[module] = True
  assert all(moved.values()), moved
