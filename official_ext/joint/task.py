"""The joint task: Model Garden's `MultiTask` over readout and YT8M tasks on
the `JointModel`, with its joint training step (docs/readout.md, Joint
training)."""
from typing import Any, Dict, Tuple

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import task_factory
from official.modeling.multitask import multitask
from official_ext.core import gradients
from official_ext.joint import configs
from official_ext.joint.modeling import model as joint_model
from official_ext.readout import task as readout_task
from official_ext.yt8m import task as yt8m_task

# (this replica's share, the global-batch loss, the task's metric inputs).
TaskLoss = Tuple[tf.Tensor, tf.Tensor, Dict[str, Any]]


def readout_data_loss(task: readout_task.ReadoutTask, model, inputs
                      ) -> TaskLoss:
  """The readout task's global-batch loss without regularization."""
  outputs = model(inputs, training=True)
  share, global_losses = task.global_losses(
      inputs, task.route(model, inputs, outputs))
  return share['total_loss'], global_losses['total_loss'], global_losses


def yt8m_data_loss(task: yt8m_task.YT8MTask, model, inputs) -> TaskLoss:
  """The YT8M task's cross-entropy over the global batch, no regularization."""
  outputs = model(inputs['video_matrix'],
                  num_frames=tf.reshape(inputs['num_frames'], [-1]),
                  training=True)
  all_losses = task.build_losses(
      labels=inputs['labels'],
      model_outputs=tf.cast(outputs['predictions'], tf.float32),
      label_weights=inputs.get('label_weights'), aux_losses=None)
  local = all_losses['model_loss']
  replicas = tf.distribute.get_strategy().num_replicas_in_sync
  share = local / replicas
  context = tf.distribute.get_replica_context()
  total = (context.all_reduce(tf.distribute.ReduceOp.SUM, share)
           if context is not None and replicas > 1 else local)
  return share, total, {'total_loss': total, 'model_loss': total}


_DATA_LOSSES = (
    (readout_task.ReadoutTask, readout_data_loss),
    (yt8m_task.YT8MTask, yt8m_data_loss),
)


def data_loss(task, model, inputs) -> TaskLoss:
  """(share, global loss, metric inputs) of one task's batch (see above)."""
  for task_cls, fn in _DATA_LOSSES:
    if isinstance(task, task_cls):
      return fn(task, model, inputs)
  raise TypeError(f'No joint loss for task type {type(task).__name__}.')


class JointMultiTask(multitask.MultiTask):
  """`MultiTask` of readout and YT8M tasks on the `JointModel`."""

  def __init__(self, tasks, config: configs.JointTaskConfig, **kwargs):
    super().__init__(tasks, **kwargs)
    self._config = config
    self._gradient_clip_norm = float(config.gradient_clip_norm)

  @classmethod
  def from_config(cls, config: configs.JointTaskConfig, logging_dir=None,
                  name=None):
    """The tasks of `config.task_routines` (validated: `configs.validate`)."""
    del name  # Each task has its routine's name.
    configs.validate(config)
    base = multitask.MultiTask.from_config(config, logging_dir=logging_dir)
    return cls(base.tasks, config=config, task_weights=base.task_weights,
               task_eval_steps=base.task_eval_steps)

  def build_multitask_model(self) -> joint_model.JointModel:
    """The joint model of the config (Model Garden's multitask interface)."""
    return joint_model.JointModel(self._config)

  def joint_train_step(self, task_inputs, multi_task_model, optimizer,
                       task_metrics, **kwargs):
    """One update from sum_t w_t * data_loss_t + regularization (counted once).

    Returns:
      {task name: its global-batch data loss, 'total_loss': the total}.
    """
    losses = {}
    with tf.GradientTape() as tape:
      share_sum = tf.constant(0.0)
      total = tf.constant(0.0)
      for name, model in multi_task_model.sub_tasks.items():
        task = self.tasks[name]
        share, loss, metric_logs = data_loss(task, model, task_inputs[name])
        weight = float(self.task_weight(name))
        share_sum += weight * share
        total += weight * loss
        losses[name] = loss
        if isinstance(task, readout_task.ReadoutTask):
          task.process_metrics(task_metrics[name], model_losses=metric_logs)
        else:
          task.process_metrics(task_metrics[name], labels=None, outputs=None,
                               model_losses=metric_logs, training=True)
      terms = multi_task_model.regularization_losses()
      if terms:
        regularization = tf.add_n(terms)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        share_sum += regularization / replicas
        total += regularization
      scaled = gradients.scale_loss(optimizer, share_sum)
    gradients.minimize(optimizer, tape, scaled,
                       multi_task_model.trainable_variables,
                       self._gradient_clip_norm)
    losses['total_loss'] = total
    return losses


task_factory.register_task_cls(configs.JointTaskConfig)(
    JointMultiTask.from_config)
