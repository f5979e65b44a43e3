"""Configuration of the multitask readout family and its experiments
(docs/readout.md#experiments)."""
import dataclasses
import re
from typing import Dict, Optional, Tuple

import numpy as np

from official.core import config_definitions as cfg
from official.core import exp_factory
from official.modeling import hyperparams
from official.modeling import optimization
from official_ext.core.kernels import kernel_policy
# Importing these registers the family's readout types in `readout_types`.
from official_ext.readout import builtin_types  # pylint: disable=unused-import
from official_ext.readout import readout_types
from official_ext.readout import von_mises  # pylint: disable=unused-import

# `READOUT_TYPES` (the registered readout types) and `METRICS_BY_TYPE`
# ({type: its metrics}, the first one its primary metric, averaged into
# `average/score`) are looked up in `readout_types` when read (module
# `__getattr__`), so a type registered later is in them.


def __getattr__(name):
  if name == 'READOUT_TYPES':
    return readout_types.registered_types()
  if name == 'METRICS_BY_TYPE':
    return readout_types.metrics_by_type()
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


PADDING_ID = 0

# `ReadoutTaskConfig.loss_weighting` values (see `losses`).
LOSS_WEIGHTINGS = ('weighted_sum', 'sample_share')

# Readout names that would collide with the task's own log keys
# (`<task>_loss` vs `total_loss`, `<task>/<metric>` vs `average/<metric>`).
RESERVED_NAMES = ('total', 'average')


@dataclasses.dataclass
class ReadoutSpec(hyperparams.Config):
  """One readout (task) of the model.

  Attributes:
    name: task name: its head, outputs and metrics; letters, digits, '_',
      '.', '-'; not one of `RESERVED_NAMES`.
    dim: the head's width (channels, labels or classes; von_mises 2).
    type: a registered readout type (`readout_types`).
    loss_weight: this task's weight in the total loss.
    metrics: metrics to report; empty: every metric of the type.
    normalize_mean, normalize_std: continuous targets normalised as
      (y - mean) / std for the loss (one value or `dim`; both or neither;
      std > 0); predictions are reported de-normalised.
  """
  name: str = ''
  dim: int = 1
  type: str = 'continuous'
  loss_weight: float = 1.0
  metrics: Tuple[str, ...] = ()
  normalize_mean: Tuple[float, ...] = ()
  normalize_std: Tuple[float, ...] = ()


def target_normalization(spec: ReadoutSpec
                         ) -> Optional[Tuple[np.ndarray, np.ndarray]]:
  """(mean, std), float32 [dim] each, of a normalised readout; else None.

  Raises:
    ValueError: naming the spec, for a normalisation that is not valid.
  """
  mean, std = tuple(spec.normalize_mean or ()), tuple(spec.normalize_std or ())
  if not mean and not std:
    return None
  where = f'task.readouts `{spec.name}`'
  if spec.type != 'continuous':
    raise ValueError(f'{where}: normalize_mean / normalize_std are set but '
                     f'its type is {spec.type!r}; target normalisation '
                     'applies to continuous readouts only.')
  if not mean or not std:
    raise ValueError(f'{where}: normalize_mean {list(mean)} and '
                     f'normalize_std {list(std)}; set both or neither.')
  out = []
  for key, values in (('normalize_mean', mean), ('normalize_std', std)):
    if len(values) not in (1, int(spec.dim)):
      raise ValueError(f'{where}: {key} has {len(values)} values; expected '
                       f'1 or dim = {spec.dim}.')
    array = np.broadcast_to(np.asarray(values, np.float32), [int(spec.dim)])
    if not np.all(np.isfinite(array)):
      raise ValueError(f'{where}: {key} {list(values)} is not finite.')
    out.append(array.copy())
  if not np.all(out[1] > 0):
    raise ValueError(f'{where}: normalize_std {list(std)}; expected every '
                     'value > 0.')
  return out[0], out[1]


def normalize_targets(spec: ReadoutSpec, targets):
  """(targets - mean) / std for a normalised readout, else `targets`."""
  norm = target_normalization(spec)
  return targets if norm is None else (targets - norm[0]) / norm[1]


