"""The YouTube-8M video classification task (`YT8MTask`)."""
from typing import Any, Dict, List, Optional

from absl import logging
import numpy as np
import tensorflow as tf, tf_keras

from official.core import base_task
from official.core import task_factory
from official.modeling import tf_utils
from official_ext.core import checkpoints
from official_ext.core import gradients
from official_ext.core import host_gather
from official_ext.core.input import bad_records
from official_ext.core.input import eval_padding
from official_ext.yt8m import class_names
from official_ext.yt8m import configs
from official_ext.yt8m import dataloader
from official_ext.yt8m import demo_data
from official_ext.yt8m import metrics as yt8m_metrics
from official_ext.yt8m.modeling import model as yt8m_model

_AP_KEY = 'average_precision'
# task.init_checkpoint_modules -> the model's checkpoint items restored
# (None: the whole model).
_INIT_MODULES = {'all': None, 'backbone': ('backbone',)}
# Metric prefixes of `evaluation.video_and_segment_level`.
_VIDEO_PREFIX = 'video/'
_SEGMENT_PREFIX = 'segment/'
# task.losses.class_reduction.
CLASS_REDUCTIONS = ('mean', 'sum')


def _ap_accumulators(params: configs.YT8MTask
                     ) -> Dict[str, yt8m_metrics.AveragePrecisionAccumulator]:
  """{metric prefix: AP accumulator} of one evaluation ({} without AP).

  Raises:
    ValueError: naming the keys of a negative `top_n`, or of
      `video_and_segment_level` with segment-level validation data or
      without AP metrics.
  """
  ap_config = params.evaluation.average_precision
  if params.evaluation.video_and_segment_level:
    if params.validation_data.segment_labels:
      raise ValueError(
          'task.evaluation.video_and_segment_level evaluates the video and '
          'the segment level of the same records; set '
          'task.validation_data.segment_labels=false (it is true).')
    if ap_config is None:
      raise ValueError(
          'task.evaluation.video_and_segment_level reports the AP metrics of '
          'both levels, but task.evaluation.average_precision is None.')
  if ap_config is None:
    return {}
  top_n = ap_config.top_n
  if top_n is not None and top_n < 0:
    raise ValueError(
        f'task.evaluation.average_precision.top_n={top_n}; expected a '
        'positive int (AP@n), or None or 0 (off).')
  prefixes = ((_VIDEO_PREFIX, _SEGMENT_PREFIX)
              if params.evaluation.video_and_segment_level else ('',))
  return {prefix: yt8m_metrics.AveragePrecisionAccumulator(
      num_classes=params.validation_data.num_classes, top_k=ap_config.top_k,
      top_n=top_n or None) for prefix in prefixes}


def _write_per_class_ap(prefix: str, results: Dict[str, Any],
                        class_positives: np.ndarray, top_n: Optional[int],
                        step) -> None:
  """Writes the per-class AP histograms and table to the default summary
  writer (Orbit's evaluation writer while it evaluates).
  """
  has = class_positives > 0
  classes = np.flatnonzero(has)
  columns = {'AP': results['per_class_ap']}
  tf.summary.histogram(f'{prefix}per_class_ap', columns['AP'][has],
                       step=step)
  if top_n is not None:
    columns[f'AP@{top_n}'] = results['per_class_ap_at_n']
    tf.summary.histogram(f'{prefix}per_class_ap_at_{top_n}',
                         columns[f'AP@{top_n}'][has], step=step)
  order = classes[np.lexsort((classes, -columns['AP'][classes]))]
  lines = [
      f'{classes.size} classes with a positive, best AP first '
      f'({class_positives.size - classes.size} without a positive are left '
      'out).', '',
      '| class | ' + ' | '.join(columns) + ' | positives |',
      '|---:|' + '---:|' * (len(columns) + 1)]
  lines += [f'| {c} | ' + ' | '.join(f'{v[c]:.4f}' for v in columns.values())
            + f' | {class_positives[c]} |' for c in order]
  tf.summary.text(f'{prefix}per_class_ap_table', '\n'.join(lines), step=step)


