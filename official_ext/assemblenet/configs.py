"""Configuration of the AssembleNet++lite video classification family.

Every flag of the original TF1 code is a config field here (backbone:
`precision`, `bn_decay`, `bn_epsilon`, `attention_mode`, the structure and
edge weights, rep-flow options; model: `max_pool_predictions`,
`dropout_rate`). Data fields use the names of Model Garden's
`official.vision.configs.video_classification.DataConfig`.

Experiments:

* `assemblenet_plus_lite_charades`: multi-label (157 classes, sigmoid
  cross-entropy, mAP), 32 frames at 224x224, the published structure with its
  published edge weights, peer attention, a video's evaluation views
  aggregated by their maximum. Needs Charades as TFRecords
  (`input_path`) or TFDS (`tfds_name`).
* `assemblenet_plus_lite_kinetics`: single-label Kinetics-400 (softmax
  cross-entropy, top-1/top-5), same backbone.
* `assemblenet_plus_lite_demo`: a tiny structure on the procedurally generated
  moving-shapes TFDS data set (`official_ext.assemblenet.demo_data`), 8 frames
  at 32x32; trains on 2 CPU cores in minutes, no download.
"""
import dataclasses
import json
from typing import Optional, Tuple

from official.core import config_definitions as cfg
from official.core import exp_factory
from official.modeling import hyperparams
from official.modeling import optimization
from official.vision.configs import common
from official_ext.assemblenet import structures
from official_ext.core.kernels import kernel_policy

CHARADES_NUM_CLASSES = 157
CHARADES_TRAIN_EXAMPLES = 7985
CHARADES_VAL_EXAMPLES = 1863
KINETICS400_NUM_CLASSES = 400
KINETICS400_TRAIN_EXAMPLES = 215570
KINETICS400_VAL_EXAMPLES = 17706


