"""Configuration of joint experiments: readout and YT8M task routines on one
shared encoder (docs/readout.md#joint-training-with-youtube-8m)."""
import dataclasses
from typing import Dict, List, Optional, Tuple, Type

from official.core import config_definitions as cfg
from official.core import exp_factory
from official.modeling import hyperparams
from official.modeling.multitask import configs as multitask_configs
from official_ext.core.kernels import kernel_policy
from official_ext.readout import configs as readout_configs
from official_ext.yt8m import configs as yt8m_configs

# family -> the class of a routine's task_config.
FAMILY_TASK_CONFIGS: Dict[str, Type[cfg.TaskConfig]] = {
    'readout': readout_configs.ReadoutTaskConfig,
    'yt8m': yt8m_configs.YT8MTask,
}

TRAINER_TYPES = ('joint', 'interleaving')


def _family_of(task_config) -> str:
  for family, config_cls in FAMILY_TASK_CONFIGS.items():
    if type(task_config) is config_cls:  # pylint: disable=unidiomatic-typecheck
      return family
  return ''


@dataclasses.dataclass
class JointTaskRoutine(multitask_configs.TaskRoutine):
  """One task of a joint experiment: Model Garden's `TaskRoutine` + family.

  Attributes:
    family: 'readout' or 'yt8m': the class of `task_config`
      (`FAMILY_TASK_CONFIGS`); set from that class when built in Python.
  """
  family: str = ''

  def __post_init__(self, *args, **kwargs):
    super().__post_init__(*args, **kwargs)
    if not self.family and self.task_config is not None:
      self.family = _family_of(self.task_config)

  def _override(self, override_dict, is_strict=True):
    """Builds `task_config`, strictly, as its family's class."""
    override_dict = dict(override_dict)
    task_config = override_dict.pop('task_config', None)
    if 'family' in override_dict:
      self._set('family', override_dict.pop('family'))
    super()._override(override_dict, is_strict)
    if task_config is None:
      return
    if isinstance(task_config, hyperparams.ParamsDict):
      task_config = task_config.as_dict()
    config_cls = FAMILY_TASK_CONFIGS.get(self.family)
    if config_cls is None:
      raise ValueError(
          f'task routine {self.task_name!r}: family={self.family!r}; expected '
          f'one of {sorted(FAMILY_TASK_CONFIGS)} (it decides the class of '
          'task_config).')
    current = self.__dict__.get('task_config')
    if type(current) is not config_cls:  # pylint: disable=unidiomatic-typecheck
      current = config_cls()
    current.override(task_config, is_strict=True)
    self.__dict__['task_config'] = current


@dataclasses.dataclass
class JointModelConfig(hyperparams.Config):
  """The shared modules of a joint model.

  Attributes:
    encoder: the shared `TokenEncoder`; a readout routine's must equal it.
    encoder_l2_weight_decay: L2 decay of the encoder's kernels (decay / 2 *
      sum(w^2)), counted once; 0: none.
    seconds_per_frame: timestamp step of YT8M frames as encoder tokens.
  """
  encoder: readout_configs.Encoder = dataclasses.field(
      default_factory=readout_configs.Encoder)
  encoder_l2_weight_decay: float = 0.0
  seconds_per_frame: float = 1.0


@dataclasses.dataclass
class JointTaskConfig(multitask_configs.MultiTaskConfig):
  """Attributes:
  model: the shared modules.
  task_routines: the tasks; any number of readout and YT8M routines.
  gradient_clip_norm: 'joint' trainer: the summed gradient's global norm
    clip (<= 0: off); 'interleaving' uses each task's own."""
  model: JointModelConfig = dataclasses.field(
      default_factory=JointModelConfig)
  task_routines: Tuple[JointTaskRoutine, ...] = ()
  gradient_clip_norm: float = 1.0


def task_names(config: JointTaskConfig) -> List[str]:
  """Each routine's task name (Model Garden: `task_name` or config name)."""
  return [r.task_name or (r.task_config.name if r.task_config else '') or ''
          for r in config.task_routines]