def _check_record_type(config: configs.YT8MTask) -> None:
  """Raises ValueError unless both splits hold the backbone's record type."""
  backbone = config.model.backbone.type
  expected = 'video' if backbone == 'identity' else 'frame'
  for key in ('train_data', 'validation_data'):
    record_type = getattr(config, key).record_type
    if record_type != expected:
      raise ValueError(
          f'task.{key}.record_type={record_type!r} but '
          f'task.model.backbone.type={backbone!r} takes {expected}-level '
          "records: video-level records need the 'identity' backbone, "
          'frame-level ones a frame backbone (dbof, nextvlad, lstm, ...).')


def _check_input_scaling(config: configs.YT8MTask) -> None:
  """Raises ValueError unless both splits undo the same PCA whitening."""
  keys = ('reverse_whitening_feature', 'pca_eigenvalues_path')
  train = tuple(getattr(config.train_data, k) for k in keys)
  validation = tuple(getattr(config.validation_data, k) for k in keys)
  if train != validation:
    raise ValueError(
        f'task.train_data.{keys[0]}/{keys[1]}={train} but '
        f'task.validation_data.{keys[0]}/{keys[1]}={validation}: the model '
        'would be evaluated on inputs of another scale; set the same in '
        'both.')


@task_factory.register_task_cls(configs.YT8MTask)
class YT8MTask(base_task.Task):
  """YouTube-8M classification on frame- or video-level records.

  Attributes:
    analytic_l2_gradient: add the L2 gradient analytically and compute its
      value outside the step's XLA function (False: through `model.losses`
      inside the step, as Model Garden's task does).
  """

  def __init__(self, params: configs.YT8MTask,
               logging_dir: Optional[str] = None, name: Optional[str] = None):
    super().__init__(params, logging_dir=logging_dir, name=name)
    self.analytic_l2_gradient = True
    # The validation input's files once resolved (demo data or input_path),
    # for the error of an evaluation of no video.
    self._validation_source: Optional[str] = None
    # {metric prefix: AP accumulator}: one per evaluated level.
    self._ap_accumulators = _ap_accumulators(params)
    evaluation = params.evaluation
    if evaluation.num_best_worst_classes < 0:
      raise ValueError('task.evaluation.num_best_worst_classes='
                       f'{evaluation.num_best_worst_classes}; expected >= 0.')
    reduction = params.losses.class_reduction
    if reduction not in CLASS_REDUCTIONS:
      raise ValueError(f'task.losses.class_reduction={reduction!r}; expected '
                       f'one of {CLASS_REDUCTIONS}.')
    self._class_names = None  # By class id, for the evaluation log.
    if evaluation.vocabulary_path:
      self._class_names = class_names.load_vocabulary(
          evaluation.vocabulary_path, params.validation_data.num_classes,
          key='task.evaluation.vocabulary_path')
    # (model, its (kernel, l2) pairs): computed once per model.
    self._l2_model: Optional[tf_keras.Model] = None
    self._l2_pairs = None
    self._jit_fn = None  # `_forward_backward` compiled with XLA, once.

  # -- model -----------------------------------------------------------------
  def build_model(self) -> tf_keras.Model:
    data = self.task_config.train_data
    _check_record_type(self.task_config)
    _check_input_scaling(self.task_config)
    model = yt8m_model.build_model(
        self.task_config.model,
        num_classes=data.num_classes,
        input_feature_size=sum(data.feature_sizes),
        l2_weight_decay=self.task_config.losses.l2_weight_decay)
    logging.info('YT8M model: %d trainable variables, %d parameters.',
                 len(model.trainable_variables),
                 sum(int(np.prod(v.shape)) for v in model.trainable_variables))
    return model

  def initialize(self, model: tf_keras.Model):
    """Restores `task.init_checkpoint_modules` from `task.init_checkpoint`.

    Called only when model_dir has no checkpoint; strict for the modules named.

    Raises:
      ValueError: an unknown `init_checkpoint_modules`, no checkpoint at
        `init_checkpoint`, or a checkpoint that does not match those modules.
    """
    path = self.task_config.init_checkpoint
    if not path:
      return
    modules = self.task_config.init_checkpoint_modules
    if modules not in _INIT_MODULES:
      raise ValueError(
          f'task.init_checkpoint_modules={modules!r}: expected one of '
          f'{list(_INIT_MODULES)} (with task.init_checkpoint={path!r}).')
    prefix, restored = checkpoints.restore_modules(
        model, path, _INIT_MODULES[modules], key='task.init_checkpoint')
    items = sorted(getattr(model, 'checkpoint_items', {}))
    fresh = [m for m in items if m not in (_INIT_MODULES[modules] or items)]
    logging.info(
        'task.init_checkpoint: initialized %s from %s (%d variables: %s)%s.',
        modules, prefix, len(restored), ', '.join(restored),
        f'; freshly initialized: {", ".join(fresh)}' if fresh else '')

  # -- data ------------------------------------------------------------------
  def _resolve_input_path(self, params: configs.DataConfig
                          ) -> configs.DataConfig:
    if params.input_path:
      return params
    key = ('task.train_data.input_path' if params.is_training else
           'task.validation_data.input_path')
    if not self.task_config.demo_data.enabled:
      level, public = (('video', configs.YT8M_PUBLIC_VIDEO_TRAIN_PATH)
                       if params.record_type == 'video' else
                       ('frame', configs.YT8M_PUBLIC_TRAIN_PATH))
      raise ValueError(
          f'{key} is empty: point it at YouTube-8M {level}-level TFRecords '
          f'(e.g. a copy of {public}), or set '
          'task.demo_data.enabled=true to train on generated data.')
    train_pattern, validation_pattern = demo_data.ensure_demo_data(
        self.task_config)
    pattern = train_pattern if params.is_training else validation_pattern
    logging.info('%s is empty: using generated demo data %s', key, pattern)
    return params.replace(input_path=pattern)

  def validation_dataset(self):
    """(dataset, config keys) for the error of an evaluation of no video."""
    return eval_padding.describe_split(
        self.task_config.validation_data,
        resolved_input_path=self._validation_source)

  def build_inputs(self, params: configs.DataConfig,
                   input_context: Optional[tf.distribute.InputContext] = None
                   ) -> tf.data.Dataset:
    """Builds the batched dataset of one split."""
    resolved = self._resolve_input_path(params)
    if not params.is_training:
      self._validation_source = resolved.input_path
    build = dataloader.build_dataset
    if (not params.is_training and
        self.task_config.evaluation.video_and_segment_level):
      build = dataloader.build_video_and_segment_dataset
    return build(
        resolved, input_context=input_context,
        bad_records=bad_records.log_for_split(self, params.is_training))

  # -- losses and metrics ------------------------------------------------------
  def build_losses(self, labels: tf.Tensor, model_outputs: tf.Tensor,
                   label_weights: Optional[tf.Tensor] = None,
                   aux_losses: Optional[List[tf.Tensor]] = None
                   ) -> Dict[str, tf.Tensor]:
    """Sigmoid cross-entropy (+ `aux_losses`, the regularization).

    `label_weights` (float32 [batch, classes]) restrict the loss to the rated
    entries. Returns {'total_loss', 'model_loss'}.
    """
    model_loss = self._cross_entropy(labels, model_outputs, label_weights)
    total_loss = model_loss
    if aux_losses:
      total_loss += tf.add_n([tf.cast(l, tf.float32) for l in aux_losses])
    return {'total_loss': total_loss, 'model_loss': model_loss}

  def _cross_entropy(self, labels: tf.Tensor, model_outputs: tf.Tensor,
                     label_weights: Optional[tf.Tensor]) -> tf.Tensor:
    """The batch's cross-entropy, reduced per `losses.class_reduction`."""
    losses_config = self.task_config.losses
    per_entry = tf_keras.losses.binary_crossentropy(
        labels[..., tf.newaxis], model_outputs[..., tf.newaxis],
        from_logits=losses_config.from_logits,
        label_smoothing=losses_config.label_smoothing)
    if losses_config.class_reduction == 'sum':
      if label_weights is None:
        return tf_utils.safe_mean(tf.reduce_sum(per_entry, axis=-1))
      rated = tf.reduce_sum(tf.cast(
          tf.reduce_max(label_weights, axis=-1) > 0, tf.float32))
      return tf.math.divide_no_nan(
          tf.reduce_sum(per_entry * label_weights), rated)
    if label_weights is None:
      return tf_utils.safe_mean(per_entry)
    return tf.math.divide_no_nan(tf.reduce_sum(per_entry * label_weights),
                                 tf.reduce_sum(label_weights))

  def _add_mixture_losses(self, all_losses: Dict[str, tf.Tensor],
                          outputs: Dict[str, tf.Tensor], labels: tf.Tensor,
                          label_weights: Optional[tf.Tensor]
                          ) -> Dict[str, tf.Tensor]:
    """Adds the NeXtVLAD mixture's `branch_loss` and `distillation_loss`."""
    if 'branch_predictions' not in outputs:
      return all_losses
    branches = tf.cast(outputs['branch_predictions'], tf.float32)
    branch_loss = tf.add_n([
        self._cross_entropy(labels, branches[:, i], label_weights)
        for i in range(branches.shape[1])])
    distillation = tf.cast(outputs['distillation_loss'], tf.float32)
    all_losses = dict(all_losses)
    all_losses['total_loss'] += branch_loss + distillation
    all_losses.update(branch_loss=branch_loss, distillation_loss=distillation)
    return all_losses

  def build_metrics(self, training: bool = True):
    """Mean losses; in evaluation also the streaming AP accumulator."""
    names = ['total_loss', 'model_loss']
    if training and self.task_config.model.backbone.type == 'mix_nextvlad':
      names += ['branch_loss', 'distillation_loss']
    metrics = [tf_keras.metrics.Mean(name, dtype=tf.float32)
               for name in names]
    metrics += bad_records.task_metrics(  # `bad_records_skipped`.
        self, self.task_config.train_data if training else
        self.task_config.validation_data, training)
    if not training:  # `num_examples`; 0 at the end of an eval is an error.
      metrics.append(eval_padding.EvaluatedExamples(self.validation_dataset))
    return metrics

  def process_metrics(self, metrics, labels, outputs, model_losses=None,
                      label_weights=None, training=True, example_mask=None,
                      segment_level=None, **kwargs):
    """Updates the loss metrics; in evaluation returns the AP inputs.

    `example_mask` marks real (not padding) rows, `segment_level` the
    segment-level rows of a `video_and_segment_level` evaluation.
    """
    model_losses = model_losses or {}
    logs = {}
    if not training and self.task_config.evaluation.average_precision:
      ap_inputs = {'labels': labels, 'predictions': outputs}
      if label_weights is not None:
        ap_inputs['label_weights'] = label_weights
      if example_mask is not None:
        ap_inputs['example_mask'] = example_mask
      if segment_level is not None:
        ap_inputs[dataloader.SEGMENT_LEVEL] = segment_level
      # With several workers, every worker accumulates all replicas' rows.
      logs[_AP_KEY] = host_gather.gather_for_host(ap_inputs)
    for m in metrics:
      if isinstance(m, eval_padding.EvaluatedExamples):
        if not training:
          m.update_state(eval_padding.example_mask(
              {} if example_mask is None else
              {eval_padding.MASK_KEY: example_mask}, tf.shape(labels)[0]))
      elif m.name in model_losses:
        m.update_state(model_losses[m.name])
        logs[m.name] = m.result()
    return logs

  # -- steps -----------------------------------------------------------------
  def _model_inputs(self, inputs, data_config: configs.DataConfig):
    # With frame sampling (video level) every frame is valid: skip the mask.
    # Segment mode never samples: its segments end in padding.
    sampled = (data_config.num_sample_frames is not None and
               not data_config.segment_labels)
    num_frames = None if sampled else tf.reshape(inputs['num_frames'], [-1])
    return inputs['video_matrix'], num_frames

  def _l2_kernels(self, model):
    """(kernel, l2) pairs of the model's L2 regularization, or None."""
    if not self.analytic_l2_gradient:
      return None
    if self._l2_model is not model:
      self._l2_model = model
      self._l2_pairs = gradients.l2_regularized_kernels(model)
    return self._l2_pairs

  def _forward_backward(self, model, optimizer, features, num_frames, labels,
                        label_weights):
    """Forward pass, losses and this replica's unscaled gradients.

    With analytic L2 the L2 term's gradient is added here and its value left
    to `train_step`, outside this (possibly XLA-compiled) function.
    """
    num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
    l2_pairs = self._l2_kernels(model)
    with tf.GradientTape() as tape:
      outputs = model(features, num_frames=num_frames, training=True)
      predictions = tf.cast(outputs['predictions'], tf.float32)
      all_losses = self.build_losses(
          labels=labels, model_outputs=predictions,
          label_weights=label_weights,
          aux_losses=model.losses if l2_pairs is None else None)
      all_losses = self._add_mixture_losses(all_losses, outputs, labels,
                                            label_weights)
      # Gradients are summed over replicas: scale to the global-batch mean.
      scaled_loss = gradients.scale_loss(
          optimizer, all_losses['total_loss'] / num_replicas)
    grads = gradients.unscale_gradients(
        optimizer, tape.gradient(scaled_loss, model.trainable_variables))
    if l2_pairs:
      grads = gradients.add_l2_gradients(
          grads, model.trainable_variables, l2_pairs, scale=1.0 / num_replicas)
    return predictions, all_losses, grads

  def _use_jit(self) -> bool:
    # Synchronized batch norm all-reduces inside the forward pass, which XLA
    # cannot compile on CPU/GPU replicas; TPU programs are XLA anyway.
    return (self.task_config.jit_compile and
            not self.task_config.model.norm_activation.use_sync_bn)

  @property
  def _jit_forward_backward(self):
    if self._jit_fn is None:
      self._jit_fn = tf.function(self._forward_backward, jit_compile=True)
    return self._jit_fn

  def train_step(self, inputs, model, optimizer, metrics=None):
    """One training step: forward, loss / replicas, gradients, clipping."""
    features, num_frames = self._model_inputs(
        inputs, self.task_config.train_data)
    labels = inputs['labels']
    label_weights = inputs.get('label_weights')
    forward_backward = self._forward_backward
    if self._use_jit():
      forward_backward = self._jit_forward_backward
    predictions, all_losses, grads = forward_backward(
        model, optimizer, features, num_frames, labels, label_weights)
    l2_pairs = self._l2_kernels(model)
    if l2_pairs:
      all_losses = dict(all_losses)
      all_losses['total_loss'] += gradients.l2_loss(l2_pairs)
    loss = all_losses['total_loss']
    gradients.apply_gradients(optimizer, grads, model.trainable_variables,
                              self.task_config.gradient_clip_norm,
                              self.task_config.gradient_clip_per_variable)
    logs = {self.loss: loss}
    logs.update(self.process_metrics(
        metrics, labels=labels, outputs=predictions, model_losses=all_losses,
        training=True))
    return logs

  def inference_step(self, inputs, model):
    features, num_frames = self._model_inputs(
        inputs, self.task_config.validation_data)
    return model(features, num_frames=num_frames, training=False)

  def validation_step(self, inputs, model, metrics=None):
    """One evaluation step; padding rows count in no loss and no metric."""
    predictions = tf.cast(self.inference_step(inputs, model)['predictions'],
                          tf.float32)
    labels = inputs['labels']
    label_weights = inputs.get('label_weights')
    example_mask = inputs.get(eval_padding.MASK_KEY)
    loss_weights = label_weights
    if example_mask is not None:  # Padding rows get loss weight 0.
      rows = tf.cast(example_mask, tf.float32)[:, tf.newaxis]
      loss_weights = rows * (tf.ones_like(labels) if label_weights is None
                             else label_weights)
    all_losses = self.build_losses(
        labels=labels, model_outputs=predictions, label_weights=loss_weights,
        aux_losses=model.losses)
    logs = {self.loss: all_losses['total_loss']}
    logs.update(self.process_metrics(
        metrics, labels=labels, outputs=predictions, model_losses=all_losses,
        label_weights=label_weights, training=False,
        example_mask=example_mask,
        segment_level=inputs.get(dataloader.SEGMENT_LEVEL)))
    return logs

  # -- AP aggregation on the host ---------------------------------------------
  def aggregate_logs(self, state=None, step_outputs=None):
    """Accumulates every local replica's rows into the AP accumulators.

    With `video_and_segment_level` each row goes to its level's accumulator.
    """
    if self.task_config.evaluation.average_precision is None:
      return state
    if state is None:
      for accumulator in self._ap_accumulators.values():
        accumulator.reset()
      state = self._ap_accumulators
    ap_inputs = {key: np.concatenate(host_gather.host_parts(values), axis=0)
                 for key, values in step_outputs[_AP_KEY].items()}
    segment_level = ap_inputs.pop(dataloader.SEGMENT_LEVEL, None)
    if segment_level is None:
      levels = {'': (slice(None), True)}
    else:
      segment_level = segment_level.astype(bool)
      levels = {_VIDEO_PREFIX: (~segment_level, False),
                _SEGMENT_PREFIX: (segment_level, True)}
    for prefix, (rows, weighted) in levels.items():
      state[prefix].accumulate(
          predictions=ap_inputs['predictions'][rows],
          labels=ap_inputs['labels'][rows],
          label_weights=(ap_inputs['label_weights'][rows]
                         if weighted and 'label_weights' in ap_inputs
                         else None),
          example_mask=(ap_inputs['example_mask'][rows]
                        if 'example_mask' in ap_inputs else None))
    return state

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    """The AP metrics of each level; logs the best and worst classes.

    Raises:
      EmptyEvaluationError: a level accumulated no example.
    """
    ap_config = self.task_config.evaluation.average_precision
    if ap_config is None or aggregated_logs is None:
      return {}
    step = (global_step if global_step is not None else
            tf.summary.experimental.get_step())
    num_listed = self.task_config.evaluation.num_best_worst_classes
    out = {}
    for prefix, accumulator in aggregated_logs.items():
      dataset, settings = self.validation_dataset()
      if prefix == _SEGMENT_PREFIX:
        dataset += (' at segment level (task.evaluation.'
                    'video_and_segment_level: no rated segment)')
      eval_padding.check_examples_seen(accumulator.num_videos, dataset,
                                       settings)
      results = accumulator.result(return_per_class_ap=True)
      class_positives = accumulator.class_positives
      if num_listed:
        logging.info('%s%s', f'[{prefix[:-1]}] ' if prefix else '',
                     class_names.best_and_worst_classes(
            results['per_class_ap'], class_positives, num_listed,
            self._class_names))
      if ap_config.return_per_class_ap:
        _write_per_class_ap(prefix, results, class_positives,
                            accumulator.top_n, step)
      accumulator.reset()
      out.update({prefix + key: value for key, value in results.items()
                  if not key.startswith('per_class_ap')})
    return out
