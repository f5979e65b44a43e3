"""NeXtVLAD backbone (Lin, Xiao and Fan, 2018), after the authors' code
(github.com/linrongc/youtube-8m); docs/yt8m.md#nextvlad.
"""
from typing import Any, Mapping, Optional, Sequence

import tensorflow as tf, tf_keras

from official_ext.core.kernels import kernel_policy
from official_ext.yt8m.modeling import batch_norm
from official_ext.yt8m.modeling import factory
from official_ext.yt8m.modeling import layers as yt8m_layers

_KEY = 'task.model.backbone.nextvlad'


class NextVladAggregation(tf_keras.layers.Layer):
  """One NeXtVLAD module: frames of one stream -> a video-level VLAD vector."""

  def __init__(self,
               cluster_size: int,
               groups: int,
               expansion: int = 2,
               norm_momentum: float = 0.99,
               norm_epsilon: float = 1e-3,
               use_sync_bn: bool = False,
               kernel_regularizer: Optional[Any] = None,
               **kwargs):
    """Initializes the module: K clusters, G groups (dividing λN), expansion λ;
    `kernel_regularizer` also regularizes the cluster centers.
    """
    super().__init__(**kwargs)
    for key, value in (('cluster_sizes', cluster_size), ('groups', groups),
                       ('expansion', expansion)):
      if int(value) < 1:
        raise ValueError(f'{_KEY}.{key} has {value!r}; expected >= 1.')
    self._config = dict(
        cluster_size=cluster_size, groups=groups, expansion=expansion,
        norm_momentum=norm_momentum, norm_epsilon=norm_epsilon,
        use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)

  def _norm(self, name):
    return batch_norm.BatchNormalization(
        momentum=self._config['norm_momentum'],
        epsilon=self._config['norm_epsilon'],
        synchronized=self._config['use_sync_bn'], name=name)

  def _dense(self, units, name, use_bias=True, activation=None):
    return batch_norm.Dense(
        units, use_bias=use_bias, activation=activation,
        kernel_initializer=yt8m_layers.variance_scaling_fan_in(),
        kernel_regularizer=self._kernel_regularizer, name=name)

  @property
  def output_size(self) -> int:
    """N'K: width of the output vector (needs `build`)."""
    return self._group_size * self._config['cluster_size']

  def build(self, input_shape):
    c = self._config
    feature_size = int(input_shape[-1])
    expanded = c['expansion'] * feature_size
    if expanded % c['groups']:
      raise ValueError(
          f'{_KEY}: expansion {c["expansion"]} x {feature_size} features = '
          f'{expanded} is not divisible by groups={c["groups"]}.')
    self._group_size = expanded // c['groups']
    self._expansion = self._dense(expanded, 'expansion')
    self._attention = self._dense(c['groups'], 'group_attention',
                                  activation='sigmoid')
    self._assignment = self._dense(c['groups'] * c['cluster_size'],
                                   'cluster_assignment', use_bias=False)
    self._assignment_bn = self._norm('cluster_bn')
    # Built here, each in its own name scope as its call would: `call` runs
    # their two kernels as one matmul.
    for layer in (self._attention, self._assignment):
      with tf.name_scope(layer.name):
        layer.build(tf.TensorShape([None, None, expanded]))
    self.cluster_centers = self.add_weight(
        'cluster_centers', shape=[self._group_size, c['cluster_size']],
        initializer=yt8m_layers.variance_scaling_fan_in(),
        regularizer=self._kernel_regularizer,
        trainable=True)
    self._vlad_bn = self._norm('vlad_bn')
    super().build(input_shape)

  def call(self, inputs: tf.Tensor, valid: Optional[tf.Tensor] = None,
           training=None) -> tf.Tensor:
    """[batch, frames, N] finite frames -> [batch, N'K]; `valid` (bool [batch,
    frames]) selects the frames aggregated.
    """
    c = self._config
    groups, clusters = c['groups'], c['cluster_size']
    batch, frames = tf.shape(inputs)[0], tf.shape(inputs)[1]
    x = self._expansion(inputs)                              # [B, T, λN]
    attention, logits = self._attention_and_assignment(x)
    if valid is not None:
      attention = tf.where(valid[:, :, tf.newaxis], attention,
                           tf.zeros_like(attention))
    logits = self._assignment_bn(logits, training=training,
                                 mask=valid)                 # [B, T, G*K]
    assignment = tf.nn.softmax(
        tf.reshape(logits, [batch, frames * groups, clusters]), axis=-1)
    assignment *= tf.reshape(attention, [batch, frames * groups, 1])
    grouped = tf.reshape(x, [batch, frames * groups, self._group_size])
    # y_jk = Σ_m α_mk x_mj - (Σ_m α_mk) c_jk, m over frames and groups.
    vlad = tf.einsum('bmk,bmj->bjk', assignment, grouped)
    mass = tf.reduce_sum(assignment, axis=1)[:, tf.newaxis, :]  # [B, 1, K]
    vlad -= mass * tf.cast(self.cluster_centers, vlad.dtype)[tf.newaxis]
    vlad = tf.nn.l2_normalize(vlad, axis=1)  # intra-normalization
    vlad = tf.reshape(vlad, [batch, self._group_size * clusters])
    return self._vlad_bn(vlad, training=training)

  def _attention_and_assignment(self, x: tf.Tensor):
    """sigmoid(x W_g + b_g) [B, T, G] and x W_gk [B, T, G K], as one matmul
    where the kernel policy takes 'yt8m.nextvlad_joint_projection'.
    """
    policy = kernel_policy.current()
    if not policy.takes('yt8m.nextvlad_joint_projection'):
      return self._attention(x), self._assignment(x)
    att, asg = self._attention, self._assignment
    rows = tf.reshape(x, [-1, x.shape[-1]])
    kernel = tf.concat([att.kernel, asg.kernel], axis=1)
    both = tf.matmul(rows, tf.cast(kernel, rows.dtype))
    gate, logits = tf.split(both, [att.units, asg.units], axis=1)
    bias = tf.cast(att.bias, gate.dtype)
    gate = (batch_norm.bias_add(gate, bias)
            if gate.dtype == tf.float32 and policy.takes('yt8m.bias_gradient')
            else gate + bias)
    lead = tf.shape(x)[:-1]
    attention = tf.reshape(att.activation(gate), tf.concat(
        [lead, [att.units]], 0))
    logits = tf.reshape(logits, tf.concat([lead, [asg.units]], 0))
    attention.set_shape(x.shape[:-1].concatenate([att.units]))
    logits.set_shape(x.shape[:-1].concatenate([asg.units]))
    return attention, logits

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = yt8m_layers.serialize_regularizer(
        self._kernel_regularizer)
    return config


