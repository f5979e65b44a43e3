"""Deep Bag of Frames (DBoF) backbone for YouTube-8M frame features."""
from typing import Any, Mapping, Optional

import tensorflow as tf, tf_keras

from official_ext.core.kernels import kernel_policy
from official_ext.yt8m.modeling import batch_norm
from official_ext.yt8m.modeling import factory
from official_ext.yt8m.modeling import layers as yt8m_layers

POOLING_METHODS = ('average', 'max', 'swap', 'none')


class Dbof(tf_keras.layers.Layer):
  """DBoF: per-frame cluster layer, pooling over the valid frames, hidden layer.

  [batch, frames, F] -> [batch, hidden_size] (pooling 'none': [batch, frames,
  hidden_size]). Padded frames are selected out, never multiplied by a mask.
  """

  def __init__(self,
               cluster_size: int = 3000,
               hidden_size: int = 2000,
               add_batch_norm: bool = True,
               pooling_method: str = 'average',
               use_context_gate_cluster_layer: bool = False,
               context_gate_cluster_bottleneck_size: int = 0,
               input_bn_affine: bool = False,
               activation: str = 'relu',
               norm_momentum: float = 0.99,
               norm_epsilon: float = 1e-3,
               use_sync_bn: bool = False,
               kernel_regularizer: Optional[Any] = None,
               **kwargs):
    """Initializes the backbone (`configs.DbofModel`'s fields and those below).

    Args:
      activation: activation name (Model Garden's `tf_utils.get_activation`).
      norm_momentum: batch norm momentum.
      norm_epsilon: batch norm epsilon.
      use_sync_bn: synchronized batch norm across replicas.
      kernel_regularizer: regularizer of the dense kernels.
      **kwargs: tf_keras.layers.Layer arguments.
    """
    super().__init__(**kwargs)
    if pooling_method not in POOLING_METHODS:
      raise ValueError(
          f'task.model.backbone.dbof.pooling_method={pooling_method!r}; '
          f'expected one of {POOLING_METHODS}.')
    self._config = dict(
        cluster_size=cluster_size,
        hidden_size=hidden_size,
        add_batch_norm=add_batch_norm,
        pooling_method=pooling_method,
        use_context_gate_cluster_layer=use_context_gate_cluster_layer,
        context_gate_cluster_bottleneck_size=context_gate_cluster_bottleneck_size,
        input_bn_affine=input_bn_affine,
        activation=activation,
        norm_momentum=norm_momentum,
        norm_epsilon=norm_epsilon,
        use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    self._activation_fn = yt8m_layers.get_activation(activation)

  def _norm(self, name, affine=True):
    return batch_norm.BatchNormalization(
        momentum=self._config['norm_momentum'],
        epsilon=self._config['norm_epsilon'],
        synchronized=self._config['use_sync_bn'],
        center=affine, scale=affine,
        name=name)

  def build(self, input_shape):
    c = self._config
    feature_size = int(input_shape[-1])
    self._input_bn = self._cluster_bn = self._hidden_bn = None
    self._cluster_dense = None
    if c['add_batch_norm']:
      # The affine part is only redundant in front of the cluster layer.
      self._input_bn = self._norm(
          'input_bn',
          affine=c['input_bn_affine'] or c['cluster_size'] <= 0)
      if c['cluster_size'] > 0:
        self._cluster_bn = self._norm('cluster_bn')
      self._hidden_bn = self._norm('hidden_bn')
    if c['cluster_size'] > 0:
      self._cluster_dense = tf_keras.layers.Dense(
          c['cluster_size'],
          use_bias=not c['add_batch_norm'],
          kernel_regularizer=self._kernel_regularizer,
          kernel_initializer=tf_keras.initializers.RandomNormal(
              stddev=feature_size ** -0.5),
          name='cluster_dense')
    pooled_size = c['cluster_size'] if c['cluster_size'] > 0 else feature_size
    self._context_gate = None
    if c['use_context_gate_cluster_layer']:
      self._context_gate = yt8m_layers.ContextGate(
          bottleneck_size=c['context_gate_cluster_bottleneck_size'],
          use_batch_norm=c['add_batch_norm'],
          norm_momentum=c['norm_momentum'],
          norm_epsilon=c['norm_epsilon'],
          use_sync_bn=c['use_sync_bn'],
          kernel_regularizer=self._kernel_regularizer,
          name='context_gate_cluster')
    self._hidden_dense = tf_keras.layers.Dense(
        c['hidden_size'],
        use_bias=not c['add_batch_norm'],
        kernel_regularizer=self._kernel_regularizer,
        kernel_initializer=tf_keras.initializers.RandomNormal(
            stddev=pooled_size ** -0.5),
        name='hidden_dense')
    super().build(input_shape)

  def call(self, inputs: tf.Tensor, num_frames: Optional[tf.Tensor] = None,
           training=None) -> tf.Tensor:
    """[batch, frames, F] -> the backbone's output; `num_frames` int [batch]
    valid frames (None: all).
    """
    c = self._config
    x, seq_mask = yt8m_layers.mask_frames(inputs, num_frames)
    x = tf.nn.l2_normalize(x, axis=-1)
    if self._input_bn is not None:
      x = self._input_bn(x, training=training, mask=seq_mask)
    if self._cluster_dense is not None:
      x = self._cluster_dense(x)
      if self._fused_training(x, training):
        return self._hidden(self._cluster_norm_relu_pool(x, seq_mask),
                            training)
      if self._cluster_bn is not None:
        x = self._cluster_bn(x, training=training, mask=seq_mask)
    x = self._activation_fn(x)
    if self._context_gate is not None:
      x = self._context_gate(x, training=training)
    if c['pooling_method'] != 'none':
      mask = None
      if seq_mask is not None:
        mask = tf.cast(seq_mask, x.dtype)[:, :, tf.newaxis]
      return self._hidden(
          yt8m_layers.pool_frames(x, c['pooling_method'], mask), training)
    x = self._hidden_dense(x)
    if self._hidden_bn is not None:
      x = self._hidden_bn(x, training=training, mask=seq_mask)
    return self._activation_fn(x)

  def _hidden(self, pooled: tf.Tensor, training) -> tf.Tensor:
    """The hidden layer on the pooled frames [batch, cluster_size]."""
    x = self._hidden_dense(pooled)
    if self._hidden_bn is not None:
      x = self._hidden_bn(x, training=training)
    return self._activation_fn(x)

  def _fused_training(self, x: tf.Tensor, training) -> bool:
    """Whether this training call takes the fused cluster path: kernel-policy
    path 'yt8m.dbof_cluster_pool', float32, batch norm, relu, average pooling,
    no cluster gate, trainable per-replica batch norm.
    """
    c = self._config
    return (kernel_policy.current().takes('yt8m.dbof_cluster_pool') and
            training is True and x.dtype == tf.float32 and
            c['add_batch_norm'] and c['cluster_size'] > 0 and
            c['activation'] == 'relu' and c['pooling_method'] == 'average' and
            not c['use_context_gate_cluster_layer'] and
            not c['use_sync_bn'] and self.compute_dtype == 'float32' and
            self._cluster_bn.trainable)

  def _ensure_built(self, norm, x: tf.Tensor) -> None:
    # The fused path reads the layer's variables without calling it: build
    # it as its own call would (same variable names), on one frame.
    if not norm.built:
      norm(x[:, :1], training=False)

  def _cluster_norm_relu_pool(self, x: tf.Tensor, seq_mask) -> tf.Tensor:
    """Cluster batch norm, ReLU and average pooling in training, fused."""
    norm = self._cluster_bn
    self._ensure_built(norm, x)
    pooled, mean, variance, count = batch_norm.batch_norm_relu_average_pool(
        x, tf.convert_to_tensor(norm.gamma), tf.convert_to_tensor(norm.beta),
        norm.epsilon, seq_mask)
    batch_norm.update_moving_moments(norm, mean, variance, count)
    return pooled

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = yt8m_layers.serialize_regularizer(
        self._kernel_regularizer)
    return config


@factory.register_backbone_builder('dbof')
def build_dbof(model_config, l2_regularizer, name='backbone') -> Dbof:
  return Dbof(activation=model_config.norm_activation.activation,
              kernel_regularizer=l2_regularizer, name=name,
              **model_config.backbone.dbof.as_dict(),
              **factory.norm_kwargs(model_config))
