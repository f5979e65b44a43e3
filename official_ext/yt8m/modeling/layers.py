"""Layers of the YouTube-8M models: context gating and masked frame pooling."""
from typing import Any, Mapping, Optional, Sequence, Tuple

import tensorflow as tf, tf_keras

from official.modeling import tf_utils


def check_feature_sizes(key: str, feature_sizes: Sequence[int],
                        width: int) -> None:
  """ValueError naming `key` unless `feature_sizes` add up to `width`."""
  if sum(feature_sizes) != width:
    raise ValueError(
        f'{key}.feature_sizes={feature_sizes} add up to {sum(feature_sizes)}, '
        f'but the frames have {width} features '
        '(task.train_data.feature_sizes); make them match.')


def mask_frames(inputs: tf.Tensor, num_frames: Optional[tf.Tensor]
                ) -> Tuple[tf.Tensor, Optional[tf.Tensor]]:
  """(float32 frames with the padded ones zeroed by selection, valid bool
  [batch, frames] or None when `num_frames` is None).
  """
  x = tf.cast(inputs, tf.float32)
  valid = None
  if num_frames is not None:
    valid = tf.sequence_mask(tf.reshape(num_frames, [-1]), tf.shape(x)[1])
    x = tf.where(valid[:, :, tf.newaxis], x, tf.zeros_like(x))
  return x, valid


def frame_mask(num_frames: Optional[tf.Tensor], max_frames: tf.Tensor,
               dtype: tf.DType) -> Optional[tf.Tensor]:
  """[batch, max_frames, 1] mask of the valid frames, or None."""
  if num_frames is None:
    return None
  mask = tf.sequence_mask(tf.reshape(num_frames, [-1]), max_frames, dtype=dtype)
  return mask[:, :, tf.newaxis]


def _large_negative(dtype: tf.DType) -> float:
  return float(dtype.min) if dtype in (tf.float16, tf.bfloat16) else -1e9


def pool_frames(frames: tf.Tensor, method: str,
                mask: Optional[tf.Tensor] = None) -> tf.Tensor:
  """Pools [batch, frames, F] over the valid frames: 'average', 'max' or
  'swap'; `mask` [batch, frames, 1] (None: all valid). Returns [batch, F].
  """
  valid = None if mask is None else mask > 0
  if method == 'average':
    if mask is None:
      return tf.reduce_mean(frames, axis=1)
    return tf.math.divide_no_nan(
        tf.reduce_sum(tf.where(valid, frames, tf.zeros_like(frames)), axis=1),
        tf.reduce_sum(mask, axis=1))
  if method == 'max':
    if mask is not None:
      frames = tf.where(valid, frames,
                        tf.cast(_large_negative(frames.dtype), frames.dtype))
    return tf.reduce_max(frames, axis=1)
  if method == 'swap':
    if mask is not None:
      frames = tf.where(valid, frames, tf.zeros_like(frames))
    weights = tf.abs(frames)
    return tf.math.divide_no_nan(
        tf.reduce_sum(weights * frames, axis=1), tf.reduce_sum(weights, axis=1))
  raise ValueError(
      f'Unknown pooling method {method!r}; expected one of average, max, swap '
      '(or none, handled by the model).')