def denormalize_predictions(spec: ReadoutSpec, predictions):
  """predictions * std + mean for a normalised readout, else `predictions`."""
  norm = target_normalization(spec)
  return predictions if norm is None else predictions * norm[1] + norm[0]


def validate_readouts(readouts, task_vocabulary) -> None:
  """Raises ValueError naming the readout spec or vocabulary entry at fault."""
  if not readouts:
    raise ValueError('task.readouts is empty; expected at least one '
                     'ReadoutSpec.')
  names = [s.name for s in readouts]
  if len(set(names)) != len(names):
    raise ValueError(f'task.readouts: names {names} repeat a name.')
  vocab = list(task_vocabulary)
  if len(set(vocab)) != len(vocab):
    raise ValueError(f'task.task_vocabulary {vocab} repeats a name.')
  for spec in readouts:
    where = f'task.readouts `{spec.name}`'
    if not spec.name:
      raise ValueError('task.readouts: a ReadoutSpec has an empty name.')
    if spec.name in RESERVED_NAMES:
      raise ValueError(f'{where}: the name is reserved ({RESERVED_NAMES}: '
                       "the logs' `total_loss` and `average/<metric>`); "
                       'rename the readout.')
    readout_type = readout_types.get_readout_type(spec, where)
    problem = readout_type.dim_problem(spec.dim)
    if problem:
      raise ValueError(f'{where}: dim {spec.dim}; {problem}.')
    if not spec.loss_weight >= 0:
      raise ValueError(f'{where}: loss_weight {spec.loss_weight}; expected '
                       '>= 0.')
    target_normalization(spec)  # Raises for a bad normalisation.
    unknown = set(spec.metrics) - set(readout_type.known_metrics)
    if unknown:
      raise ValueError(f'{where}: metrics {sorted(unknown)} are not defined '
                       f'for type {spec.type}; expected a subset of '
                       f'{readout_type.known_metrics}.')
  missing = [n for n in names if n not in vocab]
  if missing:
    raise ValueError(f'No routing index for readouts {missing}: add them to '
                     f'task.task_vocabulary (now {vocab}).')


def selected_eval_sets(task_config: 'ReadoutTaskConfig'
                       ) -> Tuple['EvalSet', ...]:
  """The evaluation sets an evaluation reads, checked; () without sets.

  Raises:
    ValueError: naming the key at fault (a set's name, data or demo_split,
      an unknown `eval_set`, selected sets whose batching differs, or
      `task.validation_data.input_path` set beside the sets).
  """
  evaluation = task_config.evaluation
  sets = tuple(evaluation.eval_sets)
  names = [s.name for s in sets]
  if evaluation.eval_set and evaluation.eval_set not in names:
    raise ValueError(
        f'task.evaluation.eval_set={evaluation.eval_set!r} names no '
        f'evaluation set; known names (task.evaluation.eval_sets): {names} '
        "('' evaluates them all).")
  if not sets:
    return ()
  if len(set(names)) != len(names):
    raise ValueError(f'task.evaluation.eval_sets: names {names} repeat a '
                     'name.')
  if task_config.validation_data.input_path:
    raise ValueError(
        'task.validation_data.input_path is set '
        f'({task_config.validation_data.input_path!r}) beside '
        f'task.evaluation.eval_sets {names}: an evaluation reads the sets '
        'only. Make it a set, or clear task.validation_data.input_path.')
  for i, s in enumerate(sets):
    key = f'task.evaluation.eval_sets[{i}]'
    if not _SET_NAME.match(s.name):
      raise ValueError(f'{key}.name={s.name!r}: expected letters, digits, '
                       "'_', '.' or '-' (it prefixes metric names).")
    if s.data.is_training:
      raise ValueError(f'{key}.data.is_training is True ({s.name!r}); an '
                       'evaluation set is read once, unshuffled.')
    if int(s.data.input_dim) != int(task_config.train_data.input_dim):
      raise ValueError(f'{key}.data.input_dim={s.data.input_dim} '
                       f'({s.name!r}) differs from task.train_data.'
                       f'input_dim={task_config.train_data.input_dim}.')
    if s.demo_split not in ('',) + DEMO_EVAL_SPLITS:
      raise ValueError(f'{key}.demo_split={s.demo_split!r} ({s.name!r}); '
                       f"expected '' or one of {DEMO_EVAL_SPLITS}.")
  selected = tuple(s for s in sets
                   if evaluation.eval_set in ('', s.name))
  for field in ('batching', 'drop_remainder'):
    values = {s.name: getattr(s.data, field) for s in selected}
    if len(set(values.values())) > 1:
      raise ValueError(
          f'task.evaluation.eval_sets: data.{field} differs between the '
          f'selected sets ({values}); one evaluation pass reads them all, '
          'so their batches must have the same fields.')
  return selected


