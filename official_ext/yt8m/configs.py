"""Configuration of the YouTube-8M video classification family.

Field names follow Model Garden's `official.projects.yt8m.configs.yt8m` so that
YAML files written for Model Garden's YT8M project load here. Two experiments
are registered:

* `yt8m`: Model Garden's published configuration (DBoF cluster 3000, hidden
  2000, MoE with 5 mixtures, bfloat16, Adam with linear warmup and exponential
  decay). It needs `task.train_data.input_path` and
  `task.validation_data.input_path` pointing at YouTube-8M frame-level
  TFRecords.
* `yt8m_demo`: a small model on 100 classes that trains on generated data in
  the real record format (see `official_ext.yt8m.demo_data`); no download.

two NeXtVLAD experiments (`yt8m_nextvlad`, `yt8m_nextvlad_demo`), the
mixture of NeXtVLAD models with online distillation
(`yt8m_mix_nextvlad`, `yt8m_mix_nextvlad_demo`; the published ones follow
the authors' training recipe, `nextvlad_recipe`), and two on the
video-level records (`DataConfig.record_type='video'`: one
`tf.Example` per video holding `mean_rgb` and `mean_audio`), with the
starter code's video-level models (the logistic or MoE head on the
concatenated mean features; backbone type 'identity'):

* `yt8m_video_level`: the YouTube-8M starter code's defaults (logistic
  model, batch 1024, Adam at 0.01 decayed by 0.95 every 4,000,000 examples,
  5 epochs); needs both `input_path`s.
* `yt8m_video_level_demo`: the same model on the demo videos' mean features
  (generated, cached; no download).
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
# Public location of the frame-level data (not reachable from every machine;
# copy the files and point `input_path` at them).
YT8M_PUBLIC_TRAIN_PATH = 'gs://youtube8m-ml/2/frame/train/train*.tfrecord'
YT8M_PUBLIC_VAL_PATH = 'gs://youtube8m-ml/3/frame/validate/validate*.tfrecord'
# The video-level data (`record_type='video'`), as the starter code names it.
YT8M_PUBLIC_VIDEO_TRAIN_PATH = 'gs://youtube8m-ml/2/video/train/train*.tfrecord'
YT8M_PUBLIC_VIDEO_VAL_PATH = (
    'gs://youtube8m-ml/2/video/validate/validate*.tfrecord')

RECORD_TYPES = ('frame', 'video')

POOLING_METHODS = ('average', 'max', 'swap', 'none')


@dataclasses.dataclass
class DataConfig(cfg.DataConfig):
  """Input pipeline of YouTube-8M records.

  Attributes:
    name: dataset name, informational.
    split: 'train' or 'valid', informational.
    record_type: 'frame': frame-level `tf.SequenceExample`s (sequence
      features, one entry per frame); 'video': video-level `tf.Example`s, one
      float list per feature and video (the frames' mean: `mean_rgb`,
      `mean_audio`), which need `feature_dtypes` 'float32',
      `feature_from_bytes` False, `num_sample_frames` None and
      `segment_labels` False (the frame keys `max_frames`,
      `sample_random_frames` and `segment_size` are not used), and the
      'identity' backbone.
    feature_names: features read from each record, in the order they are
      concatenated along the feature axis: sequence features (frame level)
      or features (video level).
    feature_sizes: width of each feature per frame, or per video (1024 rgb,
      128 audio).
    feature_dtypes: dtype of each stored feature ('uint8' quantized or
      'float32').
    feature_from_bytes: True when a frame is stored as a bytes string
      (`tf.io.decode_raw`), False when stored as a float/int list.
    label_field: context feature holding the video-level label ids.
    max_frames: frames kept per video; longer videos are cut, shorter ones
      padded with zeros (the true count is returned as `num_frames`).
    num_sample_frames: number of frames sampled per video (random frames or
      a random window of the first `max_frames`, see `sample_random_frames`);
      the model then sees exactly this many valid frames. None: no sampling,
      videos padded to `max_frames`. In training a new sample every epoch. In
      evaluation (`validation_data`; off by default) as Model Garden's YT8M
      input does it, but deterministic: each video's sample is seeded by
      `seed` and its video id, so every evaluation of a checkpoint sees the
      same frames whatever the file order, sharding or batch size. Segment
      mode never samples.
    sample_random_frames: True samples frames uniformly at random (sorted in
      time); False samples a random window of consecutive frames.
    input_per_feature_l2_norm: L2-normalize each feature block of each frame
      after dequantization.
    segment_labels: read segment-level labels (`segment_labels`,
      `segment_start_times`, `segment_scores`); every rated segment becomes one
      example of `segment_size` frames whose `label_weights` mark the rated
      classes.
    segment_size: frames per segment.
    num_classes: number of classes; a label id >= num_classes is an error.
    include_video_id: also return the video id (`video_ids`, string) per
      example.
    num_examples: number of examples, used to size evaluation; -1 unknown.
    skip_bad_records: False (default) stops on a truncated/corrupted record
      with an error naming the file; True skips such records and counts them
      (logged, and the count is available from the reader).
    reverse_whitening_feature: '' (off) or the name of a feature in
      `feature_names` (the NeXtVLAD authors: 'rgb') whose released values
      are PCA-whitened: each frame's block becomes (x - b) * (sqrt(e) +
      1e-4), with e the PCA eigenvalues of `pca_eigenvalues_path` and b the
      dequantization's half-step bias (range / 512 = 4/512 for uint8
      features, 0 for float32 ones), which undoes the whitening as the
      NeXtVLAD authors' `train.py` does. Applied after dequantization and
      before `input_per_feature_l2_norm`.
    pca_eigenvalues_path: a .npy file of the PCA eigenvalues of that
      feature (shape [n] or [n, 1], n >= its width; the first width values
      are used), e.g. the `yt8m_pca/eigenvals.npy` of the NeXtVLAD authors'
      repository or the YouTube-8M feature extractor's PCA data; supplied by
      the user, never downloaded. Needed with `reverse_whitening_feature`.
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
    hidden_size: width of the video-level hidden layer.
    add_batch_norm: batch norm on input, cluster and hidden layers (else
      biases).
    pooling_method: 'average' | 'max' | 'swap' | 'none' over the valid frames.
      'none' keeps frames: the hidden layer and head run per frame and the
      model averages per-frame probabilities over the valid frames.
    use_context_gate_cluster_layer: context gating after the cluster layer.
    context_gate_cluster_bottleneck_size: bottleneck width of that gate (0:
      full input_size x input_size gate).
    input_bn_affine: learn scale/offset in the input batch norm (Model
      Garden does). Off by default: in front of the batch-normalized cluster
      layer they give the same set of functions (absorbed by the cluster
      kernel / cancelled by the cluster batch norm), though Adam and L2
      train another parametrization, and dropping them spares the training
      step the gradient w.r.t. the frame features.
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
  """No backbone: the head reads the video-level features [batch, features]
  (video-level records, `DataConfig.record_type='video'`).

  Attributes:
    l2_normalize: L2-normalize the concatenated features of each video
      before the head, as the starter's train.py and eval.py do for every
      model (the starter's experiments set it).
  """
  l2_normalize: bool = False


