"""The progress line: an Orbit train action, not a controller override."""
import logging
import re

import orbit
import tensorflow as tf

from official_ext.core import orbit_actions


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


def test_orbit_controller_is_not_subclassed():
  """Progress is an action: the controller's private loop is Orbit's own."""
  assert not any(isinstance(v, type) and issubclass(v, orbit.Controller)
                 for v in vars(orbit_actions).values())


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
