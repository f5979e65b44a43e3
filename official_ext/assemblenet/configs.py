"""Configuration of the AssembleNet++lite video classification family and its
experiments; every flag of the original TF1 code is a field, the data fields
bear Model Garden's video names (docs/assemblenet.md#experiments-and-data)."""
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
# TFDS `ucf101` (split 1), as Model Garden's video_classification_ucf101.
UCF101_NUM_CLASSES = 101
UCF101_TRAIN_EXAMPLES = 9537
UCF101_TEST_EXAMPLES = 3783
# ADE-20K's object classes, the original AssembleNet++'s object input.
ADE20K_NUM_OBJECT_CLASSES = 151


@dataclasses.dataclass
class DataConfig(cfg.DataConfig):
  """Video clips from TFRecords of `tf.train.SequenceExample` or from TFDS."""
  # [num_frames, crop_height, crop_width, channels] of a clip; evaluation
  # clips may have another frame count (height, width, channels: the same).
  feature_shape: Tuple[int, ...] = (32, 224, 224, 3)
  temporal_stride: int = 1  # Frame stride of the sampled clip.
  # Evaluation: clips per video (evenly spaced; 1: the middle clip) and crops
  # (1: center; 3: left/center/right); their views are combined by
  # `task.eval_aggregation`.
  num_test_clips: int = 1
  num_test_crops: int = 1
  num_classes: int = -1  # A label outside [0, num_classes) is an error.
  # Several labels per video (sigmoid loss, mAP); False: exactly one each.
  is_multilabel: bool = False
  min_image_size: int = 256  # Evaluation: short side before the crop.
  zero_centering_image: bool = False  # Pixels in [-1, 1], else [0, 1].
  # Training random resized crop ranges.
  aug_min_aspect_ratio: float = 0.5
  aug_max_aspect_ratio: float = 2.0
  aug_min_area_ratio: float = 0.49
  aug_max_area_ratio: float = 1.0
  random_flip: bool = True  # Training; off when motion direction matters.
  # Training only, off by default: RandAugment / AutoAugment on the uint8
  # clip, and mixup / cutmix per batch (docs: training augmentation).
  aug_type: Optional[common.Augmentation] = None
  mixup_and_cutmix: Optional[common.MixupAndCutmix] = None
  image_field_key: str = 'image/encoded'
  label_field_key: str = 'clip/label/index'
  # The object stream (docs: object stream): > 0 reads each frame's object
  # class map (`object_field_key`; TFDS: `objects`) into features['objects']
  # int32 [T, H, W], ids in [0, num_object_classes); 0: none.
  num_object_classes: int = 0
  object_field_key: str = 'image/segmentation/class/encoded'
  # A corrupt frame's error names the record's file and frame (python reads
  # of the headers); False: pure graph ops (e.g. tf.data service),
  # TensorFlow's message only.
  name_file_in_decode_errors: bool = True
  num_examples: int = -1  # Examples in the split (-1: unknown).
  shuffle_buffer_size: int = 64
  # Skip, log and count bad records instead of failing (docs/bad_input.md).
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
  """The AssembleNet++lite backbone."""
  # The node list as JSON (`structures`); default the published structure.
  model_structure: str = json.dumps(structures.ASSEMBLENET_PLUS_LITE_STRUCTURE)
  # Per-node edge weights as JSON; '' learns them (the connectivity search).
  model_edge_weights: str = ''
  # The same read from a JSON file whenever the model is built (set the
  # inline field to ''; docs: connectivity search).
  model_structure_path: str = ''
  model_edge_weights_path: str = ''
  blocks_per_level: Tuple[int, ...] = structures.ASSEMBLENET_PLUS_LITE_BLOCKS_PER_LEVEL
  stem_filters: int = 24
  attention_mode: Optional[str] = 'peer'  # None (off), 'self' or 'peer'.
  # The original's fusion defect: projections get the input *width* as
  # channel count; default: the largest input channel count.
  fusion_width_as_channels: bool = False
  # '' follows the runtime's mixed precision; 'float32', 'bfloat16' or
  # 'float16' set this backbone's policy.
  precision: str = ''
  bn_decay: float = 0.99
  bn_epsilon: float = 1e-5
  use_sync_bn: bool = False
  # Gradient checkpointing of every stem, fusion and block group (docs:
  # gradient checkpointing).
  recompute_grad: bool = False
  rep_flow: RepFlow = dataclasses.field(default_factory=RepFlow)


