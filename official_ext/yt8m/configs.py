"""Configs and registered experiments of the YouTube-8M family.

Field names follow Model Garden's `official.projects.yt8m.configs.yt8m`, so
its YAML files load here. The experiments: docs/yt8m.md.
"""
import dataclasses
from typing import Optional, Tuple

from official.core import config_definitions as cfg
from official.core import exp_factory
from official.modeling import hyperparams
from official.modeling import optimization
from official.vision.configs import common
from official_ext.core.kernels import kernel_policy

YT8M_TRAIN_EXAMPLES = 3888919
YT8M_VAL_EXAMPLES = 1112356
YT8M_NUM_CLASSES = 3862
# Public data locations (copy the files and point `input_path` at them).
YT8M_PUBLIC_TRAIN_PATH = 'gs://youtube8m-ml/2/frame/train/train*.tfrecord'
YT8M_PUBLIC_VAL_PATH = 'gs://youtube8m-ml/3/frame/validate/validate*.tfrecord'
YT8M_PUBLIC_VIDEO_TRAIN_PATH = 'gs://youtube8m-ml/2/video/train/train*.tfrecord'
YT8M_PUBLIC_VIDEO_VAL_PATH = (
    'gs://youtube8m-ml/2/video/validate/validate*.tfrecord')

RECORD_TYPES = ('frame', 'video')

POOLING_METHODS = ('average', 'max', 'swap', 'none')


@dataclasses.dataclass
class DataConfig(cfg.DataConfig):
  """Input pipeline of YouTube-8M records (docs/yt8m.md#data).

  Attributes:
    record_type: 'frame' (`tf.SequenceExample`s) or 'video' (`tf.Example`s
      of mean features; needs the 'identity' backbone).
    feature_names: features read, in the order they are concatenated.
    feature_dtypes: stored dtype of each feature, 'uint8' or 'float32'.
    feature_from_bytes: whether each feature is stored as a bytes string.
    max_frames: frames kept per video (longer cut, shorter zero-padded).
    num_sample_frames: frames sampled per video; None: no sampling.
    sample_random_frames: sample random frames (else a random window).
    segment_labels: one example per rated segment, with `label_weights`.
    num_examples: examples, to size evaluation; -1: unknown.
    skip_bad_records: skip and count damaged records (else an error).
    reverse_whitening_feature: '' or the feature whose PCA whitening is
      undone, with the .npy eigenvalues of `pca_eigenvalues_path`.
  """
  name: Optional[str] = 'yt8m'
  split: Optional[str] = 'train'
  record_type: str = 'frame'
  feature_names: Tuple[str, ...] = ('rgb', 'audio')
  feature_sizes: Tuple[int, ...] = (1024, 128)
  feature_dtypes: Tuple[str, ...] = ('uint8', 'uint8')
  feature_from_bytes: Tuple[bool, ...] = (True, True)
  label_field: str = 'labels'
  max_frames: int = 300
  num_sample_frames: Optional[int] = None
  sample_random_frames: bool = True
  input_per_feature_l2_norm: bool = False
  segment_labels: bool = False
  segment_size: int = 5
  num_classes: int = YT8M_NUM_CLASSES
  include_video_id: bool = False
  num_examples: int = -1
  skip_bad_records: bool = False
  reverse_whitening_feature: str = ''
  pca_eigenvalues_path: str = ''
  shuffle_buffer_size: int = 1000
  prefetch_buffer_size: Optional[int] = None  # AUTOTUNE.


def yt8m_data(is_training: bool) -> DataConfig:
  return DataConfig(
      is_training=is_training,
      split='train' if is_training else 'valid',
      drop_remainder=is_training,
      num_sample_frames=300 if is_training else None,
      num_examples=YT8M_TRAIN_EXAMPLES if is_training else YT8M_VAL_EXAMPLES)


@dataclasses.dataclass
class DbofModel(hyperparams.Config):
  """Deep Bag of Frames backbone.

  Attributes:
    cluster_size: width of the per-frame cluster layer (0 skips it).
    add_batch_norm: batch norm on input, cluster and hidden layers (else
      biases).
    pooling_method: one of `POOLING_METHODS`; 'none' runs the head per frame.
    context_gate_cluster_bottleneck_size: the cluster gate's bottleneck (0:
      none).
    input_bn_affine: learn scale and offset in the input batch norm.
  """
  cluster_size: int = 3000
  hidden_size: int = 2000
  add_batch_norm: bool = True
  pooling_method: str = 'average'
  use_context_gate_cluster_layer: bool = False
  context_gate_cluster_bottleneck_size: int = 0
  input_bn_affine: bool = False