@dataclasses.dataclass
class DataConfig(cfg.DataConfig):
  """Video clips from TFRecords of `tf.train.SequenceExample` or from TFDS.

  TFRecord format (Model Garden's video format): sequence feature
  `image_field_key` (default 'image/encoded') with one JPEG (or PNG) string
  per frame, context `label_field_key` (default 'clip/label/index') with the
  int64 class id(s). TFDS: the element's `video` (uint8 [T, H, W, 3]) and
  `label` (int) features (set `tfds_name`, `tfds_split`, `tfds_data_dir`).

  Attributes:
    feature_shape: [num_frames, crop_height, crop_width, channels] of a clip.
      Evaluation clips may have more (or fewer) frames than training clips
      (the model is then built with an unknown frame count, as Model
      Garden's video classification); height, width and channels must be
      the same in both splits.
    temporal_stride: frame stride of the sampled clip.
    num_test_clips: evaluation: clips per video (linearly spaced; 1: the
      middle clip); a video's clips x crops views are scored one by one and
      aggregated by `task.eval_aggregation`.
    num_test_crops: evaluation: 1 (center crop) or 3 (left/center/right).
    num_classes: number of classes; a label outside [0, num_classes) is an
      error naming the record's file.
    is_multilabel: several labels per video (sigmoid loss, mAP). False: each
      video must have exactly one label.
    min_image_size: evaluation: frames are resized so their short side is this
      before the center crop.
    zero_centering_image: pixel values in [-1, 1] (else [0, 1]).
    aug_min_aspect_ratio, aug_max_aspect_ratio, aug_min_area_ratio,
    aug_max_area_ratio: training random resized crop ranges.
    random_flip: training random left-right flip (turn it off when the label
      depends on the direction of motion).
    aug_type: training only, off (None) by default: Model Garden's
      `common.Augmentation` with `type` 'randaug' (`augment.RandAugment`) or
      'autoaug' (`augment.AutoAugment`), applied to the uint8 clip after the
      crop and flip, before normalization, as Model Garden's
      `video_input.process_image`. One call on the whole [T, H, W, 3] clip:
      one sampled policy, the same ops and magnitudes on every frame
      (statistics-based ops: `AutoContrast` and `Equalize` use the clip's
      statistics, `Contrast` each frame's mean), except RandAugment's `Cutout`,
      which Model Garden applies to video as a spatio-temporal box through a
      few consecutive frames (`augment.cutout_video`, which draws the box's
      size itself: `cutout_const` has no effect on clips); put 'Cutout' in
      `randaug.exclude_ops` for strictly per-clip transforms.
    mixup_and_cutmix: training only, off (None) by default: Model Garden's
      `common.MixupAndCutmix`, applied per batch to the [B, T, H, W, 3] clips
      and their labels (`augment.MixupAndCutmix`: each clip mixed with the
      batch's reversed partner, cutmix boxes through all frames); labels are
      smoothed by its `label_smoothing` (y * (1 - s) + s / num_classes, for
      one-hot and multi-hot labels), so `task.losses.label_smoothing` must
      then be 0.
    image_field_key, label_field_key: feature names of the records.
    name_file_in_decode_errors: a corrupt frame fails with an error naming
      the record's file and frame (default): frames are decoded in a
      `tf.py_function`, except JPEG training clips, whose headers are read
      in one (a header that does not read, a missing end marker or another
      frame size is named) and whose crop windows are decoded in graph ops
      (damage inside the compressed data: TensorFlow's message). False
      decodes in pure graph ops (serializable pipelines, e.g. tf.data
      service); a corrupt frame then still fails, with TensorFlow's message
      only (frames of different sizes are still named).
    num_examples: examples in the split (sizes evaluation; -1 unknown).
    skip_bad_records: False (default): a truncated/corrupted TFRecord file or
      an invalid record (unparsable, bad label, corrupt frame) is an error
      naming the file. True: the damaged records of a file, or the
      invalid record, are skipped, logged and counted (`bad_records_skipped`
      in the task's logs).
  """
  feature_shape: Tuple[int, ...] = (32, 224, 224, 3)
  temporal_stride: int = 1
  num_test_clips: int = 1
  num_test_crops: int = 1
  num_classes: int = -1
  is_multilabel: bool = False
  min_image_size: int = 256
  zero_centering_image: bool = False
  aug_min_aspect_ratio: float = 0.5
  aug_max_aspect_ratio: float = 2.0
  aug_min_area_ratio: float = 0.49
  aug_max_area_ratio: float = 1.0
  random_flip: bool = True
  aug_type: Optional[common.Augmentation] = None
  mixup_and_cutmix: Optional[common.MixupAndCutmix] = None
  image_field_key: str = 'image/encoded'
  label_field_key: str = 'clip/label/index'
  name_file_in_decode_errors: bool = True
  num_examples: int = -1
  shuffle_buffer_size: int = 64
  skip_bad_records: bool = False


@dataclasses.dataclass
class RepFlow(hyperparams.Config):
  """Representation-flow (flow stem) options; see `RepresentationFlow`."""
  num_iter: int = 20
  train_feature_grad: bool = False
  train_divergence: bool = False
  train_flow_grad: bool = False
  train_hyper: bool = False
  # The original rescales grey frames with the batch's min/max (a clip's flow
  # then depends on its batch-mates); default: each clip's own.
  rescale_per_batch: bool = False


