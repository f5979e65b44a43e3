"""The trainers `official_ext.train` runs, recording the first non-finite loss.
"""
from typing import Any, Dict, Iterable, Optional

import orbit
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import base_trainer
from official.core import train_utils
from official.modeling.multitask import base_trainer as multitask_base_trainer
from official.modeling.multitask import configs as multitask_configs
from official.modeling.multitask import evaluator as multitask_evaluator
from official.modeling.multitask import interleaving_trainer
from official.modeling.multitask import multitask
from official.modeling.multitask import task_sampler
from official_ext.core import tf_internals

MULTITASK_TRAINER_TYPES = ('joint', 'interleaving')


def _is_tpu(strategy: tf.distribute.Strategy) -> bool:
  return isinstance(strategy, (tf.distribute.TPUStrategy,
                               tf.distribute.experimental.TPUStrategy))


def _first_nonfinite_variable(strategy: tf.distribute.Strategy) -> tf.Variable:
  with strategy.scope():
    # Not tracked by the checkpoint: it describes this process's run only.
    return tf.Variable(
        -1, dtype=tf.int64, trainable=False, name='first_nonfinite_step',
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


def _record_first_nonfinite(first: tf.Variable,
                            loss_totals: Iterable[tf.Tensor],
                            global_step: tf.Variable) -> None:
  """Sets `first` to `global_step` the first time a loss total is not finite."""
  finite = tf.reduce_all(tf.stack(
      [tf.reduce_all(tf.math.is_finite(t)) for t in loss_totals]))
  bad = tf.logical_and(tf.logical_not(finite), first < 0)
  first.assign(tf.where(bad, tf.cast(global_step, tf.int64), first))


def create_optimizer_weights(strategy: tf.distribute.Strategy, optimizer,
                             variables) -> None:
  """Creates the optimizer's slots before training (one trace)."""
  if not variables:  # A model built in its first step: nothing to create.
    return
  with strategy.scope():
    tf_internals.create_optimizer_weights(optimizer, variables)


class Trainer(base_trainer.Trainer):
  """`base_trainer.Trainer` that records the first non-finite-loss step."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.per_step_check = not _is_tpu(self.strategy)
    self._first_nonfinite_step = _first_nonfinite_variable(self.strategy)
    if kwargs.get('train', True):
      create_optimizer_weights(self.strategy, self.optimizer,
                               self.model.trainable_variables)

  @property
  def first_nonfinite_step(self) -> int:
    """The first step whose loss was not finite, or -1."""
    return int(self._first_nonfinite_step.numpy())

  def train_step(self, iterator):
    super().train_step(iterator)
    if self.per_step_check:
      _record_first_nonfinite(self._first_nonfinite_step,
                              [self.train_loss.total], self.global_step)


class _MultiTaskRunnable:
  """What a Model Garden multitask trainer needs to run like `Trainer`.

  Its per-task iterators live in a plain dict (a tracked one fails to trace
  under Python 3.11).
  """

  def _init_runnable(self, evaluator, train: bool = True) -> None:
    self._evaluator = evaluator
    self.per_step_check = not _is_tpu(self.strategy)
    self._first_nonfinite_step = _first_nonfinite_variable(self.strategy)
    if train:
      create_optimizer_weights(self.strategy, self.optimizer,
                               self.multi_task_model.trainable_variables)

  def attach_evaluator(
      self, evaluator: Optional[multitask_evaluator.MultiTaskEvaluator]
  ) -> None:
    """Sets the evaluator `evaluate` runs (it shares `global_step`)."""
    self._evaluator = evaluator

  @property
  def model(self):
    return self.multi_task_model

  @property
  def first_nonfinite_step(self) -> int:
    """The first step whose loss was not finite, or -1."""
    return int(self._first_nonfinite_step.numpy())

  def initialize(self):
    return self.multi_task_model.initialize()

  def evaluate(self, num_steps: tf.Tensor):
    if self._evaluator is None:
      raise ValueError('This multitask trainer was built without an '
                       'evaluator (evaluate=False).')
    return self._evaluator.evaluate(num_steps)

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

  def train_step(self, iterator_map):
    super().train_step(iterator_map)
    if self.per_step_check:
      _record_first_nonfinite(
          self._first_nonfinite_step,
          [m.total for m in self.training_losses.values()], self.global_step)

  def _loop_training_loss(self) -> tf.Tensor:
    return self.training_losses['total_loss'].result()

  def train_loop_end(self):
    result = super().train_loop_end()
    result['training_loss'] = self._loop_training_loss()
    return result


class MultiTaskTrainer(_MultiTaskRunnable,
                       multitask_base_trainer.MultiTaskBaseTrainer,
                       orbit.AbstractEvaluator):
  """Model Garden's joint multitask trainer (`trainer_type: joint`)."""

  def __init__(self, multi_task: multitask.MultiTask, multi_task_model,
               optimizer, evaluator=None, train: bool = True,
               trainer_options=None):
    super().__init__(multi_task=multi_task, multi_task_model=multi_task_model,
                     optimizer=optimizer, trainer_options=trainer_options,
                     train_datasets=None if train else {})
    self._init_runnable(evaluator, train)


class MultiTaskInterleavingTrainer(
    _MultiTaskRunnable, interleaving_trainer.MultiTaskInterleavingTrainer,
    orbit.AbstractEvaluator):
  """Model Garden's interleaving trainer: a sampled task a step."""

  def __init__(self, multi_task: multitask.MultiTask, multi_task_model,
               optimizer, task_sampler: task_sampler.TaskSampler,
               evaluator=None, trainer_options=None):
    super().__init__(multi_task=multi_task, multi_task_model=multi_task_model,
                     optimizer=optimizer, task_sampler=task_sampler,
                     trainer_options=trainer_options)
    self._init_runnable(evaluator)

  def _loop_training_loss(self) -> tf.Tensor:
    # Steps of the loop = steps of every task; `total_loss` is not updated.
    totals = [m for name, m in self.training_losses.items()
              if name != 'total_loss']
    return tf.math.divide_no_nan(tf.add_n([m.total for m in totals]),
                                 tf.add_n([m.count for m in totals]))


def create_multitask_trainer(
    params: multitask_configs.MultiTaskExperimentConfig,
    task: multitask.MultiTask,
    train: bool,
    evaluate: bool,
    checkpoint_exporter: Optional[train_utils.BestCheckpointExporter] = None,
) -> _MultiTaskRunnable:
  """A multitask experiment's trainer and evaluator (strategy scope).

  ValueError for another `trainer.trainer_type` or a task that cannot build its
  multitask model.
  """
  trainer_type = params.trainer.trainer_type
  if trainer_type not in MULTITASK_TRAINER_TYPES:
    raise ValueError(f'trainer.trainer_type={trainer_type!r}: expected one of '
                     f'{MULTITASK_TRAINER_TYPES} (Model Garden\'s multitask '
                     'trainers).')
  if not hasattr(task, 'build_multitask_model'):
    raise ValueError(f'{type(task).__name__} has no build_multitask_model(): '
                     f'cannot build the model of task config '
                     f'{type(params.task).__name__}.')
  model = task.build_multitask_model()
  optimizer = train_utils.create_optimizer(task, params)
  # As Model Garden's single-task trainer reads them (Model Garden's
  # multitask runner passes none, so the two fields had no effect there).
  options = orbit.StandardTrainerOptions(
      use_tf_function=params.trainer.train_tf_function,
      use_tf_while_loop=params.trainer.train_tf_while_loop)
  if train and trainer_type == 'interleaving':
    trainer = MultiTaskInterleavingTrainer(
        multi_task=task, multi_task_model=model, optimizer=optimizer,
        task_sampler=task_sampler.get_task_sampler(
            params.trainer.task_sampler, task.task_weights),
        trainer_options=options)
  else:
    trainer = MultiTaskTrainer(multi_task=task, multi_task_model=model,
                               optimizer=optimizer, train=train,
                               trainer_options=options)
  if evaluate:
    trainer.attach_evaluator(multitask_evaluator.MultiTaskEvaluator(
        eval_tasks=list(task.tasks.values()), model=model,
        global_step=trainer.global_step, eval_steps=task.task_eval_steps,
        checkpoint_exporter=checkpoint_exporter))
  return trainer


def create_trainer(params, task, train: bool, evaluate: bool,
                   checkpoint_exporter=None):
  """`Trainer`, or a multitask trainer (strategy scope)."""
  if isinstance(params, multitask_configs.MultiTaskExperimentConfig):
    return create_multitask_trainer(params, task, train=train,
                                    evaluate=evaluate,
                                    checkpoint_exporter=checkpoint_exporter)
  return train_utils.create_trainer(
      params, task, train=train, evaluate=evaluate,
      checkpoint_exporter=checkpoint_exporter, trainer_cls=Trainer)
