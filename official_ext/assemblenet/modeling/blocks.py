"""The residual blocks of AssembleNet++lite: `BatchNormRelu`, the lite
inverted-bottleneck `InvertedBottleneckBlock3D` and `BlockGroup` (a node's
blocks); the variable names (`conv_a`, `conv_b`, `conv_b_temporal`,
`conv_c`, `shortcut`, their `bn_*`) are the checkpoint interface."""
import math
from typing import Sequence

import tensorflow as tf, tf_keras

from official_ext.assemblenet.modeling import convolutions
from official_ext.assemblenet.modeling import recompute

BATCH_NORM_DECAY = 0.99
BATCH_NORM_EPSILON = 1e-5


class BatchNormRelu(tf_keras.layers.Layer):
  """Batch normalization (channels last; `momentum` is the original's
  `bn_decay`; `init_zero`: gamma 0, a residual branch's last BN), then an
  optional ReLU."""

  def __init__(self, relu: bool = True, init_zero: bool = False,
               bn_decay: float = BATCH_NORM_DECAY,
               bn_epsilon: float = BATCH_NORM_EPSILON,
               use_sync_bn: bool = False, **kwargs):
    super().__init__(**kwargs)
    self._relu = relu
    self._init_zero = init_zero
    self._bn_decay = bn_decay
    self._bn_epsilon = bn_epsilon
    self._use_sync_bn = use_sync_bn
    self._bn = recompute.BatchNormalization(
        axis=-1, momentum=bn_decay, epsilon=bn_epsilon,
        gamma_initializer='zeros' if init_zero else 'ones',
        synchronized=use_sync_bn, name='bn')

  def call(self, inputs, training=None):
    x = self._bn(inputs, training=training)
    return tf.nn.relu(x) if self._relu else x

  def get_config(self):
    config = super().get_config()
    config.update(relu=self._relu, init_zero=self._init_zero,
                  bn_decay=self._bn_decay, bn_epsilon=self._bn_epsilon,
                  use_sync_bn=self._use_sync_bn)
    return config



