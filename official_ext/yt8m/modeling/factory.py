"""Backbone and head registries of the YT8M model, keyed by config `type`."""
from typing import Any, Callable, Dict, Optional

import tf_keras

from official.core import registry
from official_ext.yt8m import configs

# builder(model_config, l2_regularizer, name) -> backbone layer, or None when
# the head reads the video-level features directly.
BackboneBuilder = Callable[..., Optional[tf_keras.layers.Layer]]
# builder(model_config, num_classes, l2_regularizer, name) -> head layer.
HeadBuilder = Callable[..., tf_keras.layers.Layer]

_BACKBONES: Dict[str, BackboneBuilder] = {}
_HEADS: Dict[str, HeadBuilder] = {}
_BACKBONE_HEADS: Dict[str, HeadBuilder] = {}


def register_backbone_builder(key: str):
  """Registers a backbone builder under `task.model.backbone.type` `key`."""
  return registry.register(_BACKBONES, key)


def register_head_builder(key: str):
  """Registers a head builder under `task.model.head.type` `key`."""
  return registry.register(_HEADS, key)


def register_backbone_head_builder(backbone_type: str):
  """Registers the head a backbone brings along, used instead of `head.type`'s."""
  return registry.register(_BACKBONE_HEADS, backbone_type)


def registered_backbones():
  return sorted(_BACKBONES)


def registered_heads():
  return sorted(_HEADS)


def norm_kwargs(model_config: configs.VideoClassificationModel
                ) -> Dict[str, Any]:
  """The batch-norm arguments of `model_config.norm_activation`."""
  norm = model_config.norm_activation
  return dict(norm_momentum=norm.norm_momentum, norm_epsilon=norm.norm_epsilon,
              use_sync_bn=norm.use_sync_bn)


def _lookup(collection, key: str, config_key: str):
  if key not in collection:
    raise ValueError(f'{config_key}={key!r}; expected one of the registered '
                     f'types: {", ".join(sorted(collection))}.')
  return registry.lookup(collection, key)


def build_backbone(model_config: configs.VideoClassificationModel,
                   l2_regularizer=None,
                   name: str = 'backbone') -> Optional[tf_keras.layers.Layer]:
  """The registered backbone of `model_config.backbone.type`.

  Raises:
    ValueError: the type is not registered (the message lists those that are).
  """
  builder = _lookup(_BACKBONES, model_config.backbone.type,
                    'task.model.backbone.type')
  return builder(model_config, l2_regularizer, name=name)


def build_head(model_config: configs.VideoClassificationModel,
               num_classes: int, l2_regularizer=None,
               name: str = 'head') -> tf_keras.layers.Layer:
  """The backbone's own head if it registered one, else `head.type`'s.

  Raises:
    ValueError: the head type is not registered (the message lists those that
      are).
  """
  builder = _BACKBONE_HEADS.get(model_config.backbone.type)
  if builder is None:
    builder = _lookup(_HEADS, model_config.head.type, 'task.model.head.type')
  return builder(model_config, num_classes, l2_regularizer, name=name)
