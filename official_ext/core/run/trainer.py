"""The trainers `official_ext.train` runs, and the stop on a non-finite loss.

Single-task experiments use `Trainer`: Model Garden's `base_trainer.Trainer`
(an Orbit trainer and evaluator in one) that records the first non-finite
training loss. Multitask experiments
(`official.modeling.multitask.configs.MultiTaskExperimentConfig`) use
`MultiTaskTrainer` or `MultiTaskInterleavingTrainer`: Model Garden's joint and
interleaving multitask trainers, each joined to a `MultiTaskEvaluator` and
given the interface of `base_trainer.Trainer` that Model Garden's
`OrbitExperimentRunner` uses (`model`, `optimizer`, `checkpoint`,
`global_step`, `initialize`, `evaluate`), so that both kinds run through the
same runner (`core.run.runner.OrbitExperimentRunner`) with the same
checkpoint restore, actions, progress line and final metrics.
`create_trainer` builds the one the config asks for.

The non-finite-loss stop. Model Garden's own guard (`actions.RecoveryAction`,
on when `trainer.recovery_max_trials >= 0`) looks at the loss averaged over a
whole train loop and raises "The loss value is NaN or out of range" without
saying when it happened. The trainers here record the first step whose
training loss is not finite, in the step itself, and `NonFiniteLossCheck`
(the first train action, so it runs before Model Garden's actions and before
Orbit saves the loop's checkpoint) raises `NonFiniteLossError` naming that
step. No checkpoint with non-finite weights is written: Orbit saves after
the actions of a loop.
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
  """Sets `first` to `global_step` the first time a loss total is not finite.

  Args:
    first: the record (-1: every loss finite so far).
    loss_totals: running sums of this loop's training losses (Mean metrics'
      `total`, read in cross-replica context: summed over replicas). Once a
      replica's loss is NaN or infinite its sum stays so for the loop.
    global_step: the step counter, already incremented for this step.
  """
  finite = tf.reduce_all(tf.stack(
      [tf.reduce_all(tf.math.is_finite(t)) for t in loss_totals]))
  bad = tf.logical_and(tf.logical_not(finite), first < 0)
  first.assign(tf.where(bad, tf.cast(global_step, tf.int64), first))


def create_optimizer_weights(strategy: tf.distribute.Strategy, optimizer,
                             variables) -> None:
  """Creates the optimizer's slots for `variables` before training starts.

  Otherwise the first training step creates them inside the traced train
  loop, and TensorFlow traces the whole loop a second time (a `tf.function`
  that creates variables on its first call is retraced without them):
  every run's first loop would cost two traces of the training step. The
  slots are the ones the first step creates (every trainable variable gets
  a gradient in this package's tasks: `tests/core/test_trainer.py`).
  """
  if not variables:  # A model built in its first step: nothing to create.
    return
  with strategy.scope():
    tf_internals.create_optimizer_weights(optimizer, variables)


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

  Mixed in before `multitask_base_trainer.MultiTaskBaseTrainer` (or its
  interleaving subclass), with `orbit.AbstractEvaluator` after it:

  * `evaluate` runs the joined `MultiTaskEvaluator` (one evaluation of every
    task, {task: {metric: value}}); `model` is the `MultiTaskBaseModel`;
    `initialize` its `initialize` (the checkpoint manager's `init_fn`, as in
    Model Garden's multitask `train_lib.run_experiment`).
  * `train_loop_end` adds a top-level `training_loss`, the mean training loss
    of the loop's steps (joint: the weighted total; interleaving: each step's
    sampled task's loss), which Model Garden's recovery action and
    `NonFiniteLossCheck` read.
  * `first_nonfinite_step`, recorded per step as in `Trainer`.
  * The per-task iterators are kept in a plain dict: `orbit.StandardTrainer`
    stores them as an attribute of a `tf.Module`, which wraps the dict in a
    tracking `_DictWrapper`, and tracing the train loop with that argument
    fails under Python 3.11 (TypeError: this __dict__ descriptor does not
    support '_DictWrapper' objects).
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
  """Model Garden's joint multitask trainer (`trainer_type: joint`).

  Each step takes one batch of every task and applies one update from
  `multi_task.joint_train_step` (the weighted sum of the task losses).

  Args:
    multi_task: the `MultiTask`.
    multi_task_model: its `MultiTaskBaseModel`.
    optimizer: the optimizer.
    evaluator: the evaluator `evaluate` runs (or `attach_evaluator` later).
    train: False builds no training input (an evaluation-only job).
    trainer_options: `orbit.StandardTrainerOptions`.
  """

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
  """Model Garden's interleaving trainer (`trainer_type: interleaving`).

  Each step samples one task (`trainer.task_sampler`, from the task weights)
  and runs that task's own `train_step` on its sub-model.
  """

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
  """The multitask trainer (and evaluator) of a multitask experiment.

  Call under the strategy's scope.

  Args:
    params: the experiment config; `trainer.trainer_type` chooses Model
      Garden's 'joint' or 'interleaving' trainer (an evaluation-only job uses
      the joint one, which builds no training input).
    task: the `MultiTask`; it must build its model with
      `build_multitask_model()` (as Model Garden's
      `run_experiment_with_multitask_eval` expects).
    train: whether the job trains (builds training input).
    evaluate: whether the job evaluates (builds a `MultiTaskEvaluator` over
      every task, with `task_routines[i].eval_steps`).
    checkpoint_exporter: the best-checkpoint exporter, or None.

  Raises:
    ValueError: `trainer.trainer_type` is not 'joint' or 'interleaving', or
      the task cannot build its model.
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
  """The trainer of any experiment `official_ext.train` runs.

  Args:
    params: an `ExperimentConfig` or a `MultiTaskExperimentConfig`.
    task: its task (`task_factory.get_task(params.task)`).
    train: whether the job trains.
    evaluate: whether the job evaluates.
    checkpoint_exporter: the best-checkpoint exporter, or None.

  Returns:
    `Trainer` for a single task; for a multitask config
    `create_multitask_trainer`'s trainer. Call under the strategy's scope.
  """
  if isinstance(params, multitask_configs.MultiTaskExperimentConfig):
    return create_multitask_trainer(params, task, train=train,
                                    evaluate=evaluate,
                                    checkpoint_exporter=checkpoint_exporter)
  return train_utils.create_trainer(
      params, task, train=train, evaluate=evaluate,
      checkpoint_exporter=checkpoint_exporter, trainer_cls=Trainer)
