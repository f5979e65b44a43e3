"""Orbit actions shared by every experiment: progress, last output, results, the
non-finite-loss stop."""
import time
from typing import Any, Callable, Dict, Optional

from absl import logging
import tensorflow as tf


class ProgressAction:
  """Orbit train action: logs the step, elapsed time and time left.

  The rate counts from `start`; `clock`: `time.time`, or a fake.
  """

  def __init__(self, global_step: tf.Variable, total_steps: int,
               clock: Callable[[], float] = time.time):
    self._global_step = global_step
    self._total_steps = int(total_steps)
    self._clock = clock
    self._start: Optional[tuple] = None

  def start(self) -> None:
    """Starts the clock at the current step (call after the restore)."""
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
  """{task: {metric: v}} -> {'task/metric': v}."""
  flat = {}
  for key, value in (metrics or {}).items():
    name = f'{prefix}/{key}' if prefix else str(key)
    if isinstance(value, dict):
      flat.update(flatten_metrics(value, name))
    else:
      flat[name] = value
  return flat


def format_metrics(metrics: Dict[str, Any]) -> str:
  """Scalar metrics (flattened) as an aligned two-column table."""
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
  """Orbit train action: `NonFiniteLossError` after a bad loop."""

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
