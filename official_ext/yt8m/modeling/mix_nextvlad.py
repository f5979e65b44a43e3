"""The mixture of NeXtVLAD models with online distillation (Lin, Xiao and
Fan, 2018), after the authors' `MixNeXtVladModel`;
docs/yt8m.md#the-nextvlad-mixture.
"""
from typing import Any, Dict, Mapping, Optional, Sequence

import tensorflow as tf, tf_keras

from official_ext.yt8m.modeling import factory
from official_ext.yt8m.modeling import heads
from official_ext.yt8m.modeling import layers as yt8m_layers
from official_ext.yt8m.modeling import nextvlad

_KEY = 'task.model.backbone.mix_nextvlad'
# Inside the logarithms of the distillation's KL divergence (the authors').
DISTILLATION_EPSILON = 1e-8


def distillation_loss(mix_logits: tf.Tensor, branch_logits: tf.Tensor,
                      temperature: float, weight: float) -> tf.Tensor:
  """weight * mean_b sum_i KL(softmax(mix / T) || softmax(branch_i / T)),
  eps 1e-8 inside the logarithms: a float32 scalar.
  """
  p = tf.nn.softmax(mix_logits / temperature, axis=-1)[:, tf.newaxis, :]
  q = tf.nn.softmax(branch_logits / temperature, axis=-1)
  kl = tf.reduce_sum(
      p * (tf.math.log(p + DISTILLATION_EPSILON) -
           tf.math.log(q + DISTILLATION_EPSILON)), axis=-1)  # [batch, n]
  return weight * tf.reduce_mean(tf.reduce_sum(kl, axis=-1))