@dataclasses.dataclass
class NextVladModel(hyperparams.Config):
  """NeXtVLAD backbone (Lin, Xiao and Fan, 2018); see `modeling/nextvlad.py`.

  Defaults are the authors' configuration (github.com/linrongc/youtube-8m,
  `scripts/train_nextvlad_local.sh` and `nextvlad.py`): λ = 2, G = 8,
  K = 128, hidden 2048, SE gating reduction 8, dropout 0.5; the audio stream
  has its own module with half the clusters and groups (K = 64, G = 4).

  Attributes:
    feature_sizes: width of each stream, in input order; must equal
      `task.train_data.feature_sizes` (each stream is aggregated by its own
      NeXtVLAD module).
    cluster_sizes: K of each stream's module.
    groups: G of each stream's module.
    expansion: λ, width multiplier of each module's first layer.
    hidden_size: width of the hidden layer (the head's input).
    gating_reduction: r of the SE context gating.
    dropout_rate: dropout on the concatenated VLAD vectors in training.
    regularize_backbone: apply `task.losses.l2_weight_decay` to this
      backbone's kernels and cluster centers too. The authors regularize only
      the classifier (False).
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
  """The mean of the valid frames, no variables (`modeling/starter.py`):
  with the logistic head, the starter code's `FrameLevelLogisticModel`."""


@dataclasses.dataclass
class LstmModel(hyperparams.Config):
  """Stacked LSTMs (`modeling/starter.py`), the starter code's `LstmModel`.

  Attributes:
    cells: units per LSTM layer (the starter's `--lstm_cells`, 1024).
    layers: stacked layers (`--lstm_layers`, 2).
  """
  cells: int = 1024
  layers: int = 2


