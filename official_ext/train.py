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
from official.core import task_factory
from official.core import train_lib
from official.core import train_utils
from official.modeling import performance
from official.modeling.multitask import configs as multitask_configs
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.core import controller as controller_lib

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
    model, logs = joint.run(params, mode, model_dir, strategy=strategy)
    return model, joint.flatten_logs(logs)
  if 'train' in mode:
    # Pure eval jobs do not write params.yaml: a continuous-eval job would
    # race the train job for it.
    train_utils.serialize_config(params, model_dir)
  if params.runtime.mixed_precision_dtype:
    performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)
  strategy = strategy or build_strategy(params)
  with strategy.scope():
    task = task_factory.get_task(params.task, logging_dir=model_dir)
  last_train, last_eval = controller_lib.LastOutput(), controller_lib.LastOutput()
  model, _ = train_lib.run_experiment(
      distribution_strategy=strategy,
      task=task,
      mode=mode,
      params=params,
      model_dir=model_dir,
      train_actions=[last_train],
      eval_actions=[last_eval],
      controller_cls=controller_lib.ProgressController.with_total_steps(
          params.trainer.train_steps))
  return model, (last_eval.output or last_train.output)


def main(_):
  gin.parse_config_files_and_bindings(FLAGS.gin_file, FLAGS.gin_params)
  params = train_utils.parse_configuration(FLAGS)
  _, final_metrics = run(params, FLAGS.mode, FLAGS.model_dir)
  train_utils.save_gin_config(FLAGS.mode, FLAGS.model_dir)
  if final_metrics:
    print(f'Final metrics ({FLAGS.experiment}, mode={FLAGS.mode}):\n'
          f'{controller_lib.format_metrics(final_metrics)}', flush=True)


if __name__ == '__main__':
  tfm_flags.define_flags()
  flags.mark_flags_as_required(['experiment', 'mode', 'model_dir'])
  app.run(main)