@dataclasses.dataclass
class IdentityBackbone(hyperparams.Config):
  """No backbone: the head reads video-level features.

  Attributes:
    l2_normalize: L2-normalize each video's concatenated features first.
  """
  l2_normalize: bool = False


@dataclasses.dataclass
class NextVladModel(hyperparams.Config):
  """NeXtVLAD backbone; the defaults are the authors'.

  Attributes:
    feature_sizes: width of each stream; must equal the data's.
    cluster_sizes: K of each stream's module.
    groups: G of each stream's module.
    expansion: λ, width multiplier of each module's first layer.
    gating_reduction: r of the SE context gating.
    regularize_backbone: apply `losses.l2_weight_decay` to the backbone too.
  """
  feature_sizes: Tuple[int, ...] = (1024, 128)
  cluster_sizes: Tuple[int, ...] = (128, 64)
  groups: Tuple[int, ...] = (8, 4)
  expansion: int = 2
  hidden_size: int = 2048
  gating_reduction: int = 8
  dropout_rate: float = 0.5
  regularize_backbone: bool = False


@dataclasses.dataclass
class FrameAverageModel(hyperparams.Config):
  """The mean of the valid frames; no variables."""


@dataclasses.dataclass
class LstmModel(hyperparams.Config):
  """Stacked LSTMs, the starter code's `LstmModel`.

  Attributes:
    cells: units per LSTM layer.
    layers: stacked layers.
  """
  cells: int = 1024
  layers: int = 2


@dataclasses.dataclass
class LearnablePoolingModel(hyperparams.Config):
  """A WILLOW learnable-pooling backbone; the pooling is the backbone type.

  Attributes:
    feature_sizes: width of each stream; must equal the data's.
    cluster_sizes: K of each stream's module.
    hidden_relu: batch norm and relu6 on the hidden layer (else a bias).
    regularize_backbone: apply `losses.l2_weight_decay` to the backbone too.
  """
  feature_sizes: Tuple[int, ...] = (1024, 128)
  cluster_sizes: Tuple[int, ...] = (256, 128)
  hidden_size: int = 1024
  hidden_relu: bool = False
  context_gating: bool = True
  regularize_backbone: bool = False


@dataclasses.dataclass
class MixNextVladModel(hyperparams.Config):
  """The mixture of NeXtVLADs with online distillation (the logistic head);
  the defaults are the authors'. Other fields: `NextVladModel`'s.

  Attributes:
    distillation_weight: λ of the distillation term; 0: none.
    distillation_temperature: T of its softmaxes (> 0).
  """
  num_branches: int = 3
  feature_sizes: Tuple[int, ...] = (1024, 128)
  cluster_sizes: Tuple[int, ...] = (112, 56)
  groups: Tuple[int, ...] = (8, 4)
  expansion: int = 2
  hidden_size: int = 2048
  gating_reduction: int = 16
  dropout_rate: float = 0.5
  regularize_backbone: bool = False
  distillation_weight: float = 9.0
  distillation_temperature: float = 3.0


@dataclasses.dataclass
class Backbone(hyperparams.OneOfConfig):
  """One field per registered backbone type (`modeling/factory.py`)."""
  type: Optional[str] = 'dbof'
  dbof: DbofModel = dataclasses.field(default_factory=DbofModel)
  identity: IdentityBackbone = dataclasses.field(
      default_factory=IdentityBackbone)
  nextvlad: NextVladModel = dataclasses.field(default_factory=NextVladModel)
  mix_nextvlad: MixNextVladModel = dataclasses.field(
      default_factory=MixNextVladModel)
  frame_average: FrameAverageModel = dataclasses.field(
      default_factory=FrameAverageModel)
  lstm: LstmModel = dataclasses.field(default_factory=LstmModel)
  netvlad: LearnablePoolingModel = dataclasses.field(
      default_factory=LearnablePoolingModel)
  netrvlad: LearnablePoolingModel = dataclasses.field(
      default_factory=LearnablePoolingModel)
  soft_dbof: LearnablePoolingModel = dataclasses.field(
      default_factory=lambda: LearnablePoolingModel(  # pylint: disable=g-long-lambda
          cluster_sizes=(8000, 1000), context_gating=False))
  netfv: LearnablePoolingModel = dataclasses.field(
      default_factory=lambda: LearnablePoolingModel(cluster_sizes=(128, 64)))


@dataclasses.dataclass
class MoeModel(hyperparams.Config):
  """Mixture-of-experts head.

  Attributes:
    num_mixtures: experts per class (plus a dummy expert predicting 0).
    vocab_as_last_dim: lay activations out as [batch, mixtures, classes].
  """
  num_mixtures: int = 5
  use_input_context_gate: bool = False
  use_output_context_gate: bool = False
  vocab_as_last_dim: bool = False


