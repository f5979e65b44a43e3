r"""Joint training of the readout task and YouTube-8M on one shared encoder.

Built on `official.modeling.multitask`: a `MultiTaskBaseModel` holds one
sub-model per task, both holding the same `TokenEncoder` object; the 'joint'
trainer (`MultiTaskBaseTrainer`) takes one optimizer step per training step
from the weighted sum of the task losses; `MultiTaskEvaluator` evaluates each
task with its own `validation_step`/`aggregate_logs`. What this module adds:

* `YT8MTokenModel`: YouTube-8M frame features as encoder tokens (a Dense
  projection per frame, timestamps = frame index x `seconds_per_frame`, the
  shared encoder, a masked mean over valid frames, a logistic classifier).
  It has the call signature `YT8MTask` expects, so the YT8M task's own
  losses, validation step and AP metrics run unchanged.
* `JointMultiTask.joint_train_step`: Model Garden's joint step, but each
  task's loss comes from the task itself (the readout task's global-batch
  losses, `YT8MTask.build_losses` on frames with their `num_frames`), model
  regularization is included, and the summed gradient is clipped by its global
  norm (`official_ext.core.gradients`).
* `JointModel`, the experiment `readout_yt8m_joint` (tiny: generated data of
  both families) and a runner, because `official_ext.train` drives
  single-task experiments only:

    python -m official_ext.readout.joint --experiment=readout_yt8m_joint \
        --mode=train_and_eval --model_dir=/tmp/readout_yt8m_joint

Checkpoints hold the model under `model/_sub_tasks/<task name>/`; the readout
head of a joint checkpoint can be grafted into a single-task model
(`model.graft_single_task_head`).
"""
import dataclasses
from typing import Any, Dict, Optional, Tuple

from absl import app
from absl import flags
import tensorflow as tf, tf_keras

from official.common import distribute_utils
from official.common import flags as tfm_flags
from official.core import config_definitions as cfg
from official.core import exp_factory
from official.core import train_utils
from official.modeling import hyperparams
from official.modeling import performance
from official.modeling.multitask import base_model
from official.modeling.multitask import base_trainer
from official.modeling.multitask import configs as multitask_configs
from official.modeling.multitask import multitask
from official.modeling.multitask import train_lib as multitask_train_lib
from official_ext.core import controller as controller_lib
from official_ext.core import gradients
from official_ext.readout import configs
from official_ext.readout import task as readout_task
from official_ext.readout.modeling import layers
from official_ext.readout.modeling import model as model_lib
from official_ext.yt8m import configs as yt8m_configs
from official_ext.yt8m import task as yt8m_task


class YT8MTokenModel(tf_keras.Model):
  """YouTube-8M frames through the shared encoder -> class probabilities.

  `call(inputs float [B, T, F], num_frames int [B] or None, training)` ->
  {'predictions': float [B, C] probabilities, 'logits': [B, C]}.
  Variables: `frame_embedding/`, the shared `encoder/`, `classifier/`.
  """

  def __init__(self, encoder: layers.TokenEncoder, num_classes: int,
               seconds_per_frame: float = 1.0, **kwargs):
    super().__init__(**kwargs)
    self.frame_embedding = tf_keras.layers.Dense(encoder.hidden_size,
                                                 name='frame_embedding')
    self.encoder = encoder
    self.classifier = tf_keras.layers.Dense(num_classes, name='classifier')
    self._seconds_per_frame = float(seconds_per_frame)

  def call(self, inputs: tf.Tensor, num_frames: Optional[tf.Tensor] = None,
           training=None) -> Dict[str, tf.Tensor]:
    frames = tf.shape(inputs)[1]
    if num_frames is None:
      mask = tf.ones(tf.shape(inputs)[:2], tf.bool)
    else:
      mask = tf.sequence_mask(tf.reshape(num_frames, [-1]), frames)
    times = tf.cast(tf.range(frames), tf.float32) * self._seconds_per_frame
    times = tf.broadcast_to(times[None], tf.shape(mask))
    encoded, encoded_mask = self.encoder(self.frame_embedding(inputs), times,
                                         mask, training=training)
    weights = tf.cast(encoded_mask, encoded.dtype)[..., None]
    pooled = tf.math.divide_no_nan(tf.reduce_sum(encoded * weights, 1),
                                   tf.reduce_sum(weights, 1))
    logits = tf.cast(self.classifier(pooled), tf.float32)
    return {'predictions': tf.sigmoid(logits), 'logits': logits}


