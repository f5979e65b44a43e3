"""The YouTube-8M video classification model: a registered backbone + head."""
from typing import Any, Dict, Mapping, Optional, Union

import tensorflow as tf, tf_keras

from official_ext.yt8m import configs
# The backbone and head modules register their builders with `factory`.
from official_ext.yt8m.modeling import dbof  # pylint: disable=unused-import
from official_ext.yt8m.modeling import factory
from official_ext.yt8m.modeling import heads  # pylint: disable=unused-import
from official_ext.yt8m.modeling import mix_nextvlad
from official_ext.yt8m.modeling import nextvlad  # pylint: disable=unused-import
from official_ext.yt8m.modeling import starter  # pylint: disable=unused-import
from official_ext.yt8m.modeling import willow  # pylint: disable=unused-import

ModelConfig = Union[configs.VideoClassificationModel, Mapping[str, Any]]


def _as_config(model_config: ModelConfig) -> configs.VideoClassificationModel:
  if isinstance(model_config, configs.VideoClassificationModel):
    return model_config
  config = configs.VideoClassificationModel()
  config.override(dict(model_config), is_strict=True)
  return config


class VideoClassificationModel(tf_keras.Model):
  """Frame features -> video-level class probabilities.

  `model(inputs [batch, frames, F], num_frames [batch] or None, training)`
  -> {'predictions': float32 [batch, C]}; a backbone keeping the frames adds
  'frame_predictions' (the head per frame, averaged over the valid frames),
  the mixture 'logits' and in training 'branch_predictions' and
  'distillation_loss'. Video level ('identity'): inputs [batch, F], no
  backbone. Variables and checkpoint items: `backbone/`, `head/`.
  """

  def __init__(self,
               model_config: ModelConfig,
               num_classes: int,
               input_feature_size: int = 1152,
               l2_weight_decay: Optional[float] = None,
               **kwargs):
    """Builds the model.

    Args:
      model_config: `configs.VideoClassificationModel` or its dict.
      num_classes: number of classes.
      input_feature_size: per-frame feature width.
      l2_weight_decay: L2 decay of the dense kernels, added to `model.losses`
        as decay / 2 * sum(w^2).
      **kwargs: tf_keras.Model arguments.
    """
    super().__init__(**kwargs)
    params = _as_config(model_config)
    self._params = params
    regularizer = (tf_keras.regularizers.l2(l2_weight_decay / 2.0)
                   if l2_weight_decay else None)
    self.backbone = factory.build_backbone(params, regularizer)
    self.head = factory.build_head(params, num_classes, regularizer)
    self._config_dict = dict(
        model_config=params.as_dict(), num_classes=num_classes,
        input_feature_size=input_feature_size, l2_weight_decay=l2_weight_decay)
    self._num_classes = num_classes
    self._input_feature_size = input_feature_size

  def call(self, inputs: tf.Tensor, num_frames: Optional[tf.Tensor] = None,
           training=None) -> Dict[str, tf.Tensor]:
    video_level = self.backbone is None
    if inputs.shape.rank != (2 if video_level else 3):
      raise ValueError(
          f'task.model.backbone.type={self._params.backbone.type!r} takes '
          + ('video-level features [batch, features] (DataConfig.record_type='
             "'video')" if video_level else 'frame features [batch, frames, '
             "features] (DataConfig.record_type='frame')")
          + f'; got inputs of shape {inputs.shape}.')
    if video_level:
      if self._params.backbone.identity.l2_normalize:
        inputs = tf.math.l2_normalize(inputs, axis=-1)
      return self.head(inputs, training=training)
    features = self.backbone(inputs, num_frames=num_frames, training=training)
    if isinstance(self.backbone, mix_nextvlad.MixNextVlad):
      outputs = self.head(features, training=training)
      result = {'predictions': outputs['predictions'],
                'logits': outputs['logits']}
      if training:
        distillation = self._params.backbone.mix_nextvlad
        weight = distillation.distillation_weight
        temperature = distillation.distillation_temperature
        result['branch_predictions'] = outputs['branch_predictions']
        result['distillation_loss'] = mix_nextvlad.distillation_loss(
            outputs['logits'], outputs['branch_logits'], temperature, weight)
      return result
    if features.shape.rank == 2:
      return self.head(features, training=training)
    # A backbone that keeps the frames: the head scores each frame.
    batch = tf.shape(features)[0]
    frames = tf.shape(features)[1]
    flat = tf.reshape(features, [batch * frames, features.shape[-1]])
    outputs = self.head(flat, training=training)
    per_frame = tf.reshape(outputs['predictions'],
                           [batch, frames, self._num_classes])
    if num_frames is None:
      pooled = tf.reduce_mean(per_frame, axis=1)
    else:
      valid = tf.sequence_mask(tf.reshape(num_frames, [-1]),
                               frames)[:, :, tf.newaxis]
      # Selected, not multiplied by the mask (NaN * 0 is NaN).
      pooled = tf.math.divide_no_nan(
          tf.reduce_sum(tf.where(valid, per_frame, tf.zeros_like(per_frame)),
                        axis=1),
          tf.reduce_sum(tf.cast(valid, per_frame.dtype), axis=1))
    return {'predictions': pooled, 'frame_predictions': per_frame}

  def get_config(self) -> Dict[str, Any]:
    return dict(self._config_dict)

  @classmethod
  def from_config(cls, config, custom_objects=None):
    return cls(**config)

  @property
  def checkpoint_items(self) -> Dict[str, Any]:
    if self.backbone is None:
      return dict(head=self.head)
    return dict(backbone=self.backbone, head=self.head)


def build_model(model_config: ModelConfig, num_classes: int,
                input_feature_size: int,
                l2_weight_decay: Optional[float] = None
                ) -> VideoClassificationModel:
  """Builds the model and creates its variables with a symbolic call."""
  model = VideoClassificationModel(
      model_config, num_classes=num_classes,
      input_feature_size=input_feature_size, l2_weight_decay=l2_weight_decay)
  frames = [] if model.backbone is None else [1]  # Video level: no frames.
  model(tf.zeros([1, *frames, input_feature_size], tf.float32),
        num_frames=tf.ones([1], tf.int32), training=False)
  return model


@factory.register_backbone_builder('identity')
def build_identity(model_config, l2_regularizer, name='backbone') -> None:
  """No backbone: the head reads the video-level features."""
  del model_config, l2_regularizer, name
  return None
