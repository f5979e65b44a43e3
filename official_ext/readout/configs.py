"""Configuration of the multitask readout family.

A readout model encodes a sequence of input tokens (each a feature vector
with a timestamp) with a shared encoder, decodes a variable number of readout
queries (a task id and a timestamp each) against it, and projects every query
through the linear head of its task (`modeling.multitask_readout`).

Experiments registered here:

* `readout_demo`: the eight-readout demo on generated neural-decoding-style
  data (`official_ext.readout.demo_data`); trains on 2 CPU cores.
* `readout_yt8m_joint` (in `official_ext.joint`): the readout task and
  YouTube-8M classification trained jointly on one shared encoder through
  `official.modeling.multitask`.

Routing ids. `ReadoutTaskConfig.task_vocabulary` lists task names; the routing
id of a task is 1 + its position there, and 0 is padding (never a task).
Records store these ids, so the vocabulary is a property of the data: keep it
fixed and drop a task by removing its `ReadoutSpec` from `readouts` (and its
queries from the records: the dataloader rejects a query whose task has no
spec), never by reordering the vocabulary. The model itself skips ids without
a head, so a single-task model runs on multitask batches.
"""
import dataclasses
from typing import Dict, Optional, Tuple

from official.core import config_definitions as cfg
from official.core import exp_factory
from official.modeling import hyperparams
from official.modeling import optimization
from official_ext.readout import readout_types

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

# Readout names that would collide with the task's own log keys
# (`<task>_loss` vs `total_loss`, `<task>/<metric>` vs `average/<metric>`).
RESERVED_NAMES = ('total', 'average')


@dataclasses.dataclass
class ReadoutSpec(hyperparams.Config):
  """One readout (task) of the model.

  Attributes:
    name: task name; names its head (`projections/<name>`), its outputs and
      its metrics (`<name>/<metric>`). Letters, digits, '_', '.', '-';
      not 'total' or 'average' (`RESERVED_NAMES`).
    dim: output width of the head. continuous: number of channels; binary /
      multilabel: number of independent labels; multinomial: number of
      classes; event_rate: number of event channels; von_mises: 2 (the
      vector whose direction and length are the angle's mean and
      concentration).
    type: a registered readout type (`readout_types`): 'continuous' |
      'binary' | 'multinomial' | 'multilabel' | 'event_rate' | 'von_mises'
      or one you register. Decides the target size and checks, the loss,
      the metrics and the served output. The head outputs: values
      (continuous), logits (binary, multilabel, multinomial), log-rates
      (event_rate), a 2-vector (von_mises).
    loss_weight: this task's weight in the total loss.
    metrics: metrics to report; empty: every metric of the type
      (`ReadoutType.metrics`).
  """
  name: str = ''
  dim: int = 1
  type: str = 'continuous'
  loss_weight: float = 1.0
  metrics: Tuple[str, ...] = ()


def target_size(spec: ReadoutSpec) -> int:
  """Values stored per query (the type's `target_size`: e.g. 1 class id for
  multinomial, else `dim`)."""
  return readout_types.get_readout_type(spec).target_size(spec)


def spec_metrics(spec: ReadoutSpec) -> Tuple[str, ...]:
  return (tuple(spec.metrics) or
          readout_types.get_readout_type(spec).metrics)


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
    unknown = set(spec.metrics) - set(readout_type.metrics)
    if unknown:
      raise ValueError(f'{where}: metrics {sorted(unknown)} are not defined '
                       f'for type {spec.type}; expected a subset of '
                       f'{readout_type.metrics}.')
  missing = [n for n in names if n not in vocab]
  if missing:
    raise ValueError(f'No routing index for readouts {missing}: add them to '
                     f'task.task_vocabulary (now {vocab}).')


def task_index(task_vocabulary) -> Dict[str, int]:
  """{task name: routing id}, ids 1..len(vocabulary) (0 is padding)."""
  return {name: i + 1 for i, name in enumerate(task_vocabulary)}