def task_index(task_vocabulary) -> Dict[str, int]:
  """{task name: routing id}, ids 1..len(vocabulary) (0 is padding)."""
  return {name: i + 1 for i, name in enumerate(task_vocabulary)}


@dataclasses.dataclass
class DataConfig(cfg.DataConfig):
  """Input pipeline of readout records (docs/readout.md#data).

  Attributes:
    input_dim: feature width of every input token.
    batching: 'padded' ([batch, n_out] queries) or 'varlen' (chained).
    pad_multiple: token and query counts are padded to a multiple of this.
    max_input_tokens: if set, tokens are padded to exactly this many
      (static shapes); a longer record is an error.
    max_queries: the same for queries (padded batching only).
    shuffle_buffer_size: records shuffled in training.
    num_examples: number of records, informational; -1 unknown.
    skip_bad_records: skip, log and count bad records instead of failing.
    balance_sessions: training with unit tokens: draw every session of the
      files equally often.
  """
  input_dim: int = 32
  batching: str = 'padded'
  pad_multiple: int = 8
  max_input_tokens: Optional[int] = None
  max_queries: Optional[int] = None
  shuffle_buffer_size: int = 1000
  num_examples: int = -1
  skip_bad_records: bool = False
  balance_sessions: bool = False


@dataclasses.dataclass
class Encoder(hyperparams.Config):
  """The shared token encoder (`modeling.layers.TokenEncoder`).

  Attributes:
    hidden_size: token width inside the encoder and decoder.
    num_heads: attention heads.
    num_layers: self-attention blocks.
    num_latents: 0: a Transformer over the tokens; > 0: this many
      Perceiver latents cross-attend to the tokens first.
    intermediate_size: width of the feed-forward layers.
    dropout_rate: dropout of attention and feed-forward outputs.
    min_time_period, max_time_period: the time embedding's periods (s).
  """
  hidden_size: int = 64
  num_heads: int = 4
  num_layers: int = 2
  num_latents: int = 0
  intermediate_size: int = 128
  dropout_rate: float = 0.0
  min_time_period: float = 0.02
  max_time_period: float = 20.0


@dataclasses.dataclass
class Decoder(hyperparams.Config):
  """Query decoder; num_layers: its cross-attention (+ feed-forward) blocks."""
  num_layers: int = 1


@dataclasses.dataclass
class ReadoutModel(hyperparams.Config):
  """Attributes:
    encoder: the shared encoder.
    decoder: the query decoder.
    static_shapes: route with masks, every head on every query (XLA, TPU).
    tokenization: 'binned' (a token is a bin's vector of `input_dim`
      features) or 'unit_tokens' (a token is one unit's activity at one
      time; tables sized by `task.vocabulary_file`).
    unit_token_variant: 'poyo' or 'session_per_token' (docs/readout.md,
      POYO and this model)."""
  # Fields added after params.yaml files were written without them: the
  # value a file lacking the field was trained with
  # (`core.experiment_params`).
  PARAMS_YAML_DEFAULTS = {'unit_token_variant': 'session_per_token'}

  encoder: Encoder = dataclasses.field(default_factory=Encoder)
  decoder: Decoder = dataclasses.field(default_factory=Decoder)
  static_shapes: bool = False
  tokenization: str = 'binned'
  unit_token_variant: str = 'poyo'


