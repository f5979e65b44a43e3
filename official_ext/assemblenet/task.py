"""Video classification with AssembleNet++lite (`AssembleNetTask`): single-label
(top-1, top-5) or multi-label (mAP over the whole evaluation set), every
validation video evaluated once, its views combined by `eval_aggregation`
(docs/assemblenet.md#evaluation-protocols-longer-clips-mean-or-max-over-views)."""
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf, tf_keras

from official.core import base_task
from official.core import task_factory
from official.vision.modeling import factory_3d
from official_ext.assemblenet import configs
from official_ext.assemblenet import dataloader
from official_ext.assemblenet import demo_data
from official_ext.assemblenet import metrics as anet_metrics
from official_ext.assemblenet.modeling import assemblenet  # pylint: disable=unused-import  (registers builders)
from official_ext.assemblenet.modeling import assemblenet_plus_lite  # pylint: disable=unused-import  (registers builders)
from official_ext.assemblenet import structures
from official_ext.core import gradients
from official_ext.core import host_gather
from official_ext.core.input import bad_records
from official_ext.core.input import eval_padding

_MAP_KEY = 'map_inputs'


EVAL_AGGREGATIONS = ('mean', 'max')


def count_params(variables) -> int:
  return int(sum(int(np.prod(v.shape)) for v in variables))


def check_eval_aggregation(method: str) -> None:
  """ValueError naming `task.eval_aggregation` unless it is 'mean' or 'max'."""
  if method not in EVAL_AGGREGATIONS:
    raise ValueError(f'task.eval_aggregation must be one of '
                     f'{EVAL_AGGREGATIONS}; got {method!r}.')


def aggregate_views(scores: tf.Tensor, num_views: int,
                    method: str) -> tf.Tensor:
  """float [B, K]: each video's `num_views` rows of `scores` [B * num_views,
  K] (video b's in rows b * num_views ... as the dataloader folds them)
  combined per class by their 'mean' or 'max' (`method`)."""
  check_eval_aggregation(method)
  if num_views == 1:
    return scores
  scores = tf.reshape(scores, [-1, num_views, scores.shape[-1]])
  reduce = tf.reduce_mean if method == 'mean' else tf.reduce_max
  return reduce(scores, axis=1)


def check_object_classes(params: configs.AssembleNetTask) -> None:
  """ValueError naming both keys unless the data's `num_object_classes`
  (0: no object maps) is the model's: an `assemblenet_plus` backbone's
  `num_object_classes` when `use_object_input`, else 0."""
  k = params.train_data.num_object_classes
  backbone = params.model.backbone
  key = structures.backbone_key(backbone.type)
  takes = backbone.type == 'assemblenet_plus' and bool(
      backbone.get().use_object_input)
  if takes and k != backbone.get().num_object_classes:
    raise ValueError(
        f'{key}num_object_classes ({backbone.get().num_object_classes}) and '
        f'task.train_data.num_object_classes ({k}) differ: with '
        f'{key}use_object_input the model one-hot encodes the object maps '
        'the data serves, so both must be the object class count.')
  if not takes and k:
    why = (f'{key}use_object_input is false' if
           backbone.type == 'assemblenet_plus' else
           f'the {structures.NETWORK_NAMES[backbone.type]} backbone has no '
           'object stem')
    raise ValueError(
        f'task.train_data.num_object_classes ({k}) asks for object maps, but '
        f'{why} ({key}use_object_input): set it (AssembleNet++ with an '
        'object stem) or set num_object_classes to 0.')


