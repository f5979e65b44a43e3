"""Model Garden's trainer plus a stop on the first non-finite training loss.

Model Garden's own guard (`actions.RecoveryAction`, on when
`trainer.recovery_max_trials >= 0`) looks at the loss averaged over a whole
train loop and raises "The loss value is NaN or out of range" without saying
when it happened. `Trainer` records the first step whose training loss is not
finite, in the step itself, and `NonFiniteLossCheck` (the first train action,
so it runs before Model Garden's actions and before Orbit saves the loop's
checkpoint) raises `NonFiniteLossError` naming that step. No checkpoint with
non-finite weights is written: Orbit saves after the actions of a loop.
"""
from typing import Any, Dict

import tensorflow as tf, tf_keras

from official.core import base_trainer


class NonFiniteLossError(RuntimeError):
  """The training loss became NaN or infinite."""


class Trainer(base_trainer.Trainer):
  """`base_trainer.Trainer` that records the first non-finite-loss step.

  After each step it reads the running sum of the loop's training loss (the
  `training_loss` Mean metric, reset at every loop start, summed over
  replicas): once any replica's loss was NaN or infinite the sum stays so, and
  `first_nonfinite_step` takes the step number (1-based, as `global_step`
  after the step) the first time. Costs one scalar read per step, on the
  host: on TPUs, where that would stall the device every step, the check is
  per train loop instead (`per_step_check` False).
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.per_step_check = not isinstance(
        self.strategy, (tf.distribute.TPUStrategy,
                        tf.distribute.experimental.TPUStrategy))
    with self.strategy.scope():
      # Not tracked by the checkpoint: it describes this process's run only.
      self._first_nonfinite_step = tf.Variable(
          -1, dtype=tf.int64, trainable=False, name='first_nonfinite_step',
          aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  @property
  def first_nonfinite_step(self) -> int:
    """The first step whose loss was not finite, or -1."""
    return int(self._first_nonfinite_step.numpy())

  def train_step(self, iterator):
    super().train_step(iterator)
    if not self.per_step_check:
      return
    total = self.train_loss.total  # Sync-on-read: summed over replicas.
    first = self._first_nonfinite_step
    bad = tf.logical_and(tf.logical_not(tf.math.is_finite(total)), first < 0)
    first.assign(tf.where(bad, tf.cast(self.global_step, tf.int64), first))


class NonFiniteLossCheck:
  """Orbit train action: raises `NonFiniteLossError` after a bad loop.

  Args:
    trainer: the experiment's trainer. With `official_ext.core.trainer.Trainer`
      the error names the exact step; with another trainer it names the loop
      (the loop's mean `training_loss` is checked).
  """

  def __init__(self, trainer: base_trainer.Trainer):
    self._trainer = trainer

  def __call__(self, output: Dict[str, Any]):
    step = int(self._trainer.global_step.numpy())
    if isinstance(self._trainer, Trainer) and self._trainer.per_step_check:
      bad_step = self._trainer.first_nonfinite_step
      if bad_step < 0:
        return
      where = f'at step {bad_step}'
    else:
      loss = (output or {}).get('training_loss')
      if loss is None or bool(tf.reduce_all(tf.math.is_finite(loss))):
        return
      where = f'in the train loop ending at step {step}'
    loss = (output or {}).get('training_loss')
    raise NonFiniteLossError(
        f'Training loss is not finite {where} (loop mean training_loss='
        f'{float(loss) if loss is not None else "?"}). Training stopped '
        f'before saving step {step}; the latest checkpoint in model_dir is '
        'from before it. Lower the learning rate or enable gradient '
        'clipping, and check the input data.')