@dataclasses.dataclass
class DataConfig(cfg.DataConfig):
  """Input pipeline of readout `tf.train.Example` records (see `dataloader`).

  Attributes:
    input_dim: feature width of every input token.
    batching: 'padded': queries padded per batch ([batch, n_out], padding id
      0, weight 0); 'varlen': queries of the batch chained ([N]) with an
      `output_batch_index`. Input tokens are padded in both.
    pad_multiple: padded token and query counts are rounded up to a multiple
      of this (8 keeps shapes few and vector-friendly).
    max_input_tokens: if set, input tokens are padded to exactly this many
      (static shapes, e.g. TPU); a longer record is an error naming it.
    max_queries: the same for queries (padded batching only).
    shuffle_buffer_size: records shuffled in training.
    num_examples: number of records, informational; -1 unknown.
    skip_bad_records: False (default): a truncated/corrupted file or an
      invalid record is an error naming the file and record. True: the
      damaged records of a file, or the invalid record, are skipped,
      logged and counted (`bad_records_skipped` in the task's logs).
  """
  input_dim: int = 32
  batching: str = 'padded'
  pad_multiple: int = 8
  max_input_tokens: Optional[int] = None
  max_queries: Optional[int] = None
  shuffle_buffer_size: int = 1000
  num_examples: int = -1
  skip_bad_records: bool = False


@dataclasses.dataclass
class Encoder(hyperparams.Config):
  """The shared token encoder (`modeling.layers.TokenEncoder`).

  Attributes:
    hidden_size: token width inside the encoder and decoder.
    num_heads: attention heads.
    num_layers: self-attention blocks (over the tokens, or over the latents).
    num_latents: 0: a Transformer over the input tokens; > 0: Perceiver-style,
      this many learned latents cross-attend to the tokens first.
    intermediate_size: width of the feed-forward layers.
    dropout_rate: dropout in attention and feed-forward outputs.
    min_time_period: shortest period (seconds) of the sinusoidal time
      embedding.
    max_time_period: longest period (seconds).
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
  """Query decoder: task + time embedding, cross-attention to the encoder.

  Attributes:
    num_layers: cross-attention (+ feed-forward) blocks; queries do not attend
      to each other, so padded and chained queries decode identically.
  """
  num_layers: int = 1


@dataclasses.dataclass
class ReadoutModel(hyperparams.Config):
  """Attributes:
    encoder: the shared encoder.
    decoder: the query decoder.
    static_shapes: route with masks instead of gathering rows (every head
      runs on every query; the loss masks the rest). Needed under XLA/TPU;
      same losses and metrics.
  """
  encoder: Encoder = dataclasses.field(default_factory=Encoder)
  decoder: Decoder = dataclasses.field(default_factory=Decoder)
  static_shapes: bool = False


@dataclasses.dataclass
class Evaluation(hyperparams.Config):
  """Attributes:
    print_table: print the per-task metric table (stdout) after each
      evaluation.
  """
  print_table: bool = True


@dataclasses.dataclass
class DemoDataConfig(hyperparams.Config):
  """Generated data (`demo_data`), used when a split's `input_path` is empty.

  Attributes:
    enabled: generate data when `input_path` is empty.
    cache_dir: where generated shards are kept; '' uses $OFFICIAL_EXT_CACHE
      or ~/.cache/official_ext.
    seed: random seed of the generator.
    num_train_trials: records in the train split.
    num_validation_trials: records in the validation split.
    num_shards: files per split.
    noise_std: std of the per-unit noise of the input tokens (independent
      per 100 ms bin).
    trial_noise_std: std of the per-trial error with which the units encode
      the task variables (stimulus, choice, reward); it bounds how well the
      classification readouts can be decoded.
  """
  enabled: bool = False
  cache_dir: str = ''
  seed: int = 0
  num_train_trials: int = 4096
  num_validation_trials: int = 512
  num_shards: int = 2
  noise_std: float = 0.5
  trial_noise_std: float = 0.7


@dataclasses.dataclass
class ReadoutTaskConfig(cfg.TaskConfig):
  """The multitask readout task.

  Attributes:
    readouts: one ReadoutSpec per task with a head.
    task_vocabulary: task names; routing id = 1 + position (0: padding).
    gradient_clip_norm: clip the global gradient norm (<= 0: off).
    evaluation: evaluation options.
    demo_data: generated data used when an `input_path` is empty.
  """
  model: ReadoutModel = dataclasses.field(default_factory=ReadoutModel)
  train_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(is_training=True))
  validation_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(is_training=False))
  readouts: Tuple[ReadoutSpec, ...] = ()
  task_vocabulary: Tuple[str, ...] = ()
  gradient_clip_norm: float = 1.0
  evaluation: Evaluation = dataclasses.field(default_factory=Evaluation)
  demo_data: DemoDataConfig = dataclasses.field(default_factory=DemoDataConfig)


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
      runtime=cfg.RuntimeConfig(mixed_precision_dtype='float32'),
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
