"""AssembleNet and AssembleNet++ models: published structures' parameter
counts and output shapes at a tiny clip, as Model Garden's factory builds
them, the object input and the config checks."""
import json

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.vision.modeling import factory_3d
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.assemblenet import configs
from official_ext.assemblenet import structures
from official_ext.assemblenet.modeling import assemblenet as asn
from tests.assemblenet import complexity
from official_ext.assemblenet.modeling import convolutions
from official_ext.assemblenet.modeling import fusion

T, S = 2, 32
NUM_CLASSES = 7


def _count(variables):
  return int(sum(int(np.prod(v.shape)) for v in variables))


def _model_config(backbone_type, structure, edge_weights, depth=50, **extra):
  fields = dict(model_id=str(depth), model_structure=json.dumps(structure),
                model_edge_weights=json.dumps(edge_weights),
                rep_flow=configs.RepFlow(num_iter=2))
  fields.update(extra)
  if backbone_type == 'assemblenet_plus':
    backbone = configs.Backbone3D(
        type=backbone_type, assemblenet_plus=configs.AssembleNetPlus(**fields))
  else:
    backbone = configs.Backbone3D(
        type=backbone_type, assemblenet=configs.AssembleNet(**fields))
  return configs.VideoClassificationModel(model_type=backbone_type,
                                          backbone=backbone)


def _build(backbone_type, structure, edge_weights, **kwargs):
  return factory_3d.build_model(
      backbone_type,
      input_specs=tf_keras.layers.InputSpec(shape=[None, T, S, S, 3]),
      model_config=_model_config(backbone_type, structure, edge_weights,
                                 **kwargs),
      num_classes=NUM_CLASSES)


PUBLISHED = {
    'asn50': ('assemblenet', structures.ASN50_STRUCTURE,
              structures.ASN_EDGE_WEIGHTS, 50, {}),
    'asn101': ('assemblenet', structures.ASN101_STRUCTURE,
               structures.ASN_EDGE_WEIGHTS, 101, {}),
    'asnp50_objects': ('assemblenet_plus', structures.FULL_ASNP50_STRUCTURE,
                       structures.FULL_ASNP_EDGE_WEIGHTS, 50,
                       {'use_object_input': True}),
    'asn50_under_assemblenet_plus': (
        'assemblenet_plus', structures.ASN50_STRUCTURE,
        structures.ASN_EDGE_WEIGHTS, 50, {}),
}


@pytest.mark.parametrize('name', sorted(PUBLISHED))
def test_published_networks_counts_and_shapes(name):
  backbone_type, structure, weights, depth, extra = PUBLISHED[name]
  model = _build(backbone_type, structure, weights, depth=depth, **extra)
  plus = backbone_type == 'assemblenet_plus'
  expected = complexity.analyze_assemblenet(
      structure, structures.assemblenet_blocks_per_level(depth), plus=plus,
      attention_mode='peer' if plus else None, height=S, width=S,
      num_classes=NUM_CLASSES)
  assert _count(model.trainable_variables) == expected.params
  specs = model.backbone.output_specs
  for i, (h, w, c) in enumerate(expected.node_shapes):
    assert tuple(specs[f'node_{i}']) == (None, T, h, w, c), i
  features = {'image': tf.random.uniform([1, T, S, S, 3])}
  if extra.get('use_object_input'):
    features['objects'] = tf.random.uniform([1, T, S, S], 0, 151, tf.int32)
  logits = model(features, training=False)
  assert logits.shape == (1, NUM_CLASSES) and logits.dtype == tf.float32
  assert np.all(np.isfinite(logits.numpy()))


# Level 0 takes the RGB stem (64 channels) and the object stem; the two
# level-3 nodes take the object stem and level 0 (16 channels), and the head
# reads both.
TINY_PLUS = [[-1, 1], [-3, 1], [0, [0, 1], 4, 2, 1], [3, [1, 2], 4, 1, 2],
             [3, [1, 2], 4, 2, 2]]
TINY_BLOCKS = [1, 1, 1, 2]