class MixNextVlad(tf_keras.layers.Layer):
  """`num_branches` NeXtVLAD backbones and their per-video mixture gate.

  Returns {'branches': [batch, branches, hidden_size], 'mix_weights':
  float32 [batch, branches]}.
  """

  def __init__(self,
               num_branches: int = 3,
               feature_sizes: Sequence[int] = (1024, 128),
               cluster_sizes: Sequence[int] = (112, 56),
               groups: Sequence[int] = (8, 4),
               expansion: int = 2,
               hidden_size: int = 2048,
               gating_reduction: int = 16,
               dropout_rate: float = 0.5,
               norm_momentum: float = 0.99,
               norm_epsilon: float = 1e-3,
               use_sync_bn: bool = False,
               kernel_regularizer: Optional[Any] = None,
               **kwargs):
    """Initializes the backbone; the NeXtVLAD arguments are every branch's.

    `kernel_regularizer` regularizes the branches, not the mixture gate.
    """
    super().__init__(**kwargs)
    if int(num_branches) < 1:
      raise ValueError(f'{_KEY}.num_branches={num_branches!r}; expected >= '
                       '1.')
    self._config = dict(
        num_branches=int(num_branches), feature_sizes=tuple(feature_sizes),
        cluster_sizes=tuple(cluster_sizes), groups=tuple(groups),
        expansion=expansion, hidden_size=hidden_size,
        gating_reduction=gating_reduction, dropout_rate=dropout_rate,
        norm_momentum=norm_momentum, norm_epsilon=norm_epsilon,
        use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    branch = {k: v for k, v in self._config.items() if k != 'num_branches'}
    self._branches = [
        nextvlad.NextVlad(kernel_regularizer=self._kernel_regularizer,
                          name=f'branch_{i}', **branch)
        for i in range(self._config['num_branches'])]
    self._mix_bn = tf_keras.layers.BatchNormalization(
        momentum=norm_momentum, epsilon=norm_epsilon,
        synchronized=use_sync_bn, name='mix_bn')
    self._mix_dense = tf_keras.layers.Dense(
        self._config['num_branches'],
        kernel_initializer=yt8m_layers.variance_scaling_fan_in(),
        name='mix_weights')

  def call(self, inputs: tf.Tensor, num_frames: Optional[tf.Tensor] = None,
           training=None) -> Dict[str, tf.Tensor]:
    """Padded frames are left out of the gate's mean and of every branch."""
    x = tf.cast(inputs, tf.float32)
    mask = yt8m_layers.frame_mask(num_frames, tf.shape(x)[1], tf.float32)
    mean = yt8m_layers.pool_frames(x, 'average', mask)
    gate = self._mix_dense(self._mix_bn(
        tf.cast(mean, self.compute_dtype), training=training))
    branches = [b(inputs, num_frames=num_frames, training=training)
                for b in self._branches]
    return {'branches': tf.stack(branches, axis=1),
            'mix_weights': tf.nn.softmax(tf.cast(gate, tf.float32), axis=-1)}

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = yt8m_layers.serialize_regularizer(
        self._kernel_regularizer)
    return config


class MixtureLogisticHead(tf_keras.layers.Layer):
  """One logistic classifier per branch, mixed by the gate in logit space.

  Returns float32 {'predictions', 'logits', 'branch_logits' [batch, n, C],
  'branch_predictions'}.
  """

  def __init__(self, num_classes: int, num_branches: int,
               kernel_initializer: str = 'glorot_uniform',
               kernel_regularizer: Optional[Any] = None, **kwargs):
    super().__init__(**kwargs)
    self._config = dict(num_classes=num_classes, num_branches=num_branches,
                        kernel_initializer=kernel_initializer)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    heads.logistic_initializer(kernel_initializer)  # Checks the name.
    # The name, not one instance, for every classifier: an unseeded
    # tf_keras initializer called twice repeats its values.
    self._classifiers = [
        tf_keras.layers.Dense(
            num_classes, kernel_initializer=kernel_initializer,
            kernel_regularizer=self._kernel_regularizer, name=f'branch_{i}')
        for i in range(num_branches)]

  def call(self, inputs: Mapping[str, tf.Tensor],
           training=None) -> Dict[str, tf.Tensor]:
    branches = inputs['branches']
    logits = tf.stack(
        [tf.cast(c(branches[:, i]), tf.float32)
         for i, c in enumerate(self._classifiers)], axis=1)  # [B, n, C]
    weights = tf.cast(inputs['mix_weights'], tf.float32)  # Autocast.
    mix = tf.reduce_sum(weights[:, :, tf.newaxis] * logits, axis=1)
    return {'predictions': tf.sigmoid(mix), 'logits': mix,
            'branch_logits': logits,
            'branch_predictions': tf.sigmoid(logits)}

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = yt8m_layers.serialize_regularizer(
        self._kernel_regularizer)
    return config


@factory.register_backbone_builder('mix_nextvlad')
def build_mix_nextvlad(model_config, l2_regularizer,
                       name='backbone') -> MixNextVlad:
  """Raises ValueError: a temperature <= 0, or a head other than 'logistic'."""
  config = model_config.backbone.mix_nextvlad.as_dict()
  regularize = config.pop('regularize_backbone')
  temperature = config.pop('distillation_temperature')
  del config['distillation_weight']  # Read by the model's loss.
  if temperature <= 0:
    raise ValueError(f'{_KEY}.distillation_temperature={temperature!r}; '
                     'expected > 0.')
  if model_config.head.type != 'logistic':
    raise ValueError(
        f"task.model.head.type={model_config.head.type!r}: the 'mix_nextvlad' "
        "backbone mixes one 'logistic' classifier per branch.")
  return MixNextVlad(kernel_regularizer=l2_regularizer if regularize else None,
                     name=name, **config, **factory.norm_kwargs(model_config))


@factory.register_backbone_head_builder('mix_nextvlad')
def build_mixture_head(model_config, num_classes, l2_regularizer,
                       name='head') -> MixtureLogisticHead:
  return MixtureLogisticHead(
      num_classes=num_classes,
      num_branches=model_config.backbone.mix_nextvlad.num_branches,
      kernel_initializer=model_config.head.logistic.kernel_initializer,
      kernel_regularizer=l2_regularizer, name=name)
