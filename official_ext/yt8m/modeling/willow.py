"""WILLOW's learnable pooling backbones (Miech, Laptev and Sivic, 2017),
after the authors' code (github.com/antoine77340/Youtube-8M-WILLOW);
docs/yt8m.md#model-zoo.
"""
import math
from typing import Any, Mapping, Optional, Sequence

import tensorflow as tf, tf_keras

from official_ext.yt8m.modeling import batch_norm
from official_ext.yt8m.modeling import factory
from official_ext.yt8m.modeling import layers as yt8m_layers

METHODS = ('netvlad', 'netrvlad', 'soft_dbof', 'netfv')
# Added to the squared `covariances` of NetFV (the authors' 1e-6).
NETFV_EPSILON = 1e-6


def _normal(stddev: float, mean: float = 0.0):
  return tf_keras.initializers.RandomNormal(mean=mean, stddev=stddev)


def _intra_and_global_normalize(vlad: tf.Tensor) -> tf.Tensor:
  """[batch, N, K] -> L2 over N per cluster, flattened, L2: [batch, N K]."""
  vlad = tf.nn.l2_normalize(vlad, axis=1)
  vlad = tf.reshape(vlad, [-1, vlad.shape[1] * vlad.shape[2]])
  return tf.nn.l2_normalize(vlad, axis=-1)


class LearnablePooling(tf_keras.layers.Layer):
  """One stream's learnable pooling: frames [batch, T, N] -> [batch, D]."""

  def __init__(self,
               method: str,
               cluster_size: int,
               norm_momentum: float = 0.99,
               norm_epsilon: float = 1e-3,
               use_sync_bn: bool = False,
               kernel_regularizer: Optional[Any] = None,
               **kwargs):
    """Initializes the module: `method` of `METHODS`, K = `cluster_size`;
    `kernel_regularizer` also regularizes the centers and covariances.
    """
    super().__init__(**kwargs)
    if method not in METHODS:
      raise ValueError(f'task.model.backbone.type={method!r} is not a '
                       f'learnable pooling; expected one of {METHODS}.')
    if int(cluster_size) < 1:
      raise ValueError(f'task.model.backbone.{method}.cluster_sizes has '
                       f'{cluster_size!r}; expected >= 1.')
    self._config = dict(method=method, cluster_size=int(cluster_size),
                        norm_momentum=norm_momentum, norm_epsilon=norm_epsilon,
                        use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)

  def output_width(self, feature_size: int) -> int:
    """D for N = `feature_size` input features."""
    method, k = self._config['method'], self._config['cluster_size']
    if method == 'soft_dbof':
      return k
    return (2 if method == 'netfv' else 1) * feature_size * k

  def build(self, input_shape):
    c = self._config
    n, k = int(input_shape[-1]), c['cluster_size']
    self._feature_size = n
    # The authors' initializers (one instance per variable: an unseeded
    # tf_keras initializer called twice repeats its values).
    self._assignment = tf_keras.layers.Dense(
        k, use_bias=False, kernel_initializer=_normal(1 / math.sqrt(n)),
        kernel_regularizer=self._kernel_regularizer,
        name='cluster_assignment')
    self._assignment_bn = batch_norm.BatchNormalization(
        momentum=c['norm_momentum'], epsilon=c['norm_epsilon'],
        synchronized=c['use_sync_bn'], name='cluster_bn')
    self.cluster_centers = self.covariances = None
    if c['method'] in ('netvlad', 'netfv'):
      self.cluster_centers = self.add_weight(
          'cluster_centers', shape=[n, k],
          initializer=_normal(1 / math.sqrt(n)),
          regularizer=self._kernel_regularizer, trainable=True)
    if c['method'] == 'netfv':
      self.covariances = self.add_weight(
          'covariances', shape=[n, k],
          initializer=_normal(1 / math.sqrt(n), mean=1.0),
          regularizer=self._kernel_regularizer, trainable=True)
    super().build(input_shape)

  def call(self, inputs: tf.Tensor, valid: Optional[tf.Tensor] = None,
           training=None) -> tf.Tensor:
    """[batch, frames, N] finite frames -> [batch, D]; `valid` (bool [batch,
    frames]) selects the frames pooled.
    """
    method = self._config['method']
    x = tf.cast(inputs, self.compute_dtype)
    logits = self._assignment_bn(self._assignment(x), training=training,
                                 mask=valid)
    assignment = tf.nn.softmax(logits, axis=-1)             # [B, T, K]
    if valid is not None:
      assignment = tf.where(valid[:, :, tf.newaxis], assignment,
                            tf.zeros_like(assignment))
    if method == 'soft_dbof':
      return tf.nn.l2_normalize(tf.reduce_sum(assignment, axis=1), axis=-1)
    mass = tf.reduce_sum(assignment, axis=1)[:, tf.newaxis, :]  # [B, 1, K]
    first = tf.einsum('btk,btn->bnk', assignment, x)             # [B, N, K]
    if method == 'netrvlad':
      return _intra_and_global_normalize(first)
    centers = tf.cast(self.cluster_centers, x.dtype)[tf.newaxis]
    if method == 'netvlad':
      return _intra_and_global_normalize(first - mass * centers)
    # NetFV.
    sigma = tf.cast(tf.square(self.covariances) + NETFV_EPSILON,
                    x.dtype)[tf.newaxis]
    second = (tf.einsum('btk,btn->bnk', assignment, tf.square(x)) +
              mass * tf.square(centers) - 2 * first * centers)
    second = second / tf.square(sigma) - mass
    fv1 = _intra_and_global_normalize((first - mass * centers) / sigma)
    fv2 = tf.nn.l2_normalize(
        tf.reshape(second, [-1, second.shape[1] * second.shape[2]]), axis=-1)
    return tf.concat([fv1, fv2], axis=-1)

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = yt8m_layers.serialize_regularizer(
        self._kernel_regularizer)
    return config