def _tiny_plus(num_object_classes=3, **kwargs):
  return asn.AssembleNet(
      TINY_PLUS, None, TINY_BLOCKS,
      input_specs=tf_keras.layers.InputSpec(shape=[None, T, 16, 16, 3]),
      plus=True, attention_mode='peer',
      num_object_classes=num_object_classes, **kwargs)


def test_object_input_is_excluded_from_the_fusion_width():
  """An object input (even with more channels than the others) is projected
  to the others' width, not the fusion to its width."""
  backbone = _tiny_plus(num_object_classes=100)
  f = backbone.get_layer('node_2_fusion')
  assert f.fusion_width == 64  # The RGB stem's, not the objects' 100.
  assert 'project_100' in [v.name.split('/')[-2] for v in f.variables]
  assert backbone.get_layer('node_3_fusion').fusion_width == 16
  # The peers' dense width: the largest of all lower nodes, objects included.
  peer = [v for v in f.variables if 'peer_dense_0/kernel' in v.name][0]
  assert peer.shape[-1] == 100
  with pytest.raises(ValueError, match='every input is excluded'):
    fusion.PeerAttentionFusion(2, width_excluded=[0, 1])(
        [tf.zeros([1, 1, 2, 2, 3]), tf.zeros([1, 1, 2, 2, 3])])


def test_object_stem_one_hot_pooled_and_checked():
  stem = asn.ObjectStem(3)
  ids = np.zeros([1, 1, 8, 8], np.int32)
  ids[0, 0, 0, 0] = 2
  ids[0, 0, 5, 6] = 1
  out = stem(tf.constant(ids)).numpy()
  assert out.shape == (1, 1, 2, 2, 3)
  np.testing.assert_array_equal(out[0, 0, 0, 0], [1, 0, 1])
  np.testing.assert_array_equal(out[0, 0, 1, 1], [1, 1, 0])
  np.testing.assert_array_equal(out[0, 0, 0, 1], [1, 0, 0])
  with pytest.raises(tf.errors.InvalidArgumentError, match="'objects'"):
    stem(tf.constant(np.full([1, 1, 4, 4], 3, np.int32)))


def test_object_stem_equals_max_pooled_one_hot_at_odd_sizes():
  """Eager and compiled by XLA, on sizes with 'same' padding."""
  stem = asn.ObjectStem(5)
  ids = tf.constant(np.random.default_rng(0).integers(0, 5, [2, 3, 10, 7]),
                    tf.int32)
  want = asn.frame_max_pool(tf.one_hot(ids, 5), 4, 4).numpy()
  np.testing.assert_array_equal(stem(ids).numpy(), want)
  compiled = tf.function(stem, jit_compile=True)
  np.testing.assert_array_equal(compiled(ids).numpy(), want)


def test_object_stem_never_holds_a_full_resolution_one_hot():
  """At the published clip and 151 classes a float one-hot of the maps is
  7.8 GB for 8 clips: no tensor of the traced stem has a tenth of its
  elements."""
  b, t, h, w, k = 8, 32, 224, 224, 151
  stem = asn.ObjectStem(k)
  graph = tf.function(stem).get_concrete_function(
      tf.TensorSpec([b, t, h, w], tf.int32)).graph
  largest = max(output.shape.num_elements() or 0
                for op in graph.get_operations() for output in op.outputs)
  assert largest < b * t * h * w * k / 10, largest


def test_model_object_input_errors():
  backbone = _tiny_plus()
  model = asn.AssembleNetModel(backbone, NUM_CLASSES)
  clip = tf.random.uniform([1, T, 16, 16, 3])
  ids = tf.zeros([1, T, 16, 16], tf.int32)
  assert model({'image': clip, 'objects': ids}).shape == (1, NUM_CLASSES)
  with pytest.raises(ValueError, match="needs the input 'objects'"):
    model({'image': clip})
  plain = asn.AssembleNetModel(
      asn.AssembleNet([[-1, 1], [3, [0], 4, 1, 2]], None, TINY_BLOCKS,
                      input_specs=tf_keras.layers.InputSpec(
                          shape=[None, T, 16, 16, 3])), NUM_CLASSES)
  with pytest.raises(ValueError, match='use_object_input'):
    plain({'image': clip, 'objects': ids})