@task_factory.register_task_cls(configs.AssembleNetTask)
class AssembleNetTask(base_task.Task):
  """AssembleNet++lite video classification: inputs ({'image': float32
  [B * views, T, H, W, 3]}, labels float32 [B, K] one- or multi-hot), the
  model's float32 logits [B * views, K]; with `train_data.num_object_classes`
  the model also gets 'objects' (int32 [B * views, T, H, W] class ids)."""

  def __init__(self, params: configs.AssembleNetTask,
               logging_dir: Optional[str] = None, name: Optional[str] = None):
    super().__init__(params, logging_dir=logging_dir, name=name)
    check_eval_aggregation(params.eval_aggregation)  # Before any evaluation.
    train_k = params.train_data.num_object_classes
    val_k = params.validation_data.num_object_classes
    if train_k != val_k:
      raise ValueError(
          f'task.train_data.num_object_classes ({train_k}) and '
          f'task.validation_data.num_object_classes ({val_k}) differ: the '
          'model takes object maps in both splits or in neither.')
    check_object_classes(params)
    if (params.train_data.mixup_and_cutmix is not None and
        not params.train_data.is_multilabel and params.losses.label_smoothing):
      raise ValueError(
          f'task.losses.label_smoothing ({params.losses.label_smoothing}) and '
          'task.train_data.mixup_and_cutmix are both set: the labels would be '
          'smoothed twice. With mixup / cutmix, as in Model Garden, smooth by '
          'mixup_and_cutmix.label_smoothing and set losses.label_smoothing '
          'to 0.')

  @property
  def multilabel(self) -> bool:
    return bool(self.task_config.train_data.is_multilabel)

  # -- model -----------------------------------------------------------------
  def model_input_shape(self) -> List[Optional[int]]:
    """[T, H, W, C] the model is built for; T None (any frame count) when the
    splits' clips differ in length.

    Raises:
      ValueError: naming the config key: the splits' clips differ in height,
        width or channels, or a split's frame count does not fit the network."""
    train, val = self.task_config.train_data, self.task_config.validation_data
    backbone = self.task_config.model.backbone
    network = structures.NETWORK_NAMES.get(backbone.type, backbone.type)
    if tuple(train.feature_shape[1:]) != tuple(val.feature_shape[1:]):
      raise ValueError(
          'task.train_data.feature_shape '
          f'{list(train.feature_shape)} and task.validation_data.feature_shape '
          f'{list(val.feature_shape)} differ in height, width or channels: '
          f'{network} fixes its fusions\' spatial pooling when built, '
          'so both splits need the same clip size (the frame count may '
          'differ).')
    structure, _ = structures.from_backbone(backbone)
    for key, data in (('train_data', train), ('validation_data', val)):
      structures.check_num_frames(
          structure, data.feature_shape[0],
          f'task.{key}.feature_shape {list(data.feature_shape)}', network)
    num_frames = train.feature_shape[0]
    if num_frames != val.feature_shape[0]:
      num_frames = None
    return [num_frames] + list(train.feature_shape[1:])

  def build_model(self, input_shape: Optional[Sequence[Optional[int]]] = None
                  ) -> tf_keras.Model:
    """The model for clips of `input_shape` [B, T, H, W, 3] (default: any
    batch of `model_input_shape()`; a static one for counting FLOPs)."""
    train = self.task_config.train_data
    shape = [None] + self.model_input_shape()
    if input_shape is not None:
      shape = list(input_shape)
    wd = float(self.task_config.losses.l2_weight_decay)
    # Halved to match tf.nn.l2_loss, as Model Garden's video task.
    l2 = tf_keras.regularizers.l2(wd / 2.0) if wd else None
    model = factory_3d.build_model(
        self.task_config.model.model_type,
        input_specs=tf_keras.layers.InputSpec(shape=shape),
        model_config=self.task_config.model,
        num_classes=train.num_classes,
        l2_regularizer=l2)
    logging.info('%s: %d trainable parameters in %d variables.',
                 structures.NETWORK_NAMES.get(
                     self.task_config.model.backbone.type, 'model'),
                 count_params(model.trainable_variables),
                 len(model.trainable_variables))
    return model

  def initialize(self, model: tf_keras.Model):
    """Loads `init_checkpoint` ('all' or 'backbone' modules)."""
    path = self.task_config.init_checkpoint
    if not path:
      return
    if tf.io.gfile.isdir(path):
      path = tf.train.latest_checkpoint(path)
    modules = self.task_config.init_checkpoint_modules
    if modules == 'all':
      ckpt = tf.train.Checkpoint(model=model)
    elif modules == 'backbone':
      ckpt = tf.train.Checkpoint(backbone=model.backbone)
    else:
      raise ValueError("task.init_checkpoint_modules must be 'all' or "
                       f"'backbone'; got {modules!r}.")
    ckpt.read(path).expect_partial().assert_existing_objects_matched()
    logging.info('Loaded %s from %s', modules, path)

  # -- data ------------------------------------------------------------------
  def _resolve_input_path(self, params: configs.DataConfig
                          ) -> configs.DataConfig:
    demo = self.task_config.demo_data
    name = params.tfds_name
    if demo.enabled and isinstance(name, str) and name.split('/')[0] == (
        configs.DEMO_TFDS_NAME):
      data_dir = demo_data.ensure_prepared(
          name, params.tfds_data_dir or demo.data_dir)
      return params.replace(tfds_data_dir=data_dir)
    return params

  def validation_dataset(self) -> Tuple[str, Dict[str, Any]]:
    """(what the validation data is, the config keys that shape it), for
    the errors of an evaluation that saw no video."""
    data = self.task_config.validation_data
    demo = self.task_config.demo_data
    if not data.tfds_data_dir and demo.enabled:
      data = data.replace(tfds_data_dir=demo.data_dir or '<demo cache>')
    return eval_padding.describe_split(data)

  def build_inputs(self, params: configs.DataConfig,
                   input_context: Optional[tf.distribute.InputContext] = None
                   ) -> tf.data.Dataset:
    return dataloader.build_dataset(
        self._resolve_input_path(params), input_context,
        bad_records=bad_records.log_for_split(self, params.is_training))

  def model_inputs(self, features: Dict[str, tf.Tensor]
                   ) -> Dict[str, tf.Tensor]:
    """The model's input dict of a batch's `features`: 'image', and 'objects'
    when `train_data.num_object_classes` > 0 (other keys, e.g. `eval_mask`,
    stay out).

    Raises:
      ValueError: the object maps are asked for but not in `features`."""
    inputs = {'image': features['image']}
    k = self.task_config.train_data.num_object_classes
    if k:
      if 'objects' not in features:
        raise ValueError(
            f'task.train_data.num_object_classes={k}: the model takes each '
            "frame's object class map (features['objects']) but the input "
            f'has only {sorted(features)}; the commands that take RGB frames '
            'alone (export, predict, extract_features) do not serve it.')
      inputs['objects'] = features['objects']
    return inputs

  # -- losses and metrics ------------------------------------------------------
  def build_losses(self, labels: tf.Tensor, model_outputs: tf.Tensor,
                   aux_losses: Optional[List[tf.Tensor]] = None,
                   from_logits: bool = True,
                   example_weights: Optional[tf.Tensor] = None
                   ) -> Dict[str, tf.Tensor]:
    """{'total_loss', 'model_loss'}: cross-entropy of `labels` [B, K] and
    `model_outputs` (logits, or probabilities without `from_logits`), the
    weighted mean over `example_weights` [B] (0: padding; 0 if every weight
    is 0), plus `aux_losses`."""
    if self.multilabel:
      per_example = tf.reduce_mean(tf_keras.losses.binary_crossentropy(
          labels[..., tf.newaxis], model_outputs[..., tf.newaxis],
          from_logits=from_logits), axis=-1)
    else:
      per_example = tf_keras.losses.categorical_crossentropy(
          labels, model_outputs, from_logits=from_logits,
          label_smoothing=self.task_config.losses.label_smoothing)
    if example_weights is None:
      model_loss = tf.reduce_mean(per_example)
    else:
      w = tf.cast(example_weights, per_example.dtype)
      model_loss = tf.math.divide_no_nan(
          tf.reduce_sum(tf.where(w > 0, per_example * w, 0.0)),
          tf.reduce_sum(w))
    total = model_loss
    if aux_losses:
      total += tf.add_n([tf.cast(l, tf.float32) for l in aux_losses])
    return {'total_loss': total, 'model_loss': model_loss}

  def build_metrics(self, training: bool = True):
    metrics = [tf_keras.metrics.Mean(n, dtype=tf.float32)
               for n in ('total_loss', 'model_loss')]
    if not self.multilabel:
      k = min(5, self.task_config.train_data.num_classes)
      metrics += [
          tf_keras.metrics.CategoricalAccuracy(name='accuracy'),
          tf_keras.metrics.TopKCategoricalAccuracy(k=k, name='top_5_accuracy')]
    metrics += bad_records.task_metrics(  # `bad_records_skipped`.
        self, self.task_config.train_data if training else
        self.task_config.validation_data, training)
    if not training:
      # `num_examples`: videos evaluated; zero at the end of an evaluation is
      # an error naming the dataset.
      metrics.append(eval_padding.EvaluatedExamples(self.validation_dataset))
    return metrics

  def process_metrics(self, metrics, labels, outputs, model_losses=None,
                      example_mask=None, **kwargs):
    """Updates metrics from probabilities [B, K]; with `example_mask` (bool
    [B]) only its True examples count, the loss means weighted by them."""
    model_losses = model_losses or {}
    weights = (None if example_mask is None else
               tf.cast(example_mask, tf.float32))
    logs = {}
    for m in metrics:
      if isinstance(m, eval_padding.EvaluatedExamples):
        if example_mask is not None:
          m.update_state(example_mask)
        continue
      if m.name in model_losses:
        m.update_state(model_losses[m.name], sample_weight=(
            None if weights is None else tf.reduce_sum(weights)))
      else:
        m.update_state(labels, outputs, sample_weight=weights)
      logs[m.name] = m.result()
    return logs

  def _probabilities(self, logits: tf.Tensor) -> tf.Tensor:
    logits = tf.cast(logits, tf.float32)
    return tf.sigmoid(logits) if self.multilabel else tf.nn.softmax(logits)

  # -- steps -----------------------------------------------------------------
  def train_step(self, inputs, model, optimizer, metrics=None):
    """Forward, loss / replicas, (loss-scaled) gradients, optional clipping."""
    features, labels = inputs
    num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
    with tf.GradientTape() as tape:
      logits = tf.cast(model(self.model_inputs(features), training=True),
                       tf.float32)
      losses = self.build_losses(labels, logits, aux_losses=model.losses)
      scaled_loss = gradients.scale_loss(
          optimizer, losses['total_loss'] / num_replicas)
    gradients.minimize(optimizer, tape, scaled_loss,
                       model.trainable_variables,
                       self.task_config.gradient_clip_norm)
    logs = {self.loss: losses['total_loss']}
    if metrics:
      logs.update(self.process_metrics(metrics, labels,
                                       self._probabilities(logits),
                                       model_losses=losses))
    return logs

  def inference_step(self, features, model):
    """Probabilities [B, K]: each video's views' probabilities combined by
    `task.eval_aggregation` (`aggregate_views`; with 'max' a single-label row no
    longer sums to 1: the evaluation's cross-entropy normalizes it). The
    model gets `model_inputs(features)` (no `eval_mask`)."""
    probs = self._probabilities(model(self.model_inputs(features),
                                      training=False))
    data = self.task_config.validation_data
    return aggregate_views(probs, data.num_test_clips * data.num_test_crops,
                           self.task_config.eval_aggregation)

  def validation_step(self, inputs, model, metrics=None):
    """Losses and metrics of the batch's real videos (`eval_mask`)."""
    features, labels = inputs
    mask = eval_padding.example_mask(features, tf.shape(labels)[0])
    probs = self.inference_step(features, model)
    losses = self.build_losses(labels, probs, aux_losses=model.losses,
                               from_logits=False,
                               example_weights=tf.cast(mask, tf.float32))
    logs = {self.loss: losses['total_loss']}
    if metrics:
      logs.update(self.process_metrics(metrics, labels, probs,
                                       model_losses=losses,
                                       example_mask=mask))
    if self.multilabel:
      # With several workers, every worker accumulates all replicas' rows.
      logs[_MAP_KEY] = host_gather.gather_for_host(
          {'labels': labels, 'probabilities': probs, 'mask': mask})
    return logs

  def aggregate_logs(self, state=None, step_outputs=None):
    """Multi-label: keeps every replica's real rows (labels, probabilities)
    for the mAP."""
    if not self.multilabel:
      return state
    if state is None:
      state = {'labels': [], 'probabilities': []}
    rows = step_outputs[_MAP_KEY]
    parts = {k: host_gather.host_parts(v) for k, v in rows.items()}
    masks = parts.get('mask') or [None] * len(parts['labels'])
    for i, mask in enumerate(masks):
      keep = slice(None) if mask is None else np.asarray(mask, bool)
      for key in state:
        state[key].append(parts[key][i][keep])
    return state

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    """Multi-label: {'map': mAP over every evaluated video}.

    Raises:
      EmptyEvaluationError: no video was evaluated, or none has a positive
        label; the message names the dataset."""
    if not self.multilabel:
      return {}
    labels = (np.concatenate(aggregated_logs['labels'], axis=0)
              if aggregated_logs and aggregated_logs['labels'] else
              np.zeros([0, 0]))
    if not labels.shape[0]:
      eval_padding.check_examples_seen(0, *self.validation_dataset())
    probs = np.concatenate(aggregated_logs['probabilities'], axis=0)
    value = anet_metrics.mean_average_precision(probs, labels)
    if np.isnan(value):
      dataset, _ = self.validation_dataset()
      raise eval_padding.EmptyEvaluationError(
          f'Evaluation saw {labels.shape[0]} videos of {dataset} but none '
          'has a positive label: the multi-label mAP has no value.')
    return {'map': value}
