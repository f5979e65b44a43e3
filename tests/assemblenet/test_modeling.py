"""AssembleNet++lite backbone: shapes, structure checks, edge weights, flow."""
import json

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.vision.modeling.backbones import factory as backbone_factory
from official_ext.assemblenet.modeling import assemblenet_plus_lite as anet
from official_ext.assemblenet.modeling import blocks
from tests.assemblenet import complexity
from official_ext.assemblenet.modeling import convolutions
from official_ext.assemblenet.modeling import fusion
from official_ext.assemblenet.modeling import representation_flow
from official_ext.assemblenet import structures
from official_ext.benchmarks import graph_flops
from official_ext.core.kernels import kernel_policy
from official_ext import registry_imports  # pylint: disable=unused-import
from tests.benchmarks import flop_formulas

T, S = 4, 32


def _count(variables):
  return int(sum(int(np.prod(v.shape)) for v in variables))


def _tiny(attention_mode='peer', edge_weights=None, frames=T, **kwargs):
  # Two flow iterations: shapes and variables do not depend on their number
  # (each is an unrolled step of the flow's XLA program, ~0.4 s to compile).
  kwargs.setdefault('rep_flow_options', {'num_iter': 2})
  return anet.AssembleNetPlusLite(
      structures.TINY_STRUCTURE, edge_weights, structures.TINY_BLOCKS_PER_LEVEL,
      input_specs=tf_keras.layers.InputSpec(shape=[None, frames, S, S, 3]),
      stem_filters=8, attention_mode=attention_mode, **kwargs)


NUM_CLASSES = 7
HEAD_FILTERS = (16, 24)


@pytest.fixture(scope='module')
def tiny_models():
  """`get(attention_mode, given)`: (backbone, model), each built once per
  module: the tiny backbone (edge weights `_tiny_edge_weights()` if `given`,
  else learned) and a model on it (NUM_CLASSES classes, HEAD_FILTERS, average
  pooling, dropout 0.3). Tests only read their variables or call them (which
  moves nothing but batch-norm moving statistics)."""
  cache = {}

  def get(attention_mode, given):
    key = (attention_mode, given)
    if key not in cache:
      backbone = _tiny(attention_mode, _tiny_edge_weights() if given else None)
      cache[key] = backbone, anet.AssembleNetPlusLiteModel(
          backbone, num_classes=NUM_CLASSES, head_filters=HEAD_FILTERS,
          dropout_rate=0.3)
    return cache[key]

  return get


# 'self' with given edge weights, the others learn them: the forward pass of
# both kinds of fusion weights (and the models are shared with the parameter
# counts below).
@pytest.mark.parametrize('attention_mode, given', [
    (None, False), ('self', True), ('peer', False)])
def test_output_shapes(tiny_models, attention_mode, given):
  backbone, average_pooled = tiny_models(attention_mode, given)
  clips = tf.random.uniform([2, T, S, S, 3])
  for max_pool_predictions in (False, True):
    model = average_pooled if not max_pool_predictions else (
        anet.AssembleNetPlusLiteModel(
            backbone, num_classes=NUM_CLASSES, head_filters=HEAD_FILTERS,
            max_pool_predictions=True, dropout_rate=0.3))
    logits = model({'image': clips}, training=True)
    assert logits.shape == (2, 7) and logits.dtype == tf.float32
    assert np.all(np.isfinite(logits.numpy()))
  endpoints = backbone(clips, training=False)
  # Stems at S/2, then each strided node halves the fused (smallest) size.
  assert endpoints['node_0'].shape == (2, T, 16, 16, 8)
  assert endpoints['node_1'].shape == (2, T, 16, 16, 8)
  assert endpoints['node_2'].shape == (2, T, 8, 8, 8)
  assert endpoints['node_4'].shape == (2, T, 4, 4, 8)
  assert endpoints['node_5'].shape == (2, T, 2, 2, 12)
  assert endpoints['output'].shape == (2, T, 2, 2, 16)
  names = [v.name for v in backbone.trainable_variables]
  n_attention = sum('attention_' in n and 'peer_weights' not in n
                    for n in names)
  n_peer = sum('peer_dense' in n for n in names)
  if attention_mode is None:
    assert n_attention == 0 and n_peer == 0
  elif attention_mode == 'self':
    assert n_attention > 0 and n_peer == 0
  else:
    assert n_attention > 0 and n_peer > 0