def validate(config: JointTaskConfig,
             trainer_type: Optional[str] = None) -> None:
  """Raises a ValueError naming the key of a combination that cannot work."""
  if trainer_type is not None and trainer_type not in TRAINER_TYPES:
    raise ValueError(f'trainer.trainer_type={trainer_type!r}: expected one '
                     f'of {TRAINER_TYPES}.')
  if not config.task_routines:
    raise ValueError('task.task_routines is empty: give at least one readout '
                     'or YT8M task routine.')
  if config.init_checkpoint:
    raise ValueError(f'task.init_checkpoint={config.init_checkpoint!r}: the '
                     'joint model does not load initial checkpoints; leave '
                     'it empty.')
  names = task_names(config)
  for i, (routine, name) in enumerate(zip(config.task_routines, names)):
    key = f'task.task_routines[{i}]'
    config_cls = FAMILY_TASK_CONFIGS.get(routine.family)
    if config_cls is None:
      raise ValueError(f'{key}.family={routine.family!r}: expected one of '
                       f'{sorted(FAMILY_TASK_CONFIGS)}.')
    if type(routine.task_config) is not config_cls:  # pylint: disable=unidiomatic-typecheck
      raise ValueError(
          f'{key}.task_config is a {type(routine.task_config).__name__}; '
          f'family {routine.family!r} expects a {config_cls.__name__}.')
    if not name:
      raise ValueError(f'{key}.task_name is empty: name every task.')
    if names.index(name) != i:
      raise ValueError(f'{key}.task_name={name!r} repeats '
                       f'task.task_routines[{names.index(name)}].task_name.')
    task = routine.task_config
    if task.init_checkpoint:
      raise ValueError(f'{key}.task_config.init_checkpoint='
                       f'{task.init_checkpoint!r}: the joint model does not '
                       'load initial checkpoints; leave it empty.')
    if routine.family == 'readout':
      shared = config.model.encoder.as_dict()
      own = task.model.encoder.as_dict()
      for field in shared:
        if own[field] != shared[field]:
          raise ValueError(
              f'{key}.task_config.model.encoder.{field}={own[field]!r} '
              f'differs from task.model.encoder.{field}={shared[field]!r}: '
              'the readout model runs on the shared encoder; give both the '
              'same value.')
    elif routine.family == 'yt8m':
      if task.model.backbone.type is not None:
        raise ValueError(
            f'{key}.task_config.model.backbone.type='
            f'{task.model.backbone.type!r}: in a joint model the shared '
            'encoder (task.model.encoder) replaces the YT8M backbone; set it '
            'to null.')
      if task.model.head.type not in ('moe', 'logistic'):
        raise ValueError(f'{key}.task_config.model.head.type='
                         f'{task.model.head.type!r}: expected moe or '
                         'logistic.')


@dataclasses.dataclass
class JointExperimentConfig(multitask_configs.MultiTaskExperimentConfig):
  task: JointTaskConfig = dataclasses.field(default_factory=JointTaskConfig)

  def validate(self):
    super().validate()
    validate(self.task, self.trainer.trainer_type)


# ---------------------------------------------------------------------------
# Experiment.
# ---------------------------------------------------------------------------


def tiny_yt8m_task() -> yt8m_configs.YT8MTask:
  """A small YT8M task on generated data, its backbone off, a MoE head."""
  data = dict(feature_sizes=(32, 8), num_classes=10, max_frames=16,
              num_sample_frames=None)
  return yt8m_configs.YT8MTask(
      model=yt8m_configs.VideoClassificationModel(
          backbone=yt8m_configs.Backbone(type=None),
          head=yt8m_configs.Head(type='moe', moe=yt8m_configs.MoeModel(
              num_mixtures=2))),
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
  readout = readout_configs.readout_demo_task(num_train=1024, num_val=256,
                                              batch_size=32)
  readout.validation_data.global_batch_size = 64
  train_steps = 300
  return JointExperimentConfig(
      task=JointTaskConfig(
          model=JointModelConfig(encoder=readout.model.encoder),
          task_routines=(
              JointTaskRoutine(task_name='readout', family='readout',
                               task_config=readout, task_weight=1.0),
              JointTaskRoutine(task_name='yt8m', family='yt8m',
                               task_config=tiny_yt8m_task(),
                               task_weight=1.0),
          )),
      trainer=multitask_configs.MultiTaskTrainerConfig(
          trainer_type='joint',
          train_steps=train_steps, steps_per_loop=100,
          summary_interval=100, checkpoint_interval=100,
          validation_interval=train_steps, validation_steps=-1,
          optimizer_config=readout_configs.demo_optimizer(
              2e-3, train_steps, 30)),
      runtime=kernel_policy.RuntimeConfig(mixed_precision_dtype='float32'))
