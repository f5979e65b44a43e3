"""How AssembleNet++lite joins a node's inputs: `PeerAttentionFusion` (edge
weights, self or peer attention, 1x1x1 projections, sum), and the pooled
copies and spatial means of node outputs it takes (`SpatialMaxPool`,
`SpatialMean`).

Variable names are the checkpoint interface: a node's fusion holds
`agg_weights` (edge weights), `peer_dense_<k>` (peer candidate vectors),
`attention_<i>` / `attention_<i>_peer_weights` (per-connection attention)
and `project_<c>` (1x1x1 projection of the inputs with c channels).
"""
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf, tf_keras

from official_ext.assemblenet.modeling import convolutions
from official_ext.assemblenet.modeling import recompute

ATTENTION_MODES = (None, 'self', 'peer')


def spatial_max_pool(x: tf.Tensor, r: int) -> tf.Tensor:
  """`tf.nn.max_pool3d(x, [1, 1, r, r, 1], [1, 1, r, r, 1], 'SAME')`.

  Computed as a 2-D max pool of every frame (the window holds one frame), so
  the values are the same, in an op TFLite has (it has no 3-D max pool).

  Args:
    x: [B, T, H, W, C].
    r: the spatial window and stride.

  Returns:
    [B, T, ceil(H / r), ceil(W / r), C], x's dtype.
  """
  b, t, h, w, c = convolutions.dims(x)
  pooled = tf.nn.max_pool2d(tf.reshape(x, [-1, h, w, c]), r, r, 'SAME')
  out = tf.reshape(pooled, [b, t, *convolutions.dims(pooled)[1:]])
  out.set_shape([x.shape[0], x.shape[1], *pooled.shape[1:]])
  return out



class SpatialMaxPool(tf_keras.layers.Layer):
  """`spatial_max_pool(x, ratio)` as a layer: [B, T, H, W, C] ->

  [B, T, ceil(H / ratio), ceil(W / ratio), C]. The backbone pools a node's
  output once per ratio and gives the pooled copy to every fusion that takes
  the node at that size (`AssembleNetPlusLite(share_fusion_inputs=True)`).
  """

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
  """Mean over height and width: [B, T, H, W, C] -> [B, T, C].

  A node's peer-attention vector source: the backbone averages each node's
  output once and gives the mean to every fusion that has the node as a
  peer (`PeerAttentionFusion` takes peers as such means).
  """

  def call(self, inputs):
    return tf.reduce_mean(inputs, axis=[2, 3])



def original_fusion_width(shapes: Sequence[Sequence[Optional[int]]]) -> int:
  """The original's 5-D fusion target: `shape[3]` (width), not channels.

  The original loops over its inputs with `if C > lg: lg = shape[3]`, where
  `shape[3]` of an NTHWC tensor is the width, and then uses `lg` as the
  channel count of its 1x1x1 projections (and as "the largest channel count"
  that needs no projection).
  """
  lg = 0
  for s in shapes:
    if s[-1] > lg:
      lg = s[3]
  return lg


class PeerAttentionFusion(tf_keras.layers.Layer):
  """Fuses a node's inputs: edge weights, attention, 1x1x1 projections, sum.

  Called on `inputs + peers` (a list): the node's `num_inputs` input tensors
  [B, T, H_i, W_i, C_i] (same B and T), then, for attention 'peer', the
  tensors of every node of a lower level [B, T, H_k, W_k, C_k] (the peers),
  or their spatial means [B, T, C_k] (`SpatialMean`; the backbone computes
  each node's mean once and shares it among the fusions: one gradient per
  node instead of one full-size gradient per fusion).

  1. Every input is max-pooled spatially ([1, r, r], stride r, 'same',
     r = (H_i + 1) // H_min) to the smallest input size.
  2. With several inputs, input i is multiplied by sigmoid(w_i); the logits
     w are `agg_weights` ([num_inputs] float32): trainable (truncated normal,
     stddev 0.01; the one-shot connectivity search) when no `edge_weights`
     are given, else fixed (non-trainable) at logit(edge_weights), computed
     in float32 as the original does. A single input passes through
     unweighted.
  3. Attention (per frame, per connection), when `attention_mode` is set:
     'self' uses the connection's own spatial mean [B, T, C_i]; 'peer' a
     softmax-weighted (`attention_<i>_peer_weights`, trainable, truncated
     normal 0.01) sum of candidate vectors, one per peer: the peer's spatial
     mean through a dense layer (`peer_dense_<k>`, with bias, normal(0.01)
     init) to the largest channel count among the peers. Either vector goes
     through a dense layer (`attention_<i>`) to C_i, a sigmoid, and scales the
     connection's channels.
  4. Inputs with equal channel counts are summed; each group whose channel
     count is not the fusion width is projected by a bias-free 1x1x1 conv
     (`project_<c>`) to the fusion width; the groups are summed.

  The fusion width is the largest input channel count (the intended
  behaviour). With `fusion_width_as_channels`, it is what the original's 5-D
  code computes (`original_fusion_width`: an input's *width*), which
  reproduces the original's variable shapes (its parameter count then
  depends on the input resolution). As in the original
  (`fusion_with_peer_attention`), a group is summed before its projection,
  and a single input is attended only when `attention_mode` is set.

  Output: [B, T, H_min, W_min, fusion width].

  With `recompute_grad`, training calls run through
  `recompute.recompute_grad`: the backward pass keeps only the inputs (other
  nodes' outputs, kept anyway) and recomputes the pooled, weighted and
  attended copies of every input.
  """

  def __init__(self, num_inputs: int, attention_mode: Optional[str] = None,
               edge_weights: Optional[Sequence[float]] = None,
               fusion_width_as_channels: bool = False,
               kernel_regularizer=None, recompute_grad: bool = False,
               **kwargs):
    super().__init__(**kwargs)
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
    else:
      self._width = max(s[-1] for s in in_shapes)
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
    return config