TOKENIZATIONS = ('binned', 'unit_tokens')
UNIT_TOKEN_VARIANTS = ('poyo', 'session_per_token')
# Modules `ReadoutTaskConfig.freeze` can hold (the model's variable groups):
# 'encoder' is 'encoder_except_latents' + 'latents'.
FREEZABLE_MODULES = ('encoder', 'encoder_except_latents', 'latents',
                     'decoder', 'readout', 'unit_embedding',
                     'session_embedding')
# `task.freeze` of unit identification, per `model.unit_token_variant`:
# POYO+'s (every module but the new unit and session rows and the
# Perceiver latents), and every module but the new rows.
UNIT_IDENTIFICATION_FREEZE = {
    'poyo': ('encoder_except_latents', 'decoder', 'readout',
             'unit_embedding', 'session_embedding'),
    'session_per_token': ('encoder', 'decoder', 'readout', 'unit_embedding',
                          'session_embedding'),
}


# The generated splits an evaluation set can read (`demo_data`):
# 'validation': held-out trials of the training sessions; 'held_out_sessions':
# trials of sessions no training trial comes from.
DEMO_EVAL_SPLITS = ('validation', 'held_out_sessions')
_SET_NAME = re.compile(r'^[A-Za-z0-9_.-]+$')


@dataclasses.dataclass
class EvalSet(hyperparams.Config):
  """A named evaluation set.

  Attributes:
    name: prefixes the set's metrics and names its table; letters, digits,
      '_', '.', '-'.
    data: the set's input pipeline.
    demo_split: the generated split read when `data.input_path` is empty
      (one of `DEMO_EVAL_SPLITS`); '': none.
  """
  name: str = ''
  data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(is_training=False))
  demo_split: str = ''


@dataclasses.dataclass
class Evaluation(hyperparams.Config):
  """Attributes:
    print_table: print the per-task metric table after each evaluation.
    eval_sets: named evaluation sets; empty: `task.validation_data`.
    eval_set: the set to evaluate; '': every set.
    stitch: average the predictions of overlapping windows per (session,
      time, task) and add per-session metrics.
    stitch_resolution: seconds to which session times are rounded.
    protocol: 'official_ext' or 'torch_brain' (docs/readout.md: the
      evaluation protocol)."""
  print_table: bool = True
  eval_sets: Tuple[EvalSet, ...] = ()
  eval_set: str = ''
  stitch: bool = False
  stitch_resolution: float = 1e-6
  protocol: str = 'official_ext'


def stitching(evaluation: Evaluation) -> bool:
  """Whether an evaluation stitches: `stitch` or the 'torch_brain' protocol."""
  return bool(evaluation.stitch) or evaluation.protocol == 'torch_brain'


@dataclasses.dataclass
class DemoDataConfig(hyperparams.Config):
  """Generated data (`demo_data`), used when a split's `input_path` is empty.

  Attributes:
    enabled: generate data when `input_path` is empty.
    cache_dir: where generated shards are kept; '': $OFFICIAL_EXT_CACHE or
      ~/.cache/official_ext.
    seed: random seed of the generator.
    num_train_trials, num_validation_trials: records per split.
    num_shards: files per split.
    noise_std: std of the units' per-bin noise.
    trial_noise_std: std of the per-trial error of the task variables.
    num_sessions: sessions the train and validation trials are dealt over.
    num_held_out_sessions: sessions of the `held_out_sessions` split.
    num_held_out_session_trials: its records (0: not written).
    session_gain_std: std of the log of a session's per-unit gains.
    num_held_out_train_trials: unit tokens: records of `held_out_train`.
    min_units, max_units: unit tokens: each session's unit count range.
    mean_rate_hz: unit tokens: the units' median firing rate at rest (Hz).
    tuning_std: unit tokens: std of each unit's log-rate weights.
    train_split, validation_split: the generated splits the task reads.
  """
  enabled: bool = False
  cache_dir: str = ''
  seed: int = 0
  num_train_trials: int = 4096
  num_validation_trials: int = 512
  num_shards: int = 2
  noise_std: float = 0.5
  trial_noise_std: float = 0.7
  num_sessions: int = 1
  num_held_out_sessions: int = 0
  num_held_out_session_trials: int = 0
  session_gain_std: float = 0.5
  num_held_out_train_trials: int = 0
  min_units: int = 8
  max_units: int = 32
  mean_rate_hz: float = 5.0
  tuning_std: float = 0.5
  train_split: str = 'train'
  validation_split: str = 'validation'


