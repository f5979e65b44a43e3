"""How AssembleNet++lite joins a node's inputs: `PeerAttentionFusion`, and the
pooled copies and spatial means of node outputs it takes (`SpatialMaxPool`,
`SpatialMean`); the steps and variable names: docs/assemblenet.md#the-network."""
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf, tf_keras

from official_ext.assemblenet.modeling import convolutions
from official_ext.assemblenet.modeling import recompute

ATTENTION_MODES = (None, 'self', 'peer')


def spatial_max_pool(x: tf.Tensor, r: int) -> tf.Tensor:
  """`tf.nn.max_pool3d(x, [1, 1, r, r, 1], [1, 1, r, r, 1], 'SAME')` as a 2-D
  max pool of every frame (the same values, in an op TFLite has): [B, T, H,
  W, C] -> [B, T, ceil(H / r), ceil(W / r), C]."""
  b, t, h, w, c = convolutions.dims(x)
  pooled = tf.nn.max_pool2d(tf.reshape(x, [-1, h, w, c]), r, r, 'SAME')
  out = tf.reshape(pooled, [b, t, *convolutions.dims(pooled)[1:]])
  out.set_shape([x.shape[0], x.shape[1], *pooled.shape[1:]])
  return out



class SpatialMaxPool(tf_keras.layers.Layer):
  """`spatial_max_pool(x, ratio)` as a layer; the backbone pools a node's
  output once per ratio for every fusion that takes it at that size."""

  def __init__(self, ratio: int, **kwargs):
    super().__init__(**kwargs)
    if ratio < 2:
      raise ValueError(f'{self.name}: pooling ratio must be >= 2; got '
                       f'{ratio}.')
    self._ratio = ratio

  def call(self, inputs):
    return spatial_max_pool(inputs, self._ratio)

  def get_config(self):
    config = super().get_config()
    config.update(ratio=self._ratio)
    return config


class SpatialMean(tf_keras.layers.Layer):
  """Mean over height and width, [B, T, H, W, C] -> [B, T, C]: a node's
  peer-attention source, computed once per node for every fusion."""

  def call(self, inputs):
    return tf.reduce_mean(inputs, axis=[2, 3])



def original_fusion_width(shapes: Sequence[Sequence[Optional[int]]]) -> int:
  """The original's 5-D fusion width: its loop `if C > lg: lg = shape[3]`
  takes `shape[3]`, an NTHWC tensor's width, as the projections' channel
  count."""
  lg = 0
  for s in shapes:
    if s[-1] > lg:
      lg = s[3]
  return lg