def _asn_rep_flow() -> RepFlow:
  return RepFlow(num_iter=40)  # The original AssembleNet's.


@dataclasses.dataclass
class AssembleNet(hyperparams.Config):
  """The AssembleNet backbone (Model Garden's field names where they apply;
  the clip's frame count comes from the input, so there is no num_frames)."""
  model_id: str = '50'  # Depth: 26, 38, 50, 68, 77 or 101.
  # Overrides the depth's blocks per level (4 ints) when set.
  blocks_per_level: Tuple[int, ...] = ()
  combine_method: str = 'sigmoid'  # Edge-weighted sum (no 'concat').
  # The node list as JSON (one int of filters per block node); default the
  # published AssembleNet-50 with its edge weights ('' learns them).
  model_structure: str = json.dumps(structures.ASN50_STRUCTURE)
  model_edge_weights: str = json.dumps(structures.ASN_EDGE_WEIGHTS)
  model_structure_path: str = ''
  model_edge_weights_path: str = ''
  precision: str = ''  # As AssembleNetPlusLite.precision.
  # Filters of every stem; None: 128 // the number of stems, as the original.
  stem_filters: Optional[int] = None
  bn_decay: float = 0.99
  bn_epsilon: float = 1e-5
  use_sync_bn: bool = False
  recompute_grad: bool = False
  rep_flow: RepFlow = dataclasses.field(default_factory=_asn_rep_flow)


@dataclasses.dataclass
class AssembleNetPlus(AssembleNet):
  """The AssembleNet++ backbone: AssembleNet with attention and object
  inputs."""
  attention_mode: Optional[str] = 'peer'  # None (off), 'self' or 'peer'.
  # The model takes features['objects'] (int32 class ids [B, T, H, W]);
  # must agree with the structure having an object stem (-3).
  use_object_input: bool = False
  num_object_classes: int = 151  # ADE-20K's, as the original.


@dataclasses.dataclass
class Backbone3D(hyperparams.OneOfConfig):
  type: Optional[str] = 'assemblenet_plus_lite'
  assemblenet_plus_lite: AssembleNetPlusLite = dataclasses.field(
      default_factory=AssembleNetPlusLite)
  assemblenet: AssembleNet = dataclasses.field(default_factory=AssembleNet)
  assemblenet_plus: AssembleNetPlus = dataclasses.field(
      default_factory=AssembleNetPlus)


@dataclasses.dataclass
class VideoClassificationModel(hyperparams.Config):
  """Backbone + the lite head."""
  model_type: str = 'assemblenet_plus_lite'  # The `factory_3d` builder.
  backbone: Backbone3D = dataclasses.field(default_factory=Backbone3D)
  # The lite head's 1x1x1 convs (AssembleNet's head has none).
  head_filters: Tuple[int, ...] = (432, 2048)
  # Per-frame logits summed with softmax(logits / sqrt(T)) weights over time
  # instead of global average pooling.
  max_pool_predictions: bool = False
  dropout_rate: float = 0.5  # A drop rate (the original: a keep probability).


@dataclasses.dataclass
class Losses(hyperparams.Config):
  """label_smoothing (single-label only) and L2 weight decay on kernels."""
  label_smoothing: float = 0.0
  l2_weight_decay: float = 0.0


@dataclasses.dataclass
class DemoDataConfig(hyperparams.Config):
  """The moving-shapes TFDS data set (`demo_data`), generated, no download:
  when `enabled`, a 'moving_shapes[/config]' split is prepared once, in
  its `tfds_data_dir`, else `data_dir`, $OFFICIAL_EXT_CACHE/tfds or
  ~/.cache/official_ext/tfds."""
  enabled: bool = False
  data_dir: str = ''


@dataclasses.dataclass
class AssembleNetTask(cfg.TaskConfig):
  """Video classification with AssembleNet++lite: multi-label (sigmoid,
  mAP) when `train_data.is_multilabel`, else single-label (softmax, top-1 /
  top-5)."""
  model: VideoClassificationModel = dataclasses.field(
      default_factory=VideoClassificationModel)
  train_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(is_training=True))
  validation_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(is_training=False,
                                         drop_remainder=False))
  losses: Losses = dataclasses.field(default_factory=Losses)
  gradient_clip_norm: float = 0.0  # Global norm clipping; <= 0: off.
  # A video's evaluation views combined by their probabilities' 'mean' or
  # 'max' (docs: evaluation protocols).
  eval_aggregation: str = 'mean'
  demo_data: DemoDataConfig = dataclasses.field(default_factory=DemoDataConfig)