@dataclasses.dataclass
class ReadoutTaskConfig(cfg.TaskConfig):
  """The multitask readout task.

  Attributes:
    readouts: one ReadoutSpec per task with a head.
    task_vocabulary: task names; routing id = 1 + position (0: padding).
    gradient_clip_norm: clip the global gradient norm (<= 0: off).
    loss_weighting: 'weighted_sum' or 'sample_share' (`losses`).
    evaluation: evaluation options.
    demo_data: generated data used when an `input_path` is empty.
    vocabulary_file: the unit vocabulary (JSON) of unit tokens; with demo
      data and '' the generated one.
    init_checkpoint: a checkpoint (or directory) to start from, restored
      strictly but for grown unit and session tables.
    freeze: modules not trained (`FREEZABLE_MODULES`).
    unfreeze_step: the step from which every module trains; 0: never.
  """
  model: ReadoutModel = dataclasses.field(default_factory=ReadoutModel)
  train_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(is_training=True))
  validation_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(is_training=False))
  readouts: Tuple[ReadoutSpec, ...] = ()
  task_vocabulary: Tuple[str, ...] = ()
  gradient_clip_norm: float = 1.0
  loss_weighting: str = 'weighted_sum'
  evaluation: Evaluation = dataclasses.field(default_factory=Evaluation)
  demo_data: DemoDataConfig = dataclasses.field(default_factory=DemoDataConfig)
  vocabulary_file: str = ''
  freeze: Tuple[str, ...] = ()
  unfreeze_step: int = 0


# The demo's eight readouts (see `demo_data`): all five types.
DEMO_READOUTS = (
    ReadoutSpec(name='choice', dim=1, type='binary'),
    ReadoutSpec(name='reward', dim=1, type='binary'),
    ReadoutSpec(name='stimulus', dim=5, type='multinomial'),
    ReadoutSpec(name='wheel_speed', dim=1, type='continuous'),
    ReadoutSpec(name='paw_speed', dim=2, type='continuous'),
    ReadoutSpec(name='whisker_energy', dim=1, type='continuous'),
    ReadoutSpec(name='lick_rate', dim=1, type='event_rate'),
    ReadoutSpec(name='trial_events', dim=3, type='multilabel'),
)
DEMO_VOCABULARY = tuple(s.name for s in DEMO_READOUTS)
DEMO_INPUT_DIM = 32


def demo_optimizer(learning_rate: float, train_steps: int,
                   warmup_steps: int) -> optimization.OptimizationConfig:
  """Adam; linear warmup, then cosine decay to 5% over train_steps."""
  return optimization.OptimizationConfig({
      'optimizer': {'type': 'adam', 'adam': {}},
      'learning_rate': {'type': 'cosine', 'cosine': {
          'initial_learning_rate': learning_rate,
          'decay_steps': train_steps, 'alpha': 0.05}},
      'warmup': {'type': 'linear', 'linear': {
          'warmup_learning_rate': 0.0, 'warmup_steps': warmup_steps}},
  })


_RESTRICTIONS = [
    'task.train_data.input_dim == task.validation_data.input_dim',
]


def readout_demo_task(num_train: int = 4096, num_val: int = 512,
                      batch_size: int = 64) -> ReadoutTaskConfig:
  return ReadoutTaskConfig(
      model=ReadoutModel(encoder=Encoder(hidden_size=64, num_heads=4,
                                         num_layers=2, intermediate_size=128),
                         decoder=Decoder(num_layers=1)),
      train_data=DataConfig(is_training=True, global_batch_size=batch_size,
                            drop_remainder=True, input_dim=DEMO_INPUT_DIM,
                            num_examples=num_train),
      validation_data=DataConfig(is_training=False, global_batch_size=128,
                                 drop_remainder=False,
                                 input_dim=DEMO_INPUT_DIM,
                                 num_examples=num_val),
      readouts=DEMO_READOUTS,
      task_vocabulary=DEMO_VOCABULARY,
      demo_data=DemoDataConfig(enabled=True, num_train_trials=num_train,
                               num_validation_trials=num_val))