def test_max_pool_predictions_is_softmax_over_time():
  head = anet.LiteHead(3, filters=(4, 5), max_pool_predictions=True)
  x = tf.random.normal([2, 6, 2, 2, 8])
  out = head(x, training=False)
  # Recompute from the head's own per-frame logits.
  h = head._bn2(head._conv2(head._bn1(head._conv1(x))))
  per_frame = head._dense(tf.reduce_mean(h, [2, 3]))  # [2, 6, 3]
  acts = tf.nn.softmax(per_frame / np.sqrt(6.0), axis=1)
  np.testing.assert_allclose(out, tf.reduce_sum(per_frame * acts, 1),
                             rtol=1e-5, atol=1e-6)


def test_frame_counts_the_network_cannot_take_are_named():
  """Every temporal stride is 1: any frame count works but for the flow
  stem's 2 (flow between consecutive frames). A static count is checked
  when the network is built, an unknown one (T None, built for evaluation
  clips longer than training clips) when it is called: eagerly or traced
  with a known count a ValueError, in a graph where it is known only at run
  time an InvalidArgumentError. (That a network built with T None computes
  what a static one does: tests/assemblenet/test_eval_coverage.py.)"""
  assert structures.min_num_frames(structures.TINY_STRUCTURE) == 2
  assert structures.min_num_frames([[-1, 1], [3, [0], [4, 4, 4], 1, 1]]) == 1
  with pytest.raises(ValueError, match=r'input_specs \[None, 1, 32, 32, 3\]: '
                     r'1 frames; AssembleNet\+\+lite takes any frame count '
                     r'>= 2 \(all its temporal strides are 1; the flow stem '
                     r'\(node 1\) computes optical flow between consecutive '
                     r'frames\)'):
    _tiny(frames=1)
  # A known count when called: test_rep_flow_trainable_options_and_still_
  # frames; a count known only at run time:
  flow = representation_flow.RepresentationFlow(num_iter=1, name='rep_flow')
  unknown = tf.function(flow, input_signature=[
      tf.TensorSpec([None, None, 8, 8, 3], tf.float32)])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'rep_flow: the flow stem needs clips of at least '
                     r'2 frames.*\[1\]'):
    unknown(tf.zeros([2, 1, 8, 8, 3]))


def test_dropout_rate_is_a_drop_rate():
  """In training, 90 % of the pooled features are dropped at rate 0.9 and
  the rest scaled by 1 / 0.1 (a keep probability would drop 10 %)."""
  head = anet.LiteHead(3, filters=(4, 5), dropout_rate=0.9)
  x = tf.random.normal([4000, 2, 2, 2, 8], seed=1)
  head(x, training=False)  # Build.
  # The dense layer passes pooled features 0..2 through unchanged.
  head._dense.kernel.assign(np.eye(5, 3, dtype=np.float32))
  head._dense.bias.assign(np.zeros(3, np.float32))
  out = head(x, training=True).numpy()
  h = head._bn2(head._conv2(head._bn1(head._conv1(x), training=True)),
                training=True)
  pooled = tf.reduce_mean(h, [1, 2, 3]).numpy()[:, :3]
  dropped = out == 0.0
  assert abs(dropped.mean() - 0.9) < 0.02
  np.testing.assert_allclose(out[~dropped], pooled[~dropped] / 0.1,
                             rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match='drop rate'):
    anet.LiteHead(3, dropout_rate=1.0)


@pytest.mark.parametrize('structure, message', [
    ([[-1, 1], [0, [1], [8, 8, 8], 1, 2], [3, [1], [8, 8, 8], 1, 2]],
     r'node 1 .*input index 1 must be >= 0 and lower'),
    ([[-1, 1], [4, [0], [8, 8, 8], 1, 2]], r'node 1 .*block_level must be 0..3'),
    ([[-1, 1], [3, [0], [8, 8], 1, 2]], r'node 1 .*filters must be 3 positive'),
    ([[-1, 1], [3, [0], [8, 0, 8], 1, 2]], r'node 1 .*filters must be 3'),
    ([[-1, 1], [3, [], [8, 8, 8], 1, 2]], r'node 1 .*non-empty list'),
    ([[-1, 1], [3, [0, 0], [8, 8, 8], 1, 2]], r'node 1 .*repeat'),
    ([[-5, 1], [3, [0], [8, 8, 8], 1, 2]], r'node 0 .*stem_type -1'),
    ([[-1, 1], [2, [0], [8, 8, 8], 1, 2]], r'no level-3 node'),
    ([[-1, 1], [3, [0], [8, 8, 8], 0, 2]], r'node 1 .*temporal_dilation'),
    ('[[-1, 1], [3, [0], [8, 8, 8], 1', r'not valid JSON'),
])
def test_structure_validation_names_the_node(structure, message):
  with pytest.raises(ValueError, match=message):
    structures.validate_structure(structure)


