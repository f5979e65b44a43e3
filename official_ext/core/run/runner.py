"""The runner of every run: Model Garden's, with what it lacks.

`official_ext.train` runs every experiment, single-task or multitask, on one
device or a cluster, through `OrbitExperimentRunner` (Model Garden's
`train_lib.OrbitExperimentRunner`) inside `run_with_preemption_recovery`.
What they add to Model Garden's:

* A non-chief worker checkpoints into its own model_dir, which holds a copy
  of the chief's latest checkpoint (`core.run.multiworker.worker_model_dir`),
  instead of a fresh `mkdtemp()` a restarted worker would restore nothing
  from.
* The checkpoint to resume from is the one the caller found readable, and it
  must hold every model variable with its shape (Model Garden's restore is
  not strict).
* `continuous_eval` ends at `trainer.continuous_eval_timeout`.
* Preemption: `run_with_preemption_recovery` is the recovery loop of
  `official/vision/train.py`'s `_run_experiment_with_preemption_recovery`,
  with the `tf.distribute.experimental.PreemptionWatcher` that the public
  driver never creates (there `preemption_watcher = None`). Model Garden's own
  on-demand checkpoint at preemption (`trainer.preemption_on_demand_checkpoint`,
  `orbit.actions.SaveCheckpointIfPreempted`) is added by `train_lib` already;
  it acts on a cluster only.
* SIGTERM / SIGINT on every strategy (`StopOnSignal`): a checkpoint at the
  step reached, then `TrainingInterruptedError`.
"""
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
  """SIGTERM or SIGINT stopped training (a checkpoint of the step reached was
  saved, see `StopOnSignal`).

  Attributes:
    exit_code: 128 + the signal's number (143 SIGTERM, 130 SIGINT), the
      shell's status of a process the signal ended; a worker stopped because
      another worker got the signal exits 143.
  """

  def __init__(self, message: str, signum: Optional[int]):
    super().__init__(message)
    self.exit_code = 128 + int(signum or signal.SIGTERM)


class StopOnSignal:
  """Orbit train and eval action: SIGTERM / SIGINT stop training, saved.

  `handling()` installs handlers for `STOP_SIGNALS` that only record the
  signal; after the train loop (or evaluation) under way, the action saves a
  checkpoint at the step reached through `checkpoint_manager` and raises
  `TrainingInterruptedError`. On a cluster every worker learns of a signal
  any worker got at the same loop end (`multiworker.any_worker`, one scalar
  all-reduce per loop), so all save the same step and stop. A second signal
  ends the process at once, with the signal's default action (no checkpoint).

  Put it after the checks that must see a loop first (non-finite loss, the
  lock) and before Model Garden's actions.

  Args:
    strategy: the run's strategy.
    global_step: the trainer's step counter.
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
  """Model Garden's runner; a non-chief worker checkpoints into model_dir.

  The one runner of `official_ext.train`, for single-task and multitask
  experiments: its `trainer` is Model Garden's `base_trainer.Trainer` (a
  trainer and evaluator in one) or a multitask trainer of `core.run.trainer`,
  which joins Model Garden's multitask trainer and evaluator behind the same
  interface (Model Garden's own multitask `train_lib.run_experiment` builds a
  bare `orbit.Controller`: no train/eval actions, no guard on the restored
  checkpoint, no non-chief model_dir).

  Give a non-chief worker its `worker_model_dir`: its CheckpointManager then
  restores the chief's checkpoint copied there and keeps one checkpoint of
  its own there (Model Garden's runner would use a fresh `mkdtemp()`).

  The checkpoint the controller is about to restore must hold every model
  variable with its shape (`checkpoints.unmatched_model_variables`), or a
  ValueError lists the unmatched ones: Model Garden's non-strict restore
  would restore only the step counter of another model's checkpoint.

  Args:
    resume_from: the checkpoint the caller found to resume from
      (`checkpoints.use_latest_restorable`), or None. TensorFlow's
      CheckpointManager reads the state file again and treats *any* error
      there as "no checkpoint" (`tf.train.get_checkpoint_state`), which would
      restart training from step 0 and later overwrite the checkpoints; a
      manager that does not find `resume_from` is an error instead.
    **kwargs: `train_lib.OrbitExperimentRunner`'s arguments.
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
    """Model Garden's `run`; `continuous_eval` ends at its timeout.

    Model Garden's continuous evaluation ends at a timeout only when the
    restored step has reached `trainer.train_steps`, so with no checkpoint
    arriving it waits forever. Here `trainer.continuous_eval_timeout` holds:
    when no new checkpoint arrived within it, evaluation ends (logged, with
    the last checkpoint evaluated), or, when none arrived at all, raises a
    TimeoutError naming model_dir. None waits for ever, as in Model Garden.

    Returns:
      (model, the last evaluation's output) for `continuous_eval`; Model
      Garden's (model, {}) for the other modes.
    """
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
  """Runs `run(strategy)`, restarting it in-process after a preemption.

  The loop of `official/vision/train.py`'s
  `_run_experiment_with_preemption_recovery`, whose public version never
  creates the watcher (`preemption_watcher = None`), with the watcher: on a
  cluster (TPU, several workers) a
  `tf.distribute.experimental.PreemptionWatcher` is created after the
  strategy (connecting to the cluster); when `run` fails with a
  `tf.errors.OpError` and the watcher has a preemption message, it waits for
  the preempted workers to exit, then builds a new strategy and runs again,
  which resumes from the latest checkpoint. Any other error propagates. The
  watcher receives preemption notices on Google TPU platforms only; elsewhere
  TensorFlow logs that it does not support the environment, and a preempted
  multi-worker job is restarted by its scheduler (Model Garden saves a
  checkpoint at SIGTERM first: `trainer.preemption_on_demand_checkpoint`).

  Args:
    build_strategy: builds (and connects) the strategy; called per attempt.
    run: runs the experiment under a strategy.

  Returns:
    (the strategy of the successful attempt, what `run` returned).
  """
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