@dataclasses.dataclass
class AssembleNetPlusLite(hyperparams.Config):
  """The AssembleNet++lite backbone.

  Attributes:
    model_structure: the node list as JSON (see `structures`); default the
      published lite structure.
    model_edge_weights: per-node edge weights as JSON; '' (or '[]') learns
      them (trainable, the one-shot connectivity search).
    model_structure_path, model_edge_weights_path: the same, read from a
      JSON file (e.g. written by `official_ext.assemblenet.derive_structure`);
      set the inline field to '' when giving its path (both set is an error,
      as is a file that is missing or not JSON; the message names the key and
      the file). The file is read whenever the model is built (training,
      export), so it must stay where it is.
    blocks_per_level: inverted-bottleneck blocks per block group, levels 0-3.
    stem_filters: filters of every stem (24 in the original).
    attention_mode: None (off), 'self' or 'peer'.
    fusion_width_as_channels: reproduce the original's 5-D fusion defect (its
      projections get the input *width* as channel count); default False:
      project to the largest input channel count.
    precision: '' follows the runtime's mixed-precision policy; 'float32',
      'bfloat16' or 'float16' set this backbone's policy (float32 variables;
      compute in that dtype).
    bn_decay, bn_epsilon: batch-norm momentum and epsilon.
    use_sync_bn: synchronized batch norm across replicas.
    recompute_grad: gradient checkpointing (`modeling.recompute.recompute_grad`)
      of every stem, fusion and block group: the backward pass keeps only the
      nodes' outputs and reruns one segment at a time; less memory, about one
      more forward of compute. The recomputation does not update batch-norm
      moving statistics, so on and off give the same gradients and
      statistics.
    rep_flow: the flow stem's options.
  """
  model_structure: str = json.dumps(structures.ASSEMBLENET_PLUS_LITE_STRUCTURE)
  model_edge_weights: str = ''
  model_structure_path: str = ''
  model_edge_weights_path: str = ''
  blocks_per_level: Tuple[int, ...] = structures.ASSEMBLENET_PLUS_LITE_BLOCKS_PER_LEVEL
  stem_filters: int = 24
  attention_mode: Optional[str] = 'peer'
  fusion_width_as_channels: bool = False
  precision: str = ''
  bn_decay: float = 0.99
  bn_epsilon: float = 1e-5
  use_sync_bn: bool = False
  recompute_grad: bool = False
  rep_flow: RepFlow = dataclasses.field(default_factory=RepFlow)


@dataclasses.dataclass
class Backbone3D(hyperparams.OneOfConfig):
  type: Optional[str] = 'assemblenet_plus_lite'
  assemblenet_plus_lite: AssembleNetPlusLite = dataclasses.field(
      default_factory=AssembleNetPlusLite)


@dataclasses.dataclass
class VideoClassificationModel(hyperparams.Config):
  """Backbone + the lite head.

  Attributes:
    model_type: the `factory_3d` model builder ('assemblenet_plus_lite').
    head_filters: the head's two 1x1x1 convs (432, 2048 in the original).
    max_pool_predictions: per-frame predictions combined by a softmax over
      time (`logits * softmax(logits / sqrt(T), time)` summed over time)
      instead of global average pooling.
    dropout_rate: dropout rate before the classifier (the original passed a
      keep probability where Keras takes a drop rate; this is the rate).
  """
  model_type: str = 'assemblenet_plus_lite'
  backbone: Backbone3D = dataclasses.field(default_factory=Backbone3D)
  head_filters: Tuple[int, ...] = (432, 2048)
  max_pool_predictions: bool = False
  dropout_rate: float = 0.5


@dataclasses.dataclass
class Losses(hyperparams.Config):
  """label_smoothing (single-label only) and L2 weight decay on kernels."""
  label_smoothing: float = 0.0
  l2_weight_decay: float = 0.0


@dataclasses.dataclass
class DemoDataConfig(hyperparams.Config):
  """The moving-shapes TFDS data set (`demo_data`), generated, no download.

  When `enabled`, a split whose `tfds_name` is 'moving_shapes[/config]' is
  prepared (once, cached) before it is read; its `tfds_data_dir`, if empty,
  becomes `data_dir`, or $OFFICIAL_EXT_CACHE/tfds, or
  ~/.cache/official_ext/tfds.
  """
  enabled: bool = False
  data_dir: str = ''


@dataclasses.dataclass
class AssembleNetTask(cfg.TaskConfig):
  """Video classification with AssembleNet++lite.

  Multi-label when `train_data.is_multilabel` (sigmoid cross-entropy; mAP over
  classes), else single-label (softmax cross-entropy; top-1 / top-5).

  Attributes:
    gradient_clip_norm: clip the global gradient norm (<= 0: off).
    eval_aggregation: how a video's evaluation views
      (`validation_data.num_test_clips` x `num_test_crops`) are combined
      into its scores: 'mean' (Model Garden's video classification,
      Kinetics) or 'max' (the Charades protocol: per class, the highest
      score of any view). Either is taken over the views' probabilities
      (softmax, or sigmoid for multi-label), as Model Garden's
      `inference_step` averages them; the evaluation losses, metrics and
      the SavedModel's `probabilities` use the aggregate.
  """
  model: VideoClassificationModel = dataclasses.field(
      default_factory=VideoClassificationModel)
  train_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(is_training=True))
  validation_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(is_training=False,
                                         drop_remainder=False))
  losses: Losses = dataclasses.field(default_factory=Losses)
  gradient_clip_norm: float = 0.0
  eval_aggregation: str = 'mean'
  demo_data: DemoDataConfig = dataclasses.field(default_factory=DemoDataConfig)


