"""Trains and evaluates an official_ext experiment (single-task or multitask):
`python -m official_ext.train` with Model Garden's flags (docs/distributed.md).
"""
import sys
from typing import Any, Dict, Optional, Tuple

from absl import app
from absl import flags
from absl import logging
import gin

from official_ext.core.run import run_logging

run_logging.quiet_tensorflow_cpp()  # Before TensorFlow is imported.

import tensorflow as tf, tf_keras  # pylint: disable=g-import-not-at-top,g-bad-import-order

from official.common import flags as tfm_flags
from official.core import config_definitions
from official.core import task_factory
from official.core import train_lib
from official.core import train_utils
from official.modeling import performance
from official_ext.core import checkpoints
from official_ext.core import config_checks
from official_ext.core import experiment_params
from official_ext.core.input import input_files
from official_ext.core.kernels import kernel_policy
from official_ext.core.kernels import process_settings
from official_ext.core.run import distribution
from official_ext.core.run import model_dir as model_dir_lib
from official_ext.core.run import multiworker
from official_ext.core.run import orbit_actions
from official_ext.core.run import run_lock
from official_ext.core.run import runner as runner_lib
from official_ext.core.run import trainer as trainer_lib
from official_ext import registry_imports  # pylint: disable=unused-import

FLAGS = flags.FLAGS


def run(params: config_definitions.ExperimentConfig,
        mode: str,
        model_dir: str,
        strategy: Optional[tf.distribute.Strategy] = None,
        experiment: Optional[str] = None,
        policy: Optional[kernel_policy.KernelPolicy] = None,
        ) -> Tuple[Any, Dict[str, Any]]:
  """Runs `mode` for the parsed experiment; returns (model, final metrics).

  `strategy` and `policy` replace the runtime's (tests); `experiment` is
  recorded in params.yaml and compared with a model_dir's (None: only the
  configs). The metrics are evaluation's when the mode evaluates; a multitask
  experiment's as `<task>/<metric>`.

  Raises:
    ModelDirInUseError: model_dir holds another experiment's or model's run.
    ModelDirLockedError: another live training run writes model_dir.
    PermissionError: an evaluation cannot write its summaries' folder.
    ValueError: a step count, runtime setting, checkpoint to evaluate,
      init_checkpoint or restore that cannot work (naming it).
    TimeoutError: `continuous_eval` saw no checkpoint in its timeout.
    TrainingInterruptedError: SIGTERM or SIGINT (a checkpoint was saved).
  """
  if 'train' in mode and params.trainer.train_steps < 1:
    raise ValueError(
        f'trainer.train_steps={params.trainer.train_steps} with --mode={mode}:'
        ' training needs at least 1 step (use --mode=eval to evaluate a '
        'checkpoint).')
  # Before anything is written to model_dir (core.run.model_dir).
  precision = config_checks.mixed_precision_dtype(params.runtime)
  kernel_policy.setting_of(params)
  model_dir_lib.check_model_dir(params, model_dir, experiment)
  model_dir_lib.check_checkpoint_to_evaluate(params, model_dir, mode)
  model_dir_lib.check_eval_outputs_writable(params, model_dir, mode)
  init_checkpoint = getattr(params.task, 'init_checkpoint', None)
  if init_checkpoint and not tf.train.latest_checkpoint(model_dir):
    # The model will be initialized from it: read it whole now, before the
    # model and its input are built (core.checkpoints).
    checkpoints.check_readable(init_checkpoint, 'task.init_checkpoint')
  strategy = distribution.distribution_strategy(params, strategy)
  if policy is None:
    policy = kernel_policy.for_strategy(params, strategy)
  logging.info(policy.describe())
  # One live training run per model_dir (core.run.run_lock); evaluation takes
  # no lock. Released when the run ends, also on an error.
  lock = None
  if 'train' in mode and multiworker.is_chief(strategy):
    lock = run_lock.acquire(model_dir, experiment, mode)
  # Keras' global dtype policy is process state: restored when the run ends.
  previous = tf_keras.mixed_precision.global_policy()
  if precision:
    performance.set_mixed_precision_policy(precision)
  try:
    with kernel_policy.use(policy):
      return _run_locked(params, mode, model_dir, strategy, experiment, lock)
  finally:
    tf_keras.mixed_precision.set_global_policy(previous)
    if lock:
      lock.release()


