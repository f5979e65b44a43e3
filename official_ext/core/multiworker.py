"""Multi-worker training: what Model Garden and Orbit leave to the caller.

Under `MultiWorkerMirroredStrategy` every worker runs the same program; worker
0 is the chief (`strategy.extended.should_checkpoint`). What the libraries do
already, and what this module adds:

* Checkpoints. `train_lib.OrbitExperimentRunner` lets every worker save
  (saving reads sync-on-read variables, a collective that needs all workers),
  the chief to `model_dir` and the others to `tempfile.mkdtemp()`. That
  directory is never removed, and a restarted non-chief worker restores from
  it, i.e. from nothing: it would start at step 0 with fresh weights while the
  chief resumes at step N, and the job diverges or hangs. `worker_model_dir`
  gives each non-chief worker its own temporary model_dir (removed when the
  process exits) holding a copy of the chief's latest checkpoint, and
  `run_experiment` (Model Garden's runner with that one change) has the
  non-chief CheckpointManager restore from and save to it.
* Summaries, params.yaml, the operative gin config, best-checkpoint exports:
  Orbit writes summaries on every worker and Model Garden writes the others
  to whatever model_dir it is given; with `worker_model_dir` they land in the
  non-chief worker's temporary directory.
* Host-side evaluation metrics (AP, R², ...): Orbit hands `aggregate_logs`
  the outputs of this worker's replicas only. `gather_for_host` (in
  `validation_step`) and `host_parts` (in `aggregate_logs`) make every worker
  accumulate every replica's rows, so the chief reports the metrics of the
  whole validation set.
* Preemption: `run_with_preemption_recovery` is the recovery loop of
  `official/vision/train.py`'s `_run_experiment_with_preemption_recovery`,
  with the `tf.distribute.experimental.PreemptionWatcher` that the public
  driver never creates (there `preemption_watcher = None`). Model Garden's own
  on-demand checkpoint at preemption (`trainer.preemption_on_demand_checkpoint`,
  `orbit.actions.SaveCheckpointIfPreempted`) is added by `train_lib` already.
"""
import atexit
import os
import shutil
import tempfile
from typing import Any, Callable, List, Optional, Tuple, TypeVar

from absl import logging
import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import train_lib
from official_ext.core import checkpoints

T = TypeVar('T')


def num_workers(strategy: Optional[tf.distribute.Strategy] = None) -> int:
  """Worker processes (hosts) of the strategy's cluster; 1 without a cluster.

  Args:
    strategy: a strategy; default: the current one.
  """
  strategy = strategy or tf.distribute.get_strategy()
  resolver = getattr(strategy, 'cluster_resolver', None)
  if resolver is None:
    return 1
  jobs = resolver.cluster_spec().as_dict()
  return max(1, len(jobs.get('chief', ())) + len(jobs.get('worker', ())))


def is_chief(strategy: Optional[tf.distribute.Strategy]) -> bool:
  """Whether this worker writes the job's checkpoints and summaries."""
  return strategy is None or bool(strategy.extended.should_checkpoint)


def _barrier(strategy: tf.distribute.Strategy) -> None:
  """Returns on every worker once every worker has called it (an all-reduce)."""

  @tf.function
  def all_reduce():
    return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.ones([], tf.float32)))

  all_reduce()


def _copy_latest_checkpoint(source_dir: str, target_dir: str) -> Optional[str]:
  """Copies `source_dir`'s latest checkpoint and makes it `target_dir`'s."""
  latest = tf.train.latest_checkpoint(source_dir)
  if not latest:
    return None
  prefix = os.path.join(target_dir, os.path.basename(latest))
  for path in tf.io.gfile.glob(latest + '.*'):
    tf.io.gfile.copy(path, prefix + path[len(latest):], overwrite=True)
  tf.compat.v1.train.update_checkpoint_state(target_dir, prefix)
  return latest


def worker_model_dir(strategy: Optional[tf.distribute.Strategy],
                     model_dir: str) -> str:
  """The directory this worker writes to: `model_dir` on the chief.

  A non-chief worker gets a new temporary directory, removed when the process
  exits, into which the chief's latest checkpoint in `model_dir` is copied, so
  that its CheckpointManager resumes from the same step and weights as the
  chief's. All workers call this at the same point, after the chief has
  settled which checkpoint to resume from; it waits for every worker (one
  all-reduce) before the copy.

  Args:
    strategy: the job's strategy (None: a single process, the chief).
    model_dir: the job's model_dir (the chief's).

  Returns:
    `model_dir` (chief) or the worker's temporary directory.
  """
  if strategy is None or num_workers(strategy) <= 1:
    return model_dir
  _barrier(strategy)
  if is_chief(strategy):
    return model_dir
  task_id = strategy.cluster_resolver.task_id
  worker_dir = tempfile.mkdtemp(prefix=f'official_ext_worker{task_id}_')
  atexit.register(shutil.rmtree, worker_dir, ignore_errors=True)
  restored = _copy_latest_checkpoint(model_dir, worker_dir)
  logging.info(
      'Worker %s is not the chief: it writes checkpoints and summaries to %s '
      '(removed at exit); the chief writes to %s. Resuming from: %s.', task_id,
      worker_dir, model_dir, restored or 'no checkpoint')
  return worker_dir


class OrbitExperimentRunner(train_lib.OrbitExperimentRunner):
  """Model Garden's runner; a non-chief worker checkpoints into model_dir.

  The one runner of `official_ext.train`, for single-task and multitask
  experiments: its `trainer` is Model Garden's `base_trainer.Trainer` (a
  trainer and evaluator in one) or a multitask trainer of `core.trainer`,
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
            'model_dir without taking its lock, core.run_lock). Training '
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


def gather_for_host(tree: T) -> T:
  """Every replica's rows on every replica, when there are several workers.

  Call in replica context (`validation_step`) on the tensors that
  `aggregate_logs` accumulates on the host; then accumulate `host_parts`.

  Args:
    tree: a nest of tensors of rank >= 1 whose first axis is rows (examples,
      queries); the row counts may differ between replicas.

  Returns:
    With several workers, each tensor all-gathered along axis 0 (the rows of
    all replicas of all workers, in replica order); otherwise `tree`.
  """
  if num_workers() <= 1:
    return tree
  context = tf.distribute.get_replica_context()
  # tf.identity places each tensor on this replica's device: with one device
  # per worker the collective needs a device (input tensors have none).
  return tf.nest.map_structure(
      lambda t: context.all_gather(tf.identity(t), axis=0), tree)


def host_parts(values: Any) -> List[np.ndarray]:
  """The parts of one step output to accumulate on the host.

  Args:
    values: one output of `validation_step` as `aggregate_logs` receives it:
      a tuple with one value per local replica, or a single value.

  Returns:
    Every local replica's value as numpy; with several workers (where
    `gather_for_host` gave every replica all rows) the first one only.
  """
  if not isinstance(values, (tuple, list)):
    return [np.asarray(values)]
  if num_workers() > 1:
    return [np.asarray(values[0])]
  return [np.asarray(v) for v in values]


def needs_preemption_watcher(strategy: tf.distribute.Strategy) -> bool:
  """Whether the strategy spans a cluster: TPU, or several workers."""
  return (isinstance(strategy, (tf.distribute.TPUStrategy,
                                tf.distribute.experimental.TPUStrategy)) or
          num_workers(strategy) > 1)


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
