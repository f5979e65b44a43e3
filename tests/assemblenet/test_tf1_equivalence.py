"""AssembleNet++lite, AssembleNet and AssembleNet++ compute what the original
TF1 code computes.

The original (google-research `assemblenet/`: assemblenet_plus_lite.py,
assemblenet_plus.py, assemblenet.py, rep_flow_2d_layer.py, model_structures.py,
run_asn.py) is not shipped: set ASSEMBLENET_TF1_PATH to the folder that
contains its `assemblenet/`, else these tests are skipped.
`tf1_reference.py` runs it unchanged, as TF1 code, in a process of its own
(the lite structure and edge weights of model_structures.py, peer attention,
non-trivial weights and batch-norm statistics, inference mode) and saves its
variables and outputs; here the project's network, as Model Garden's model
factory builds the shipped `assemblenet_plus_lite_charades` configuration,
takes every variable by `original_variable_map` and must give the same flow,
fusions, node outputs and logits; likewise AssembleNet-50 and
AssembleNet++-50 with an object input (`compared_asn`), and the published
AssembleNet(++) networks' parameter counts. What is compared, the mapping and
the settings: docs/assemblenet.md#equal-to-the-original-code and
#assemblenet-and-assemblenet.
"""
import collections
import json
import os
import subprocess
import sys
from typing import Dict, Sequence

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.vision.modeling import factory_3d
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.assemblenet import structures
from tests.assemblenet import complexity
from official_ext.assemblenet.modeling import representation_flow

TF1_PATH = os.environ.get('ASSEMBLENET_TF1_PATH', '')
pytestmark = pytest.mark.skipif(
    not TF1_PATH,
    reason='ASSEMBLENET_TF1_PATH is not set (the folder that contains the '
    'original google-research assemblenet/ TF1 code)')

# Two blocks per level: each level has a strided first block (its temporal
# conv dilated by the node's dilation: the original's hand-made dilated
# kernel where the dilation is > 1) and a non-strided [3, 3, 3] block; the
# published [3, 5, 11, 7] only repeats them (and takes 3 times as long to
# build). Its parameter count is compared below.
BLOCKS_PER_LEVEL = (2, 2, 2, 2)
BATCH, FRAMES, SIZE = 2, 8, 48
NUM_CLASSES = 157
# Largest |ours - original| allowed, relative to the largest |original| of
# the tensor compared (and at least 1): float32 rounding through ~40 layers
# with differently ordered sums (our CPU convolutions, XLA's flow).
TOLERANCE = 1e-4

_RUNNER = os.path.join(os.path.dirname(__file__), 'tf1_reference.py')
_BN = ('gamma', 'beta', 'moving_mean', 'moving_variance')
_REP_FLOW = ('img_grad_x', 'img_grad_y', 'f_grad_x', 'f_grad_y', 'f_grad_x2',
             'f_grad_y2', 'theta', 'lambda', 'tau')
# The original leaves channel counts equal to this flag's default out of its
# fusion width (FLAGS.num_object_classes, object inputs).
_NUM_OBJECT_CLASSES = 151


