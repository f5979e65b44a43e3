"""The joint model: one sub-model per task routine around one shared encoder
(its variable names and regularization: docs/readout.md, Joint training)."""
from typing import Any, Dict, List, Optional

import tensorflow as tf, tf_keras

from official.modeling.multitask import base_model
from official_ext.joint import configs
from official_ext.readout.modeling import layers as readout_layers
from official_ext.readout.modeling import model as readout_model
from official_ext.yt8m import configs as yt8m_configs
from official_ext.yt8m.modeling import heads as yt8m_heads


def _l2(l2_weight_decay: Optional[float]):
  """YT8M's kernel regularizer: decay / 2 * sum(w^2) (tf.nn.l2_loss scaled)."""
  return (tf_keras.regularizers.l2(l2_weight_decay / 2.0)
          if l2_weight_decay else None)


def build_yt8m_head(model_config: yt8m_configs.VideoClassificationModel,
                    num_classes: int,
                    l2_weight_decay: Optional[float] = None,
                    name: str = 'head') -> tf_keras.layers.Layer:
  """The YT8M head `model_config.head` names (MoE or logistic), built as the
  YT8M model builds it, its kernels regularized by `l2_weight_decay`."""
  head = model_config.head
  regularizer = _l2(l2_weight_decay)
  if head.type == 'moe':
    norm = model_config.norm_activation
    return yt8m_heads.MoeHead(
        num_classes=num_classes, kernel_regularizer=regularizer, name=name,
        norm_momentum=norm.norm_momentum, norm_epsilon=norm.norm_epsilon,
        use_sync_bn=norm.use_sync_bn, **head.moe.as_dict())
  if head.type == 'logistic':
    return yt8m_heads.LogisticHead(num_classes=num_classes,
                                   kernel_regularizer=regularizer, name=name,
                                   **head.logistic.as_dict())
  raise ValueError(f'model.head.type={head.type!r}; expected moe or logistic.')


class YT8MTokenModel(tf_keras.Model):
  """YouTube-8M frames through the shared encoder -> class probabilities.

  `call(inputs [B, T, F], num_frames [B] or None)` -> the YT8M head's
  outputs: frames projected to encoder tokens (timestamp: frame index x
  `seconds_per_frame`), encoded, averaged over the valid frames. The YT8M
  task's losses, steps and metrics run on it unchanged.
  """

  def __init__(self, encoder: readout_layers.TokenEncoder,
               model_config: yt8m_configs.VideoClassificationModel,
               num_classes: int,
               l2_weight_decay: Optional[float] = None,
               seconds_per_frame: float = 1.0, **kwargs):
    super().__init__(**kwargs)
    if not isinstance(model_config, yt8m_configs.VideoClassificationModel):
      config = yt8m_configs.VideoClassificationModel()
      config.override(dict(model_config), is_strict=True)
      model_config = config
    self._self_setattr_tracking = False
    self._config_dict = dict(
        encoder=encoder.get_config(), model_config=model_config.as_dict(),
        num_classes=num_classes, l2_weight_decay=l2_weight_decay,
        seconds_per_frame=seconds_per_frame)
    self._self_setattr_tracking = True
    self.frame_embedding = tf_keras.layers.Dense(
        encoder.hidden_size, kernel_regularizer=_l2(l2_weight_decay),
        name='frame_embedding')
    self.encoder = encoder
    self.head = build_yt8m_head(model_config, num_classes, l2_weight_decay)
    self._seconds_per_frame = float(seconds_per_frame)

  def call(self, inputs: tf.Tensor, num_frames: Optional[tf.Tensor] = None,
           training=None) -> Dict[str, tf.Tensor]:
    frames = tf.shape(inputs)[1]
    if num_frames is None:
      mask = tf.ones(tf.shape(inputs)[:2], tf.bool)
    else:
      mask = tf.sequence_mask(tf.reshape(num_frames, [-1]), frames)
    times = tf.cast(tf.range(frames), tf.float32) * self._seconds_per_frame
    times = tf.broadcast_to(times[None], tf.shape(mask))
    encoded, encoded_mask = self.encoder(self.frame_embedding(inputs), times,
                                         mask, training=training)
    weights = tf.cast(encoded_mask, encoded.dtype)[..., None]
    pooled = tf.math.divide_no_nan(tf.reduce_sum(encoded * weights, 1),
                                   tf.reduce_sum(weights, 1))
    return self.head(pooled, training=training)

  def get_config(self) -> Dict[str, Any]:
    return dict(self._config_dict)

  @classmethod
  def from_config(cls, config, custom_objects=None):
    config = dict(config)
    encoder = readout_layers.TokenEncoder.from_config(config.pop('encoder'))
    return cls(encoder, **config)


def add_kernel_l2(layer: tf_keras.layers.Layer, l2_weight_decay: float) -> None:
  """Adds l2_weight_decay / 2 * sum(w^2) over a built `layer`'s kernels to
  its losses (0: nothing)."""
  if not l2_weight_decay:
    return
  kernels = [v for v in layer.trainable_variables
             if v.name.split('/')[-1].startswith('kernel')]
  if not kernels:
    raise ValueError(f'{layer.name} has no kernel to regularize (is it '
                     'built?).')
  coefficient = l2_weight_decay / 2.0
  layer.add_loss(lambda: coefficient * tf.add_n(
      [tf.reduce_sum(tf.square(tf.cast(k, tf.float32))) for k in kernels]))


def regularization_losses(models: List[tf_keras.Model]) -> List[tf.Tensor]:
  """The models' regularization terms, a layer held by several (the shared
  encoder) counted once; layers compared at each model's top level."""
  seen, terms = set(), []
  for model in models:
    for layer in model.layers:
      if id(layer) in seen:
        continue
      seen.add(id(layer))
      terms.extend(tf.cast(loss, tf.float32) for loss in layer.losses)
  return terms


class JointModel(base_model.MultiTaskBaseModel):
  """One sub-model per task routine around one shared `TokenEncoder`.

  `sub_tasks`: {task name: a readout `ReadoutModel` or a `YT8MTokenModel`}.
  """

  def __init__(self, config: configs.JointTaskConfig, **kwargs):
    configs.validate(config)
    self._config = config
    self.encoder = readout_model.build_encoder(config.model.encoder)
    super().__init__(**kwargs)
    self.build()
    add_kernel_l2(self.encoder, config.model.encoder_l2_weight_decay)

  def _instantiate_sub_tasks(self) -> Dict[str, tf_keras.Model]:
    sub_tasks = {}
    for name, routine in zip(configs.task_names(self._config),
                             self._config.task_routines):
      task = routine.task_config
      if routine.family == 'readout':
        sub_tasks[name] = readout_model.build_model(task, encoder=self.encoder)
        continue
      data = task.train_data
      model = YT8MTokenModel(
          self.encoder, task.model, num_classes=data.num_classes,
          l2_weight_decay=task.losses.l2_weight_decay,
          seconds_per_frame=self._config.model.seconds_per_frame,
          name=f'{name}_tokens')
      model(tf.zeros([1, 1, sum(data.feature_sizes)]),
            num_frames=tf.ones([1], tf.int32), training=False)
      sub_tasks[name] = model
    return sub_tasks

  def regularization_losses(self) -> List[tf.Tensor]:
    """Every regularization term of the sub-models, each layer's once."""
    return regularization_losses(list(self.sub_tasks.values()))