def test_edge_weight_validation_and_object_stem():
  s = structures.ASSEMBLENET_PLUS_LITE_STRUCTURE
  w = json.loads(json.dumps(structures.ASSEMBLENET_PLUS_LITE_EDGE_WEIGHTS))
  structures.validate_structure(s, w)
  bad = json.loads(json.dumps(w))
  bad[4] = [[0.5, 0.5, 0.5]]
  with pytest.raises(ValueError, match='node 4: expected'):
    structures.validate_structure(s, bad)
  bad = json.loads(json.dumps(w))
  bad[3] = [[1.0, 0.5]]
  with pytest.raises(ValueError, match='node 3: weights are post-sigmoid'):
    structures.validate_structure(s, bad)
  with pytest.raises(ValueError, match='one entry per node'):
    structures.validate_structure(s, w[:-1])
  with pytest.raises(ValueError, match=r'node 2 .*object-input stem'):
    anet.AssembleNetPlusLite(
        [[-1, 1], [-2, 1], [-3, 1], [3, [0, 1], [8, 8, 8], 1, 2]], None,
        (1, 1, 1, 1), input_specs=tf_keras.layers.InputSpec(
            shape=[None, T, S, S, 3]), stem_filters=4)


def _tiny_edge_weights():
  weights = []
  for node in structures.TINY_STRUCTURE:
    n = 0 if node[0] < 0 else len(node[1])
    weights.append([] if n <= 1 else [list(np.linspace(0.2, 0.8, n))])
  return weights


def test_fixed_vs_trainable_edge_weights(tiny_models):
  weights = _tiny_edge_weights()
  learned, _ = tiny_models('peer', False)
  fixed, _ = tiny_models('peer', True)
  multi_input = [i for i, n in enumerate(structures.TINY_STRUCTURE)
                 if n[0] >= 0 and len(n[1]) > 1]
  agg = lambda m, trainable: [  # pylint: disable=g-long-lambda
      v for v in (m.trainable_variables if trainable else
                  m.non_trainable_variables) if 'agg_weights' in v.name]
  assert len(agg(learned, True)) == len(multi_input)
  assert len(agg(fixed, True)) == 0
  assert len(agg(fixed, False)) == len(multi_input)
  assert (len(learned.trainable_variables) ==
          len(fixed.trainable_variables) + len(multi_input))
  # Given weights are stored as logits: sigmoid gives them back.
  layer = fixed.get_layer('node_5_fusion')
  np.testing.assert_allclose(tf.sigmoid(layer.agg_weights), weights[5][0],
                             rtol=1e-6)
  # Learned weights start near sigmoid(0) = 0.5 (truncated normal 0.01).
  w = learned.get_layer('node_5_fusion').agg_weights.numpy()
  assert np.all(np.abs(w) <= 0.02) and np.any(w != 0)


def test_given_edge_weights_are_the_originals_logits():
  """The fixed logits are computed as the original's `fusion_with_peer_
  attention` does, in float32: `-np.log(1. / w - 1.)` of the weights cast
  to float32 (bit for bit; float64 arithmetic rounds some differently, e.g.
  the published node 9's third weight, whose logit is near 0)."""
  weights = structures.ASSEMBLENET_PLUS_LITE_EDGE_WEIGHTS[9][0]
  layer = fusion.PeerAttentionFusion(num_inputs=len(weights),
                                     edge_weights=weights)
  layer.build([[2, 1, 4, 4, 3]] * len(weights))
  w = np.asarray(weights).astype('float32')
  np.testing.assert_array_equal(layer.agg_weights.numpy(),
                                -np.log(1. / w - 1.))


def test_single_input_node_passes_through_unweighted():
  layer = fusion.PeerAttentionFusion(num_inputs=1, attention_mode=None)
  x = tf.random.normal([2, 3, 4, 4, 5])
  np.testing.assert_array_equal(layer([x]), x)
  assert not layer.weights


