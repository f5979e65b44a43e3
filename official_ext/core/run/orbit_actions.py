"""Orbit actions shared by every experiment: progress, last output, results.

`ProgressAction` and `LastOutput` are Orbit actions: callables that
`orbit.Controller` calls with a loop's output after each train loop
(`train_actions`) or each evaluation (`eval_actions`). `official_ext.train`
gives them to the runner with the other actions (`core.run.trainer`,
Model Garden's `official.core.actions`).
"""
import time
from typing import Any, Callable, Dict, Optional

from absl import logging
import tensorflow as tf


class ProgressAction:
  """Orbit train action: logs progress and the time left after each loop.

  Logs `progress | step s/total (p%) | elapsed H:MM:SS | time left H:MM:SS`,
  the time left extrapolated from the mean rate since `start` (so a resumed
  run estimates from its own steps, not from the steps it restored).

  Args:
    global_step: the trainer's global step variable.
    total_steps: the step training ends at (`trainer.train_steps`).
    clock: seconds, `time.time` (tests pass a fake).
  """

  def __init__(self, global_step: tf.Variable, total_steps: int,
               clock: Callable[[], float] = time.time):
    self._global_step = global_step
    self._total_steps = int(total_steps)
    self._clock = clock
    self._start: Optional[tuple] = None

  def start(self) -> None:
    """Starts the clock at the current step.

    Call once the checkpoint is restored, right before training (the runner
    restores when it builds the controller). Without it the first call
    starts the clock instead, and the first loop logs no estimate.
    """
    self._start = (self._clock(), int(self._global_step.numpy()))

  def __call__(self, output: Optional[Dict[str, Any]] = None) -> None:
    if self._start is None:
      self.start()
      return
    start_time, start_step = self._start
    step = int(self._global_step.numpy())
    elapsed = self._clock() - start_time
    done = step - start_step
    if self._total_steps <= 0 or done <= 0:
      return
    left = max(self._total_steps - step, 0) * elapsed / done
    logging.info('progress | step %d/%d (%.0f%%) | elapsed %s | time left %s',
                 step, self._total_steps, 100.0 * step / self._total_steps,
                 _hms(elapsed), _hms(left))


def _hms(seconds: float) -> str:
  seconds = int(round(seconds))
  return f'{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}'


class LastOutput:
  """An Orbit action that keeps the last output it was called with."""

  def __init__(self):
    self.output: Dict[str, Any] = {}

  def __call__(self, output: Dict[str, Any]):
    self.output = dict(output or {})


def flatten_metrics(metrics: Dict[str, Any], prefix: str = ''
                    ) -> Dict[str, Any]:
  """{task: {metric: v}} (a multitask output) -> {'task/metric': v}.

  Args:
    metrics: an Orbit output, nested dicts allowed (Model Garden's multitask
      trainer and evaluator report one dict per task).
    prefix: prepended to every key, with '/'.

  Returns:
    A flat dict; a flat input comes back with the same keys.
  """
  flat = {}
  for key, value in (metrics or {}).items():
    name = f'{prefix}/{key}' if prefix else str(key)
    if isinstance(value, dict):
      flat.update(flatten_metrics(value, name))
    else:
      flat[name] = value
  return flat


def format_metrics(metrics: Dict[str, Any]) -> str:
  """Formats scalar metrics as an aligned two-column table.

  Nested dicts (one per task of a multitask experiment) are flattened to
  `task/metric` (`flatten_metrics`); non-scalar values are left out. Names
  are padded to 24 characters, or to the longest name.
  """
  metrics = flatten_metrics(metrics)
  values = {}
  for name in sorted(metrics):
    try:
      values[name] = float(metrics[name])
    except (TypeError, ValueError):
      continue
  width = max([24] + [len(name) for name in values])
  return '\n'.join(f'  {name:<{width}s} {value:.4f}'
                   for name, value in values.items())


class NonFiniteLossError(RuntimeError):
  """The training loss became NaN or infinite."""


class NonFiniteLossCheck:
  """Orbit train action: raises `NonFiniteLossError` after a bad loop.

  Args:
    trainer: the experiment's trainer. With a trainer of this module (which
      records `first_nonfinite_step`) the error names the exact step; with
      another trainer it names the loop (the loop's mean `training_loss` is
      checked).
  """

  def __init__(self, trainer):
    self._trainer = trainer

  def __call__(self, output: Dict[str, Any]):
    step = int(self._trainer.global_step.numpy())
    loss = (output or {}).get('training_loss')
    if getattr(self._trainer, 'per_step_check', False):
      bad_step = self._trainer.first_nonfinite_step
      if bad_step < 0:
        return
      where = f'at step {bad_step}'
    else:
      if loss is None or bool(tf.reduce_all(tf.math.is_finite(loss))):
        return
      where = f'in the train loop ending at step {step}'
    raise NonFiniteLossError(
        f'Training loss is not finite {where} (loop mean training_loss='
        f'{float(loss) if loss is not None else "?"}). Training stopped '
        f'before saving step {step}; the latest checkpoint in model_dir is '
        'from before it. Lower the learning rate or enable gradient '
        'clipping, and check the input data.')