@dataclasses.dataclass
class LogisticModel(hyperparams.Config):
  """Logistic head: one dense layer + sigmoid; `kernel_initializer` is a
  tf_keras initializer name.
  """
  return_logits: bool = False
  kernel_initializer: str = 'glorot_uniform'


@dataclasses.dataclass
class Head(hyperparams.OneOfConfig):
  type: Optional[str] = 'moe'
  moe: MoeModel = dataclasses.field(default_factory=MoeModel)
  logistic: LogisticModel = dataclasses.field(default_factory=LogisticModel)


@dataclasses.dataclass
class VideoClassificationModel(hyperparams.Config):
  backbone: Backbone = dataclasses.field(default_factory=Backbone)
  head: Head = dataclasses.field(default_factory=Head)
  norm_activation: common.NormActivation = dataclasses.field(
      default_factory=lambda: common.NormActivation(  # pylint: disable=g-long-lambda
          activation='relu', use_sync_bn=False))


@dataclasses.dataclass
class Losses(hyperparams.Config):
  """Sigmoid cross-entropy on the class probabilities.

  Attributes:
    name: only 'binary_crossentropy'.
    l2_weight_decay: L2 weight decay on the kernels (added to the loss).
    class_reduction: 'mean' or 'sum' of each example's per-class losses.
  """
  name: str = 'binary_crossentropy'
  from_logits: bool = False
  label_smoothing: float = 0.0
  l2_weight_decay: float = 1e-5
  class_reduction: str = 'mean'


@dataclasses.dataclass
class AveragePrecisionConfig(hyperparams.Config):
  """AP metrics: GAP/mAP over each video's `top_k` predictions; `top_n` adds
  AP@n (None or 0: off).
  """
  top_k: int = 20
  top_n: Optional[int] = None
  return_per_class_ap: bool = False


@dataclasses.dataclass
class Evaluation(hyperparams.Config):
  """Evaluation metrics and log.

  Attributes:
    average_precision: the AP metrics (None: losses only).
    num_best_worst_classes: best and worst per-class APs logged; 0: none.
    vocabulary_path: the dataset's vocabulary.csv, to name those classes.
    video_and_segment_level: report both levels in one evaluation.
  """
  average_precision: Optional[AveragePrecisionConfig] = None
  num_best_worst_classes: int = 5
  vocabulary_path: str = ''
  video_and_segment_level: bool = False


@dataclasses.dataclass
class DemoDataConfig(hyperparams.Config):
  """Generated data in the real record format, used when `enabled` and a
  split's `input_path` is empty; cached under `cache_dir` ('':
  $OFFICIAL_EXT_CACHE or ~/.cache/official_ext). `segment_fraction`: the
  share of videos with segment ratings.
  """
  enabled: bool = False
  cache_dir: str = ''
  seed: int = 0
  num_train_videos: int = 4000
  num_validation_videos: int = 1000
  num_shards: int = 4
  segment_fraction: float = 0.3


@dataclasses.dataclass
class YT8MTask(cfg.TaskConfig):
  """The YouTube-8M task.

  Attributes:
    init_checkpoint_modules: what `init_checkpoint` restores: 'all' or
      'backbone'.
    gradient_clip_norm: clip gradients by this global norm (<= 0: off).
    gradient_clip_per_variable: clip each variable's gradient on its own.
    jit_compile: XLA-compile each training step's forward and backward pass
      (not with synchronized batch norm).
  """
  model: VideoClassificationModel = dataclasses.field(
      default_factory=VideoClassificationModel)
  train_data: DataConfig = dataclasses.field(
      default_factory=lambda: yt8m_data(is_training=True))
  validation_data: DataConfig = dataclasses.field(
      default_factory=lambda: yt8m_data(is_training=False))
  losses: Losses = dataclasses.field(default_factory=Losses)
  evaluation: Evaluation = dataclasses.field(
      default_factory=lambda: Evaluation(  # pylint: disable=g-long-lambda
          average_precision=AveragePrecisionConfig()))
  init_checkpoint_modules: str = 'all'
  gradient_clip_norm: float = 1.0
  gradient_clip_per_variable: bool = False
  demo_data: DemoDataConfig = dataclasses.field(default_factory=DemoDataConfig)
  jit_compile: bool = True


_RESTRICTIONS = [
    'task.train_data.num_classes == task.validation_data.num_classes',
    'task.train_data.feature_sizes != None',
    'task.train_data.feature_names != None',
    'task.validation_data.feature_sizes != None',
]