def test_fusion_pools_weights_and_projects():
  a = tf.random.normal([1, 2, 8, 8, 4])  # pooled by 2 to 4x4
  b = tf.random.normal([1, 2, 4, 4, 6])
  c = tf.random.normal([1, 2, 4, 4, 6])
  layer = fusion.PeerAttentionFusion(3, None, [0.25, 0.5, 0.75])
  out = layer([a, b, c])
  assert layer.fusion_width == 6 and out.shape == (1, 2, 4, 4, 6)
  pooled = tf.nn.max_pool3d(a, [1, 1, 2, 2, 1], [1, 1, 2, 2, 1], 'SAME')
  expected = (layer._projections['4'](0.25 * pooled) + 0.5 * b + 0.75 * c)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
  # The original's 5-D defect: the fusion width is an input's *width*.
  orig = fusion.PeerAttentionFusion(3, None, [0.25, 0.5, 0.75],
                                    fusion_width_as_channels=True)
  assert orig([a, b, c]).shape == (1, 2, 4, 4, 8)  # width of `a`, not 6
  assert sorted(orig._projections) == ['4', '6']


def test_fusion_takes_peers_or_their_spatial_means():
  # The backbone gives peer attention each node's mean ([B, T, C]), shared
  # by the fusions; a fusion given the nodes themselves averages them.
  x = tf.random.normal([1, 2, 4, 4, 3])
  peers = [tf.random.normal([1, 2, 8, 8, 5]), tf.random.normal([1, 2, 4, 4, 2])]
  layer = fusion.PeerAttentionFusion(1, 'peer')
  out = layer([x] + peers)
  means = [fusion.SpatialMean()(p) for p in peers]
  assert means[0].shape == (1, 2, 5)
  np.testing.assert_array_equal(layer([x] + means), out)
  with pytest.raises(ValueError, match=r'fusion_1: peer 0 must be .* got '
                     r'shape \[1, 2, 5, 5\]'):
    fusion.PeerAttentionFusion(1, 'peer', name='fusion_1')(
        [x, tf.zeros([1, 2, 5, 5])])
  pool = fusion.SpatialMaxPool(2)
  np.testing.assert_array_equal(pool(peers[0]),
                                fusion.spatial_max_pool(peers[0], 2))


def _charades_params(**backbone_overrides):
  params = exp_factory.get_exp_config('assemblenet_plus_lite_charades')
  params.override({'task': {'model': {'backbone': {
      'assemblenet_plus_lite': backbone_overrides}}}}, is_strict=True)
  return params


def _charades_backbone(**backbone_overrides):
  """The backbone alone, as the model builder makes it (Model Garden's
  backbone factory), for one clip (a static batch: the flow's nested
  function then has static shapes, which the FLOP count reads): the model
  calls the backbone again to wire the head to it, which adds ~40 % to the
  backbone's build time."""
  task = _charades_params(**backbone_overrides).task
  return backbone_factory.build_backbone(
      input_specs=tf_keras.layers.InputSpec(
          shape=[1] + list(task.train_data.feature_shape)),
      backbone_config=task.model.backbone, norm_activation_config=None)


