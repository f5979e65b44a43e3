"""The residual blocks of AssembleNet++lite and AssembleNet(++):
`BatchNormRelu`, the lite inverted-bottleneck `InvertedBottleneckBlock3D`
and `BlockGroup` (a node's blocks), AssembleNet's (2+1)-D
`InterleavedBottleneckBlock` and `InterleavedBlockGroup`; the variable names
(`conv_a`, `conv_b`, `conv_b_temporal`, `conv_c`, `shortcut`, their `bn_*`)
are the checkpoint interface."""
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
        filters=filters if isinstance(filters, int) else list(filters),
        num_blocks=num_blocks, strides=strides,
        temporal_dilation=temporal_dilation, recompute_grad=recompute_grad,
        bn_decay=bn_decay, bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    self._blocks = [self._block(b) for b in range(num_blocks)]

  def _block(self, b: int) -> tf_keras.layers.Layer:
    """Block b of the group (the first projects and strides)."""
    c = self._config
    return InvertedBottleneckBlock3D(
        c['filters'], strides=c['strides'] if b == 0 else 1,
        use_projection=(b == 0), temporal_dilation=c['temporal_dilation'],
        bn_decay=c['bn_decay'], bn_epsilon=c['bn_epsilon'],
        use_sync_bn=c['use_sync_bn'],
        kernel_regularizer=self._kernel_regularizer, name=f'block_{b}')

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


class InterleavedBottleneckBlock(tf_keras.layers.Layer):
  """AssembleNet's bottleneck block (the original's
  `bottleneck_block_interleave`), alternating 2-D and (2+1)-D by `step`:
  conv_a is a 1x1 conv to `filters` (step even) or a [3, 1, 1] temporal conv
  dilated by `temporal_dilation` (step odd; truncated normal
  sqrt(2 / (3 C_in)) when dilated, as the original); conv_b a per-frame 3x3
  conv with the stride (`convolutions.conv2d_fixed_padding`) to
  `inter_filters`; conv_c a 1x1 conv to 4 `filters` (BN gamma 0, no ReLU);
  each other conv with BN and ReLU. Shortcut: the input, or
  (`use_projection`) a strided 1x1 conv with BN. Output ReLU(branch +
  shortcut), [B, T, ceil(H / s), ceil(W / s), 4 filters]."""

  def __init__(self, filters: int, inter_filters: int, strides: int = 1,
               use_projection: bool = False, temporal_dilation: int = 1,
               step: int = 0, bn_decay: float = BATCH_NORM_DECAY,
               bn_epsilon: float = BATCH_NORM_EPSILON,
               use_sync_bn: bool = False, kernel_regularizer=None, **kwargs):
    super().__init__(**kwargs)
    if strides != 1 and not use_projection:
      raise ValueError(f'{self.name}: strides > 1 needs use_projection.')
    self._args = dict(filters=filters, inter_filters=inter_filters,
                      strides=strides, use_projection=use_projection,
                      temporal_dilation=temporal_dilation, step=step,
                      bn_decay=bn_decay, bn_epsilon=bn_epsilon,
                      use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    self._use_projection = use_projection
    self._temporal = step % 2 == 1
    reg = self._kernel_regularizer
    bn = lambda name, **kw: BatchNormRelu(  # pylint: disable=g-long-lambda
        bn_decay=bn_decay, bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn,
        name=name, **kw)
    if use_projection:
      self._shortcut = convolutions.conv2d_fixed_padding(
          4 * filters, 1, strides, kernel_regularizer=reg, name='shortcut')
      self._shortcut_bn = bn('bn_shortcut', relu=False)
    self._conv_a = None  # Built in build(): the temporal init needs C_in.
    self._bn_a = bn('bn_a')
    self._conv_b = convolutions.conv2d_fixed_padding(
        inter_filters, 3, strides, kernel_regularizer=reg, name='conv_b')
    self._bn_b = bn('bn_b')
    self._conv_c = convolutions.conv2d_fixed_padding(
        4 * filters, 1, kernel_regularizer=reg, name='conv_c')
    self._bn_c = bn('bn_c', relu=False, init_zero=True)

  def build(self, input_shape):
    c = self._args
    if self._temporal:
      init = None
      if c['temporal_dilation'] > 1:
        init = tf_keras.initializers.TruncatedNormal(
            stddev=math.sqrt(2.0 / (3 * int(input_shape[-1]))))
      self._conv_a = convolutions.conv3d_same_padding(
          c['filters'], [3, 1, 1], 1, c['temporal_dilation'],
          kernel_initializer=init, kernel_regularizer=self._kernel_regularizer,
          name='conv_a')
    else:
      self._conv_a = convolutions.conv2d_fixed_padding(
          c['filters'], 1, kernel_regularizer=self._kernel_regularizer,
          name='conv_a')
    super().build(input_shape)

  def call(self, inputs, training=None):
    shortcut = inputs
    if self._use_projection:
      shortcut = self._shortcut_bn(self._shortcut(inputs), training=training)
    x = self._bn_a(self._conv_a(inputs), training=training)
    x = self._bn_b(self._conv_b(x), training=training)
    x = self._bn_c(self._conv_c(x), training=training)
    return tf.nn.relu(x + shortcut)

  def get_config(self):
    config = super().get_config()
    config.update(self._args)
    config['kernel_regularizer'] = (
        tf_keras.regularizers.serialize(self._kernel_regularizer)
        if self._kernel_regularizer else None)
    return config


class InterleavedBlockGroup(BlockGroup):
  """A node's `num_blocks` AssembleNet blocks (`InterleavedBottleneckBlock`,
  block b at step b: the first projecting and striding, the odd ones
  temporal), `inter_filters` wide inside; output 4 `filters` channels."""

  def __init__(self, filters: int, inter_filters: int, num_blocks: int,
               strides: int, temporal_dilation: int = 1, **kwargs):
    self._inter_filters = inter_filters
    super().__init__(filters, num_blocks, strides, temporal_dilation,
                     **kwargs)

  def _block(self, b: int) -> tf_keras.layers.Layer:
    c = self._config
    return InterleavedBottleneckBlock(
        c['filters'], self._inter_filters,
        strides=c['strides'] if b == 0 else 1, use_projection=(b == 0),
        temporal_dilation=c['temporal_dilation'], step=b,
        bn_decay=c['bn_decay'], bn_epsilon=c['bn_epsilon'],
        use_sync_bn=c['use_sync_bn'],
        kernel_regularizer=self._kernel_regularizer, name=f'block_{b}')

  def get_config(self):
    config = super().get_config()
    config['inter_filters'] = self._inter_filters
    return config
