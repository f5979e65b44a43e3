"""Orbit controller pieces shared by every family: progress and results."""
import time
from typing import Any, Dict, Optional

from absl import logging
import orbit


class ProgressController(orbit.Controller):
  """An `orbit.Controller` that also logs progress and time left.

  After each train loop it logs `progress | step s/total (p%) | elapsed |
  time left`, the time left extrapolated from the mean rate since this
  process started training (so a resumed run estimates from its own steps).
  Set `total_steps` with `with_total_steps`.
  """
  total_steps: Optional[int] = None

  @classmethod
  def with_total_steps(cls, total_steps: int):
    return type(cls.__name__, (cls,), {'total_steps': int(total_steps)})

  def _train_n_steps(self, num_steps: int):
    if not hasattr(self, '_progress_start'):
      self._progress_start = (time.time(), int(self.global_step.numpy()))
    super()._train_n_steps(num_steps)
    start_time, start_step = self._progress_start
    step = int(self.global_step.numpy())
    elapsed = time.time() - start_time
    done = step - start_step
    if self.total_steps and done > 0:
      left = max(self.total_steps - step, 0) * elapsed / done
      logging.info('progress | step %d/%d (%.0f%%) | elapsed %s | time left %s',
                   step, self.total_steps, 100.0 * step / self.total_steps,
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


def format_metrics(metrics: Dict[str, Any]) -> str:
  """Formats scalar metrics as an aligned two-column table."""
  rows = []
  for name in sorted(metrics):
    value = metrics[name]
    try:
      value = float(value)
    except (TypeError, ValueError):
      continue
    rows.append(f'  {name:<24s} {value:.4f}')
  return '\n'.join(rows)