@dataclasses.dataclass
class JointModelConfig(hyperparams.Config):
  """Attributes:
    seconds_per_frame: timestamp step of YT8M frames (YouTube-8M: 1 s).
  The shared encoder is built from the readout task's `model.encoder`.
  """
  seconds_per_frame: float = 1.0


@dataclasses.dataclass
class JointTaskConfig(multitask_configs.MultiTaskConfig):
  """Attributes:
    model: the joint model.
    gradient_clip_norm: clip the summed gradient's global norm (<= 0: off).
  """
  model: JointModelConfig = dataclasses.field(default_factory=JointModelConfig)
  gradient_clip_norm: float = 1.0


@dataclasses.dataclass
class JointExperimentConfig(multitask_configs.MultiTaskExperimentConfig):
  task: JointTaskConfig = dataclasses.field(default_factory=JointTaskConfig)


def _routines(config: JointTaskConfig):
  readout, yt8m = None, None
  for routine in config.task_routines:
    if isinstance(routine.task_config, configs.ReadoutTaskConfig):
      readout = routine
    elif isinstance(routine.task_config, yt8m_configs.YT8MTask):
      yt8m = routine
  if readout is None or yt8m is None or len(config.task_routines) != 2:
    kinds = [type(r.task_config).__name__ for r in config.task_routines]
    raise ValueError('task.task_routines: expected one ReadoutTaskConfig and '
                     f'one YT8MTask routine; got {kinds}.')
  return readout, yt8m


class JointModel(base_model.MultiTaskBaseModel):
  """One readout model and one YT8M token model around one shared encoder."""

  def __init__(self, config: JointTaskConfig, **kwargs):
    readout, yt8m = _routines(config)
    self._readout_name = readout.task_name
    self._yt8m_name = yt8m.task_name
    self._readout_config = readout.task_config
    self._yt8m_config = yt8m.task_config
    self._seconds_per_frame = config.model.seconds_per_frame
    self.encoder = model_lib.build_encoder(
        self._readout_config.model.encoder)
    super().__init__(**kwargs)
    self.build()

  def _instantiate_sub_tasks(self) -> Dict[str, tf_keras.Model]:
    readout = model_lib.build_model(self._readout_config,
                                    encoder=self.encoder)
    data = self._yt8m_config.train_data
    yt8m = YT8MTokenModel(self.encoder, data.num_classes,
                          self._seconds_per_frame, name='yt8m_tokens')
    yt8m(tf.zeros([1, 1, sum(data.feature_sizes)]),
         num_frames=tf.ones([1], tf.int32))
    return {self._readout_name: readout, self._yt8m_name: yt8m}