def original_variable_map(structure: Sequence, blocks_per_level: Sequence[int],
                          node_shapes: Sequence[Sequence[int]]
                          ) -> Dict[str, str]:
  """The original's variable names -> ours (both without ':0').

  The original names its variables by creation order inside each
  `Node_<i>` scope (tf.layers: `conv3d`, `conv3d_1`, ...; its dilated
  temporal kernels are bare `tf.Variable`s: `Variable`, `Variable_1`, ...);
  this replays that order from the structure and the original's node output
  shapes `node_shapes` ([B, T, H, W, C] each), which fix the fusions'
  channel groups and projections:

  * stem i: `conv3d` -> node_i/conv, then the temporal conv (`conv3d_1`, or
    `Variable` when dilated) -> node_i/conv_temporal, with their batch norms
    (bn, bn_temporal);
  * block node i, fusion (node_i_fusion): `dense_k` (peer k, in the order
    stems -3, -2, -1, then levels) -> peer_dense_k; `agg_weights`;
    `Connection_<C>_<n>` (the n-th input with C channels, input p) ->
    attention_<p> (its dense) and attention_<p>_peer_weights; a `conv3d`
    per channel group not of the fusion width (first-seen order) ->
    project_<C>;
  * then each block b (node_i/block_b): shortcut (first block), conv_a,
    conv_b, conv_b_temporal (strided first block; `Variable` when dilated),
    conv_c, each with its batch norm;
  * head (top-level scope): `conv3d`, `conv3d_1`, `dense` -> head/last_conv,
    last_conv2, final_dense; rep_flow/* keep their names.
  """
  m = {}

  def bn(original, ours):
    for leaf in _BN:
      m[f'{original}/{leaf}'] = f'{ours}/bn/{leaf}'

  def dense(original, ours):
    for leaf in ('kernel', 'bias'):
      m[f'{original}/{leaf}'] = f'{ours}/{leaf}'

  for leaf in _REP_FLOW:
    m[f'rep_flow/{leaf}'] = f'rep_flow/{leaf}'
  levels = {lv: [i for i, n in enumerate(structure) if n[0] == lv]
            for lv in range(-3, 4)}
  for i, node in enumerate(structure):
    counts = collections.Counter()

    def layer(kind, scope=f'Node_{i}'):
      n = counts[kind]
      counts[kind] += 1
      return f'{scope}/{kind}' + (f'_{n}' if n else '')

    def temporal_kernel(dilation):
      return layer('conv3d') + '/kernel' if dilation == 1 else layer('Variable')

    ours = f'node_{i}'
    if node[0] < 0:
      m[layer('conv3d') + '/kernel'] = f'{ours}/conv/kernel'
      bn(layer('batch_normalization'), f'{ours}/bn')
      m[temporal_kernel(max(node[1], 1))] = f'{ours}/conv_temporal/kernel'
      bn(layer('batch_normalization'), f'{ours}/bn_temporal')
      continue
    level, inputs, _, dilation, stride = node[:5]
    if len(inputs) < 2:
      raise ValueError(f'node {i}: single-input nodes (not in the lite '
                       'structure) are not mapped')
    fusion = f'node_{i}_fusion'
    below = [k for lv in range(-3, level) for k in levels[lv]]
    for k in range(len(below)):
      dense(layer('dense'), f'{fusion}/peer_dense_{k}')
    m[f'Node_{i}/agg_weights'] = f'{fusion}/agg_weights'
    width = 0  # The original's fusion width: an input's *width* (shape[3]).
    groups = {}
    for p, j in enumerate(inputs):
      shape = node_shapes[j]
      if shape[-1] > width and shape[-1] != _NUM_OBJECT_CLASSES:
        width = shape[3]
      groups.setdefault(shape[-1], []).append(p)
    for c, members in groups.items():
      for n, p in enumerate(members):
        connection = f'Node_{i}/Connection_{c}_{n}'
        m[f'{connection}/peer_attention_weights'] = (
            f'{fusion}/attention_{p}_peer_weights')
        dense(f'{connection}/dense', f'{fusion}/attention_{p}')
    for c in groups:
      if c != width:
        m[layer('conv3d') + '/kernel'] = f'{fusion}/project_{c}/kernel'
    for b in range(blocks_per_level[level]):
      block = f'{ours}/block_{b}'

      def conv(name, kernel=None, block=block):
        m[kernel or layer('conv3d') + '/kernel'] = f'{block}/{name}/kernel'
        bn(layer('batch_normalization'), f'{block}/bn_{name[5:] or name}')

      if b == 0:
        m[layer('conv3d') + '/kernel'] = f'{block}/shortcut/kernel'
        bn(layer('batch_normalization'), f'{block}/bn_shortcut')
      conv('conv_a')
      conv('conv_b')
      if b == 0 and stride > 1:
        conv('conv_b_temporal', temporal_kernel(dilation))
      conv('conv_c')
  m['conv3d/kernel'] = 'head/last_conv/kernel'
  bn('batch_normalization', 'head/last_conv_bn')
  m['conv3d_1/kernel'] = 'head/last_conv2/kernel'
  bn('batch_normalization_1', 'head/last_conv2_bn')
  dense('dense', 'head/final_dense')
  return m


def _name(variable) -> str:
  return variable.name[:-2] if variable.name.endswith(':0') else variable.name