class WillowBackbone(tf_keras.layers.Layer):
  """A WILLOW backbone: per-stream pooling, hidden layer, context gating:
  [batch, frames, F] -> [batch, hidden_size].
  """

  def __init__(self,
               method: str,
               feature_sizes: Sequence[int] = (1024, 128),
               cluster_sizes: Sequence[int] = (256, 128),
               hidden_size: int = 1024,
               hidden_relu: bool = False,
               context_gating: bool = True,
               norm_momentum: float = 0.99,
               norm_epsilon: float = 1e-3,
               use_sync_bn: bool = False,
               kernel_regularizer: Optional[Any] = None,
               **kwargs):
    """Initializes the backbone (`configs.LearnablePoolingModel`'s fields);
    `method` is one of `METHODS`, the `feature_sizes` add up to the input
    width.
    """
    super().__init__(**kwargs)
    key = f'task.model.backbone.{method}'
    feature_sizes = tuple(int(s) for s in feature_sizes)
    cluster_sizes = tuple(int(s) for s in cluster_sizes)
    if not feature_sizes or len(feature_sizes) != len(cluster_sizes):
      raise ValueError(
          f'{key}: feature_sizes {feature_sizes} and cluster_sizes '
          f'{cluster_sizes} need one entry per stream (the same, non-zero, '
          'length).')
    if int(hidden_size) < 1:
      raise ValueError(f'{key}.hidden_size={hidden_size!r}; expected >= 1.')
    self._key = key
    self._config = dict(
        method=method, feature_sizes=feature_sizes,
        cluster_sizes=cluster_sizes, hidden_size=int(hidden_size),
        hidden_relu=hidden_relu, context_gating=context_gating,
        norm_momentum=norm_momentum, norm_epsilon=norm_epsilon,
        use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    norm_kwargs = dict(norm_momentum=norm_momentum, norm_epsilon=norm_epsilon,
                       use_sync_bn=use_sync_bn)
    bn_kwargs = dict(momentum=norm_momentum, epsilon=norm_epsilon,
                     synchronized=use_sync_bn)
    self._input_bn = batch_norm.BatchNormalization(name='input_bn',
                                                   **bn_kwargs)
    self._streams = [
        LearnablePooling(method, k, kernel_regularizer=kernel_regularizer,
                         name=f'pooling_{i}', **norm_kwargs)
        for i, k in enumerate(cluster_sizes)]
    # The authors' initializers: N(0, 1/K) for the hidden kernel (K: the
    # first stream's clusters), N(0, 0.01^2) for its bias.
    self._hidden_dense = tf_keras.layers.Dense(
        hidden_size, use_bias=not hidden_relu,
        kernel_initializer=_normal(1 / math.sqrt(cluster_sizes[0])),
        bias_initializer=_normal(0.01),
        kernel_regularizer=self._kernel_regularizer, name='hidden_dense')
    self._hidden_bn = (tf_keras.layers.BatchNormalization(
        name='hidden_bn', **bn_kwargs) if hidden_relu else None)
    self._gate = (yt8m_layers.ContextGate(
        kernel_regularizer=self._kernel_regularizer, name='context_gate',
        **norm_kwargs) if context_gating else None)

  def build(self, input_shape):
    yt8m_layers.check_feature_sizes(
        self._key, self._config['feature_sizes'], int(input_shape[-1]))
    super().build(input_shape)

  def call(self, inputs: tf.Tensor, num_frames: Optional[tf.Tensor] = None,
           training=None) -> tf.Tensor:
    """[batch, frames, F] -> [batch, hidden_size]; `num_frames` int [batch]
    valid frames (None: all).
    """
    x, valid = yt8m_layers.mask_frames(inputs, num_frames)
    x = tf.nn.l2_normalize(x, axis=-1)
    x = self._input_bn(x, training=training, mask=valid)
    parts = tf.split(x, list(self._config['feature_sizes']), axis=-1)
    pooled = tf.concat([stream(part, valid=valid, training=training)
                        for stream, part in zip(self._streams, parts)],
                       axis=-1)
    hidden = self._hidden_dense(pooled)
    if self._hidden_bn is not None:
      hidden = tf.nn.relu6(self._hidden_bn(hidden, training=training))
    if self._gate is not None:
      hidden = self._gate(hidden, training=training)
    return hidden

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = yt8m_layers.serialize_regularizer(
        self._kernel_regularizer)
    return config


def build_willow(model_config, l2_regularizer,
                 name='backbone') -> WillowBackbone:
  config = model_config.backbone.get().as_dict()
  regularize = config.pop('regularize_backbone')
  return WillowBackbone(
      method=model_config.backbone.type,
      kernel_regularizer=l2_regularizer if regularize else None, name=name,
      **config, **factory.norm_kwargs(model_config))


for _method in METHODS:
  factory.register_backbone_builder(_method)(build_willow)