def test_published_parameter_and_flop_counts():
  """The published lite network (Charades: 157 classes, peer attention, the
  published edge weights, 32 x 224^2 clips), its backbone built by Model
  Garden's backbone factory; its FLOPs as the benchmarks count them
  (`benchmarks/graph_flops.py`, the traced forward pass) equal the hand
  formula (tests/benchmarks/flop_formulas.py).

  50,042,581 trainable parameters with the intended fusion: most of them in
  the [3, 3, 3] 432->432 convs of the 7 level-3 blocks (6 x 5.04M) and the
  152->152 convs of the 22 level-2 blocks (~0.62M each); the head has
  0.08M + 0.89M (convs) + 0.32M (dense). The edge weights are given, so they
  are not trainable; peer attention adds per-node candidate dense layers and a
  softmax weight vector and dense layer per connection.

  With `fusion_width_as_channels` (the original TF1 code's 5-D fusion, which
  takes its projection width from the input *width*), nodes 2-9 fuse to 112
  channels (the stems' width at 224^2) and node 10 to 14 channels (the width
  of node 8): 66,192 more parameters, 50,108,773 -- the original's count at
  224^2. The same shapes give the original's 394.1 GFLOP per 32 x 224^2
  clip quoted for the TF1 code in its convolutions and dense layers (ours:
  376.8), and the representation flow adds 1.0 GFLOP.
  """
  intended = complexity.analyze(fusion_width_as_channels=False)
  original = complexity.analyze(fusion_width_as_channels=True)
  assert intended.params == 50_042_581
  assert original.params == 50_108_773
  assert original.fusion_widths[2:] == [112] * 8 + [14]
  flops = flop_formulas.assemblenet_flops(fusion_width_as_channels=True)
  assert round((flops['Conv3D'] + flops['MatMul']) / 1e9, 1) == 394.1
  assert round(flops['Conv2D'] / 1e9, 1) == 1.0
  flops = flop_formulas.assemblenet_flops()
  assert round((flops['Conv3D'] + flops['MatMul']) / 1e9, 1) == 376.8
  # Building the network is graph construction (~17,000 ops; no forward
  # pass over a clip): its time (~25 s per network on 2 idle cores) does not
  # depend on the clip size, so the published 32 x 224^2 clip, which the
  # original's count needs, costs nothing extra.
  # The backbone alone, as the model builder makes it; the head (through
  # task_factory, with the model around it) is counted analytically here and
  # against a built model in `test_tiny_model_matches_analytic_count`.
  head = 192 * 432 + 2 * 432 + 432 * 2048 + 2 * 2048 + 2048 * 157 + 157
  backbone = _charades_backbone()
  assert backbone.input_shape == (1, 32, 224, 224, 3)
  assert _count(backbone.trainable_variables) == intended.params - head
  clip = tf.zeros([1, 32, 224, 224, 3])
  assert graph_flops.forward_flops(backbone, clip) == (
      flop_formulas.assemblenet_forward_flops(head=False))
  # The head does not depend on the fusion: the original's backbone alone.
  # Its fusion widths come from the stems and nodes, not from the number of
  # blocks inside a node, so one block per level (a tenth of the build time)
  # checks the same fusion projections against the analysis.
  one_block = (1, 1, 1, 1)
  backbone = _charades_backbone(fusion_width_as_channels=True,
                                blocks_per_level=one_block)
  assert backbone.input_shape == (1, 32, 224, 224, 3)
  assert graph_flops.forward_flops(backbone, clip) == (
      flop_formulas.assemblenet_forward_flops(
          fusion_width_as_channels=True, blocks_per_level=one_block,
          head=False))
  original_one_block = complexity.analyze(fusion_width_as_channels=True,
                                          blocks_per_level=one_block)
  assert original_one_block.fusion_widths == original.fusion_widths
  assert (_count(backbone.trainable_variables) ==
          original_one_block.params - head)
  # The original's count depends on the resolution; the intended one not.
  assert complexity.analyze(fusion_width_as_channels=True, height=112,
                            width=112).params == 50_042_413
  assert complexity.analyze(height=112, width=112).params == intended.params


@pytest.mark.parametrize('attention_mode, given', [
    (None, False), ('self', True), ('peer', False), ('peer', True)])
def test_tiny_model_matches_analytic_count(tiny_models, attention_mode,
                                          given):
  _, model = tiny_models(attention_mode, given)
  expected = complexity.analyze(
      structures.TINY_STRUCTURE, structures.TINY_BLOCKS_PER_LEVEL,
      edge_weights_given=given, attention_mode=attention_mode,
      height=S, width=S, num_classes=NUM_CLASSES,
      stem_filters=8, head_filters=HEAD_FILTERS)
  assert _count(model.trainable_variables) == expected.params


def test_conv3d_same_padding_kernels():
  x = tf.zeros([1, 4, 9, 9, 2])
  conv2d = convolutions.conv3d_same_padding(3, 3, 2, do_2d_conv=True)
  assert conv2d(x).shape == (1, 4, 5, 5, 3)
  assert conv2d.kernel.shape == (1, 3, 3, 2, 3) and not conv2d.use_bias
  conv3d = convolutions.conv3d_same_padding(3, 3, 1, temporal_dilation=2)
  assert conv3d(x).shape == (1, 4, 9, 9, 3)
  assert conv3d.kernel.shape == (3, 3, 3, 2, 3)
  assert conv3d.dilation_rate == (2, 1, 1) and conv3d.strides == (1, 1, 1)