@dataclasses.dataclass
class LearnablePoolingModel(hyperparams.Config):
  """A WILLOW learnable-pooling backbone (`modeling/willow.py`): the pooling
  is the backbone's type ('netvlad', 'netrvlad', 'soft_dbof', 'netfv').

  Defaults: the authors' NetVLAD / NetRVLAD (github.com/antoine77340/
  Youtube-8M-WILLOW, README: `--netvlad_cluster_size=256
  --netvlad_hidden_size=1024 --netvlad_relu=False --gating=True`; audio has
  half the clusters); `Backbone` sets Soft-DBoF's and NetFV's.

  Attributes:
    feature_sizes: width of each stream, in input order; must equal
      `task.train_data.feature_sizes` (each stream is pooled by its own
      module).
    cluster_sizes: K of each stream's module.
    hidden_size: width of the hidden layer (the head's input).
    hidden_relu: hidden layer with batch norm and relu6 (the authors'
      `--*_relu=True`); False (theirs): a bias, no activation.
    context_gating: context gating after the hidden layer (`--gating`).
    regularize_backbone: apply `task.losses.l2_weight_decay` to this
      backbone's kernels, centers and covariances too. The authors
      regularize only the MoE classifier (False).
  """
  feature_sizes: Tuple[int, ...] = (1024, 128)
  cluster_sizes: Tuple[int, ...] = (256, 128)
  hidden_size: int = 1024
  hidden_relu: bool = False
  context_gating: bool = True
  regularize_backbone: bool = False