def _run_locked(params, mode: str, model_dir: str,
                strategy: tf.distribute.Strategy, experiment: Optional[str],
                lock: Optional[run_lock.WriterLock]
                ) -> Tuple[Any, Dict[str, Any]]:
  """`run` once model_dir is checked and locked, the runtime set up."""
  resume_from = None
  if 'train' in mode and strategy.extended.should_checkpoint:
    resume_from = checkpoints.use_latest_restorable(model_dir)
  # A non-chief worker writes to a temporary directory of its own, which
  # starts with a copy of the chief's latest checkpoint (core.run.multiworker).
  model_dir = multiworker.worker_model_dir(strategy, model_dir)
  configured = params  # What params.yaml records (not the per-start seed).
  to_train = True
  if 'train' in mode:
    restored = resume_from or tf.train.latest_checkpoint(model_dir)
    step = checkpoints.checkpoint_step(restored)
    # Every worker decides alike (the same checkpoint): refused below, or
    # nothing left to train (core.run.model_dir).
    to_train = model_dir_lib.check_resume_step(params, model_dir, restored,
                                               step)
    # A resumed run continues its data stream (core.input.input_files).
    params = input_files.reseed_for_start(params, step)
  with strategy.scope():
    task = task_factory.get_task(params.task, logging_dir=model_dir)
    trainer = trainer_lib.create_trainer(
        params, task, train='train' in mode, evaluate='eval' in mode,
        checkpoint_exporter=train_lib.maybe_create_best_ckpt_exporter(
            params, model_dir))
  last_train = orbit_actions.LastOutput()
  last_eval = orbit_actions.LastOutput()
  progress = orbit_actions.ProgressAction(trainer.global_step,
                                          params.trainer.train_steps)
  # The non-finite check and the lock check run first: before Model
  # Garden's actions and before Orbit saves the loop's checkpoint; then the
  # stop on SIGTERM / SIGINT, which saves the step reached.
  checks = [orbit_actions.NonFiniteLossCheck(trainer)]
  if lock:
    checks.append(run_lock.LockCheck(lock))
  stop = runner_lib.StopOnSignal(strategy, trainer.global_step)
  if 'train' in mode:
    checks.append(stop)
  runner = runner_lib.OrbitExperimentRunner(
      distribution_strategy=strategy,
      task=task,
      mode=mode,
      params=params,
      model_dir=model_dir,
      trainer=trainer,
      resume_from=resume_from,
      train_actions=checks + [progress, last_train],
      eval_actions=[last_eval] + ([stop] if 'train' in mode else []))
  stop.checkpoint_manager = runner.checkpoint_manager
  progress.start()  # The runner's controller has restored the checkpoint.
  if not to_train:
    # The run ended already: nothing is trained or written; train_and_eval
    # still reports the checkpoint's metrics.
    model = trainer.model
    if 'eval' in mode:
      with strategy.scope():
        runner.controller.evaluate(steps=params.trainer.validation_steps)
  else:
    if 'train' in mode:
      # Written once the config validated and the restore succeeded. Pure
      # eval jobs do not write it: a continuous-eval job would race the
      # train job.
      model_dir_lib.write_params_yaml(configured, model_dir, experiment)
      # Installed after the runner: they replace the SIGTERM handler of
      # Model Garden's on-demand checkpoint (a cluster's only).
      with stop.handling():
        model, _ = runner.run()
    else:
      model, _ = runner.run()
  if not getattr(model, 'inputs', None):
    logging.info(run_logging.flops_note(model))
  return model, orbit_actions.flatten_metrics(
      last_eval.output or last_train.output)


def parse_configuration(flags_obj) -> config_definitions.ExperimentConfig:
  """The experiment config from the flags (`core.experiment_params`)."""
  return experiment_params.parse_flags(flags_obj)


def apply_process_settings(params) -> process_settings.Applied:
  """Applies and logs the process settings the run's kernel policy takes, before
  TensorFlow's runtime starts, unless the user set them."""
  applied = process_settings.apply(kernel_policy.process_env(params))
  logging.info(process_settings.describe(applied))
  return applied


def main(_):
  run_logging.configure()
  gin.parse_config_files_and_bindings(FLAGS.gin_file, FLAGS.gin_params)
  params = parse_configuration(FLAGS)
  # Before anything starts TensorFlow's runtime (the strategy, the task).
  apply_process_settings(params)
  # On a cluster (TPU, several workers) a preemption restarts the run
  # in-process (the loop of official/vision/train.py, whose public version
  # never creates the PreemptionWatcher).
  try:
    strategy, (_, final_metrics) = runner_lib.run_with_preemption_recovery(
        lambda: distribution.distribution_strategy(params),
        lambda strategy: run(params, FLAGS.mode, FLAGS.model_dir, strategy,
                             experiment=FLAGS.experiment))
  except runner_lib.TrainingInterruptedError as e:
    # Not what was asked (the steps are not all trained): non-zero.
    logging.error('%s', e)
    sys.exit(e.exit_code)
  if multiworker.is_chief(strategy):
    # An evaluation writes beside its summaries: model_dir may be read-only.
    train_utils.save_gin_config(
        FLAGS.mode, FLAGS.model_dir if 'train' in FLAGS.mode else
        model_dir_lib.eval_output_dir(params, FLAGS.model_dir))
  if final_metrics:
    print(f'Final metrics ({FLAGS.experiment}, mode={FLAGS.mode}):\n'
          f'{orbit_actions.format_metrics(final_metrics)}', flush=True)


if __name__ == '__main__':
  tfm_flags.define_flags()
  flags.mark_flags_as_required(['experiment', 'mode', 'model_dir'])
  app.run(main)