@pytest.mark.parametrize('kernel,strides,dilation,shape', [
    ([3, 1, 1], 1, 2, [2, 8, 5, 5, 3]),  # A stem's / strided block's temporal.
    ([3, 1, 1], 1, 4, [1, 3, 4, 4, 2]),  # Fewer frames than the dilation.
    ([3, 1, 1], 1, 4, [1, 3, 5, 5, 2]),  # The same on larger frames.
    ([3, 3, 3], 1, 2, [2, 5, 7, 6, 3]),  # An unstrided block's conv_b.
    ([3, 3, 3], 1, 1, [2, 5, 7, 6, 3]),  # The same, undilated.
    ([3, 3, 3], 1, 2, [1, 3, 4, 3, 3]),  # Small frames: one matmul.
    ([1, 3, 3], 2, 1, [2, 3, 7, 8, 3]),  # A stem's / strided block's conv_b.
    ([1, 1, 1], 1, 1, [2, 3, 5, 5, 3]),  # conv_a, conv_c, projections.
    ([1, 1, 1], 2, 1, [2, 3, 7, 6, 3]),  # A strided shortcut.
])
@pytest.mark.parametrize('onednn', [False, True])
def test_conv3d_implementations(kernel, strides, dilation, shape, onednn):
  """Both CPU fast paths of `convolutions.Conv3D`, as the CPU kernel policy
  picks them (`conv3d_implementation`: with oneDNN reported on, the native
  Conv3D op for kernels of more than one tap but dilated ones on frames of
  <= 16 pixels, a dilation as the time phases folded into the batch; else
  `conv3d_as_2d`: no Conv3D; never a 5-D SpaceToBatchND) give TensorFlow's
  (dilated) 3-D convolution's values and gradients (input and kernel; the
  temporal taps' gradient is written out in `shift_and_sum_taps`) to
  float32 rounding, also for a batch and frame count known only at run
  time."""
  native = (onednn and kernel != [1, 1, 1] and
            (dilation == 1 or shape[2] * shape[3] > 16))
  policy = kernel_policy.resolve('auto', 'CPU', onednn)
  x = tf.constant(np.random.default_rng(0).normal(size=shape), tf.float32)
  conv = convolutions.conv3d_same_padding(4, kernel, strides, dilation)
  conv.build(x.shape)
  expected = tf.nn.convolution(x, conv.kernel, [1, strides, strides],
                               padding='SAME', dilations=[dilation, 1, 1])
  with kernel_policy.use(policy):
    dynamic = tf.function(conv).get_concrete_function(
        tf.TensorSpec([None, None, *shape[2:]], tf.float32))
    eager = conv(x)
  ops = [n.op for n in dynamic.graph.as_graph_def().node]
  assert 'SpaceToBatchND' not in ops
  assert ('Conv3D' in ops) == native, ops
  for got in (eager, dynamic(x)):
    assert got.shape == expected.shape
    # Sums of up to 27 x 3 products of normal(0, 1) values, reordered.
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5,
                               atol=1e-5)
  cotangent = tf.constant(
      np.random.default_rng(1).normal(size=expected.shape), tf.float32)
  grads = []
  for fn in (conv.convolution_op, lambda x, k: tf.nn.convolution(
      x, k, [1, strides, strides], padding='SAME', dilations=[dilation, 1, 1])):

    @tf.function  # Conv3D's gradient needs a graph (its attrs), not eager.
    def gradient(x, kernel, fn=fn):
      with tf.GradientTape() as tape:
        tape.watch([x, kernel])
        y = tf.reduce_sum(fn(x, kernel) * cotangent)
      return tape.gradient(y, [x, kernel])

    with kernel_policy.use(policy):
      grads.append(gradient(x, tf.convert_to_tensor(conv.kernel)))
  for got, expected in zip(*grads):
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4,
                               atol=1e-4)


