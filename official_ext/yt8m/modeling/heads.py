"""Video-level classification heads: mixture of experts and logistic."""
from typing import Any, Dict, Mapping, Optional

import tensorflow as tf, tf_keras

from official_ext.yt8m.modeling import factory
from official_ext.yt8m.modeling import layers as yt8m_layers


def logistic_initializer(
    kernel_initializer: str) -> tf_keras.initializers.Initializer:
  """A new tf_keras initializer from its name.

  Raises:
    ValueError: naming `task.model.head.logistic.kernel_initializer`.
  """
  try:
    return tf_keras.initializers.get(kernel_initializer)
  except ValueError as e:
    raise ValueError(
        'task.model.head.logistic.kernel_initializer='
        f'{kernel_initializer!r} is not a tf_keras initializer name (e.g. '
        "'glorot_uniform', 'he_normal').") from e


class MoeHead(tf_keras.layers.Layer):
  """A per-class softmax over `num_mixtures` logistic experts (+ a dummy).

  p(class) = sum_m softmax(gate)[m] * sigmoid(expert[m]); with
  `use_output_context_gate` the gated probabilities are the output.
  """

  def __init__(self,
               num_classes: int,
               num_mixtures: int = 5,
               use_input_context_gate: bool = False,
               use_output_context_gate: bool = False,
               vocab_as_last_dim: bool = False,
               norm_momentum: float = 0.99,
               norm_epsilon: float = 1e-3,
               use_sync_bn: bool = False,
               kernel_regularizer: Optional[Any] = None,
               **kwargs):
    """Initializes the head: `configs.MoeModel`'s fields, the context gates'
    batch-norm settings and the kernels' regularizer.
    """
    super().__init__(**kwargs)
    self._config = dict(
        num_classes=num_classes, num_mixtures=num_mixtures,
        use_input_context_gate=use_input_context_gate,
        use_output_context_gate=use_output_context_gate,
        vocab_as_last_dim=vocab_as_last_dim, norm_momentum=norm_momentum,
        norm_epsilon=norm_epsilon, use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    gate_kwargs = dict(norm_momentum=norm_momentum, norm_epsilon=norm_epsilon,
                       use_sync_bn=use_sync_bn,
                       kernel_regularizer=self._kernel_regularizer)
    self._input_context_gate = (
        yt8m_layers.ContextGate(name='input_context_gate', **gate_kwargs)
        if use_input_context_gate else None)
    self._output_context_gate = (
        yt8m_layers.ContextGate(name='output_context_gate', **gate_kwargs)
        if use_output_context_gate else None)
    self._gate_dense = tf_keras.layers.Dense(
        num_classes * (num_mixtures + 1), use_bias=False,
        kernel_regularizer=self._kernel_regularizer, name='gate')
    self._expert_dense = tf_keras.layers.Dense(
        num_classes * num_mixtures,
        kernel_regularizer=self._kernel_regularizer, name='expert')

  def call(self, inputs: tf.Tensor, training=None) -> Dict[str, tf.Tensor]:
    """[batch, features] -> {'predictions': float32 [batch, C]}."""
    c = self._config
    num_classes, num_mixtures = c['num_classes'], c['num_mixtures']
    if self._input_context_gate is not None:
      inputs = self._input_context_gate(inputs, training=training)
    gates = tf.cast(self._gate_dense(inputs), tf.float32)
    experts = tf.cast(self._expert_dense(inputs), tf.float32)
    if c['vocab_as_last_dim']:
      gates = tf.reshape(gates, [-1, num_mixtures + 1, num_classes])
      experts = tf.reshape(experts, [-1, num_mixtures, num_classes])
      axis = 1
    else:
      gates = tf.reshape(gates, [-1, num_classes, num_mixtures + 1])
      experts = tf.reshape(experts, [-1, num_classes, num_mixtures])
      axis = 2
    gating = tf.nn.softmax(gates, axis=axis)
    if c['vocab_as_last_dim']:
      gating = gating[:, :num_mixtures, :]
    else:
      gating = gating[:, :, :num_mixtures]
    probabilities = tf.reduce_sum(gating * tf.sigmoid(experts), axis=axis)
    probabilities = tf.reshape(probabilities, [-1, num_classes])
    if self._output_context_gate is not None:
      probabilities = self._output_context_gate(
          tf.cast(probabilities, self.compute_dtype), training=training)
    return {'predictions': tf.cast(probabilities, tf.float32)}

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = yt8m_layers.serialize_regularizer(
        self._kernel_regularizer)
    return config


class LogisticHead(tf_keras.layers.Layer):
  """One dense layer + sigmoid per class."""

  def __init__(self, num_classes: int, return_logits: bool = False,
               kernel_initializer: str = 'glorot_uniform',
               kernel_regularizer: Optional[Any] = None, **kwargs):
    super().__init__(**kwargs)
    self._config = dict(num_classes=num_classes, return_logits=return_logits,
                        kernel_initializer=kernel_initializer)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    initializer = logistic_initializer(kernel_initializer)
    self._dense = tf_keras.layers.Dense(
        num_classes, kernel_initializer=initializer,
        kernel_regularizer=self._kernel_regularizer, name='logits')

  def call(self, inputs: tf.Tensor, training=None) -> Dict[str, tf.Tensor]:
    """[batch, features] -> float32 'predictions' (and 'logits') [batch, C]."""
    logits = tf.cast(self._dense(inputs), tf.float32)
    outputs = {'predictions': tf.sigmoid(logits)}
    if self._config['return_logits']:
      outputs['logits'] = logits
    return outputs

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = yt8m_layers.serialize_regularizer(
        self._kernel_regularizer)
    return config


@factory.register_head_builder('moe')
def build_moe(model_config, num_classes, l2_regularizer,
              name='head') -> MoeHead:
  return MoeHead(num_classes=num_classes, kernel_regularizer=l2_regularizer,
                 name=name, **model_config.head.moe.as_dict(),
                 **factory.norm_kwargs(model_config))


@factory.register_head_builder('logistic')
def build_logistic(model_config, num_classes, l2_regularizer,
                   name='head') -> LogisticHead:
  return LogisticHead(num_classes=num_classes,
                      kernel_regularizer=l2_regularizer, name=name,
                      **model_config.head.logistic.as_dict())