class InvertedBottleneckBlock3D(tf_keras.layers.Layer):
  """The lite inverted-bottleneck 3-D residual block, filters [f_a, f_b,
  f_out]: 1x1x1 conv to f_a; strided: a [1, 3, 3] conv with the stride and a
  [3, 1, 1] temporal conv (dilated; truncated normal sqrt(2 / (3 f_b)) when
  dilated, as the original), else a [3, 3, 3] conv dilated in time, to f_b;
  a 1x1x1 conv to f_out (BN gamma 0, no ReLU); each conv with BN and ReLU
  otherwise. Shortcut: the input, or (`use_projection`) a strided 1x1x1 conv
  with BN. Output ReLU(branch + shortcut), [B, T, ceil(H / s), ceil(W / s),
  f_out]."""

  def __init__(self, filters: Sequence[int], strides: int = 1,
               use_projection: bool = False, temporal_dilation: int = 1,
               bn_decay: float = BATCH_NORM_DECAY,
               bn_epsilon: float = BATCH_NORM_EPSILON,
               use_sync_bn: bool = False, kernel_regularizer=None, **kwargs):
    super().__init__(**kwargs)
    self._filters = list(filters)
    self._strides = strides
    self._use_projection = use_projection
    self._temporal_dilation = temporal_dilation
    self._bn_decay = bn_decay
    self._bn_epsilon = bn_epsilon
    self._use_sync_bn = use_sync_bn
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    reg = self._kernel_regularizer
    bn = lambda name, **kw: BatchNormRelu(  # pylint: disable=g-long-lambda
        bn_decay=bn_decay, bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn,
        name=name, **kw)
    f_a, f_b, f_out = self._filters
    self._layers = []
    if use_projection:
      self._shortcut = convolutions.conv3d_same_padding(
          f_out, 1, strides, kernel_regularizer=reg, name='shortcut')
      self._shortcut_bn = bn('bn_shortcut', relu=False)
    elif strides != 1:
      raise ValueError(f'{self.name}: strides > 1 needs use_projection.')
    self._layers += [convolutions.conv3d_same_padding(
        f_a, 1, kernel_regularizer=reg, name='conv_a'), bn('bn_a')]
    if strides > 1:
      temporal_init = None
      if temporal_dilation > 1:
        temporal_init = tf_keras.initializers.TruncatedNormal(
            stddev=math.sqrt(2.0 / (3 * f_b)))
      self._layers += [
          convolutions.conv3d_same_padding(
              f_b, 3, strides, do_2d_conv=True, kernel_regularizer=reg,
              name='conv_b'),
          bn('bn_b'),
          convolutions.conv3d_same_padding(
              f_b, [3, 1, 1], 1, temporal_dilation,
              kernel_initializer=temporal_init, kernel_regularizer=reg,
              name='conv_b_temporal'),
          bn('bn_b_temporal')]
    else:
      self._layers += [
          convolutions.conv3d_same_padding(
              f_b, [3, 3, 3], 1, temporal_dilation, kernel_regularizer=reg,
              name='conv_b'),
          bn('bn_b')]
    self._layers += [
        convolutions.conv3d_same_padding(f_out, 1, kernel_regularizer=reg,
                                         name='conv_c'),
        bn('bn_c', relu=False, init_zero=True)]

  def call(self, inputs, training=None):
    shortcut = inputs
    if self._use_projection:
      shortcut = self._shortcut_bn(self._shortcut(inputs), training=training)
    x = inputs
    for layer in self._layers:
      if isinstance(layer, BatchNormRelu):
        x = layer(x, training=training)
      else:
        x = layer(x)
    return tf.nn.relu(x + shortcut)

  def get_config(self):
    config = super().get_config()
    config.update(
        filters=self._filters, strides=self._strides,
        use_projection=self._use_projection,
        temporal_dilation=self._temporal_dilation, bn_decay=self._bn_decay,
        bn_epsilon=self._bn_epsilon, use_sync_bn=self._use_sync_bn,
        kernel_regularizer=tf_keras.regularizers.serialize(
            self._kernel_regularizer) if self._kernel_regularizer else None)
    return config


class BlockGroup(tf_keras.layers.Layer):
  """`num_blocks` inverted-bottleneck blocks, the first projecting and
  striding; with `recompute_grad` training calls run through
  `recompute.recompute_grad` (only the group's input kept)."""

  def __init__(self, filters: Sequence[int], num_blocks: int, strides: int,
               temporal_dilation: int = 1, recompute_grad: bool = False,
               bn_decay: float = BATCH_NORM_DECAY,
               bn_epsilon: float = BATCH_NORM_EPSILON,
               use_sync_bn: bool = False, kernel_regularizer=None, **kwargs):
    super().__init__(**kwargs)
    self._config = dict(
        filters=list(filters), num_blocks=num_blocks, strides=strides,
        temporal_dilation=temporal_dilation, recompute_grad=recompute_grad,
        bn_decay=bn_decay, bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    self._blocks = [
        InvertedBottleneckBlock3D(
            filters, strides=strides if b == 0 else 1,
            use_projection=(b == 0), temporal_dilation=temporal_dilation,
            bn_decay=bn_decay, bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn,
            kernel_regularizer=self._kernel_regularizer, name=f'block_{b}')
        for b in range(num_blocks)]

  def _forward(self, x, training):
    for block in self._blocks:
      x = block(x, training=training)
    return x

  def call(self, inputs, training=None):
    if self._config['recompute_grad'] and training is True:
      fn = recompute.recompute_grad(lambda x: self._forward(x, True))
      return fn(inputs)
    return self._forward(inputs, training)

  def get_config(self):
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = (
        tf_keras.regularizers.serialize(self._kernel_regularizer)
        if self._kernel_regularizer else None)
    return config
