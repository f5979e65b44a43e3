"""The runner of every run: Model Garden's, with what it lacks
(docs/architecture.md, "core/run: what train.py drives")."""
import contextlib
import os
import signal
import threading
from typing import Any, Callable, Iterator, Optional, Tuple, TypeVar

from absl import logging
import tensorflow as tf, tf_keras

from official.core import train_lib
from official_ext.core import checkpoints
from official_ext.core.run import multiworker

T = TypeVar('T')

# What stops a training run with a checkpoint at the step reached.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterruptedError(RuntimeError):
  """SIGTERM or SIGINT stopped training after saving its step; `exit_code`: 128
  + the signal's number."""

  def __init__(self, message: str, signum: Optional[int]):
    super().__init__(message)
    self.exit_code = 128 + int(signum or signal.SIGTERM)


class StopOnSignal:
  """Orbit action: on SIGTERM / SIGINT saves the step and stops every worker.

  Put it after the loss and lock checks, before Model Garden's actions.
  """

  def __init__(self, strategy: tf.distribute.Strategy,
               global_step: tf.Variable):
    self._strategy = strategy
    self._global_step = global_step
    self.checkpoint_manager: Optional[tf.train.CheckpointManager] = None
    self.signum: Optional[int] = None

  def _handle(self, signum, frame) -> None:
    del frame
    if self.signum is not None:  # The second signal: its default action.
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    self.signum = signum
    logging.warning(
        'Received %s: training stops after the train loop under way, saving '
        'a checkpoint at the step it reaches. Send it again to exit at once '
        'without one.', signal.Signals(signum).name)

  @contextlib.contextmanager
  def handling(self) -> Iterator[None]:
    """Installs the handlers (main thread only) for the `with` body."""
    if threading.current_thread() is not threading.main_thread():
      yield
      return
    previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
    try:
      yield
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)

  def __call__(self, output=None) -> None:
    del output
    if not multiworker.any_worker(self._strategy, self.signum is not None):
      return
    step = int(self._global_step.numpy())
    manager = self.checkpoint_manager
    path = manager.latest_checkpoint if manager else None
    if manager and checkpoints.checkpoint_step(path) != step:
      path = manager.save(checkpoint_number=step, check_interval=False)
    cause = (signal.Signals(self.signum).name if self.signum else
             'a signal another worker received')
    raise TrainingInterruptedError(
        f'Training stopped by {cause} at step {step}: saved the checkpoint '
        f'{path}. Run the same command again to resume from it.',
        self.signum)


class OrbitExperimentRunner(train_lib.OrbitExperimentRunner):
  """Model Garden's runner: a non-chief's own model_dir, a strict restore.

  `resume_from`: the checkpoint to resume from, which the manager must find;
  **kwargs: `train_lib.OrbitExperimentRunner`'s.
  """

  def __init__(self, resume_from: Optional[str] = None, **kwargs):
    self._resume_from = resume_from
    super().__init__(**kwargs)

  def _maybe_build_checkpoint_manager(
      self) -> Optional[tf.train.CheckpointManager]:
    if (not self.trainer.checkpoint or self.strategy is None or
        self.strategy.extended.should_checkpoint):
      manager = super()._maybe_build_checkpoint_manager()
      found = manager.latest_checkpoint if manager else None
      if self._resume_from and (not found or os.path.basename(found) !=
                                os.path.basename(self._resume_from)):
        raise checkpoints.CheckpointReadError(
            f'The checkpoint manager of {self.model_dir} found '
            f'{found or "no checkpoint"} where {self._resume_from} was just '
            'found readable: the checkpoint state file changed since, or '
            'could not be read again (a storage error, or a process writing '
            'model_dir without taking its lock, core.run.run_lock). Training '
            'stops instead of starting from scratch; run the same command '
            'again to resume.')
    else:
      manager = tf.train.CheckpointManager(
          self.trainer.checkpoint,
          directory=self.model_dir,
          max_to_keep=1,
          step_counter=self.trainer.global_step,
          checkpoint_interval=self.params.trainer.checkpoint_interval,
          init_fn=self.trainer.initialize)
    if manager and manager.latest_checkpoint:
      # Model Garden's restore is not strict: a checkpoint of another model
      # would restore only the step counter. The controller restores it next.
      _, unmatched = checkpoints.unmatched_model_variables(
          self.trainer.model, manager.latest_checkpoint)
      if unmatched:
        raise ValueError(checkpoints.mismatch_message(
            manager.latest_checkpoint, unmatched))
    return manager

  def run(self) -> Tuple[tf_keras.Model, Any]:
    """Model Garden's `run`; `continuous_eval` ends at its timeout."""
    if self._mode != 'continuous_eval':
      return super().run()
    timeout = self.params.trainer.continuous_eval_timeout
    with self.strategy.scope():
      output = self.controller.evaluate_continuously(
          steps=self.params.trainer.validation_steps, timeout=timeout,
          timeout_fn=lambda: True)
    if output is None:
      raise TimeoutError(
          f'continuous_eval: no checkpoint appeared in {self.model_dir} '
          f'within trainer.continuous_eval_timeout={timeout} s; nothing was '
          'evaluated. Check --model_dir (the training job\'s), or raise the '
          'timeout above the time the training job takes to its first '
          'checkpoint.')
    logging.info(
        'continuous_eval: no new checkpoint in %s for %s s '
        '(trainer.continuous_eval_timeout) after %s; evaluation ends.',
        self.model_dir, timeout, tf.train.latest_checkpoint(self.model_dir))
    return self.trainer.model, output


def run_experiment(**kwargs) -> Tuple[tf_keras.Model, Any]:
  """`train_lib.run_experiment` (same arguments) with `OrbitExperimentRunner`."""
  return OrbitExperimentRunner(**kwargs).run()


def needs_preemption_watcher(strategy: tf.distribute.Strategy) -> bool:
  """Whether the strategy spans a cluster: TPU, or several workers."""
  return (isinstance(strategy, (tf.distribute.TPUStrategy,
                                tf.distribute.experimental.TPUStrategy)) or
          multiworker.num_workers(strategy) > 1)


def run_with_preemption_recovery(
    build_strategy: Callable[[], tf.distribute.Strategy],
    run: Callable[[tf.distribute.Strategy], T],
) -> Tuple[tf.distribute.Strategy, T]:
  """(strategy, `run(strategy)`), rerun in-process after a preemption."""
  while True:
    watcher = None
    try:
      strategy = build_strategy()
      if needs_preemption_watcher(strategy):
        watcher = tf.distribute.experimental.PreemptionWatcher()
      return strategy, run(strategy)
    except tf.errors.OpError:
      if watcher is None or not watcher.preemption_message:
        raise
      watcher.block_until_worker_exit()
      logging.info('Some workers were preempted (message: %s); restarting '
                   'training from the latest checkpoint.',
                   watcher.preemption_message)