def _optimizer(learning_rate: float, decay_steps: int, warmup_steps: int,
               decay_rate: float = 0.95, staircase: Optional[bool] = None
               ) -> optimization.OptimizationConfig:
  """Adam, exponential decay (after a linear warmup if warmup_steps > 0)."""
  config = {
      'optimizer': {'type': 'adam', 'adam': {}},
      'learning_rate': {
          'type': 'exponential',
          'exponential': {
              'initial_learning_rate': learning_rate,
              'decay_rate': decay_rate,
              'decay_steps': decay_steps,
              'offset': warmup_steps,
              'staircase': staircase,
          },
      },
  }
  if warmup_steps > 0:
    config['warmup'] = {
        'type': 'linear',
        'linear': {'warmup_learning_rate': 0, 'warmup_steps': warmup_steps}}
  return optimization.OptimizationConfig(config)


def _experiment(task, steps_per_loop: int, train_steps: int,
                validation_steps: int, validation_interval: int,
                optimizer_config: optimization.OptimizationConfig,
                mixed_precision_dtype: str = 'float32'
                ) -> cfg.ExperimentConfig:
  """An experiment of this family: summaries and checkpoints every loop."""
  return cfg.ExperimentConfig(
      runtime=kernel_policy.RuntimeConfig(
          mixed_precision_dtype=mixed_precision_dtype),
      task=task,
      trainer=cfg.TrainerConfig(
          steps_per_loop=steps_per_loop,
          summary_interval=steps_per_loop,
          checkpoint_interval=steps_per_loop,
          train_steps=train_steps,
          validation_steps=validation_steps,
          validation_interval=validation_interval,
          optimizer_config=optimizer_config),
      restrictions=list(_RESTRICTIONS))


@exp_factory.register_config_factory('yt8m')
def yt8m() -> cfg.ExperimentConfig:
  """Model Garden's published YouTube-8M configuration (needs input_path)."""
  train_batch_size = 1024  # 32 per core on a 32-core TPU v3 pod slice.
  eval_batch_size = 1024
  steps_per_epoch = YT8M_TRAIN_EXAMPLES // train_batch_size
  steps_per_loop = 500
  config = _experiment(
      YT8MTask(), steps_per_loop=steps_per_loop,
      train_steps=100 * steps_per_epoch,
      validation_steps=YT8M_VAL_EXAMPLES // eval_batch_size,
      validation_interval=steps_per_loop,
      optimizer_config=_optimizer(
          learning_rate=0.0001 * train_batch_size / 512,
          decay_steps=int(steps_per_epoch * 1.5),
          warmup_steps=500),
      mixed_precision_dtype='bfloat16')
  config.task.train_data.global_batch_size = train_batch_size
  config.task.validation_data.global_batch_size = eval_batch_size
  return config


DEMO_NUM_CLASSES = 100
DEMO_MAX_FRAMES = 64