@dataclasses.dataclass
class MixNextVladModel(hyperparams.Config):
  """The mixture of NeXtVLAD models with online distillation (Lin, Xiao and
  Fan, 2018); see `modeling/mix_nextvlad.py`. Needs the 'logistic' head
  (one classifier per branch, mixed in logit space).

  Defaults are the authors' final submission (github.com/linrongc/
  youtube-8m, `scripts/train_mix_nextvlad_final_submission.sh`): 3
  branches, each a NeXtVLAD with λ = 2, G = 8, K = 112 (audio: K = 56,
  G = 4), hidden 2048, SE gating reduction 16, dropout 0.5; distillation
  weight 9 at temperature 3.

  Attributes:
    num_branches: NeXtVLAD branches of the mixture (`--mix_number`).
    feature_sizes: as `NextVladModel`'s, for every branch.
    cluster_sizes: as `NextVladModel`'s.
    groups: as `NextVladModel`'s.
    expansion: as `NextVladModel`'s.
    hidden_size: as `NextVladModel`'s.
    gating_reduction: as `NextVladModel`'s.
    dropout_rate: as `NextVladModel`'s.
    regularize_backbone: as `NextVladModel`'s (the authors: False).
    distillation_weight: λ of the distillation term (`--cl_lambda`); 0
      trains the branches without it.
    distillation_temperature: T of its softmaxes (`--cl_temperature`).
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
  """'dbof', 'nextvlad', 'mix_nextvlad', 'frame_average', 'lstm',
  'netvlad', 'netrvlad', 'soft_dbof' or 'netfv' (frame-level records), or
  'identity' (video-level records)."""
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
  # The authors' Soft-DBoW: 8000 clusters (audio 1/8), no gating.
  soft_dbof: LearnablePoolingModel = dataclasses.field(
      default_factory=lambda: LearnablePoolingModel(  # pylint: disable=g-long-lambda
          cluster_sizes=(8000, 1000), context_gating=False))
  # The authors' NetFV: 128 clusters (audio 64).
  netfv: LearnablePoolingModel = dataclasses.field(
      default_factory=lambda: LearnablePoolingModel(cluster_sizes=(128, 64)))


@dataclasses.dataclass
class MoeModel(hyperparams.Config):
  """Mixture-of-experts head.

  Attributes:
    num_mixtures: experts per class (a dummy expert predicting 0 is added).
    use_input_context_gate: context gate on the head's input features.
    use_output_context_gate: context gate on the output probabilities (applied,
      unlike Model Garden 2.20 which builds it and drops it).
    vocab_as_last_dim: lay the gate/expert activations out as
      [batch, mixtures, classes] (TPU-friendly) instead of
      [batch * classes, mixtures]; same math.
  """
  num_mixtures: int = 5
  use_input_context_gate: bool = False
  use_output_context_gate: bool = False
  vocab_as_last_dim: bool = False


@dataclasses.dataclass
class LogisticModel(hyperparams.Config):
  """Logistic (one dense layer + sigmoid) head.

  Attributes:
    return_logits: also return the logits ('logits' [batch, classes]).
    kernel_initializer: initializer of the classifier's kernel, a tf_keras
      initializer name: 'glorot_uniform' (tf_keras' default and the
      starter code's `slim.fully_connected` default, Xavier) or
      'he_normal' (truncated normal of variance 2 / fan_in: the NeXtVLAD
      authors' `slim.variance_scaling_initializer()`).
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
    from_logits: the model outputs logits rather than probabilities.
    label_smoothing: label smoothing of the binary cross-entropy.
    l2_weight_decay: L2 weight decay on the kernels (added to the loss).
    class_reduction: how each example's per-class cross-entropies are
      reduced: 'mean' over the classes (Model Garden's YT8M task) or 'sum'
      (the YouTube-8M starter code's, WILLOW's and the NeXtVLAD authors'
      `CrossEntropyLoss`: 3,862x larger on YouTube-8M, so the same
      `l2_weight_decay` weighs 3,862x less against it). Either way the
      loss is then the mean over the examples (with `label_weights`: 'mean'
      is the weighted mean over the rated entries, 'sum' the sum of the
      weighted entries over the examples with a rated class).
  """
  name: str = 'binary_crossentropy'
  from_logits: bool = False
  label_smoothing: float = 0.0
  l2_weight_decay: float = 1e-5
  class_reduction: str = 'mean'


@dataclasses.dataclass
class AveragePrecisionConfig(hyperparams.Config):
  """AP metrics: GAP/mAP over each video's top_k predictions.

  Attributes:
    top_k: predictions of each video pooled into GAP / mAP.
    top_n: also report AP@n, the starter's `top_n`: `map_at_{n}` and
      `gap_at_{n}` count only the first n ranks of each class's (of the
      pooled) list, over min(positives, n) (`yt8m.metrics`). None or 0:
      off.
    return_per_class_ap: write every class's AP (and AP@n) to TensorBoard,
      in the evaluation's summary directory: a histogram `per_class_ap` and
      a text table `per_class_ap_table`.
  """
  top_k: int = 20
  top_n: Optional[int] = None
  return_per_class_ap: bool = False


@dataclasses.dataclass
class Evaluation(hyperparams.Config):
  """Evaluation metrics and log.

  Attributes:
    average_precision: the AP metrics (None: losses only).
    num_best_worst_classes: the evaluation log lists the N best and N worst
      per-class APs (of the classes with positives; with `average_precision`);
      0: no list.
    vocabulary_path: the dataset's vocabulary.csv (`Index` and `Name`
      columns, see `official_ext.yt8m.class_names`): names beside the class
      ids in that list. '': ids only.
    video_and_segment_level: one evaluation reports both levels, for
      validation records that carry video labels and segment ratings: the
      video-level metrics under `video/` (every video, as with
      `validation_data.segment_labels: false`) and the segment-level ones
      under `segment/` (every rated segment, as with `segment_labels: true`;
      `segment/num_videos` counts the segments). The validation
      records are read twice, once per level; `trainer.validation_steps`
      counts the batches of both, videos first (-1: all); the losses are
      the mean over the batches of both, and `num_examples` counts the rows
      of both. Needs `validation_data.segment_labels: false`.
      CPU / GPU: the frame axis of the batches differs between the levels
      (max_frames, segment_size), which a TPU's static shapes do not allow.
  """
  average_precision: Optional[AveragePrecisionConfig] = None
  num_best_worst_classes: int = 5
  vocabulary_path: str = ''
  video_and_segment_level: bool = False


@dataclasses.dataclass
class DemoDataConfig(hyperparams.Config):
  """Generated data for an experiment without input files.

  Used only when `enabled` and a split's `input_path` is empty: the task then
  writes (once; cached under `cache_dir`) train and validation shards in the
  real YouTube-8M format, deterministic by `seed`.

  Attributes:
    enabled: generate data when `input_path` is empty.
    cache_dir: where generated shards are kept; '' uses
      $OFFICIAL_EXT_CACHE or ~/.cache/official_ext.
    seed: random seed of the generator.
    num_train_videos: videos in the train split.
    num_validation_videos: videos in the validation split.
    num_shards: files per split.
    segment_fraction: share of videos that carry segment-level labels.
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
    init_checkpoint: a checkpoint (prefix, or a directory: its latest) to
      start training from, as Model Garden's tasks do: loaded only when
      model_dir has no checkpoint of its own (a restarted run resumes from
      model_dir). '' trains from scratch.
    init_checkpoint_modules: what `init_checkpoint` initializes: 'all' (every
      model variable: the config must match) or 'backbone' (the backbone
      only; the head starts fresh, e.g. for another label set or number of
      classes). The restore is strict for the modules named: a variable
      missing from the checkpoint, or of another shape, is an error naming
      it. The log lists the variables restored.
    gradient_clip_norm: clip gradients by this global norm (<= 0: off).
    gradient_clip_per_variable: clip each variable's gradient to norm
      `gradient_clip_norm` on its own instead (the starter code's and the
      NeXtVLAD authors' `utils.clip_gradient_norms`;
      `core.gradients.clip_by_norm_per_variable`).
    demo_data: generated data used when an `input_path` is empty.
    jit_compile: XLA-compile each training step's forward and backward pass
      (fuses the per-frame batch norm / activation / pooling work around the
      cluster matmul; see `python -m official_ext.benchmark yt8m`). Not
      applied with synchronized batch norm (a collective inside the pass).
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


# ---------------------------------------------------------------------------
# Video-level records (`record_type='video'`).
# ---------------------------------------------------------------------------

# The starter code's names and widths of the video-level features.
VIDEO_LEVEL_FEATURES = dict(
    record_type='video', feature_names=('mean_rgb', 'mean_audio'),
    feature_sizes=(1024, 128), feature_dtypes=('float32', 'float32'),
    feature_from_bytes=(False, False), num_sample_frames=None)


def video_level_model(head: str, num_mixtures: int = 2
                      ) -> VideoClassificationModel:
  """The starter code's video-level models: `head` ('logistic' or 'moe',
  with `num_mixtures` experts, the starter's default 2) on the concatenated
  mean features, L2-normalized, no backbone."""
  return VideoClassificationModel(
      backbone=Backbone(type='identity',
                        identity=IdentityBackbone(l2_normalize=True)),
      head=Head(type=head, moe=MoeModel(num_mixtures=num_mixtures)))


@exp_factory.register_config_factory('yt8m_video_level')
def yt8m_video_level() -> cfg.ExperimentConfig:
  """The starter code's video-level training (needs input_path).

  `train.py --feature_names=mean_rgb,mean_audio --feature_sizes=1024,128`
  with its defaults: LogisticModel (L2 1e-8), batch 1024, Adam at
  base_learning_rate 0.01 multiplied by 0.95 every 4,000,000 examples
  (staircase), gradients clipped to norm 1.0, 5 epochs; eval.py's top_k 20.
  Differences from the starter, each with its expected effect: it sums the
  cross-entropy over the classes, this experiment averages it
  (`losses.class_reduction: mean`; Adam's updates hardly depend on the
  loss scale, but the L2 term weighs 3,862 times more relative to it; at
  1e-8 it is negligible either way); it clips each variable's gradient to
  norm 1, this experiment the global norm (`gradient_clip_per_variable:
  false`; with one kernel and one bias the two differ little); Adam's
  epsilon is 1e-7 here, 1e-8 there (negligible next to gradients of the
  summed loss). `losses.class_reduction=sum`,
  `gradient_clip_per_variable=true` and
  `trainer.optimizer_config.optimizer.adam.epsilon=1e-8` set them as the
  starter has them.
  """
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
  """`yt8m_video_level` on the demo videos' mean features (no download).

  The videos are `yt8m_demo`'s (100 classes, lengths up to 1.5 x 64
  frames), written as video-level `tf.Example`s (`demo_data`).
  """
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
  """NeXtVLAD + logistic classifier, the authors' setup (needs input_path
  and the rgb PCA eigenvalues).

  λ = 2, G = 8, K = 128 (audio: its own module with K = 64, G = 4), hidden
  2048, SE gating reduction 8, dropout 0.5, logistic classifier; all 300
  frames, no frame sampling (padding masked); batch 160, Adam 2e-4 x 0.8
  (staircase) every 2M examples, 5 epochs (the paper's local experiments),
  float32. Their training recipe (`nextvlad_recipe`): the cross-entropy
  summed over the classes, L2 1e-5 on the classifier, each variable's
  gradient clipped to norm 1, batch-norm momentum 0.999 (slim's), Adam
  epsilon 1e-8 (tf.train's), the classifier initialized He-normal
  (`slim.variance_scaling_initializer`), the rgb input's PCA whitening
  undone (`DataConfig.reverse_whitening_feature`: set
  `pca_eigenvalues_path` of both splits). Deviations, each with its
  expected effect: the classifier's bias is not L2-regularized (theirs is,
  at 1e-5 on 3,862 values: negligible next to the kernel's 7.9 M); padded
  frames are left out of the batch-norm statistics (theirs count them:
  statistics of the valid frames only, the same on videos of 300 frames).
  """
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
  """Sets the NeXtVLAD authors' training recipe (github.com/linrongc/
  youtube-8m, `train.py`, `losses.py`, `nextvlad.py`) on `config`.

  The cross-entropy summed over the classes (`CrossEntropyLoss`); L2 1e-5
  on the classifier (`--l2_penalty`); each variable's gradient clipped to
  norm 1 (`--clip_gradient_norm`, `utils.clip_gradient_norms`); batch-norm
  momentum 0.999 and epsilon 1e-3 (`slim.batch_norm`'s defaults); Adam
  epsilon 1e-8 (`tf.train.AdamOptimizer`'s); the logistic classifier
  He-normal (`slim.variance_scaling_initializer()`); with
  `reverse_whitening` the rgb frames' PCA whitening undone
  (`DataConfig.reverse_whitening_feature`; the eigenvalues file is the
  user's to supply as `pca_eigenvalues_path`).
  """
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
  """A small NeXtVLAD on `yt8m_demo`'s generated data and validation videos.

  λ = 1 (the first layer costs λ² x 1024² multiply-adds per rgb frame, 7x
  the DBoF demo's whole per-frame cost at λ = 2), G = 8 / 4, K = 16 / 8,
  hidden 256, dropout 0.25; 7 epochs of 16 sampled frames per video (the
  DBoF demo: 16 epochs of 32 frames), evaluated once, at the end.
  """
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
  """The NeXtVLAD mixture with online distillation, the authors' setup
  (needs input_path and the rgb PCA eigenvalues).

  3 NeXtVLAD branches (λ = 2, G = 8, K = 112; audio K = 56, G = 4; hidden
  2048, SE reduction 16, dropout 0.5), each with a logistic classifier,
  mixed by a gate on the frames' mean; loss: the mixture's and every
  branch's cross-entropy plus the distillation term (weight 9, temperature
  3); all 300 frames; batch 160, Adam 2e-4 x 0.8 (staircase) every 2.5M
  examples, 15 epochs, float32; the authors' recipe (`nextvlad_recipe`:
  cross-entropy summed over the classes, L2 1e-5 on the classifiers,
  per-variable clipping at 1, batch-norm momentum 0.999, Adam epsilon 1e-8,
  He-normal classifiers, the rgb whitening undone). Deviations, each with
  its expected effect: the classifiers' biases are not L2-regularized
  (negligible, as in `yt8m_nextvlad`); padded frames are left out of the
  gate's frame mean and of the batch-norm statistics (theirs count the
  padding of videos shorter than 300 frames: the same on full-length
  videos); the epochs count the train split (the authors' final model
  trained on train and validate files: point `input_path` at both for
  that).
  """
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
  """The NeXtVLAD mixture on `yt8m_demo`'s generated data and validation
  videos: 3 branches of `yt8m_nextvlad_demo`'s NeXtVLAD (λ = 1, G = 8 / 4,
  K = 16 / 8, hidden 256, dropout 0.25), distillation weight 9 at
  temperature 3, with its schedule (7 epochs of 16 sampled frames, one
  evaluation at the end) and the authors' recipe except the whitening (the
  demo's frames are not PCA-whitened).
  """
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


# ---------------------------------------------------------------------------
# The model zoo: the starter code's frame-level models and WILLOW's learnable
# pooling, each at its published size (`yt8m_<model>`, needs input_path) and
# on the demo data (`yt8m_<model>_demo`).
# ---------------------------------------------------------------------------

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
  """A published-size frame-level experiment (needs input_path) with the
  starter's recipe, which WILLOW's train.py keeps: the cross-entropy summed
  over the classes, each variable's gradient clipped to norm 1 (slim's
  `clip_gradient_norms`), Adam with TF1's epsilon and a staircase
  exponential decay every `decay_examples`, slim's batch-norm momentum,
  float32."""
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
  """`_published` with the starter's train.py defaults: batch 1024, L2 1e-8,
  Adam at 0.01 x 0.95 every 4M examples, 5 epochs of all 300 frames."""
  steps_per_epoch = YT8M_TRAIN_EXAMPLES // STARTER_BATCH_SIZE
  return _published(
      model, batch=STARTER_BATCH_SIZE, l2_weight_decay=1e-8,
      learning_rate=0.01, decay_rate=0.95,
      decay_examples=STARTER_DECAY_EXAMPLES,
      train_steps=STARTER_EPOCHS * steps_per_epoch, num_sample_frames=None)


def _zoo_demo(model: VideoClassificationModel,
              learning_rate: float = 0.002) -> cfg.ExperimentConfig:
  """`yt8m_demo` (its data, validation videos, 16 epochs of 32 sampled
  frames) with `model` and Adam at `learning_rate`."""
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
  """The starter's `FrameLevelLogisticModel` as its train.py trains it.

  The mean of the valid (L2-normalized) frames of all 300 frames into a
  logistic classifier (L2 1e-8, Glorot-uniform kernel as slim's); the
  cross-entropy summed over the classes, batch 1024, Adam at 0.01 (epsilon
  1e-8) x 0.95 every 4M examples (staircase), each variable's gradient
  clipped to norm 1, 5 epochs. One deviation: the starter's cross-entropy
  adds 1e-5 inside its logarithms, tf_keras' clips the probabilities to
  [1e-7, 1 - 1e-7] and adds 1e-7 (the loss of a confident mistake is
  capped at 15.42 instead of 11.51; no effect on the other terms).
  """
  return _starter_published(frame_logistic_model())


@exp_factory.register_config_factory('yt8m_frame_logistic_demo')
def yt8m_frame_logistic_demo() -> cfg.ExperimentConfig:
  """`yt8m_frame_logistic` on the demo data (yt8m_demo's budget), Adam at
  0.01 as the starter's."""
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
  """The starter's `LstmModel` with its train.py's defaults.

  Two LSTM layers of 1024 cells over all 300 (L2-normalized) frames, the
  last layer's final output into the MoE (2 mixtures, L2 1e-8); trained
  as `yt8m_frame_logistic` (its recipe and its one deviation). The cells
  are the starter's `BasicLSTMCell`s (`modeling/starter.py`).
  """
  return _starter_published(lstm_model())


@exp_factory.register_config_factory('yt8m_lstm_demo')
def yt8m_lstm_demo() -> cfg.ExperimentConfig:
  """A small `yt8m_lstm` (one layer of 128 cells) on the demo data, Adam at
  0.01 as the starter's (64 cells at yt8m_demo's 0.002 learn far less in
  the same budget)."""
  return _zoo_demo(lstm_model(cells=128, layers=1), learning_rate=0.01)


def willow_model(method: str, cluster_sizes: Tuple[int, int],
                 hidden_size: int = 1024, context_gating: bool = True,
                 prob_gating: bool = True) -> VideoClassificationModel:
  """A WILLOW model: `method` pooling + MoE (2 mixtures; `prob_gating`:
  the authors' `--moe_prob_gating`, a context gate on the probabilities)."""
  pooling = LearnablePoolingModel(
      cluster_sizes=cluster_sizes, hidden_size=hidden_size,
      context_gating=context_gating)
  return VideoClassificationModel(
      backbone=Backbone(type=method, **{method: pooling}),
      head=Head(type='moe', moe=MoeModel(
          num_mixtures=2, use_output_context_gate=prob_gating)))


def _willow(model: VideoClassificationModel, moe_l2: float,
            decay_rate: float, max_steps: int) -> cfg.ExperimentConfig:
  """WILLOW's training (README commands, train.py defaults): batch 80, Adam
  at 2e-4 (epsilon 1e-8) x `decay_rate` every 4M examples (staircase),
  gradients clipped to norm 1, `max_steps` steps, 300 frames sampled per
  training video, slim's batch-norm momentum 0.999, float32."""
  return _published(
      model, batch=WILLOW_BATCH_SIZE, l2_weight_decay=moe_l2,
      learning_rate=WILLOW_LEARNING_RATE, decay_rate=decay_rate,
      decay_examples=WILLOW_DECAY_EXAMPLES, train_steps=max_steps,
      num_sample_frames=WILLOW_ITERATIONS)


_WILLOW_DEVIATIONS = """
  The recipe is the authors' (the starter's train.py): the cross-entropy
  summed over the classes, each variable's gradient clipped to norm 1, Adam
  epsilon 1e-8, batch-norm momentum 0.999, the authors' initializers.
  Deviations, with their expected effect: the MoE's probability gate
  kernel is L2-regularized with the experts' (theirs is not; a small pull
  on 3,862 x 3,862 weights whose data gradient is summed over the classes);
  the context gates' kernels start Glorot-uniform (theirs normal; the same
  standard deviation, 1/sqrt(width)); the cross-entropy's epsilon as in
  `yt8m_frame_logistic`;
  evaluation pools all valid frames where theirs samples 300 with
  replacement (a less noisy score); the 300 training frames are sampled
  without replacement where a video has 300 (theirs always with
  replacement), in time order (no effect: the pooling ignores the order).
"""


@exp_factory.register_config_factory('yt8m_netvlad')
def yt8m_netvlad() -> cfg.ExperimentConfig:
  """WILLOW's gated NetVLAD (the authors' best single model).

  `--model=NetVLADModelLF --netvlad_cluster_size=256 --netvlad_hidden_size=
  1024 --netvlad_relu=False --gating=True --moe_prob_gating=True
  --moe_l2=1e-6 --learning_rate_decay=0.8 --max_step=700000`: NetVLAD with
  256 clusters on rgb, 128 on audio, hidden 1024 (bias, no activation),
  context gating, MoE with 2 mixtures and probability gating, L2 1e-6 on
  the MoE; lr x 0.8 every 4M examples, 700,000 steps (the README's best
  single model stops at 300,000).
  """
  return _willow(willow_model('netvlad', (256, 128)), moe_l2=1e-6,
                 decay_rate=0.8, max_steps=700_000)


@exp_factory.register_config_factory('yt8m_netrvlad')
def yt8m_netrvlad() -> cfg.ExperimentConfig:
  """WILLOW's gated NetRVLAD (`--lightvlad=True`: VLAD without centers).

  The `yt8m_netvlad` command with `--lightvlad=True --max_step=600000`.
  """
  return _willow(willow_model('netrvlad', (256, 128)), moe_l2=1e-6,
                 decay_rate=0.8, max_steps=600_000)


@exp_factory.register_config_factory('yt8m_soft_dbof')
def yt8m_soft_dbof() -> cfg.ExperimentConfig:
  """WILLOW's Soft-DBoW (`--model=SoftDbofModelLF`).

  `--dbof_cluster_size=8000 --dbof_hidden_size=1024 --dbof_relu=False
  --max_step=800000`: soft bag of frames with 8000 clusters on rgb and 1000
  (1/8) on audio, hidden 1024 (bias, no activation), no context gating (the
  authors' SoftDbofModelLF has none; `context_gating` turns it on), MoE
  with 2 mixtures without probability gating, train.py's L2 1e-8 and decay
  0.9.
  """
  return _willow(willow_model('soft_dbof', (8000, 1000), context_gating=False,
                              prob_gating=False),
                 moe_l2=1e-8, decay_rate=0.9, max_steps=800_000)


@exp_factory.register_config_factory('yt8m_netfv')
def yt8m_netfv() -> cfg.ExperimentConfig:
  """WILLOW's gated NetFV (`--model=NetFVModelLF`).

  `--fv_cluster_size=128 --fv_hidden_size=1024 --fv_relu=False --gating=True
  --moe_prob_gating=True --moe_l2=1e-6 --learning_rate_decay=0.8
  --fv_couple_weights=False --max_step=600000`: NetFV with 128 clusters on
  rgb, 64 on audio (centers separate from the assignment weights).
  """
  return _willow(willow_model('netfv', (128, 64)), moe_l2=1e-6,
                 decay_rate=0.8, max_steps=600_000)


# Each published WILLOW experiment's docstring names its deviations.
for _factory in (yt8m_netvlad, yt8m_netrvlad, yt8m_soft_dbof, yt8m_netfv):
  _factory.__doc__ = _factory.__doc__.rstrip() + '\n' + _WILLOW_DEVIATIONS


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
  """A small `yt8m_soft_dbof` (256 / 32 clusters, hidden 256) on the
  demo."""
  return _zoo_demo(willow_model('soft_dbof', (256, 32), hidden_size=256,
                                context_gating=False, prob_gating=False))


@exp_factory.register_config_factory('yt8m_netfv_demo')
def yt8m_netfv_demo() -> cfg.ExperimentConfig:
  """A small `yt8m_netfv` (8 / 4 clusters, hidden 256) on the demo."""
  return _zoo_demo(willow_model('netfv', (8, 4), hidden_size=256))