class ContextGate(tf_keras.layers.Layer):
  """Context gating: y = x * sigmoid(BN(W x + b)) over the last axis."""

  def __init__(self,
               bottleneck_size: int = 0,
               use_batch_norm: bool = True,
               norm_momentum: float = 0.99,
               norm_epsilon: float = 1e-3,
               use_sync_bn: bool = False,
               kernel_regularizer: Optional[Any] = None,
               **kwargs):
    super().__init__(**kwargs)
    self._bottleneck_size = bottleneck_size
    self._use_batch_norm = use_batch_norm
    self._norm_momentum = norm_momentum
    self._norm_epsilon = norm_epsilon
    self._use_sync_bn = use_sync_bn
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)

  def _norm(self, name):
    return tf_keras.layers.BatchNormalization(
        momentum=self._norm_momentum, epsilon=self._norm_epsilon,
        synchronized=self._use_sync_bn, name=name)

  def build(self, input_shape):
    features = int(input_shape[-1])
    self._bottleneck = None
    if self._bottleneck_size >= 2:
      self._bottleneck = tf_keras.layers.Dense(
          self._bottleneck_size, activation='relu6',
          kernel_regularizer=self._kernel_regularizer, name='bottleneck')
      self._bottleneck_norm = (self._norm('bottleneck_norm')
                               if self._use_batch_norm else None)
    self._gates = tf_keras.layers.Dense(
        features, use_bias=not self._use_batch_norm,
        kernel_regularizer=self._kernel_regularizer, name='gates')
    self._gates_norm = self._norm('gates_norm') if self._use_batch_norm else None
    super().build(input_shape)

  def call(self, inputs, training=None):
    context = inputs
    if self._bottleneck is not None:
      context = self._bottleneck(context)
      if self._bottleneck_norm is not None:
        context = self._bottleneck_norm(context, training=training)
    gates = self._gates(context)
    if self._gates_norm is not None:
      gates = self._gates_norm(gates, training=training)
    return inputs * tf.sigmoid(gates)

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(
        bottleneck_size=self._bottleneck_size,
        use_batch_norm=self._use_batch_norm,
        norm_momentum=self._norm_momentum,
        norm_epsilon=self._norm_epsilon,
        use_sync_bn=self._use_sync_bn,
        kernel_regularizer=serialize_regularizer(self._kernel_regularizer))
    return config


class SeContextGate(tf_keras.layers.Layer):
  """NeXtVLAD's SE context gating: y = x * sigmoid(W2 relu(BN(W1 x))), the
  bottleneck F // reduction wide.
  """

  def __init__(self,
               reduction: int = 8,
               norm_momentum: float = 0.99,
               norm_epsilon: float = 1e-3,
               use_sync_bn: bool = False,
               kernel_regularizer: Optional[Any] = None,
               **kwargs):
    super().__init__(**kwargs)
    self._config = dict(reduction=reduction, norm_momentum=norm_momentum,
                        norm_epsilon=norm_epsilon, use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)

  def build(self, input_shape):
    features = int(input_shape[-1])
    bottleneck = features // self._config['reduction']
    if bottleneck < 1:
      raise ValueError(
          f'SeContextGate: {features} features // reduction '
          f'{self._config["reduction"]} leaves no bottleneck unit.')
    self._squeeze = tf_keras.layers.Dense(
        bottleneck, use_bias=False,
        kernel_initializer=variance_scaling_fan_in(),
        kernel_regularizer=self._kernel_regularizer, name='squeeze')
    self._squeeze_bn = tf_keras.layers.BatchNormalization(
        momentum=self._config['norm_momentum'],
        epsilon=self._config['norm_epsilon'],
        synchronized=self._config['use_sync_bn'], name='squeeze_bn')
    self._excite = tf_keras.layers.Dense(
        features, use_bias=False,
        kernel_initializer=variance_scaling_fan_in(),
        kernel_regularizer=self._kernel_regularizer, name='excite')
    super().build(input_shape)

  def call(self, inputs, training=None):
    gates = tf.nn.relu(self._squeeze_bn(self._squeeze(inputs),
                                        training=training))
    return inputs * tf.sigmoid(self._excite(gates))

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = serialize_regularizer(
        self._kernel_regularizer)
    return config


def variance_scaling_fan_in() -> tf_keras.initializers.Initializer:
  """`slim.variance_scaling_initializer()`: truncated normal, var 2 / fan_in."""
  return tf_keras.initializers.VarianceScaling(
      scale=2.0, mode='fan_in', distribution='truncated_normal')


def serialize_regularizer(regularizer) -> Optional[Mapping[str, Any]]:
  """A regularizer's get_config form for a layer config (None stays None)."""
  return (tf_keras.regularizers.serialize(regularizer)
          if regularizer is not None else None)


def get_activation(name: str):
  return tf_utils.get_activation(name)