class JointMultiTask(multitask.MultiTask):
  """MultiTask whose joint step takes each task's loss from the task."""

  def __init__(self, tasks, gradient_clip_norm: float = 1.0, **kwargs):
    super().__init__(tasks, **kwargs)
    self._gradient_clip_norm = float(gradient_clip_norm)

  @classmethod
  def from_config(cls, config: JointTaskConfig, logging_dir=None):
    base = multitask.MultiTask.from_config(config, logging_dir=logging_dir)
    return cls(base.tasks, gradient_clip_norm=config.gradient_clip_norm,
               task_weights=base.task_weights,
               task_eval_steps=base.task_eval_steps)

  def task_losses(self, task, model, inputs) -> Tuple[tf.Tensor, tf.Tensor,
                                                      Dict[str, Any]]:
    """(this replica's share, global-batch loss, metric logs) of one task."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if isinstance(task, readout_task.ReadoutTask):
      share, global_losses, _ = task.compute_losses(inputs, model,
                                                    training=True)
      return share['total_loss'], global_losses['total_loss'], global_losses
    if isinstance(task, yt8m_task.YT8MTask):
      outputs = model(inputs['video_matrix'],
                      num_frames=tf.reshape(inputs['num_frames'], [-1]),
                      training=True)
      all_losses = task.build_losses(
          labels=inputs['labels'], model_outputs=outputs['predictions'],
          label_weights=inputs.get('label_weights'), aux_losses=model.losses)
      local = all_losses['total_loss']
      share = local / replicas
      context = tf.distribute.get_replica_context()
      total = (context.all_reduce(tf.distribute.ReduceOp.SUM, share)
               if context is not None and replicas > 1 else local)
      return share, total, all_losses
    raise TypeError(f'JointMultiTask: no loss for task type '
                    f'{type(task).__name__}.')

  def joint_train_step(self, task_inputs, multi_task_model, optimizer,
                       task_metrics, **kwargs):
    """One update from sum_task task_weight * task_loss.

    Returns:
      {task name: global-batch loss, 'total_loss': the weighted sum}.
    """
    losses = {}
    with tf.GradientTape() as tape:
      share_sum = tf.constant(0.0)
      total = tf.constant(0.0)
      for name, model in multi_task_model.sub_tasks.items():
        task = self.tasks[name]
        share, loss, metric_logs = self.task_losses(task, model,
                                                    task_inputs[name])
        weight = float(self.task_weight(name))
        share_sum += weight * share
        total += weight * loss
        losses[name] = loss
        if isinstance(task, readout_task.ReadoutTask):
          task.process_metrics(task_metrics[name], model_losses=metric_logs)
        else:
          task.process_metrics(task_metrics[name], labels=None, outputs=None,
                               model_losses=metric_logs, training=True)
      scaled = gradients.scale_loss(optimizer, share_sum)
    gradients.minimize(optimizer, tape, scaled,
                       multi_task_model.trainable_variables,
                       self._gradient_clip_norm)
    losses['total_loss'] = total
    return losses


class JointTrainer(base_trainer.MultiTaskBaseTrainer):
  """Model Garden's joint trainer, with its iterator map kept a plain dict.

  `orbit.StandardTrainer.train` stores the per-task iterators as an attribute
  of a `tf.Module`, which wraps the dict in a tracking `_DictWrapper`; tracing
  the train loop with that argument fails under Python 3.11 (TypeError: this
  __dict__ descriptor does not support '_DictWrapper' objects). The iterators
  are created here without attribute tracking.
  """

  def train(self, num_steps):
    if self._train_iter is None:
      iterators = {name: iter(dataset)
                   for name, dataset in dict(self.train_dataset).items()}
      self._self_setattr_tracking = False
      try:
        self._train_iter = iterators
      finally:
        self._self_setattr_tracking = True
    return super().train(num_steps)


# ---------------------------------------------------------------------------
# Experiment.
# ---------------------------------------------------------------------------


def _tiny_yt8m_task() -> yt8m_configs.YT8MTask:
  data = dict(feature_sizes=(32, 8), num_classes=10, max_frames=16,
              num_sample_frames=None)
  return yt8m_configs.YT8MTask(
      train_data=yt8m_configs.DataConfig(
          is_training=True, split='train', drop_remainder=True,
          global_batch_size=32, num_examples=512, **data),
      validation_data=yt8m_configs.DataConfig(
          is_training=False, split='valid', drop_remainder=False,
          global_batch_size=64, num_examples=128, **data),
      evaluation=yt8m_configs.Evaluation(
          average_precision=yt8m_configs.AveragePrecisionConfig(top_k=5)),
      demo_data=yt8m_configs.DemoDataConfig(
          enabled=True, num_train_videos=512, num_validation_videos=128,
          num_shards=2))


@exp_factory.register_config_factory('readout_yt8m_joint')
def readout_yt8m_joint() -> JointExperimentConfig:
  """Readout demo + YT8M on one shared encoder, joint updates (tiny)."""
  readout = configs.readout_demo_task(num_train=1024, num_val=256,
                                      batch_size=32)
  readout.validation_data.global_batch_size = 64
  train_steps = 300
  return JointExperimentConfig(
      task=JointTaskConfig(task_routines=(
          multitask_configs.TaskRoutine(task_name='readout',
                                        task_config=readout, task_weight=1.0),
          multitask_configs.TaskRoutine(task_name='yt8m',
                                        task_config=_tiny_yt8m_task(),
                                        task_weight=1.0),
      )),
      trainer=multitask_configs.MultiTaskTrainerConfig(
          trainer_type='joint',
          train_steps=train_steps, steps_per_loop=100,
          summary_interval=100, checkpoint_interval=100,
          validation_interval=train_steps, validation_steps=-1,
          optimizer_config=configs.demo_optimizer(
              2e-3, train_steps, 30)),
      runtime=cfg.RuntimeConfig(mixed_precision_dtype='float32'))


# ---------------------------------------------------------------------------
# Runner.
# ---------------------------------------------------------------------------


def run(params: JointExperimentConfig, mode: str, model_dir: str,
        strategy: Optional[tf.distribute.Strategy] = None
        ) -> Tuple[JointModel, Dict[str, Any]]:
  """Runs `mode` of a joint experiment; returns (model, final eval logs).

  Args:
    params: the experiment config.
    mode: 'train', 'eval' or 'train_and_eval'.
    model_dir: checkpoints, summaries, params.yaml.
    strategy: overrides `runtime.distribution_strategy`.

  Returns:
    The `JointModel` and {task name: {metric: value}} of a final evaluation
    (empty for 'train').
  """
  if params.trainer.trainer_type != 'joint':
    raise ValueError(f'trainer.trainer_type is '
                     f'{params.trainer.trainer_type!r}; this runner does joint '
                     "updates: set it to 'joint'.")
  if 'train' in mode:
    train_utils.serialize_config(params, model_dir)
  if params.runtime.mixed_precision_dtype:
    performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)
  runtime = params.runtime
  strategy = strategy or distribute_utils.get_distribution_strategy(
      distribution_strategy=runtime.distribution_strategy,
      all_reduce_alg=runtime.all_reduce_alg, num_gpus=runtime.num_gpus,
      tpu_address=runtime.tpu)
  with strategy.scope():
    task = JointMultiTask.from_config(params.task, logging_dir=model_dir)
    model = JointModel(params.task)
    trainer = None
    if 'train' in mode:
      trainer = JointTrainer(
          multi_task=task, multi_task_model=model,
          optimizer=train_utils.create_optimizer(task, params))
  result = multitask_train_lib.run_experiment(
      distribution_strategy=strategy, task=task, model=model, mode=mode,
      params=params, model_dir=model_dir, run_post_eval='eval' in mode,
      trainer=trainer)
  if isinstance(result, tuple):
    return result
  return result, {}


def flatten_logs(logs: Dict[str, Any]) -> Dict[str, Any]:
  """{task: {metric: v}} -> {'task/metric': v}."""
  flat = {}
  for task_name, values in logs.items():
    if isinstance(values, dict):
      for k, v in values.items():
        flat[f'{task_name}/{k}'] = v
    else:
      flat[task_name] = values
  return flat


def main(_):
  params = train_utils.parse_configuration(flags.FLAGS)
  _, logs = run(params, flags.FLAGS.mode, flags.FLAGS.model_dir)
  if logs:
    print(f'Final metrics ({flags.FLAGS.experiment}):\n'
          f'{controller_lib.format_metrics(flatten_logs(logs))}', flush=True)


if __name__ == '__main__':
  tfm_flags.define_flags()
  flags.mark_flags_as_required(['experiment', 'mode', 'model_dir'])
  app.run(main)
