"""The YT8M model's backbone and head registries (`modeling/factory.py`)."""
import dataclasses
import math

import pytest
import tensorflow as tf, tf_keras

from official_ext.yt8m import configs
from official_ext.yt8m.modeling import factory
from official_ext.yt8m.modeling import model as yt8m_model
from official_ext.yt8m.modeling import starter

FEATURES = 12  # = sum of the tiny feature_sizes below.
CLASSES = 5
_STREAMS = {'feature_sizes': [8, 4], 'cluster_sizes': [4, 2]}
_NEXTVLAD = dict(_STREAMS, groups=[2, 2], expansion=1, hidden_size=8,
                 gating_reduction=2)
TINY = {
    'dbof': {'dbof': {'cluster_size': 16, 'hidden_size': 8}},
    'nextvlad': {'nextvlad': _NEXTVLAD},
    'mix_nextvlad': {'mix_nextvlad': dict(_NEXTVLAD, num_branches=2)},
    'frame_average': {},
    'lstm': {'lstm': {'cells': 8, 'layers': 2}},
    'netvlad': {'netvlad': dict(_STREAMS, hidden_size=8)},
    'netrvlad': {'netrvlad': dict(_STREAMS, hidden_size=8)},
    'soft_dbof': {'soft_dbof': dict(_STREAMS, hidden_size=8)},
    'netfv': {'netfv': dict(_STREAMS, hidden_size=8)},
    'identity': {'identity': {'l2_normalize': True}},
}
# (backbone class, head class, variables, parameters, regularization losses)
# of each pair, as the if/elif chain the registries replace built them.
BUILT = {
    'dbof+logistic': ('Dbof', 'LogisticHead', 14, 485, 3),
    'dbof+moe': ('Dbof', 'MoeHead', 15, 650, 4),
    'frame_average+logistic': ('FrameAverage', 'LogisticHead', 2, 65, 1),
    'frame_average+moe': ('FrameAverage', 'MoeHead', 3, 310, 2),
    'identity+logistic': (None, 'LogisticHead', 2, 65, 1),
    'identity+moe': (None, 'MoeHead', 3, 310, 2),
    'lstm+logistic': ('Lstm', 'LogisticHead', 6, 1261, 1),
    'lstm+moe': ('Lstm', 'MoeHead', 7, 1426, 2),
    'mix_nextvlad+logistic': ('MixNextVlad', 'MixtureLogisticHead', 88, 1404,
                              2),
    'netfv+logistic': ('WillowBackbone', 'LogisticHead', 27, 981, 1),
    'netfv+moe': ('WillowBackbone', 'MoeHead', 28, 1146, 2),
    'netrvlad+logistic': ('WillowBackbone', 'LogisticHead', 23, 581, 1),
    'netrvlad+moe': ('WillowBackbone', 'MoeHead', 24, 746, 2),
    'netvlad+logistic': ('WillowBackbone', 'LogisticHead', 25, 621, 1),
    'netvlad+moe': ('WillowBackbone', 'MoeHead', 26, 786, 2),
    'nextvlad+logistic': ('NextVlad', 'LogisticHead', 41, 665, 1),
    'nextvlad+moe': ('NextVlad', 'MoeHead', 42, 830, 2),
    'soft_dbof+logistic': ('WillowBackbone', 'LogisticHead', 18, 213, 1),
    'soft_dbof+moe': ('WillowBackbone', 'MoeHead', 19, 378, 2),
}


def _config(backbone, head='moe'):
  c = configs.VideoClassificationModel()
  c.backbone.type = backbone
  c.backbone.override(TINY.get(backbone, {}))
  c.head.type = head
  c.head.moe.num_mixtures = 2
  return c


def test_every_config_type_is_registered():
  assert factory.registered_backbones() == sorted(TINY)
  assert factory.registered_heads() == ['logistic', 'moe']


@pytest.mark.parametrize('pair', sorted(BUILT))
def test_every_registered_type_builds_the_same_model(pair):
  backbone, head = pair.split('+')
  model = yt8m_model.build_model(_config(backbone, head), CLASSES, FEATURES,
                                 l2_weight_decay=1e-3)
  built = (None if model.backbone is None else type(model.backbone).__name__,
           type(model.head).__name__, len(model.variables),
           sum(math.prod(v.shape) for v in model.variables),
           len(model.losses))
  assert built == BUILT[pair]


def test_unknown_types_name_the_registered_ones():
  with pytest.raises(ValueError, match=(
      r"task.model.backbone.type='resnet'; expected one of the registered "
      r'types: dbof, frame_average, identity, lstm, .*soft_dbof\.')):
    yt8m_model.build_model(_config('resnet'), CLASSES, FEATURES)
  with pytest.raises(ValueError, match=(
      r"task.model.head.type='svm'; expected one of the registered types: "
      r'logistic, moe\.')):
    yt8m_model.build_model(_config('dbof', 'svm'), CLASSES, FEATURES)


@dataclasses.dataclass
class _Backbone(configs.Backbone):
  frame_mean: configs.FrameAverageModel = dataclasses.field(
      default_factory=configs.FrameAverageModel)


@dataclasses.dataclass
class _ModelConfig(configs.VideoClassificationModel):
  backbone: _Backbone = dataclasses.field(default_factory=_Backbone)


def test_a_new_backbone_is_a_config_field_and_one_registered_builder():
  config = _ModelConfig()
  config.backbone.type = 'frame_mean'
  config.head.type = 'logistic'
  with pytest.raises(ValueError, match=(
      r"task.model.backbone.type='frame_mean'; expected one of the registered "
      r'types: dbof, frame_average, identity, lstm, .*soft_dbof\.')):
    yt8m_model.build_model(config, CLASSES, FEATURES)

  @factory.register_backbone_builder('frame_mean')
  def build(model_config, l2_regularizer, name='backbone'):
    del model_config, l2_regularizer
    return starter.FrameAverage(name=name)

  try:
    model = yt8m_model.build_model(config, CLASSES, FEATURES)
    out = model(tf.ones([2, 3, FEATURES]), num_frames=tf.constant([1, 3]))
    assert out['predictions'].shape == (2, CLASSES)
    assert isinstance(model.backbone, starter.FrameAverage)
  finally:
    del factory._BACKBONES['frame_mean']  # pylint: disable=protected-access


def test_the_mixture_brings_its_head_and_needs_logistic():
  with pytest.raises(ValueError, match="'mix_nextvlad' backbone mixes one "
                     "'logistic' classifier"):
    yt8m_model.build_model(_config('mix_nextvlad', 'moe'), CLASSES, FEATURES)
  assert isinstance(factory.build_head(_config('mix_nextvlad', 'logistic'),
                                       CLASSES), tf_keras.layers.Layer)