class NextVlad(tf_keras.layers.Layer):
  """The NeXtVLAD backbone: a module per stream, dropout, hidden layer and
  batch norm, SE gating: [batch, frames, F] -> [batch, hidden_size].
  """

  def __init__(self,
               feature_sizes: Sequence[int] = (1024, 128),
               cluster_sizes: Sequence[int] = (128, 64),
               groups: Sequence[int] = (8, 4),
               expansion: int = 2,
               hidden_size: int = 2048,
               gating_reduction: int = 8,
               dropout_rate: float = 0.5,
               norm_momentum: float = 0.99,
               norm_epsilon: float = 1e-3,
               use_sync_bn: bool = False,
               kernel_regularizer: Optional[Any] = None,
               **kwargs):
    """Initializes the backbone (`configs.NextVladModel`'s fields); the
    `feature_sizes` add up to the input width, `kernel_regularizer` also
    regularizes the cluster centers.
    """
    super().__init__(**kwargs)
    feature_sizes = tuple(int(s) for s in feature_sizes)
    cluster_sizes = tuple(int(s) for s in cluster_sizes)
    groups = tuple(int(s) for s in groups)
    if not feature_sizes or len({len(feature_sizes), len(cluster_sizes),
                                 len(groups)}) != 1:
      raise ValueError(
          f'{_KEY}: feature_sizes {feature_sizes}, cluster_sizes '
          f'{cluster_sizes} and groups {groups} need one entry per stream '
          '(the same, non-zero, length).')
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError(f'{_KEY}.dropout_rate={dropout_rate!r}; expected a '
                       'value in [0, 1).')
    if gating_reduction < 1 or hidden_size // gating_reduction < 1:
      raise ValueError(
          f'{_KEY}.gating_reduction={gating_reduction!r}; expected 1 <= it '
          f'<= hidden_size ({hidden_size}).')
    self._config = dict(
        feature_sizes=feature_sizes, cluster_sizes=cluster_sizes,
        groups=groups, expansion=expansion, hidden_size=hidden_size,
        gating_reduction=gating_reduction, dropout_rate=dropout_rate,
        norm_momentum=norm_momentum, norm_epsilon=norm_epsilon,
        use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    norm_kwargs = dict(norm_momentum=norm_momentum, norm_epsilon=norm_epsilon,
                       use_sync_bn=use_sync_bn)
    self._streams = [
        NextVladAggregation(
            cluster_size=k, groups=g, expansion=expansion,
            kernel_regularizer=self._kernel_regularizer,
            name=f'nextvlad_{i}', **norm_kwargs)
        for i, (k, g) in enumerate(zip(cluster_sizes, groups))]
    self._dropout = tf_keras.layers.Dropout(dropout_rate, name='vlad_dropout')
    self._hidden_dense = tf_keras.layers.Dense(
        hidden_size, use_bias=False,
        kernel_initializer=yt8m_layers.variance_scaling_fan_in(),
        kernel_regularizer=self._kernel_regularizer, name='hidden_dense')
    self._hidden_bn = batch_norm.BatchNormalization(
        momentum=norm_momentum, epsilon=norm_epsilon,
        synchronized=use_sync_bn, name='hidden_bn')
    self._gate = yt8m_layers.SeContextGate(
        reduction=gating_reduction, kernel_regularizer=self._kernel_regularizer,
        name='se_gate', **norm_kwargs)

  def build(self, input_shape):
    yt8m_layers.check_feature_sizes(_KEY, self._config['feature_sizes'],
                                    int(input_shape[-1]))
    super().build(input_shape)

  def call(self, inputs: tf.Tensor, num_frames: Optional[tf.Tensor] = None,
           training=None) -> tf.Tensor:
    """[batch, frames, F] -> [batch, hidden_size]; `num_frames` int [batch]
    valid frames (None: all).
    """
    x, valid = yt8m_layers.mask_frames(inputs, num_frames)
    parts = tf.split(x, list(self._config['feature_sizes']), axis=-1)
    vlad = tf.concat([stream(part, valid=valid, training=training)
                      for stream, part in zip(self._streams, parts)], axis=-1)
    vlad = self._dropout(vlad, training=training)
    hidden = self._hidden_bn(self._hidden_dense(vlad), training=training)
    return self._gate(hidden, training=training)

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = yt8m_layers.serialize_regularizer(
        self._kernel_regularizer)
    return config


@factory.register_backbone_builder('nextvlad')
def build_nextvlad(model_config, l2_regularizer, name='backbone') -> NextVlad:
  config = model_config.backbone.nextvlad.as_dict()
  regularize = config.pop('regularize_backbone')
  return NextVlad(kernel_regularizer=l2_regularizer if regularize else None,
                  name=name, **config, **factory.norm_kwargs(model_config))