_RESTRICTIONS = [
    'task.train_data.num_classes == task.validation_data.num_classes',
    'task.train_data.is_multilabel == task.validation_data.is_multilabel',
]


def _sgd_cosine(learning_rate: float, decay_steps: int, warmup_steps: int,
                momentum: float = 0.9) -> optimization.OptimizationConfig:
  return optimization.OptimizationConfig({
      'optimizer': {'type': 'sgd', 'sgd': {'momentum': momentum,
                                           'nesterov': True}},
      'learning_rate': {'type': 'cosine', 'cosine': {
          'initial_learning_rate': learning_rate,
          'decay_steps': decay_steps}},
      'warmup': {'type': 'linear', 'linear': {
          'warmup_steps': warmup_steps, 'warmup_learning_rate': 0.0}},
  })


def _published_backbone() -> Backbone3D:
  return Backbone3D(
      type='assemblenet_plus_lite',
      assemblenet_plus_lite=AssembleNetPlusLite(
          model_edge_weights=json.dumps(
              structures.ASSEMBLENET_PLUS_LITE_EDGE_WEIGHTS),
          attention_mode='peer'))


def _full_experiment(num_classes: int, multilabel: bool, num_train: int,
                     num_val: int, epochs: int,
                     eval_aggregation: str) -> cfg.ExperimentConfig:
  batch_size = 64  # 8 clips on each of 8 GPUs.
  steps_per_epoch = num_train // batch_size
  data = dict(feature_shape=(32, 224, 224, 3), num_classes=num_classes,
              is_multilabel=multilabel, global_batch_size=batch_size)
  task = AssembleNetTask(
      model=VideoClassificationModel(backbone=_published_backbone(),
                                     dropout_rate=0.5),
      train_data=DataConfig(is_training=True, drop_remainder=True,
                            num_examples=num_train, temporal_stride=2, **data),
      validation_data=DataConfig(is_training=False, drop_remainder=False,
                                 num_examples=num_val, temporal_stride=2,
                                 num_test_clips=1, **data),
      losses=Losses(l2_weight_decay=1e-4),
      eval_aggregation=eval_aggregation)
  return cfg.ExperimentConfig(
      runtime=kernel_policy.RuntimeConfig(mixed_precision_dtype='float32'),
      task=task,
      trainer=cfg.TrainerConfig(
          steps_per_loop=steps_per_epoch,
          summary_interval=steps_per_epoch,
          checkpoint_interval=steps_per_epoch,
          train_steps=epochs * steps_per_epoch,
          validation_steps=-1,
          validation_interval=5 * steps_per_epoch,
          optimizer_config=_sgd_cosine(
              0.1 * batch_size / 64, epochs * steps_per_epoch,
              steps_per_epoch)),
      restrictions=list(_RESTRICTIONS))


@exp_factory.register_config_factory('assemblenet_plus_lite_charades')
def assemblenet_plus_lite_charades() -> cfg.ExperimentConfig:
  """Charades (multi-label, 157 classes), the published lite network.

  Views are aggregated by their maximum (`eval_aggregation: max`), the
  Charades protocol (a video's actions occupy parts of it: a class scores
  what its best clip scores). The TF1 original ships no evaluation code.
  """
  return _full_experiment(CHARADES_NUM_CLASSES, True, CHARADES_TRAIN_EXAMPLES,
                          CHARADES_VAL_EXAMPLES, epochs=50,
                          eval_aggregation='max')


@exp_factory.register_config_factory('assemblenet_plus_lite_kinetics')
def assemblenet_plus_lite_kinetics() -> cfg.ExperimentConfig:
  """Kinetics-400 (single-label), the published lite network."""
  return _full_experiment(KINETICS400_NUM_CLASSES, False,
                          KINETICS400_TRAIN_EXAMPLES, KINETICS400_VAL_EXAMPLES,
                          epochs=100, eval_aggregation='mean')


DEMO_TFDS_NAME = 'moving_shapes'