def test_conv3d_takes_native_op_where_onednn_makes_it_faster():
  """On a CPU with oneDNN's kernels reported on, a 3x3x3 (and a 3x1x1, a
  strided 1x3x3, a temporally dilated 3x3x3 on 8 x 8 frames) kernel runs as
  TensorFlow's Conv3D op, a 1x1x1 as a matmul and a dilated one on 4 x 4
  frames as one matmul; with them off every kernel is in 2-D ops
  (`conv3d_as_2d`)."""

  def ops(kernel, strides=1, dilation=1, onednn=True, size=8):
    conv = convolutions.conv3d_same_padding(4, kernel, strides, dilation)
    with kernel_policy.use(kernel_policy.resolve('auto', 'CPU', onednn)):
      fn = tf.function(conv).get_concrete_function(
          tf.TensorSpec([1, 4, size, size, 3], tf.float32))
    return {n.op for n in fn.graph.as_graph_def().node}

  assert 'Conv3D' in ops([3, 3, 3])
  assert 'Conv3D' in ops([3, 1, 1])
  assert 'Conv3D' in ops([1, 3, 3], strides=2)
  one = ops([1, 1, 1])
  assert 'MatMul' in one and 'Conv3D' not in one
  dilated = ops([3, 3, 3], dilation=2)
  assert 'Conv3D' in dilated and 'SpaceToBatchND' not in dilated
  small = ops([3, 3, 3], dilation=2, size=4)
  assert 'Conv3D' not in small and 'MatMul' in small
  for kernel in ([3, 3, 3], [3, 1, 1], [1, 1, 1]):
    assert 'Conv3D' not in ops(kernel, onednn=False)
  assert 'Conv3D' not in ops([3, 3, 3], dilation=2, onednn=False)
  choose = convolutions.conv3d_implementation
  onednn = kernel_policy.resolve('auto', 'CPU', onednn=True)
  assert choose([3, 3, 3], 1, policy=onednn) == 'stock'
  assert choose([3, 3, 3], 2, 49, policy=onednn) == 'time_phases'
  assert choose([3, 3, 3], 2, 16, policy=onednn) == 'as_2d'
  assert choose([3, 3, 3], 2, None, policy=onednn) == 'as_2d'
  assert choose([2, 3, 3], 2, 49, policy=onednn) == 'as_2d'
  assert choose([1, 1, 1], 1, policy=onednn) == 'as_2d'
  eigen = kernel_policy.resolve('auto', 'CPU', onednn=False)
  assert choose([3, 3, 3], 1, policy=eigen) == 'as_2d'


@pytest.mark.parametrize('device', ['GPU', 'TPU'])
def test_conv3d_on_accelerators_is_the_stock_op(device):
  """On a GPU or TPU the kernel policy's 'auto' takes no CPU fast path:
  every kernel is tf_keras' Conv3D (TensorFlow's Conv3D op; SpaceToBatchND
  for a temporal dilation, which cuDNN and XLA run), whatever the frame
  size; 'fast' there takes the 2-D forms (to measure them)."""
  policy = kernel_policy.resolve('auto', device)
  for kernel, dilation, size in (([3, 3, 3], 1, 8), ([1, 1, 1], 1, 8),
                                 ([3, 1, 1], 2, 8), ([3, 3, 3], 2, 4),
                                 ([1, 3, 3], 1, 4)):
    assert convolutions.conv3d_implementation(
        kernel, dilation, size * size, policy=policy) == 'stock'
    conv = convolutions.conv3d_same_padding(4, kernel, 1, dilation)
    with kernel_policy.use(policy):
      fn = tf.function(conv).get_concrete_function(
          tf.TensorSpec([1, 4, size, size, 3], tf.float32))
    ops = {n.op for n in fn.graph.as_graph_def().node}
    assert 'Conv3D' in ops and 'MatMul' not in ops, (kernel, ops)
  fast = kernel_policy.resolve('fast', device)
  assert convolutions.conv3d_implementation([3, 3, 3], 1, 64,
                                            policy=fast) == 'as_2d'


def test_spatial_max_pool_is_max_pool3d():
  x = tf.constant(np.random.default_rng(1).normal(size=[2, 3, 7, 5, 4]),
                  tf.float32)
  for r in (2, 4):
    np.testing.assert_array_equal(
        fusion.spatial_max_pool(x, r).numpy(),
        tf.nn.max_pool3d(x, [1, 1, r, r, 1], [1, 1, r, r, 1], 'SAME').numpy())


def test_batch_norm_relu_init_zero():
  bn = blocks.BatchNormRelu(relu=False, init_zero=True)
  x = tf.random.normal([2, 3, 4])
  assert np.all(bn(x, training=False).numpy() == 0)
  bn = blocks.BatchNormRelu(relu=True)
  assert np.all(bn(x, training=True).numpy() >= 0)


def _moving_pattern(shift, frames=3, size=24):
  yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
  out = []
  for t in range(frames):
    cx = 10.0 + shift[1] * t
    cy = 10.0 + shift[0] * t
    out.append(100 * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 18.0))
  v = np.stack(out)[..., None].repeat(3, -1)
  return tf.constant(v[None])


