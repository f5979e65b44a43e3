"""The progress line: an Orbit train action, not a controller override."""
import logging
import re

import orbit
import tensorflow as tf

from official.core import exp_factory
from official_ext.core.run import orbit_actions
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from tests.yt8m.test_train import _tiny_overrides


class _Clock:

  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def test_progress_action_logs_steps_elapsed_and_time_left(caplog):
  caplog.set_level(logging.INFO, logger='absl')
  step, clock = tf.Variable(40, dtype=tf.int64), _Clock()
  progress = orbit_actions.ProgressAction(step, total_steps=100, clock=clock)
  progress.start()  # A run resumed at step 40.
  step.assign(60)
  clock.now += 20.0  # 20 steps in 20 s: 40 steps left take 40 s.
  progress({'training_loss': 0.5})
  assert ('progress | step 60/100 (60%) | elapsed 0:00:20 | time left '
          '0:00:40') in caplog.text
  step.assign(100)
  clock.now += 3600.0 + 40.0
  progress({})
  assert 'progress | step 100/100 (100%) | elapsed 1:01:00 | time left ' \
         '0:00:00' in caplog.text


def test_without_start_the_first_call_starts_the_clock(caplog):
  caplog.set_level(logging.INFO, logger='absl')
  step, clock = tf.Variable(0, dtype=tf.int64), _Clock()
  progress = orbit_actions.ProgressAction(step, total_steps=10, clock=clock)
  step.assign(5)
  progress({})
  assert 'progress |' not in caplog.text
  step.assign(10)
  clock.now += 5.0
  progress({})
  assert re.search(r'progress \| step 10/10 \(100%\) \| elapsed 0:00:05',
                   caplog.text)


def test_a_run_gives_progress_to_orbits_own_controller(tmp_path, monkeypatch,
                                                        caplog):
  """`official_ext.train` runs Orbit's own `Controller` (no subclass with a
  loop of its own) and gives it the progress line as a train action, which
  logs after each train loop."""
  caplog.set_level(logging.INFO, logger='absl')
  built = []
  init = orbit.Controller.__init__

  def record(self, *args, **kwargs):
    built.append((type(self), list(kwargs.get('train_actions') or ())))
    init(self, *args, **kwargs)

  monkeypatch.setattr(orbit.Controller, '__init__', record)
  overrides = _tiny_overrides(tmp_path / 'cache', train_steps=2)
  overrides['trainer'].update(steps_per_loop=1, checkpoint_interval=2,
                              summary_interval=2)
  params = exp_factory.get_exp_config('yt8m_demo')
  params.override(overrides, is_strict=True)
  train.run(params, 'train', str(tmp_path / 'model'))
  assert [kind for kind, _ in built] == [orbit.Controller]
  progress = [a for a in built[0][1]
              if isinstance(a, orbit_actions.ProgressAction)]
  assert len(progress) == 1
  assert 'progress | step 2/2 (100%)' in caplog.text


def test_format_metrics_flattens_tasks():
  table = orbit_actions.format_metrics(
      {'readout': {'choice/balanced_accuracy': 0.75}, 'yt8m': {'map': 0.5},
       'training_loss': 1.25, 'text': 'skipped'})
  assert table.splitlines() == [
      '  readout/choice/balanced_accuracy 0.7500',
      '  training_loss                    1.2500',
      '  yt8m/map                         0.5000']
  assert orbit_actions.format_metrics({'map': 0.5}) == (
      '  map                      0.5000')