@exp_factory.register_config_factory('readout_demo')
def readout_demo() -> cfg.ExperimentConfig:
  """Eight readouts of five types on generated data; 2 CPU cores."""
  num_train, batch_size = 4096, 64
  steps_per_epoch = num_train // batch_size
  train_steps = 12 * steps_per_epoch
  return cfg.ExperimentConfig(
      runtime=kernel_policy.RuntimeConfig(mixed_precision_dtype='float32'),
      task=readout_demo_task(num_train=num_train, batch_size=batch_size),
      trainer=cfg.TrainerConfig(
          steps_per_loop=steps_per_epoch,
          summary_interval=steps_per_epoch,
          checkpoint_interval=4 * steps_per_epoch,
          train_steps=train_steps,
          validation_steps=-1,
          validation_interval=4 * steps_per_epoch,
          optimizer_config=demo_optimizer(2e-3, train_steps, steps_per_epoch)),
      restrictions=list(_RESTRICTIONS))


@exp_factory.register_config_factory('readout_demo_named_eval')
def readout_demo_named_eval() -> cfg.ExperimentConfig:
  """`readout_demo` over four sessions, evaluated on two named sets."""
  params = readout_demo()
  task = params.task
  data = task.validation_data
  task.demo_data = task.demo_data.replace(
      num_sessions=4, num_held_out_sessions=2, num_held_out_session_trials=512)
  task.evaluation = task.evaluation.replace(eval_sets=(
      EvalSet(name='held_out_trials', data=data, demo_split='validation'),
      EvalSet(name='held_out_sessions', data=data,
              demo_split='held_out_sessions'),
  ))
  return params


def readout_units_demo_task() -> ReadoutTaskConfig:
  """The unit-token demo's task: eight generated sessions, Perceiver encoder."""
  task = readout_demo_task(num_train=4096, num_val=512, batch_size=64)
  task.model = task.model.replace(
      tokenization='unit_tokens',
      encoder=task.model.encoder.replace(num_latents=32))
  task.train_data = task.train_data.replace(input_dim=1,
                                            balance_sessions=True)
  task.validation_data = task.validation_data.replace(input_dim=1)
  task.demo_data = task.demo_data.replace(
      num_sessions=8, num_held_out_sessions=1,
      num_held_out_session_trials=256, num_held_out_train_trials=256)
  task.evaluation = task.evaluation.replace(stitch=True)
  return task


@exp_factory.register_config_factory('readout_units_demo')
def readout_units_demo() -> cfg.ExperimentConfig:
  """One unit-token model pretrained over eight generated recordings."""
  params = readout_demo()
  params.task = readout_units_demo_task()
  return params


@exp_factory.register_config_factory('readout_units_finetune_demo')
def readout_units_finetune_demo() -> cfg.ExperimentConfig:
  """`readout_units_demo` adapted to its held-out session: unit
  identification, then fine-tuning (docs/readout.md)."""
  params = readout_units_demo()
  task = params.task
  task.demo_data = task.demo_data.replace(train_split='held_out_train',
                                          validation_split='held_out_sessions')
  task.train_data = task.train_data.replace(
      global_batch_size=32, num_examples=256, balance_sessions=False)
  task.validation_data = task.validation_data.replace(num_examples=256)
  task.freeze = UNIT_IDENTIFICATION_FREEZE[task.model.unit_token_variant]
  task.unfreeze_step = 224
  steps_per_epoch, train_steps = 8, 256
  params.trainer = params.trainer.replace(
      steps_per_loop=steps_per_epoch, summary_interval=steps_per_epoch,
      checkpoint_interval=64, train_steps=train_steps,
      validation_interval=64,
      optimizer_config=demo_optimizer(2e-3, train_steps, steps_per_epoch))
  return params