@exp_factory.register_config_factory('yt8m_demo')
def yt8m_demo() -> cfg.ExperimentConfig:
  """A small DBoF+MoE on generated YouTube-8M-format data (no download)."""
  num_train = 4000
  num_val = 1000
  train_batch_size = 64
  eval_batch_size = 100
  steps_per_epoch = num_train // train_batch_size
  train_steps = 16 * steps_per_epoch
  task = YT8MTask(
      model=VideoClassificationModel(
          backbone=Backbone(type='dbof', dbof=DbofModel(
              cluster_size=256, hidden_size=256, pooling_method='average')),
          head=Head(type='moe', moe=MoeModel(num_mixtures=2))),
      train_data=DataConfig(
          is_training=True, split='train', drop_remainder=True,
          global_batch_size=train_batch_size,
          num_classes=DEMO_NUM_CLASSES, max_frames=DEMO_MAX_FRAMES,
          num_sample_frames=32, num_examples=num_train),
      validation_data=DataConfig(
          is_training=False, split='valid', drop_remainder=False,
          global_batch_size=eval_batch_size,
          num_classes=DEMO_NUM_CLASSES, max_frames=DEMO_MAX_FRAMES,
          num_sample_frames=None, num_examples=num_val),
      demo_data=DemoDataConfig(
          enabled=True, num_train_videos=num_train,
          num_validation_videos=num_val))
  return _experiment(
      task, steps_per_loop=steps_per_epoch, train_steps=train_steps,
      validation_steps=-1, validation_interval=4 * steps_per_epoch,
      optimizer_config=_optimizer(
          learning_rate=0.002, decay_steps=steps_per_epoch,
          warmup_steps=steps_per_epoch // 2))


# Video-level records (`record_type='video'`).
# The starter code's names and widths of the video-level features.
VIDEO_LEVEL_FEATURES = dict(
    record_type='video', feature_names=('mean_rgb', 'mean_audio'),
    feature_sizes=(1024, 128), feature_dtypes=('float32', 'float32'),
    feature_from_bytes=(False, False), num_sample_frames=None)


def video_level_model(head: str, num_mixtures: int = 2
                      ) -> VideoClassificationModel:
  """The starter code's video-level `head` on the normalized mean features."""
  return VideoClassificationModel(
      backbone=Backbone(type='identity',
                        identity=IdentityBackbone(l2_normalize=True)),
      head=Head(type=head, moe=MoeModel(num_mixtures=num_mixtures)))


@exp_factory.register_config_factory('yt8m_video_level')
def yt8m_video_level() -> cfg.ExperimentConfig:
  """The starter code's video-level LogisticModel (needs input_path)."""
  train_batch_size = 1024
  eval_batch_size = 1024
  steps_per_epoch = YT8M_TRAIN_EXAMPLES // train_batch_size
  steps_per_loop = 500
  task = YT8MTask(
      model=video_level_model('logistic'),
      train_data=DataConfig(
          is_training=True, split='train', drop_remainder=True,
          global_batch_size=train_batch_size,
          num_examples=YT8M_TRAIN_EXAMPLES, **VIDEO_LEVEL_FEATURES),
      validation_data=DataConfig(
          is_training=False, split='valid', drop_remainder=False,
          global_batch_size=eval_batch_size, num_examples=YT8M_VAL_EXAMPLES,
          **VIDEO_LEVEL_FEATURES),
      losses=Losses(l2_weight_decay=1e-8))
  return _experiment(
      task, steps_per_loop=steps_per_loop, train_steps=5 * steps_per_epoch,
      validation_steps=-1, validation_interval=steps_per_epoch,
      # The starter's: x 0.95 every 4M examples (staircase), no warmup.
      optimizer_config=_optimizer(
          learning_rate=0.01, decay_steps=4_000_000 // train_batch_size,
          warmup_steps=0, staircase=True))


@exp_factory.register_config_factory('yt8m_video_level_demo')
def yt8m_video_level_demo() -> cfg.ExperimentConfig:
  """`yt8m_video_level` on the demo videos' mean features (no download)."""
  num_train = 4000
  num_val = 1000
  train_batch_size = 64
  eval_batch_size = 100
  steps_per_epoch = num_train // train_batch_size
  epochs = 16
  data = dict(num_classes=DEMO_NUM_CLASSES, max_frames=DEMO_MAX_FRAMES,
              **VIDEO_LEVEL_FEATURES)
  task = YT8MTask(
      model=video_level_model('logistic'),
      train_data=DataConfig(
          is_training=True, split='train', drop_remainder=True,
          global_batch_size=train_batch_size, num_examples=num_train, **data),
      validation_data=DataConfig(
          is_training=False, split='valid', drop_remainder=False,
          global_batch_size=eval_batch_size, num_examples=num_val, **data),
      losses=Losses(l2_weight_decay=1e-8),
      demo_data=DemoDataConfig(
          enabled=True, num_train_videos=num_train,
          num_validation_videos=num_val))
  return _experiment(
      task, steps_per_loop=steps_per_epoch,
      train_steps=epochs * steps_per_epoch,
      validation_steps=-1, validation_interval=4 * steps_per_epoch,
      optimizer_config=_optimizer(
          learning_rate=0.01, decay_steps=steps_per_epoch,
          warmup_steps=0, staircase=True))


# NeXtVLAD (Lin, Xiao and Fan, 2018) as its authors trained it: the flags of
# `scripts/train_nextvlad_local.sh` in github.com/linrongc/youtube-8m.
NEXTVLAD_BATCH_SIZE = 160  # 80 per GPU on 2 GPUs.
NEXTVLAD_EPOCHS = 5
NEXTVLAD_DECAY_EXAMPLES = 2_000_000  # lr x 0.8 every 2M examples.


@exp_factory.register_config_factory('yt8m_nextvlad')
def yt8m_nextvlad() -> cfg.ExperimentConfig:
  """NeXtVLAD + logistic as its authors trained it (needs input_path and the
  rgb PCA eigenvalues)."""
  batch = NEXTVLAD_BATCH_SIZE
  steps_per_epoch = YT8M_TRAIN_EXAMPLES // batch
  steps_per_loop = 500
  task = YT8MTask(
      model=VideoClassificationModel(
          backbone=Backbone(type='nextvlad', nextvlad=NextVladModel()),
          head=Head(type='logistic', logistic=LogisticModel())))
  task.train_data.num_sample_frames = None
  task.train_data.global_batch_size = batch
  task.validation_data.global_batch_size = batch
  config = _experiment(
      task, steps_per_loop=steps_per_loop,
      train_steps=NEXTVLAD_EPOCHS * steps_per_epoch,
      validation_steps=YT8M_VAL_EXAMPLES // batch,
      validation_interval=10 * steps_per_loop,
      optimizer_config=_optimizer(
          learning_rate=0.0002,
          decay_steps=NEXTVLAD_DECAY_EXAMPLES // batch,
          warmup_steps=0, decay_rate=0.8, staircase=True))
  nextvlad_recipe(config)
  return config


def nextvlad_recipe(config: cfg.ExperimentConfig,
                    reverse_whitening: bool = True) -> None:
  """Sets the NeXtVLAD authors' training recipe on `config` (docs/yt8m.md)."""
  task = config.task
  task.losses.class_reduction = 'sum'
  task.losses.l2_weight_decay = 1e-5
  task.gradient_clip_norm = 1.0
  task.gradient_clip_per_variable = True
  task.model.norm_activation.norm_momentum = 0.999
  task.model.norm_activation.norm_epsilon = 1e-3
  task.model.head.logistic.kernel_initializer = 'he_normal'
  config.trainer.optimizer_config.optimizer.adam.epsilon = 1e-8
  if reverse_whitening:
    for data in (task.train_data, task.validation_data):
      data.reverse_whitening_feature = 'rgb'


@exp_factory.register_config_factory('yt8m_nextvlad_demo')
def yt8m_nextvlad_demo() -> cfg.ExperimentConfig:
  """A small NeXtVLAD on `yt8m_demo`'s data, 7 epochs of 16 sampled frames."""
  config = yt8m_demo()
  config.task.model = VideoClassificationModel(
      backbone=Backbone(type='nextvlad', nextvlad=NextVladModel(
          cluster_sizes=(16, 8), groups=(8, 4), expansion=1, hidden_size=256,
          gating_reduction=8, dropout_rate=0.25)),
      head=Head(type='logistic', logistic=LogisticModel()))
  data = config.task.train_data
  data.num_sample_frames = 16
  steps_per_epoch = data.num_examples // data.global_batch_size
  config.trainer.train_steps = 7 * steps_per_epoch
  config.trainer.validation_interval = config.trainer.train_steps
  return config


# The mixture of NeXtVLAD models (the 2nd challenge's winner) as its authors
# trained it: `scripts/train_mix_nextvlad_final_submission.sh`.
MIX_NEXTVLAD_EPOCHS = 15
MIX_NEXTVLAD_DECAY_EXAMPLES = 2_500_000  # lr x 0.8 every 2.5M examples.


@exp_factory.register_config_factory('yt8m_mix_nextvlad')
def yt8m_mix_nextvlad() -> cfg.ExperimentConfig:
  """The NeXtVLAD mixture with distillation as its authors trained it (needs
  input_path and the rgb PCA eigenvalues)."""
  config = yt8m_nextvlad()
  config.task.model = VideoClassificationModel(
      backbone=Backbone(type='mix_nextvlad',
                        mix_nextvlad=MixNextVladModel()),
      head=Head(type='logistic', logistic=LogisticModel()))
  batch = NEXTVLAD_BATCH_SIZE
  steps_per_epoch = YT8M_TRAIN_EXAMPLES // batch
  config.trainer.train_steps = MIX_NEXTVLAD_EPOCHS * steps_per_epoch
  config.trainer.optimizer_config.learning_rate.exponential.decay_steps = (
      MIX_NEXTVLAD_DECAY_EXAMPLES // batch)
  nextvlad_recipe(config)
  return config


@exp_factory.register_config_factory('yt8m_mix_nextvlad_demo')
def yt8m_mix_nextvlad_demo() -> cfg.ExperimentConfig:
  """A mixture of 3 `yt8m_nextvlad_demo` NeXtVLADs, without whitening."""
  config = yt8m_nextvlad_demo()
  small = config.task.model.backbone.nextvlad
  config.task.model = VideoClassificationModel(
      backbone=Backbone(type='mix_nextvlad', mix_nextvlad=MixNextVladModel(
          num_branches=3, cluster_sizes=small.cluster_sizes,
          groups=small.groups, expansion=small.expansion,
          hidden_size=small.hidden_size,
          gating_reduction=small.gating_reduction,
          dropout_rate=small.dropout_rate)),
      head=Head(type='logistic', logistic=LogisticModel()))
  nextvlad_recipe(config, reverse_whitening=False)
  return config


# The model zoo: `yt8m_<model>` (published size) and `yt8m_<model>_demo`.
# The starter code's train.py defaults (github.com/google/youtube-8m).
STARTER_BATCH_SIZE = 1024
STARTER_EPOCHS = 5
STARTER_DECAY_EXAMPLES = 4_000_000  # lr x 0.95 every 4M examples.
# TF1's `tf.train.AdamOptimizer` epsilon (Model Garden's Adam: 1e-7) and
# slim's batch-norm decay (tf_keras: 0.99), used by both code bases.
TF1_ADAM_EPSILON = 1e-8
SLIM_BATCH_NORM_MOMENTUM = 0.999
# WILLOW's README commands (github.com/antoine77340/Youtube-8M-WILLOW).
WILLOW_BATCH_SIZE = 80
WILLOW_LEARNING_RATE = 0.0002
WILLOW_DECAY_EXAMPLES = 4_000_000  # train.py's learning_rate_decay_examples.
WILLOW_ITERATIONS = 300  # --iterations: frames sampled per video.


def _published(model: VideoClassificationModel, batch: int,
               l2_weight_decay: float, learning_rate: float,
               decay_rate: float, decay_examples: int, train_steps: int,
               num_sample_frames: Optional[int]) -> cfg.ExperimentConfig:
  """A published-size frame-level experiment with the starter's recipe."""
  steps_per_loop = 500
  model.norm_activation.norm_momentum = SLIM_BATCH_NORM_MOMENTUM
  task = YT8MTask(model=model, losses=Losses(l2_weight_decay=l2_weight_decay,
                                             class_reduction='sum'),
                  gradient_clip_norm=1.0, gradient_clip_per_variable=True)
  task.train_data.num_sample_frames = num_sample_frames
  task.train_data.global_batch_size = batch
  task.validation_data.global_batch_size = batch
  config = _experiment(
      task, steps_per_loop=steps_per_loop, train_steps=train_steps,
      validation_steps=YT8M_VAL_EXAMPLES // batch,
      validation_interval=10 * steps_per_loop,
      optimizer_config=_optimizer(
          learning_rate=learning_rate, decay_steps=decay_examples // batch,
          warmup_steps=0, decay_rate=decay_rate, staircase=True))
  config.trainer.optimizer_config.optimizer.adam.epsilon = TF1_ADAM_EPSILON
  return config


def _starter_published(
    model: VideoClassificationModel) -> cfg.ExperimentConfig:
  """`_published` with the starter's train.py defaults."""
  steps_per_epoch = YT8M_TRAIN_EXAMPLES // STARTER_BATCH_SIZE
  return _published(
      model, batch=STARTER_BATCH_SIZE, l2_weight_decay=1e-8,
      learning_rate=0.01, decay_rate=0.95,
      decay_examples=STARTER_DECAY_EXAMPLES,
      train_steps=STARTER_EPOCHS * steps_per_epoch, num_sample_frames=None)


def _zoo_demo(model: VideoClassificationModel,
              learning_rate: float = 0.002) -> cfg.ExperimentConfig:
  """`yt8m_demo` with `model` and Adam at `learning_rate`."""
  config = yt8m_demo()
  config.task.model = model
  config.trainer.optimizer_config.learning_rate.exponential.override(
      {'initial_learning_rate': learning_rate})
  return config


def frame_logistic_model() -> VideoClassificationModel:
  """The starter's `FrameLevelLogisticModel`: frame mean + logistic."""
  return VideoClassificationModel(
      backbone=Backbone(type='frame_average'),
      head=Head(type='logistic', logistic=LogisticModel()))


@exp_factory.register_config_factory('yt8m_frame_logistic')
def yt8m_frame_logistic() -> cfg.ExperimentConfig:
  """The starter's `FrameLevelLogisticModel` as its train.py trains it."""
  return _starter_published(frame_logistic_model())


@exp_factory.register_config_factory('yt8m_frame_logistic_demo')
def yt8m_frame_logistic_demo() -> cfg.ExperimentConfig:
  """`yt8m_frame_logistic` on the demo data, Adam at 0.01."""
  return _zoo_demo(frame_logistic_model(), learning_rate=0.01)


def lstm_model(cells: int = 1024, layers: int = 2, num_mixtures: int = 2
               ) -> VideoClassificationModel:
  """The starter's `LstmModel`: stacked LSTMs + its default MoE head."""
  return VideoClassificationModel(
      backbone=Backbone(type='lstm', lstm=LstmModel(cells=cells,
                                                    layers=layers)),
      head=Head(type='moe', moe=MoeModel(num_mixtures=num_mixtures)))


@exp_factory.register_config_factory('yt8m_lstm')
def yt8m_lstm() -> cfg.ExperimentConfig:
  """The starter's `LstmModel` as its train.py trains it."""
  return _starter_published(lstm_model())


@exp_factory.register_config_factory('yt8m_lstm_demo')
def yt8m_lstm_demo() -> cfg.ExperimentConfig:
  """A small `yt8m_lstm` (one layer of 128 cells) on the demo, Adam at 0.01."""
  return _zoo_demo(lstm_model(cells=128, layers=1), learning_rate=0.01)


def willow_model(method: str, cluster_sizes: Tuple[int, int],
                 hidden_size: int = 1024, context_gating: bool = True,
                 prob_gating: bool = True) -> VideoClassificationModel:
  """A WILLOW model: `method` pooling + MoE (`prob_gating`: the output gate)."""
  pooling = LearnablePoolingModel(
      cluster_sizes=cluster_sizes, hidden_size=hidden_size,
      context_gating=context_gating)
  return VideoClassificationModel(
      backbone=Backbone(type=method, **{method: pooling}),
      head=Head(type='moe', moe=MoeModel(
          num_mixtures=2, use_output_context_gate=prob_gating)))


def _willow(model: VideoClassificationModel, moe_l2: float,
            decay_rate: float, max_steps: int) -> cfg.ExperimentConfig:
  """WILLOW's training (its README commands and train.py defaults)."""
  return _published(
      model, batch=WILLOW_BATCH_SIZE, l2_weight_decay=moe_l2,
      learning_rate=WILLOW_LEARNING_RATE, decay_rate=decay_rate,
      decay_examples=WILLOW_DECAY_EXAMPLES, train_steps=max_steps,
      num_sample_frames=WILLOW_ITERATIONS)


@exp_factory.register_config_factory('yt8m_netvlad')
def yt8m_netvlad() -> cfg.ExperimentConfig:
  """WILLOW's gated NetVLAD (its best single model)."""
  return _willow(willow_model('netvlad', (256, 128)), moe_l2=1e-6,
                 decay_rate=0.8, max_steps=700_000)


@exp_factory.register_config_factory('yt8m_netrvlad')
def yt8m_netrvlad() -> cfg.ExperimentConfig:
  """WILLOW's gated NetRVLAD (VLAD without centers)."""
  return _willow(willow_model('netrvlad', (256, 128)), moe_l2=1e-6,
                 decay_rate=0.8, max_steps=600_000)


@exp_factory.register_config_factory('yt8m_soft_dbof')
def yt8m_soft_dbof() -> cfg.ExperimentConfig:
  """WILLOW's Soft-DBoF."""
  return _willow(willow_model('soft_dbof', (8000, 1000), context_gating=False,
                              prob_gating=False),
                 moe_l2=1e-8, decay_rate=0.9, max_steps=800_000)


@exp_factory.register_config_factory('yt8m_netfv')
def yt8m_netfv() -> cfg.ExperimentConfig:
  """WILLOW's gated NetFV."""
  return _willow(willow_model('netfv', (128, 64)), moe_l2=1e-6,
                 decay_rate=0.8, max_steps=600_000)


@exp_factory.register_config_factory('yt8m_netvlad_demo')
def yt8m_netvlad_demo() -> cfg.ExperimentConfig:
  """A small `yt8m_netvlad` (16 / 8 clusters, hidden 256) on the demo."""
  return _zoo_demo(willow_model('netvlad', (16, 8), hidden_size=256))


@exp_factory.register_config_factory('yt8m_netrvlad_demo')
def yt8m_netrvlad_demo() -> cfg.ExperimentConfig:
  """A small `yt8m_netrvlad` (16 / 8 clusters, hidden 256) on the demo."""
  return _zoo_demo(willow_model('netrvlad', (16, 8), hidden_size=256))


@exp_factory.register_config_factory('yt8m_soft_dbof_demo')
def yt8m_soft_dbof_demo() -> cfg.ExperimentConfig:
  """A small `yt8m_soft_dbof` (256 / 32 clusters, hidden 256) on the demo."""
  return _zoo_demo(willow_model('soft_dbof', (256, 32), hidden_size=256,
                                context_gating=False, prob_gating=False))


@exp_factory.register_config_factory('yt8m_netfv_demo')
def yt8m_netfv_demo() -> cfg.ExperimentConfig:
  """A small `yt8m_netfv` (8 / 4 clusters, hidden 256) on the demo."""
  return _zoo_demo(willow_model('netfv', (8, 4), hidden_size=256))
