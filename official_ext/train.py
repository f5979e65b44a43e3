r"""Trains and evaluates an official_ext experiment.

  python -m official_ext.train --experiment=yt8m_demo \
      --mode=train_and_eval --model_dir=/tmp/yt8m_demo \
      [--config_file=configs/yt8m/yt8m_gpu.yaml ...] \
      [--params_override='task.train_data.global_batch_size=32'] \
      [--gin_file=... --gin_params=...] [--tpu=NAME]

Model Garden's flags and semantics (`official.common.flags`): config files
and overrides are applied in order and strictly (an unknown key is an error
naming the key); the strategy comes from `runtime.distribution_strategy`;
training runs through `official.core.train_lib.run_experiment` with Orbit.
model_dir receives params.yaml, checkpoints and TensorBoard summaries; the same
command run again resumes from the latest checkpoint in model_dir.
"""
from typing import Any, Dict, Optional, Tuple

from absl import app
from absl import flags
from absl import logging
import gin
import tensorflow as tf, tf_keras

from official.common import distribute_utils
from official.common import flags as tfm_flags
from official.core import config_definitions
from official.core import exp_factory
from official.core import task_factory
from official.core import train_lib
from official.core import train_utils
from official.modeling import performance
from official.modeling.multitask import configs as multitask_configs
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.core import checkpoints
from official_ext.core import config_checks
from official_ext.core import controller as controller_lib
from official_ext.core import input_files
from official_ext.core import multiworker
from official_ext.core import trainer as trainer_lib

FLAGS = flags.FLAGS


def build_strategy(params: config_definitions.ExperimentConfig
                   ) -> tf.distribute.Strategy:
  """The tf.distribute strategy named by `runtime.distribution_strategy`."""
  runtime = params.runtime
  return distribute_utils.get_distribution_strategy(
      distribution_strategy=runtime.distribution_strategy,
      all_reduce_alg=runtime.all_reduce_alg,
      num_gpus=runtime.num_gpus,
      tpu_address=runtime.tpu)


def check_batch_sizes(params: config_definitions.ExperimentConfig,
                      strategy: tf.distribute.Strategy) -> None:
  """Every global batch must split evenly over the strategy's replicas.

  Model Garden divides `global_batch_size` by the number of replicas; an
  uneven split fails later with a message that names neither the key nor
  the strategy. Raises a ValueError naming both and the nearest valid sizes.
  """
  replicas = strategy.num_replicas_in_sync
  for name in ('train_data', 'validation_data'):
    data = getattr(params.task, name, None)
    batch = getattr(data, 'global_batch_size', None)
    if batch is None or batch % replicas == 0:
      continue
    lower = max(batch // replicas * replicas, replicas)
    raise ValueError(
        f'task.{name}.global_batch_size={batch} does not divide evenly over '
        f'the {replicas} replicas of runtime.distribution_strategy='
        f'{params.runtime.distribution_strategy!r}: expected a multiple of '
        f'{replicas} (e.g. {lower} or {lower + replicas}).')


def run(params: config_definitions.ExperimentConfig,
        mode: str,
        model_dir: str,
        strategy: Optional[tf.distribute.Strategy] = None,
        ) -> Tuple[tf_keras.Model, Dict[str, Any]]:
  """Runs `mode` for the parsed experiment; returns (model, final metrics).

  Args:
    params: the experiment config (validated).
    mode: 'train', 'eval', 'train_and_eval' or 'continuous_eval'.
    model_dir: directory of checkpoints, summaries and params.yaml.
    strategy: a strategy to use instead of the one the runtime config names
      (tests use a MirroredStrategy over logical CPU devices).

  Returns:
    The model and the last metrics: evaluation metrics when the mode
    evaluates, otherwise the last training outputs.
  """
  if isinstance(params, multitask_configs.MultiTaskExperimentConfig):
    # Several tasks on shared modules (official.modeling.multitask).
    from official_ext.readout import joint  # pylint: disable=g-import-not-at-top
    model, logs = joint.run(
        params, mode, multiworker.worker_model_dir(strategy, model_dir),
        strategy=strategy)
    return model, joint.flatten_logs(logs)
  if params.runtime.mixed_precision_dtype:
    performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)
  strategy = strategy or build_strategy(params)
  check_batch_sizes(params, strategy)
  resume_from = None
  if 'train' in mode and strategy.extended.should_checkpoint:
    resume_from = checkpoints.use_latest_restorable(model_dir)
  # A non-chief worker writes to a temporary directory of its own, which
  # starts with a copy of the chief's latest checkpoint (core.multiworker).
  model_dir = multiworker.worker_model_dir(strategy, model_dir)
  if 'train' in mode:
    # Pure eval jobs do not write params.yaml: a continuous-eval job would
    # race the train job for it.
    train_utils.serialize_config(params, model_dir)
    # A resumed run continues its data stream (core.input_files).
    params = input_files.reseed_for_start(
        params, checkpoints.checkpoint_step(
            resume_from or tf.train.latest_checkpoint(model_dir)))
  with strategy.scope():
    task = task_factory.get_task(params.task, logging_dir=model_dir)
    trainer = train_utils.create_trainer(
        params, task, train='train' in mode, evaluate='eval' in mode,
        checkpoint_exporter=train_lib.maybe_create_best_ckpt_exporter(
            params, model_dir),
        trainer_cls=trainer_lib.Trainer)
  last_train, last_eval = controller_lib.LastOutput(), controller_lib.LastOutput()
  model, _ = multiworker.run_experiment(
      distribution_strategy=strategy,
      task=task,
      mode=mode,
      params=params,
      model_dir=model_dir,
      trainer=trainer,
      resume_from=resume_from,
      # The non-finite check runs first: before Model Garden's actions and
      # before Orbit saves the loop's checkpoint.
      train_actions=[trainer_lib.NonFiniteLossCheck(trainer), last_train],
      eval_actions=[last_eval],
      controller_cls=controller_lib.ProgressController.with_total_steps(
          params.trainer.train_steps))
  return model, (last_eval.output or last_train.output)


def parse_configuration(flags_obj) -> config_definitions.ExperimentConfig:
  """Model Garden's `train_utils.parse_configuration`, plus type checks.

  An unknown key in a config file or --params_override is Model Garden's
  KeyError naming the key; a value of the wrong type for its field (e.g. a
  string for an int) is a ValueError naming the key, the expected type and
  the value (`core.config_checks`).
  """
  params = train_utils.parse_configuration(flags_obj)
  config_checks.check_types(
      params, baseline=exp_factory.get_exp_config(flags_obj.experiment))
  return params


def main(_):
  gin.parse_config_files_and_bindings(FLAGS.gin_file, FLAGS.gin_params)
  params = parse_configuration(FLAGS)
  # On a cluster (TPU, several workers) a preemption restarts the run
  # in-process (the loop of official/vision/train.py, whose public version
  # never creates the PreemptionWatcher).
  strategy, (_, final_metrics) = multiworker.run_with_preemption_recovery(
      lambda: build_strategy(params),
      lambda strategy: run(params, FLAGS.mode, FLAGS.model_dir, strategy))
  if multiworker.is_chief(strategy):
    train_utils.save_gin_config(FLAGS.mode, FLAGS.model_dir)
  if final_metrics:
    print(f'Final metrics ({FLAGS.experiment}, mode={FLAGS.mode}):\n'
          f'{controller_lib.format_metrics(final_metrics)}', flush=True)


if __name__ == '__main__':
  tfm_flags.define_flags()
  flags.mark_flags_as_required(['experiment', 'mode', 'model_dir'])
  app.run(main)