def _demo_experiment(model_structure) -> cfg.ExperimentConfig:
  """The demo's data, model sizes and schedule around `model_structure`

  (edge weights learned: `model_edge_weights` '')."""
  from official_ext.assemblenet import demo_data  # pylint: disable=g-import-not-at-top
  num_train, num_val = 2400, 480  # moving_shapes/default
  num_frames, size = 8, 32
  num_classes = demo_data.NUM_CLASSES
  train_batch = 16
  steps_per_epoch = num_train // train_batch  # 150
  train_steps = 400  # 2.7 epochs of the generated train split
  shape = (num_frames, size, size, 3)
  common = dict(tfds_name=DEMO_TFDS_NAME, feature_shape=shape,
                num_classes=num_classes, is_multilabel=False,
                min_image_size=size)
  task = AssembleNetTask(
      model=VideoClassificationModel(
          backbone=Backbone3D(
              type='assemblenet_plus_lite',
              assemblenet_plus_lite=AssembleNetPlusLite(
                  model_structure=json.dumps(model_structure),
                  blocks_per_level=structures.TINY_BLOCKS_PER_LEVEL,
                  stem_filters=8, attention_mode='peer', bn_decay=0.9,
                  rep_flow=RepFlow(num_iter=10))),
          head_filters=(64, 128), dropout_rate=0.2),
      train_data=DataConfig(
          is_training=True, tfds_split='train', drop_remainder=True,
          global_batch_size=train_batch, num_examples=num_train, random_flip=False,
          aug_min_area_ratio=0.8, aug_min_aspect_ratio=0.8,
          aug_max_aspect_ratio=1.25, shuffle_buffer_size=256, **common),
      validation_data=DataConfig(
          is_training=False, tfds_split='validation', drop_remainder=False,
          global_batch_size=48, num_examples=num_val,
          **common),
      demo_data=DemoDataConfig(enabled=True))
  return cfg.ExperimentConfig(
      runtime=kernel_policy.RuntimeConfig(mixed_precision_dtype='float32'),
      task=task,
      trainer=cfg.TrainerConfig(
          steps_per_loop=steps_per_epoch // 3,
          summary_interval=steps_per_epoch // 3,
          checkpoint_interval=steps_per_epoch,
          train_steps=train_steps,
          validation_steps=-1,
          validation_interval=train_steps,
          optimizer_config=optimization.OptimizationConfig({
              'optimizer': {'type': 'adam', 'adam': {}},
              'learning_rate': {'type': 'cosine', 'cosine': {
                  'initial_learning_rate': 0.003,
                  'decay_steps': train_steps}},
              'warmup': {'type': 'linear', 'linear': {
                  'warmup_steps': steps_per_epoch // 2,
                  'warmup_learning_rate': 0.0}},
          })),
      restrictions=list(_RESTRICTIONS))


@exp_factory.register_config_factory('assemblenet_plus_lite_demo')
def assemblenet_plus_lite_demo() -> cfg.ExperimentConfig:
  """A tiny AssembleNet++lite on generated moving shapes (CPU, minutes)."""
  return _demo_experiment(structures.TINY_STRUCTURE)


@exp_factory.register_config_factory('assemblenet_plus_lite_search_demo')
def assemblenet_plus_lite_search_demo() -> cfg.ExperimentConfig:
  """The connectivity search on the demo: `TINY_SEARCH_STRUCTURE`.

  Step 1 of the schedule of the AssembleNet papers' one-shot search
  (google-research/assemblenet: assemblenet.py, `multi_connection_fusion`,
  and its README, "Fixed Connectivity vs. Connectivity Learning"): the demo's
  nodes, every block taking every lower-level node, trained with learnable
  edge weights (`model_edge_weights` '': one logit per input, `agg_weights`,
  truncated normal 0.01 initial, sigmoid applied) jointly with the filters,
  by the same optimizer and schedule as the demo. Step 2,
  `python -m official_ext.assemblenet.derive_structure`, drops the edges whose
  sigmoid weight is below a threshold; step 3 trains
  `assemblenet_plus_lite_demo` on the derived structure with the kept
  weights fixed (`model_structure_path`, `model_edge_weights_path`).
  """
  return _demo_experiment(structures.TINY_SEARCH_STRUCTURE)