def test_head_averages_every_level_3_node():
  backbone = _tiny_plus()
  model = asn.AssembleNetModel(backbone, NUM_CLASSES)
  clip = tf.random.uniform([2, T, 16, 16, 3])
  ids = tf.random.uniform([2, T, 16, 16], 0, 3, tf.int32)
  ends = backbone({'image': clip, 'objects': ids}, training=False)
  pooled = (tf.reduce_mean(ends['node_3'], [1, 2, 3]) +
            tf.reduce_mean(ends['node_4'], [1, 2, 3])) / 2
  expected = model.head._dense(pooled)  # pylint: disable=protected-access
  np.testing.assert_allclose(
      model({'image': clip, 'objects': ids}, training=False), expected,
      atol=1e-5)


def test_fixed_padding_convolution():
  """Strided: symmetric padding, then 'valid' (not 'same'); stride 1:
  'same'."""
  x = tf.random.uniform([1, 2, 8, 8, 3])
  conv = convolutions.conv2d_fixed_padding(4, 3, 2)
  y = conv(x)
  k = conv.kernel[0]
  padded = tf.pad(tf.reshape(x, [2, 8, 8, 3]), [[0, 0], [1, 1], [1, 1], [0, 0]])
  expected = tf.nn.conv2d(padded, k, 2, 'VALID')
  np.testing.assert_allclose(y.numpy().reshape(expected.shape), expected,
                             atol=1e-5)
  same = tf.nn.conv2d(tf.reshape(x, [2, 8, 8, 3]), k, 2, 'SAME')
  assert np.max(np.abs(same - expected)) > 1e-3
  assert convolutions.conv2d_fixed_padding(4, 3, 1)(x).shape == (1, 2, 8, 8, 4)


def test_config_checks():
  with pytest.raises(ValueError, match='use_object_input'):
    _build('assemblenet_plus', structures.FULL_ASNP50_STRUCTURE,
           structures.FULL_ASNP_EDGE_WEIGHTS)
  with pytest.raises(ValueError, match='use_object_input'):
    _build('assemblenet_plus', structures.ASN50_STRUCTURE,
           structures.ASN_EDGE_WEIGHTS, use_object_input=True)
  with pytest.raises(ValueError, match="'assemblenet_plus'"):
    _build('assemblenet', structures.FULL_ASNP50_STRUCTURE,
           structures.FULL_ASNP_EDGE_WEIGHTS)
  with pytest.raises(ValueError, match='model_id'):
    _build('assemblenet', structures.ASN50_STRUCTURE,
           structures.ASN_EDGE_WEIGHTS, depth=42)
  with pytest.raises(ValueError, match='concat'):
    _build('assemblenet', structures.ASN50_STRUCTURE,
           structures.ASN_EDGE_WEIGHTS, combine_method='concat')
  with pytest.raises(ValueError, match='one positive int'):
    structures.validate_structure(structures.ASSEMBLENET_PLUS_LITE_STRUCTURE,
                                  int_filters=True)
  with pytest.raises(ValueError, match='3 positive ints'):
    structures.validate_structure(structures.ASN50_STRUCTURE)


def test_stem_filters_from_the_config_reach_every_stem():
  """`stem_filters` (None: the original's 128 // the number of stems) sets
  the filters of every stem the structure has (an RGB and a flow stem)."""
  structure = [[-1, 1], [-2, 1], [3, [0, 1], 4, 1, 2]]

  def stem_filters(**extra):
    model = _build('assemblenet', structure, None, blocks_per_level=[1] * 4,
                   model_edge_weights='', **extra)
    return {v.shape[-1] for v in model.trainable_variables
            if v.name.split('/')[0] in ('node_0', 'node_1')
            and v.name.endswith('kernel:0')}

  assert stem_filters() == {64}
  assert stem_filters(stem_filters=8) == {8}