_RESTRICTIONS = [
    'task.train_data.num_classes == task.validation_data.num_classes',
    'task.train_data.is_multilabel == task.validation_data.is_multilabel',
    'task.train_data.num_object_classes == '
    'task.validation_data.num_object_classes',
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


def _asn_backbone(backbone_type: str, structure, edge_weights,
                  num_object_classes: int = 0, **fields) -> Backbone3D:
  """An AssembleNet (`backbone_type` 'assemblenet') or AssembleNet++
  ('assemblenet_plus') backbone of depth 50; `num_object_classes` > 0 takes
  object maps of that many classes."""
  fields = dict(model_id='50', model_structure=json.dumps(structure),
                model_edge_weights=(json.dumps(edge_weights) if edge_weights
                                    else ''), **fields)
  if backbone_type == 'assemblenet':
    return Backbone3D(type=backbone_type, assemblenet=AssembleNet(**fields))
  if num_object_classes:
    fields.update(use_object_input=True,
                  num_object_classes=num_object_classes)
  return Backbone3D(type=backbone_type,
                    assemblenet_plus=AssembleNetPlus(**fields))


def _full_experiment(num_classes: int, multilabel: bool, num_train: int,
                     num_val: int, epochs: int,
                     eval_aggregation: str,
                     backbone: Optional[Backbone3D] = None,
                     num_object_classes: int = 0) -> cfg.ExperimentConfig:
  """A published-size experiment (32 x 224^2, batch 64, SGD cosine);
  default backbone: the published AssembleNet++lite."""
  backbone = backbone or _published_backbone()
  batch_size = 64  # 8 clips on each of 8 GPUs.
  steps_per_epoch = num_train // batch_size
  data = dict(feature_shape=(32, 224, 224, 3), num_classes=num_classes,
              is_multilabel=multilabel, global_batch_size=batch_size,
              num_object_classes=num_object_classes)
  task = AssembleNetTask(
      model=VideoClassificationModel(model_type=backbone.type,
                                     backbone=backbone, dropout_rate=0.5),
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
  """Charades (multi-label, 157 classes), the published lite network; views
  aggregated by their maximum, the Charades protocol."""
  return _full_experiment(CHARADES_NUM_CLASSES, True, CHARADES_TRAIN_EXAMPLES,
                          CHARADES_VAL_EXAMPLES, epochs=50,
                          eval_aggregation='max')


@exp_factory.register_config_factory('assemblenet_plus_lite_kinetics')
def assemblenet_plus_lite_kinetics() -> cfg.ExperimentConfig:
  """Kinetics-400 (single-label), the published lite network."""
  return _full_experiment(KINETICS400_NUM_CLASSES, False,
                          KINETICS400_TRAIN_EXAMPLES, KINETICS400_VAL_EXAMPLES,
                          epochs=100, eval_aggregation='mean')


# AssembleNet-50 and AssembleNet++-50 at the published sizes
# (docs/assemblenet.md#experiments-and-data).
@exp_factory.register_config_factory('assemblenet50_charades')
def assemblenet50_charades() -> cfg.ExperimentConfig:
  """Charades (multi-label, 157 classes), AssembleNet-50 with its published
  structure and edge weights; views aggregated by their maximum."""
  return _full_experiment(
      CHARADES_NUM_CLASSES, True, CHARADES_TRAIN_EXAMPLES,
      CHARADES_VAL_EXAMPLES, epochs=50, eval_aggregation='max',
      backbone=_asn_backbone('assemblenet', structures.ASN50_STRUCTURE,
                             structures.ASN_EDGE_WEIGHTS))


@exp_factory.register_config_factory('assemblenet50_kinetics400')
def assemblenet50_kinetics400() -> cfg.ExperimentConfig:
  """Kinetics-400 (single-label), AssembleNet-50 as published."""
  return _full_experiment(
      KINETICS400_NUM_CLASSES, False, KINETICS400_TRAIN_EXAMPLES,
      KINETICS400_VAL_EXAMPLES, epochs=100, eval_aggregation='mean',
      backbone=_asn_backbone('assemblenet', structures.ASN50_STRUCTURE,
                             structures.ASN_EDGE_WEIGHTS))


@exp_factory.register_config_factory('assemblenet_plus_charades')
def assemblenet_plus_charades() -> cfg.ExperimentConfig:
  """Charades (multi-label, 157 classes), AssembleNet++-50 with its object
  stem (`FULL_ASNP50_STRUCTURE`, 151 ADE-20K object classes in the records'
  object maps) and published edge weights, peer attention."""
  return _full_experiment(
      CHARADES_NUM_CLASSES, True, CHARADES_TRAIN_EXAMPLES,
      CHARADES_VAL_EXAMPLES, epochs=50, eval_aggregation='max',
      backbone=_asn_backbone(
          'assemblenet_plus', structures.FULL_ASNP50_STRUCTURE,
          structures.FULL_ASNP_EDGE_WEIGHTS,
          num_object_classes=ADE20K_NUM_OBJECT_CLASSES),
      num_object_classes=ADE20K_NUM_OBJECT_CLASSES)


@exp_factory.register_config_factory('assemblenet_plus_kinetics400')
def assemblenet_plus_kinetics400() -> cfg.ExperimentConfig:
  """Kinetics-400 (single-label), AssembleNet++ (peer attention) on the
  AssembleNet-50 structure, RGB and flow only (no object maps)."""
  return _full_experiment(
      KINETICS400_NUM_CLASSES, False, KINETICS400_TRAIN_EXAMPLES,
      KINETICS400_VAL_EXAMPLES, epochs=100, eval_aggregation='mean',
      backbone=_asn_backbone('assemblenet_plus', structures.ASN50_STRUCTURE,
                             structures.ASN_EDGE_WEIGHTS))


def _ucf101_experiment(backbone: Backbone3D) -> cfg.ExperimentConfig:
  """UCF-101 from TFDS `ucf101` (split 1: train / test) with Model Garden's
  video_classification_ucf101 data, sizes and schedule (batch 64, SGD
  Nesterov 0.8 cosine over 100 epochs, 5 warmup epochs)."""
  batch_size, eval_batch = 64, 16
  epochs, warmup_epochs = 100, 5
  steps_per_epoch = UCF101_TRAIN_EXAMPLES // batch_size
  data = dict(feature_shape=(32, 224, 224, 3), num_classes=UCF101_NUM_CLASSES,
              is_multilabel=False, tfds_name='ucf101', temporal_stride=2)
  task = AssembleNetTask(
      model=VideoClassificationModel(model_type=backbone.type,
                                     backbone=backbone, dropout_rate=0.5),
      train_data=DataConfig(is_training=True, tfds_split='train',
                            drop_remainder=True, global_batch_size=batch_size,
                            num_examples=UCF101_TRAIN_EXAMPLES, **data),
      validation_data=DataConfig(is_training=False, tfds_split='test',
                                 drop_remainder=False,
                                 global_batch_size=eval_batch,
                                 num_examples=UCF101_TEST_EXAMPLES, **data),
      losses=Losses(l2_weight_decay=1e-4))
  return cfg.ExperimentConfig(
      runtime=kernel_policy.RuntimeConfig(mixed_precision_dtype='float32'),
      task=task,
      trainer=cfg.TrainerConfig(
          steps_per_loop=steps_per_epoch,
          summary_interval=steps_per_epoch,
          checkpoint_interval=steps_per_epoch,
          train_steps=epochs * steps_per_epoch,
          validation_steps=-1,
          validation_interval=steps_per_epoch,
          optimizer_config=_sgd_cosine(0.8, epochs * steps_per_epoch,
                                       warmup_epochs * steps_per_epoch)),
      restrictions=list(_RESTRICTIONS))


@exp_factory.register_config_factory('assemblenet50_ucf101')
def assemblenet50_ucf101() -> cfg.ExperimentConfig:
  """UCF-101 (TFDS), AssembleNet-50 as published: Model Garden's
  assemblenet_ucf101."""
  return _ucf101_experiment(_asn_backbone(
      'assemblenet', structures.ASN50_STRUCTURE, structures.ASN_EDGE_WEIGHTS))


@exp_factory.register_config_factory('assemblenet_plus_ucf101')
def assemblenet_plus_ucf101() -> cfg.ExperimentConfig:
  """UCF-101 (TFDS), AssembleNet++ on the AssembleNet-50 structure without
  objects: Model Garden's assemblenetplus_ucf101."""
  return _ucf101_experiment(_asn_backbone(
      'assemblenet_plus', structures.ASN50_STRUCTURE,
      structures.ASN_EDGE_WEIGHTS))


DEMO_TFDS_NAME = 'moving_shapes'


def _lite_demo_backbone(model_structure) -> Backbone3D:
  return Backbone3D(
      type='assemblenet_plus_lite',
      assemblenet_plus_lite=AssembleNetPlusLite(
          model_structure=json.dumps(model_structure),
          blocks_per_level=structures.TINY_BLOCKS_PER_LEVEL,
          stem_filters=8, attention_mode='peer', bn_decay=0.9,
          rep_flow=RepFlow(num_iter=10)))


def _demo_experiment(backbone: Backbone3D, tfds_name: str = DEMO_TFDS_NAME,
                     num_object_classes: int = 0) -> cfg.ExperimentConfig:
  """The demo's data, model sizes and schedule around `backbone` (edge
  weights learned); `tfds_name` a moving_shapes config (its object maps read
  with `num_object_classes`)."""
  from official_ext.assemblenet import demo_data  # pylint: disable=g-import-not-at-top
  num_train, num_val = 2400, 480  # moving_shapes/default
  num_frames, size = 8, 32
  num_classes = demo_data.NUM_CLASSES
  train_batch = 16
  steps_per_epoch = num_train // train_batch  # 150
  train_steps = 400  # 2.7 epochs of the generated train split
  shape = (num_frames, size, size, 3)
  common = dict(tfds_name=tfds_name, feature_shape=shape,
                num_classes=num_classes, is_multilabel=False,
                min_image_size=size, num_object_classes=num_object_classes)
  task = AssembleNetTask(
      model=VideoClassificationModel(
          model_type=backbone.type, backbone=backbone,
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
  return _demo_experiment(_lite_demo_backbone(structures.TINY_STRUCTURE))


def _asn_demo_backbone(backbone_type: str, structure,
                       num_object_classes: int = 0) -> Backbone3D:
  return _asn_backbone(
      backbone_type, structure, None, num_object_classes=num_object_classes,
      blocks_per_level=structures.TINY_BLOCKS_PER_LEVEL, bn_decay=0.9,
      rep_flow=RepFlow(num_iter=10))


@exp_factory.register_config_factory('assemblenet50_demo')
def assemblenet50_demo() -> cfg.ExperimentConfig:
  """A tiny AssembleNet (`TINY_ASN_STRUCTURE`, one block a level) on the
  generated moving shapes (CPU)."""
  return _demo_experiment(_asn_demo_backbone(
      'assemblenet', structures.TINY_ASN_STRUCTURE))


@exp_factory.register_config_factory('assemblenet_plus_demo')
def assemblenet_plus_demo() -> cfg.ExperimentConfig:
  """A tiny AssembleNet++ with an object stem (`TINY_ASNP_STRUCTURE`, peer
  attention) on moving shapes with their shape masks
  (`moving_shapes/objects`, 3 object classes; CPU)."""
  from official_ext.assemblenet import demo_data  # pylint: disable=g-import-not-at-top
  k = demo_data.NUM_OBJECT_CLASSES
  return _demo_experiment(
      _asn_demo_backbone('assemblenet_plus', structures.TINY_ASNP_STRUCTURE,
                         num_object_classes=k),
      tfds_name=DEMO_TFDS_NAME + '/objects', num_object_classes=k)


@exp_factory.register_config_factory('assemblenet_plus_lite_search_demo')
def assemblenet_plus_lite_search_demo() -> cfg.ExperimentConfig:
  """Step 1 of the one-shot connectivity search on the demo: every block
  of `TINY_SEARCH_STRUCTURE` takes every lower-level node, edge weights
  learned with the filters (docs/assemblenet.md#connectivity-search)."""
  return _demo_experiment(
      _lite_demo_backbone(structures.TINY_SEARCH_STRUCTURE))