def _run_original(output: str) -> subprocess.Popen:
  """Starts `tf1_reference.py` (it runs while our model is built)."""
  if not os.path.isfile(os.path.join(TF1_PATH, 'assemblenet',
                                     'assemblenet_plus_lite.py')):
    pytest.fail(f'ASSEMBLENET_TF1_PATH={TF1_PATH!r} has no '
                'assemblenet/assemblenet_plus_lite.py')
  return subprocess.Popen(
      [sys.executable, _RUNNER, f'--tf1_path={TF1_PATH}', f'--output={output}',
       '--blocks_per_level=' + ','.join(map(str, BLOCKS_PER_LEVEL)),
       f'--clip_shape={BATCH},{FRAMES},{SIZE},{SIZE}',
       f'--num_classes={NUM_CLASSES}'],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _build_ours() -> tf_keras.Model:
  """The shipped Charades configuration, as Model Garden's factory builds it,
  with the original's two behaviours the default does not have:
  `fusion_width_as_channels` and the flow's `rescale_per_batch`."""
  params = exp_factory.get_exp_config('assemblenet_plus_lite_charades')
  params.override({'task': {'model': {'backbone': {'assemblenet_plus_lite': {
      'blocks_per_level': list(BLOCKS_PER_LEVEL),
      'fusion_width_as_channels': True,
      'rep_flow': {'rescale_per_batch': True}}}}}}, is_strict=True)
  assert params.task.train_data.num_classes == NUM_CLASSES
  return factory_3d.build_model(
      'assemblenet_plus_lite',
      input_specs=tf_keras.layers.InputSpec(
          shape=[None, FRAMES, SIZE, SIZE, 3]),
      model_config=params.task.model, num_classes=NUM_CLASSES)


@pytest.fixture(scope='module')
def compared(tmp_path_factory):
  """The original's run (arrays, metadata) and ours with its variables."""
  output = str(tmp_path_factory.mktemp('tf1') / 'original.npz')
  proc = _run_original(output)
  try:
    model = _build_ours()
    _, stderr = proc.communicate()
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  if proc.returncode:
    pytest.fail(f'tf1_reference.py failed:\n{stderr[-4000:]}')
  with np.load(output) as z:
    arrays = {k: z[k] for k in z.files}
  meta = json.loads(str(arrays.pop('meta')))

  structure = meta['structure']
  node_shapes = [arrays[f'node/{i}'].shape for i in range(len(structure))]
  mapping = original_variable_map(structure, BLOCKS_PER_LEVEL, node_shapes)
  variables = {_name(v): v for v in model.variables}
  built = {name: variables[name].numpy() for name in variables
           if name.endswith('agg_weights') or name.startswith('rep_flow/')}
  for name, theirs in mapping.items():
    variables[theirs].assign(arrays[f'var/{name}'])
  backbone = model.backbone
  probe = tf_keras.Model(backbone.inputs, dict(
      flow=backbone.get_layer('rep_flow').output,
      **{f'node/{i}': backbone.get_layer(f'node_{i}').output
         for i in range(len(structure))},
      **{f'fusion/{i}': backbone.get_layer(f'node_{i}_fusion').output
         for i, n in enumerate(structure) if n[0] >= 0}))
  clip = tf.constant(arrays['clip'])
  outputs = {k: v.numpy() for k, v in probe(clip, training=False).items()}
  outputs['logits'] = model({'image': clip}, training=False).numpy()
  return dict(arrays=arrays, meta=meta, model=model, mapping=mapping,
              variables=variables, built=built, outputs=outputs)


def _max_error(a, b):
  return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def test_structure_and_edge_weights_are_the_originals(compared):
  meta = compared['meta']
  assert structures.ASSEMBLENET_PLUS_LITE_STRUCTURE == meta['structure']
  assert structures.ASSEMBLENET_PLUS_LITE_EDGE_WEIGHTS == meta['edge_weights']
  assert (list(structures.ASSEMBLENET_PLUS_LITE_BLOCKS_PER_LEVEL) ==
          meta['published_blocks_per_level'])


def test_every_variable_is_mapped_once_with_its_shape(compared):
  arrays, mapping = compared['arrays'], compared['mapping']
  variables = compared['variables']
  theirs = {k[len('var/'):] for k in arrays if k.startswith('var/')}
  assert set(mapping) == theirs
  assert sorted(mapping.values()) == sorted(variables)  # each exactly once
  for name, our_name in mapping.items():
    assert variables[our_name].shape == arrays[f'var/{name}'].shape, name
  # Trainable on both sides alike (the given edge weights and the flow's
  # constants are not).
  assert {mapping[n] for n in compared['meta']['trainable']} == {
      _name(v) for v in compared['model'].trainable_variables}


def test_the_comparison_covers_every_path(compared):
  """The compared network takes every path of the lite original: the flow
  stem (representation flow), peer attention on every connection, inputs
  pooled by 2 and by 4, channel groups projected to the fusion width and one
  of it (no projection), strided first blocks with 1x1x1 and hand-made dilated
  temporal kernels (`Variable`) and non-strided [3, 3, 3] blocks."""
  meta, mapping = compared['meta'], compared['mapping']
  structure = meta['structure']
  shapes = [compared['arrays'][f'node/{i}'].shape
            for i in range(len(structure))]
  assert any(n[0] == structures.STEM_FLOW for n in structure)
  ratios, unprojected = set(), 0
  for i, node in enumerate(structure):
    if node[0] < 0:
      continue
    h_min = min(shapes[j][2] for j in node[1])
    ratios |= {(shapes[j][2] + 1) // h_min for j in node[1]}
    channels = {shapes[j][-1] for j in node[1]}
    projected = {c for c in channels
                 if f'node_{i}_fusion/project_{c}/kernel' in mapping.values()}
    unprojected += len(channels - projected)
    assert (sum(f'node_{i}_fusion/attention_' in v and 'peer_weights' in v
                for v in mapping.values()) == len(node[1]))
  assert ratios == {1, 2, 4}
  assert unprojected and any('/project_' in v for v in mapping.values())
  temporal = [k for k, v in mapping.items() if 'conv_b_temporal' in v]
  assert any('Variable' in k for k in temporal)
  assert any(k.endswith('/kernel') for k in temporal)
  assert any(v.endswith('block_1/conv_b/kernel') for v in mapping.values())


def test_parameter_counts(compared):
  arrays, meta, model = compared['arrays'], compared['meta'], compared['model']

  def count(shapes):
    return int(sum(np.prod(s) for s in shapes))

  assert count(v.shape for v in model.variables) == count(
      arrays[k].shape for k in arrays if k.startswith('var/'))
  assert count(v.shape for v in model.trainable_variables) == count(
      arrays[f'var/{n}'].shape for n in meta['trainable'])
  # The published network (blocks [3, 5, 11, 7]) at 32 x 224^2, built by the
  # original, has our analysis' count of the original's fusion (tied to our
  # built networks in test_modeling.py), not of our intended one.
  published = meta['published_trainable_params_224']
  assert published == complexity.analyze(fusion_width_as_channels=True).params
  assert published != complexity.analyze(fusion_width_as_channels=False).params


def test_fixed_weights_as_built_equal_the_originals(compared):
  """The edge weights (logits of the published sigmoid weights, fixed) and
  the flow's kernels and hyper-parameters, as each side builds them: bit for
  bit."""
  inverse = {v: k for k, v in compared['mapping'].items()}
  assert compared['built']
  for name, value in compared['built'].items():
    np.testing.assert_array_equal(
        value, compared['arrays'][f'var/{inverse[name]}'], err_msg=name)


def test_flow_equals_the_originals(compared):
  ours = compared['outputs']['flow']
  theirs = compared['arrays']['flow'].reshape(ours.shape)
  assert _max_error(ours, theirs) < TOLERANCE
  # The default rescales each clip by its own min/max; the original by the
  # batch's, and the test's two clips differ in range.
  per_clip = representation_flow.RepresentationFlow(rescale_per_batch=False)(
      tf.constant(compared['arrays']['clip'])).numpy()
  assert _max_error(per_clip, theirs) > 100 * TOLERANCE


def test_fusions_and_nodes_equal_the_originals(compared):
  """Node by node, in the order of the network: each fusion's output (edge
  weights, pooling to the smallest input, peer attention, projections) and
  each node's output."""
  arrays, ours = compared['arrays'], compared['outputs']
  errors = {}
  for i, node in enumerate(compared['meta']['structure']):
    keys = [f'fusion/{i}'] if node[0] >= 0 else []
    for key in keys + [f'node/{i}']:
      assert ours[key].shape == arrays[key].shape, key
      errors[key] = _max_error(ours[key], arrays[key])
  bad = [k for k, e in errors.items() if not e < TOLERANCE]
  assert not bad, f'first differing: {bad[0]}; errors: {errors}'


def test_logits_equal_the_originals(compared):
  ours, theirs = compared['outputs']['logits'], compared['arrays']['logits']
  assert ours.shape == theirs.shape == (BATCH, NUM_CLASSES)
  print(f'max |logits - original logits| = '
        f'{np.max(np.abs(ours - theirs)):.3g} (max |original logits| '
        f'{np.max(np.abs(theirs)):.3g})')
  assert _max_error(ours, theirs) < TOLERANCE


# -- AssembleNet and AssembleNet++ --------------------------------------------
# ASN-50 (asn50 structure and edge weights) and AssembleNet++-50
# (full_asnp50 structure and edge weights, peer attention, an object stem of
# ASN_OBJECT_CLASSES classes), 2 blocks per level: each level's strided first
# block (projection, 1x1 conv_a) and a temporal block (conv_a a dilated
# [3, 1, 1] conv: hand-made `Variable` kernels where the dilation is > 1).
# 2 clips x 10 frames x 52^2: stems at 13^2 (a 7x7 / 2 conv of an even size,
# where fixed padding differs from 'same'), levels at 13, 7, 4 and 2 (odd
# sizes strided and pooled by 2); 10 frames reach the taps of dilations 4 and
# 8 and are no multiple of them.
ASN_BLOCKS_PER_LEVEL = (2, 2, 2, 2)
ASN_FRAMES, ASN_SIZE = 10, 52
ASN_OBJECT_CLASSES = 5
PUBLISHED_OBJECT_CLASSES = 151
# (name in tf1_reference.py, backbone type, structure, edge weights, depth,
# object stem) of the published networks whose trainable counts are compared.
PUBLISHED_ASN = (
    ('asn50', 'assemblenet', structures.ASN50_STRUCTURE,
     structures.ASN_EDGE_WEIGHTS, 50),
    ('asn101', 'assemblenet', structures.ASN101_STRUCTURE,
     structures.ASN_EDGE_WEIGHTS, 101),
    ('asnp50_objects', 'assemblenet_plus', structures.FULL_ASNP50_STRUCTURE,
     structures.FULL_ASNP_EDGE_WEIGHTS, 50),
    ('asnp101_objects', 'assemblenet_plus', structures.FULL_ASNP50_STRUCTURE,
     structures.FULL_ASNP_EDGE_WEIGHTS, 101),
    ('asnp50_asn50', 'assemblenet_plus', structures.ASN50_STRUCTURE,
     structures.ASN_EDGE_WEIGHTS, 50),
)


def original_asn_variable_map(structure: Sequence,
                              blocks_per_level: Sequence[int],
                              node_shapes: Sequence[Sequence[int]],
                              plus: bool, num_object_classes: int
                              ) -> Dict[str, str]:
  """AssembleNet(++)'s variable names -> ours (both without ':0').

  The original (4-D, `tf.layers.conv2d`) names its variables by creation
  order in each `Node_<i>` scope, replayed here:

  * RGB stem i: `conv2d` -> node_i/conv, then the temporal conv (`conv2d_1`,
    or `Variable` when dilated) -> node_i/conv_temporal, with their batch
    norms (bn, bn_temporal); flow stem: `conv2d` and its batch norm -> conv,
    bn; the object stem has none;
  * block node i, fusion (node_i_fusion): AssembleNet++ first `dense_k` (peer
    k, stems -3, -2, -1, then levels) -> peer_dense_k; a single input's
    attention (`peer_attention_weights`, the next `dense`) ->
    attention_0_peer_weights, attention_0; else `agg_weights`, then
    `Connection_<C>_<n>` (the n-th input with C channels, input p) ->
    attention_<p>_peer_weights, attention_<p>; a `conv2d` per channel group
    not of the fusion width (first-seen order) -> project_<C>;
  * each block b (node_i/block_b): shortcut (first block), conv_a (`conv2d`,
    or in odd blocks the temporal conv: `conv2d` or `Variable` when
    dilated), conv_b, conv_c, each with its batch norm;
  * head (top-level scope): `dense` -> head/final_dense; rep_flow/* keep
    their names.

  The fusion width is the largest channel count of the inputs, leaving out
  (AssembleNet++) those with `num_object_classes` channels."""
  m = {}

  def bn(original, ours):
    for leaf in _BN:
      m[f'{original}/{leaf}'] = f'{ours}/bn/{leaf}'

  def dense(original, ours):
    for leaf in ('kernel', 'bias'):
      m[f'{original}/{leaf}'] = f'{ours}/{leaf}'

  for leaf in _REP_FLOW:
    m[f'rep_flow/{leaf}'] = f'rep_flow/{leaf}'
  for i, node in enumerate(structure):
    counts = collections.Counter()

    def layer(kind, i=i, counts=counts):
      n = counts[kind]
      counts[kind] += 1
      return f'Node_{i}/{kind}' + (f'_{n}' if n else '')

    def temporal_kernel(dilation, layer=layer):
      return layer('conv2d') + '/kernel' if dilation == 1 else layer('Variable')

    ours = f'node_{i}'
    if node[0] == structures.STEM_OBJECT:
      continue
    if node[0] < 0:
      m[layer('conv2d') + '/kernel'] = f'{ours}/conv/kernel'
      bn(layer('batch_normalization'), f'{ours}/bn')
      if node[0] == structures.STEM_RGB:
        m[temporal_kernel(max(node[1], 1))] = f'{ours}/conv_temporal/kernel'
        bn(layer('batch_normalization'), f'{ours}/bn_temporal')
      continue
    level, inputs, _, dilation, _ = node[:5]
    fusion = f'node_{i}_fusion'
    if plus:
      below = structures.nodes_below(structure, level)
      for k in range(len(below)):
        dense(layer('dense'), f'{fusion}/peer_dense_{k}')
    if len(inputs) == 1:
      if plus:
        m[f'Node_{i}/peer_attention_weights'] = (
            f'{fusion}/attention_0_peer_weights')
        dense(layer('dense'), f'{fusion}/attention_0')
    else:
      m[f'Node_{i}/agg_weights'] = f'{fusion}/agg_weights'
      width, groups = 0, {}
      for p, j in enumerate(inputs):
        c = node_shapes[j][-1]
        if c > width and not (plus and c == num_object_classes):
          width = c
        groups.setdefault(c, []).append(p)
      if plus:
        for c, members in groups.items():
          for n, p in enumerate(members):
            connection = f'Node_{i}/Connection_{c}_{n}'
            m[f'{connection}/peer_attention_weights'] = (
                f'{fusion}/attention_{p}_peer_weights')
            dense(f'{connection}/dense', f'{fusion}/attention_{p}')
      for c in groups:
        if c != width:
          m[layer('conv2d') + '/kernel'] = f'{fusion}/project_{c}/kernel'
    for b in range(blocks_per_level[level]):
      block = f'{ours}/block_{b}'
      if b == 0:
        m[layer('conv2d') + '/kernel'] = f'{block}/shortcut/kernel'
        bn(layer('batch_normalization'), f'{block}/bn_shortcut')
      m[temporal_kernel(dilation) if b % 2 else
        layer('conv2d') + '/kernel'] = f'{block}/conv_a/kernel'
      bn(layer('batch_normalization'), f'{block}/bn_a')
      for name in ('conv_b', 'conv_c'):
        m[layer('conv2d') + '/kernel'] = f'{block}/{name}/kernel'
        bn(layer('batch_normalization'), f'{block}/bn_{name[5:]}')
  dense('dense', 'head/final_dense')
  return m


def _asn_model_config(backbone_type: str, structure, edge_weights, depth=50,
                      blocks_per_level=(), num_object_classes=None,
                      rescale_per_batch=False):
  """A Model Garden model config of our AssembleNet(++) (peer attention for
  AssembleNet++, objects when the structure has an object stem)."""
  from official_ext.assemblenet import configs  # pylint: disable=g-import-not-at-top
  fields = dict(model_id=str(depth), blocks_per_level=list(blocks_per_level),
                model_structure=json.dumps(structure),
                model_edge_weights=json.dumps(edge_weights),
                rep_flow=configs.RepFlow(num_iter=40,
                                         rescale_per_batch=rescale_per_batch))
  if backbone_type == 'assemblenet_plus':
    fields.update(attention_mode='peer', use_object_input=any(
        n[0] == structures.STEM_OBJECT for n in structure))
    if num_object_classes:
      fields['num_object_classes'] = num_object_classes
    backbone = configs.Backbone3D(type=backbone_type,
                                  assemblenet_plus=configs.AssembleNetPlus(
                                      **fields))
  else:
    backbone = configs.Backbone3D(type=backbone_type,
                                  assemblenet=configs.AssembleNet(**fields))
  return configs.VideoClassificationModel(model_type=backbone_type,
                                          backbone=backbone)


def _build_asn(backbone_type, frames, size, num_classes, **kwargs):
  return factory_3d.build_model(
      backbone_type,
      input_specs=tf_keras.layers.InputSpec(shape=[None, frames, size, size,
                                                   3]),
      model_config=_asn_model_config(backbone_type, **kwargs),
      num_classes=num_classes)


_ASN_NETWORKS = {
    'asn': ('assemblenet', structures.ASN50_STRUCTURE,
            structures.ASN_EDGE_WEIGHTS),
    'asnp': ('assemblenet_plus', structures.FULL_ASNP50_STRUCTURE,
             structures.FULL_ASNP_EDGE_WEIGHTS),
}


@pytest.fixture(scope='module', params=sorted(_ASN_NETWORKS))
def compared_asn(request, tmp_path_factory):
  """For 'asn' and 'asnp': the original's run (arrays, metadata) and ours,
  built by Model Garden's factory, with its variables."""
  network = request.param
  backbone_type, structure, edge_weights = _ASN_NETWORKS[network]
  output = str(tmp_path_factory.mktemp('tf1') / f'{network}.npz')
  if not os.path.isfile(os.path.join(TF1_PATH, 'assemblenet',
                                     'assemblenet.py')):
    pytest.fail(f'ASSEMBLENET_TF1_PATH={TF1_PATH!r} has no '
                'assemblenet/assemblenet.py')
  proc = subprocess.Popen(
      [sys.executable, _RUNNER, f'--tf1_path={TF1_PATH}', f'--output={output}',
       f'--network={network}',
       '--blocks_per_level=' + ','.join(map(str, ASN_BLOCKS_PER_LEVEL)),
       f'--clip_shape={BATCH},{ASN_FRAMES},{ASN_SIZE},{ASN_SIZE}',
       f'--num_classes={NUM_CLASSES}',
       f'--num_object_classes={ASN_OBJECT_CLASSES}'],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    model = _build_asn(backbone_type, ASN_FRAMES, ASN_SIZE, NUM_CLASSES,
                       structure=structure, edge_weights=edge_weights,
                       blocks_per_level=ASN_BLOCKS_PER_LEVEL,
                       num_object_classes=ASN_OBJECT_CLASSES,
                       rescale_per_batch=True)
    _, stderr = proc.communicate()
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  if proc.returncode:
    pytest.fail(f'tf1_reference.py --network={network} failed:\n'
                f'{stderr[-4000:]}')
  with np.load(output) as z:
    arrays = {k: z[k] for k in z.files}
  meta = json.loads(str(arrays.pop('meta')))
  plus = network == 'asnp'
  node_shapes = [arrays[f'node/{i}'].shape for i in range(len(structure))]
  mapping = original_asn_variable_map(
      meta['structure'], ASN_BLOCKS_PER_LEVEL, node_shapes, plus,
      ASN_OBJECT_CLASSES)
  variables = {_name(v): v for v in model.variables}
  built = {name: variables[name].numpy() for name in variables
           if name.endswith('agg_weights') or name.startswith('rep_flow/')}
  for name, ours in mapping.items():
    if ours in variables:
      variables[ours].assign(np.reshape(arrays[f'var/{name}'],
                                        variables[ours].shape))
  backbone = model.backbone
  probe = tf_keras.Model(backbone.input, dict(
      flow=backbone.get_layer('rep_flow').output,
      **{f'node/{i}': backbone.get_layer(f'node_{i}').output
         for i in range(len(structure))},
      **{f'fusion/{i}': backbone.get_layer(f'node_{i}_fusion').output
         for i, n in enumerate(structure) if n[0] >= 0}))
  features = {'image': tf.constant(arrays['clip'])}
  if plus:
    features['objects'] = tf.constant(arrays['objects'])
  outputs = {k: v.numpy() for k, v in probe(
      features if plus else features['image'], training=False).items()}
  outputs['logits'] = model(features, training=False).numpy()
  return dict(network=network, arrays=arrays, meta=meta, model=model,
              mapping=mapping, variables=variables, built=built,
              outputs=outputs, structure=structure,
              edge_weights=edge_weights)


def _unit_dims_inserted(ours, theirs) -> bool:
  """`ours` is `theirs` with a unit dimension inserted where our 5-D
  kernels have one: per-frame [1, kh, kw, C, F] of [kh, kw, C, F], temporal
  [kt, 1, 1, C, F] of [kt, 1, C, F]; other shapes equal."""
  ours, theirs = tuple(ours), tuple(theirs)
  return ours in (theirs, (1,) + theirs, theirs[:2] + (1,) + theirs[2:])


def test_asn_structures_are_the_originals(compared_asn):
  meta = compared_asn['meta']
  assert compared_asn['structure'] == meta['structure']
  assert compared_asn['edge_weights'] == meta['edge_weights']


def test_asn_every_variable_is_mapped_once_with_its_shape(compared_asn):
  arrays, mapping = compared_asn['arrays'], compared_asn['mapping']
  variables = compared_asn['variables']
  theirs = {k[len('var/'):] for k in arrays if k.startswith('var/')}
  assert set(mapping) == theirs
  assert sorted(mapping.values()) == sorted(variables)  # each exactly once
  for name, our_name in mapping.items():
    assert _unit_dims_inserted(variables[our_name].shape,
                               arrays[f'var/{name}'].shape), name
  assert {mapping[n] for n in compared_asn['meta']['trainable']} == {
      _name(v) for v in compared_asn['model'].trainable_variables}


def test_asn_fixed_weights_as_built_equal_the_originals(compared_asn):
  inverse = {v: k for k, v in compared_asn['mapping'].items()}
  assert compared_asn['built']
  for name, value in compared_asn['built'].items():
    np.testing.assert_array_equal(
        value, compared_asn['arrays'][f'var/{inverse[name]}'], err_msg=name)


def test_asn_the_comparison_covers_every_path(compared_asn):
  """Every kind of fusion input of the compared structure occurs: inputs
  pooled by 2 (of odd size) and unpooled, channel groups projected to the
  fusion width, one of it, several inputs in one group; AssembleNet: single
  inputs (no fusion); AssembleNet++: the object input (left out of the
  fusion width, projected) and peer attention on every connection. Blocks:
  strided first blocks and temporal blocks, dilated ones by `Variable`."""
  structure, mapping = compared_asn['structure'], compared_asn['mapping']
  arrays = compared_asn['arrays']
  shapes = [arrays[f'node/{i}'].shape for i in range(len(structure))]
  ratios, unprojected, projected, grouped, single = set(), 0, 0, 0, 0
  object_projected = False
  for i, node in enumerate(structure):
    if node[0] < 0:
      continue
    h_min = min(shapes[j][2] for j in node[1])
    ratios |= {(shapes[j][2] + 1) // h_min for j in node[1]}
    channels = [shapes[j][-1] for j in node[1]]
    single += len(channels) == 1
    grouped += len(channels) > len(set(channels))
    for c in set(channels):
      if f'node_{i}_fusion/project_{c}/kernel' in mapping.values():
        projected += 1
        object_projected |= c == ASN_OBJECT_CLASSES and any(
            structure[j][0] == structures.STEM_OBJECT for j in node[1])
      elif len(channels) > 1:
        unprojected += 1
  assert ratios == {1, 2}
  assert any(s[2] % 2 == 1 for s in shapes)
  assert projected and unprojected and grouped
  temporal = [k for k, v in mapping.items() if 'conv_a' in v and
              'block_1' in v]
  assert any('Variable' in k for k in temporal)
  assert any(k.endswith('/kernel') for k in temporal)
  if compared_asn['network'] == 'asn':
    assert single
  else:
    assert object_projected
    for i, node in enumerate(structure):
      if node[0] >= 0:
        assert sum(f'node_{i}_fusion/attention_' in v and 'peer_weights' in v
                   for v in mapping.values()) == len(node[1])


def test_asn_flow_fusions_nodes_and_logits_equal_the_originals(compared_asn):
  """The representation flow, then node by node each fusion's and node's
  output (the object stem's too), and the logits."""
  arrays, ours = compared_asn['arrays'], compared_asn['outputs']
  errors = {'flow': _max_error(ours['flow'], arrays['flow'])}
  for i, node in enumerate(compared_asn['structure']):
    keys = [f'fusion/{i}'] if node[0] >= 0 else []
    for key in keys + [f'node/{i}']:
      assert ours[key].shape == arrays[key].shape, key
      errors[key] = _max_error(ours[key], arrays[key])
  assert ours['logits'].shape == arrays['logits'].shape == (BATCH,
                                                             NUM_CLASSES)
  errors['logits'] = _max_error(ours['logits'], arrays['logits'])
  print(f"{compared_asn['network']}: max |logits - original logits| = "
        f"{np.max(np.abs(ours['logits'] - arrays['logits'])):.3g} (max "
        f"|original logits| {np.max(np.abs(arrays['logits'])):.3g})")
  bad = [k for k, e in errors.items() if not e < TOLERANCE]
  assert not bad, f'first differing: {bad[0]}; errors: {errors}'


def test_asn_published_parameter_counts(compared_asn):
  """The published networks' trainable counts at 32 x 224^2, built by the
  original (objects: 151 classes), equal ours built at a small clip (the
  count does not depend on the clip's size) and `complexity`'s."""
  if compared_asn['network'] != 'asn':
    pytest.skip('counted once, with the AssembleNet run')
  published = compared_asn['meta']['published_trainable_params']
  assert set(published) == {p[0] for p in PUBLISHED_ASN}
  for name, backbone_type, structure, weights, depth in PUBLISHED_ASN:
    plus = backbone_type == 'assemblenet_plus'
    model = _build_asn(backbone_type, 2, 64, NUM_CLASSES,
                       structure=structure, edge_weights=weights, depth=depth,
                       num_object_classes=PUBLISHED_OBJECT_CLASSES)
    ours = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    analysed = complexity.analyze_assemblenet(
        structure, structures.assemblenet_blocks_per_level(depth), plus=plus,
        attention_mode='peer' if plus else None,
        num_object_classes=PUBLISHED_OBJECT_CLASSES,
        num_classes=NUM_CLASSES).params
    print(f'{name}: ours {ours:,}, original {published[name]:,}')
    assert ours == published[name] == analysed, name