_SHIFTS = [(0, 1), (0, -1), (1, 0), (-1, 0)]


@pytest.fixture(scope='module')
def known_motion_flow():
  """The default flow layer (20 iterations) and its flow of every pattern of
  `_SHIFTS`, in one batch: the layer rescales each clip by its own extremes,
  so a clip's flow does not depend on its batch (checked below), and one
  batch compiles the layer's XLA program once."""
  layer = representation_flow.RepresentationFlow(num_iter=20)
  clips = tf.concat([_moving_pattern(shift) for shift in _SHIFTS], axis=0)
  return layer, layer(clips).numpy()


@pytest.mark.parametrize('shift, axis, sign', [
    ((0, 1), 0, 1), ((0, -1), 0, -1), ((1, 0), 1, 1), ((-1, 0), 1, -1)])
def test_rep_flow_known_motion(known_motion_flow, shift, axis, sign):
  layer, flows = known_motion_flow
  assert flows.shape == (len(_SHIFTS), 3, 24, 24, 2)
  i = _SHIFTS.index(shift)
  flow = flows[i:i + 1]
  np.testing.assert_array_equal(flow[:, -1], flow[:, -2])  # last repeated
  component = flow[0, 0, :, :, axis]
  other = flow[0, 0, :, :, 1 - axis]
  assert sign * component.mean() > 0.05
  assert abs(sign * component.mean()) > 3 * abs(other.mean())
  assert not layer.trainable_weights


def test_rep_flow_trainable_options_and_still_frames():
  layer = representation_flow.RepresentationFlow(num_iter=2, train_hyper=True)
  flow = layer(tf.ones([2, 4, 8, 8, 3])).numpy()  # constant: no motion
  assert np.all(np.isfinite(flow)) and np.abs(flow).max() < 1e-6
  assert sorted(v.name.split('/')[-1].split(':')[0]
                for v in layer.trainable_weights) == ['lambda', 'tau', 'theta']
  with pytest.raises(ValueError, match='a clip of 1 frames; the flow stem .* '
                     'needs at least 2 frames'):
    representation_flow.RepresentationFlow()(tf.zeros([1, 1, 8, 8, 3]))


# Recompute on and off: same gradients and batch-norm statistics in
# tests/assemblenet/test_recompute.py.


def test_layer_configs_round_trip(tiny_models):
  for layer in [
      blocks.BatchNormRelu(relu=False, init_zero=True, bn_decay=0.9),
      representation_flow.RepresentationFlow(num_iter=3, train_hyper=True),
      fusion.PeerAttentionFusion(2, 'self', [0.3, 0.6], True,
                                 recompute_grad=True),
      blocks.InvertedBottleneckBlock3D([4, 4, 8], 2, True, 2),
      blocks.BlockGroup([4, 4, 8], 2, 2, recompute_grad=True),
      fusion.SpatialMaxPool(3), fusion.SpatialMean(),
      anet.LiteStem(8, 2, recompute_grad=True), anet.LiteHead(5, (8, 16), True, 0.2)]:
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
  backbone, _ = tiny_models('self', True)  # Edge weights in the config too.
  clone = anet.AssembleNetPlusLite.from_config(backbone.get_config())
  assert _count(clone.trainable_variables) == _count(
      backbone.trainable_variables)


def test_rep_flow_of_a_clip_does_not_depend_on_its_batch():
  rng = np.random.default_rng(0)
  clip = tf.constant(rng.uniform(0, 100, [1, 3, 12, 12, 3]), tf.float32)
  other = tf.constant(rng.uniform(0, 255, [1, 3, 12, 12, 3]), tf.float32)
  batch = tf.concat([clip, other], axis=0)
  # Two iterations: every term of the scheme (the dual variables enter the
  # flow from the second one on); each shape is an XLA compilation.
  per_clip = representation_flow.RepresentationFlow(num_iter=2)
  np.testing.assert_allclose(per_clip(batch)[:1], per_clip(clip),
                             rtol=1e-5, atol=1e-5)
  # The original rescales by the batch's min/max: the other clip changes it.
  original = representation_flow.RepresentationFlow(num_iter=2,
                                                    rescale_per_batch=True)
  assert np.abs(original(batch)[:1] - original(clip)).max() > 1e-2