class PeerAttentionFusion(tf_keras.layers.Layer):
  """Fuses a node's inputs: edge weights, attention, 1x1x1 projections, sum.

  Called on `inputs + peers`: the node's `num_inputs` tensors [B, T, H_i,
  W_i, C_i], then for 'peer' attention every lower-level node's output or its
  spatial mean [B, T, C_k]; returns [B, T, H_min, W_min, fusion width]. With
  `recompute_grad`, training calls run through `recompute.recompute_grad`
  (only the inputs kept). The inputs indexed by `width_excluded` (object
  inputs, as AssembleNet++ leaves them out) do not count toward the fusion
  width. The steps: docs/assemblenet.md#the-network."""

  def __init__(self, num_inputs: int, attention_mode: Optional[str] = None,
               edge_weights: Optional[Sequence[float]] = None,
               fusion_width_as_channels: bool = False,
               kernel_regularizer=None, recompute_grad: bool = False,
               width_excluded: Sequence[int] = (),
               **kwargs):
    super().__init__(**kwargs)
    self._width_excluded = tuple(sorted(int(i) for i in width_excluded))
    if any(not 0 <= i < num_inputs for i in self._width_excluded):
      raise ValueError(f'{self.name}: width_excluded {self._width_excluded} '
                       f'must index the {num_inputs} inputs.')
    if fusion_width_as_channels and self._width_excluded:
      raise ValueError(f'{self.name}: width_excluded is not defined with '
                       'fusion_width_as_channels.')
    self._recompute_grad = recompute_grad
    if attention_mode not in ATTENTION_MODES:
      raise ValueError(f'attention_mode must be one of {ATTENTION_MODES}; '
                       f'got {attention_mode!r}.')
    if edge_weights is not None and len(edge_weights) != num_inputs:
      raise ValueError(f'{self.name}: {len(edge_weights)} edge weights for '
                       f'{num_inputs} inputs.')
    self._num_inputs = num_inputs
    self._attention_mode = attention_mode
    self._edge_weights = (None if edge_weights is None else
                          [float(w) for w in edge_weights])
    self._fusion_width_as_channels = fusion_width_as_channels
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)

  def build(self, input_shape):
    shapes = [tf.TensorShape(s).as_list() for s in input_shape]
    in_shapes, peer_shapes = shapes[:self._num_inputs], shapes[self._num_inputs:]
    for k, s in enumerate(peer_shapes):
      if len(s) not in (3, 5):
        raise ValueError(f'{self.name}: peer {k} must be a node output [B, T, '
                         f'H, W, C] or its spatial mean [B, T, C]; got shape '
                         f'{s}.')
    for s in in_shapes:
      if None in s[2:]:
        raise ValueError(f'{self.name}: fusion needs static height, width and '
                         f'channels; got input shape {s}.')
    self._sm_h = min(s[2] for s in in_shapes)
    self._sm_w = min(s[3] for s in in_shapes)
    self._ratios = []
    for s in in_shapes:
      if s[2] != self._sm_h or s[3] != self._sm_w:
        self._ratios.append((s[2] + 1) // self._sm_h)
      else:
        self._ratios.append(1)
    if self._fusion_width_as_channels:
      self._width = original_fusion_width(in_shapes)
    elif len(in_shapes) == 1:
      self._width = in_shapes[0][-1]  # A single input passes unprojected.
    else:
      counted = [s[-1] for i, s in enumerate(in_shapes)
                 if i not in self._width_excluded]
      if not counted:
        raise ValueError(f'{self.name}: every input is excluded from the '
                         'fusion width (width_excluded '
                         f'{self._width_excluded}); the fusion needs one '
                         'counted input.')
      self._width = max(counted)
    self._channels = [s[-1] for s in in_shapes]
    groups: Dict[int, List[int]] = {}
    for i, c in enumerate(self._channels):
      groups.setdefault(c, []).append(i)
    # (channels, input indices) pairs in first-seen order; a tuple so Keras
    # does not track it.
    self._groups = tuple((c, tuple(ids)) for c, ids in groups.items())

    if self._num_inputs > 1:
      if self._edge_weights is None:
        init = tf_keras.initializers.TruncatedNormal(mean=0.0, stddev=0.01)
        trainable = True
      else:
        # In float32, as the original computes them (bit for bit).
        w = np.asarray(self._edge_weights).astype(np.float32)
        init = tf_keras.initializers.Constant(-np.log(1.0 / w - 1.0))
        trainable = False
      self.agg_weights = self.add_weight(
          name='agg_weights', shape=[self._num_inputs], initializer=init,
          trainable=trainable, dtype=tf.float32)

    dense = lambda units, name: tf_keras.layers.Dense(  # pylint: disable=g-long-lambda
        units, kernel_initializer=tf_keras.initializers.RandomNormal(
            stddev=0.01), kernel_regularizer=self._kernel_regularizer,
        name=name)
    self._peer_dense = []
    self._peer_weights = []
    self._attention_dense = []
    if self._attention_mode == 'peer':
      if not peer_shapes:
        raise ValueError(f'{self.name}: attention "peer" needs peer inputs.')
      peer_width = max(s[-1] for s in peer_shapes)
      self._peer_dense = [dense(peer_width, f'peer_dense_{k}')
                          for k in range(len(peer_shapes))]
      for i in range(self._num_inputs):
        self._peer_weights.append(self.add_weight(
            name=f'attention_{i}_peer_weights', shape=[len(peer_shapes)],
            initializer=tf_keras.initializers.TruncatedNormal(stddev=0.01),
            trainable=True, dtype=tf.float32))
    if self._attention_mode:
      for i, c in enumerate(self._channels):
        self._attention_dense.append(dense(c, f'attention_{i}'))
    projections = {}
    for c, _ in self._groups:
      if c != self._width:
        conv = convolutions.conv3d_same_padding(
            self._width, 1, kernel_regularizer=self._kernel_regularizer,
            name=f'project_{c}')
        projections[str(c)] = conv
    self._projections = projections
    super().build(input_shape)

  def call(self, inputs, training=None):
    inputs = list(inputs)
    if self._recompute_grad and training is True:
      return recompute.recompute_grad(lambda *xs: self._fuse(list(xs)))(*inputs)
    return self._fuse(inputs)

  def _fuse(self, inputs):
    xs = list(inputs[:self._num_inputs])
    peers = list(inputs[self._num_inputs:])
    dtype = xs[0].dtype
    candidates = None
    if self._attention_mode == 'peer':
      candidates = [d(p if p.shape.rank == 3 else tf.reduce_mean(p, [2, 3]))
                    for d, p in zip(self._peer_dense, peers)]
    if self._num_inputs > 1:
      weights = tf.cast(tf.math.sigmoid(self.agg_weights), dtype)
    for i, x in enumerate(xs):
      r = self._ratios[i]
      if r > 1:
        x = spatial_max_pool(x, r)
      if self._num_inputs > 1:
        x = weights[i] * x
      if self._attention_mode:
        if self._attention_mode == 'peer':
          mix = tf.cast(tf.nn.softmax(self._peer_weights[i]), candidates[0].dtype)
          vec = tf.add_n([mix[k] * v for k, v in enumerate(candidates)])
        else:
          vec = tf.reduce_mean(x, axis=[2, 3])
        attn = tf.math.sigmoid(self._attention_dense[i](vec))
        x = x * tf.cast(attn[:, :, tf.newaxis, tf.newaxis, :], x.dtype)
      xs[i] = x
    outs = []
    for c, members in self._groups:
      y = xs[members[0]] if len(members) == 1 else tf.add_n(
          [xs[j] for j in members])
      if c != self._width:
        y = self._projections[str(c)](y)
      outs.append(y)
    return outs[0] if len(outs) == 1 else tf.add_n(outs)

  @property
  def fusion_width(self) -> int:
    return self._width

  def get_config(self):
    config = super().get_config()
    config.update(
        num_inputs=self._num_inputs, attention_mode=self._attention_mode,
        edge_weights=self._edge_weights,
        fusion_width_as_channels=self._fusion_width_as_channels,
        recompute_grad=self._recompute_grad,
        kernel_regularizer=tf_keras.regularizers.serialize(
            self._kernel_regularizer) if self._kernel_regularizer else None)
    if self._width_excluded:
      config['width_excluded'] = list(self._width_excluded)
    return config
