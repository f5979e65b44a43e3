"""Runs the original TF1 AssembleNet++lite, AssembleNet or AssembleNet++ for
test_tf1_equivalence.py.

A script, run by the test in a process of its own: the original
(google-research `assemblenet/`, from `--tf1_path`) is imported unchanged
and run as TF1 code (`tf.compat.v1.disable_v2_behavior()`, graph + Session;
`TF_USE_LEGACY_KERAS=1` routes its `tf.compat.v1.layers` to tf_keras' legacy
layers, what TensorFlow 2.20 offers in place of the removed `tf.layers`).
Nothing here may import the project: this process holds the original only.

It writes an .npz: the clip, the logits, every variable's value, the tensors
each stem, fusion, block group and the representation flow returned, the
original's structure and edge weights, and the trainable parameter count of
the published network (lite: blocks [3, 5, 11, 7]; AssembleNet(++): each
published network, objects with 151 classes) at 32 x 224^2 (graph only).
Recipe and weight values: docs/assemblenet.md#equal-to-the-original-code.
"""
import argparse
import json
import os
import sys
import time

# The published lite network's blocks per level, as run_asn.py builds it.
PUBLISHED_BLOCKS = [3, 5, 11, 7]


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--tf1_path', required=True,
                 help='folder that contains the original assemblenet/')
  p.add_argument('--output', required=True, help='.npz to write')
  p.add_argument('--blocks_per_level', default='2,2,2,2')
  p.add_argument('--clip_shape', default='2,8,48,48',
                 help='batch, frames, height, width of the RGB clip')
  p.add_argument('--num_classes', type=int, default=157)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--network', default='lite', choices=('lite', 'asn', 'asnp'),
                 help='lite: AssembleNet++lite; asn: AssembleNet (asn50 '
                 'structure); asnp: AssembleNet++ (full_asnp50 structure, '
                 'object input)')
  p.add_argument('--num_object_classes', type=int, default=5)
  return p.parse_args(argv)


def main(argv=None):
  args = _parse(argv)
  # Before TensorFlow is imported: its compat.v1 `layers` resolve to
  # tf_keras' legacy layers (TF 2.20 has no other `tf.compat.v1.layers`).
  os.environ['TF_USE_LEGACY_KERAS'] = '1'
  sys.path.insert(0, os.path.abspath(args.tf1_path))
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  tf.disable_v2_behavior()  # TF1 semantics, e.g. Tensor == Tensor.
  from absl import flags  # pylint: disable=g-import-not-at-top
  # run_asn.py defines the flags the model code reads (rep_flow_2d_layer.py
  # the batch-norm ones); their defaults are the original's.
  from assemblenet import run_asn  # pylint: disable=g-import-not-at-top,unused-import
  from assemblenet import assemblenet as asn  # pylint: disable=g-import-not-at-top
  from assemblenet import assemblenet_plus as asnp  # pylint: disable=g-import-not-at-top
  from assemblenet import assemblenet_plus_lite as lite  # pylint: disable=g-import-not-at-top
  from assemblenet import model_structures  # pylint: disable=g-import-not-at-top
  from assemblenet import rep_flow_2d_layer as rf  # pylint: disable=g-import-not-at-top

  FLAGS = flags.FLAGS  # pylint: disable=invalid-name
  FLAGS(['tf1_reference'])
  blocks = [int(b) for b in args.blocks_per_level.split(',')]
  batch, frames, height, width = [int(d) for d in args.clip_shape.split(',')]
  network = args.network
  four_d = network != 'lite'
  if network == 'lite':
    # As run_asn.main does for 'assemblenet_plus_lite', with peer attention.
    structure = model_structures.asnp_lite_structure
    edge_weights = model_structures.asnp_lite_structure_weights
    FLAGS.attention_mode = 'peer'
  elif network == 'asn':  # As run_asn.main does for 'assemblenet'.
    structure = model_structures.asn50_structure
    edge_weights = model_structures.asn_structure_weights
  else:  # AssembleNet++-50 with its object stem, peer attention.
    structure = model_structures.full_asnp50_structure
    edge_weights = model_structures.full_asnp_structure_weights
    FLAGS.attention_mode = 'peer'
    FLAGS.use_object_input = True
    FLAGS.num_object_classes = args.num_object_classes
  FLAGS.model_structure = json.dumps(structure)
  FLAGS.model_edge_weights = json.dumps(edge_weights)
  FLAGS.num_frames = frames
  num_objects = args.num_object_classes

  # What the original's functions return is recorded (its modules look
  # them up at call time); their computation is theirs, unchanged.
  recorded = {}

  def record(module, name, key):
    original = getattr(module, name)

    def wrapper(*a, **k):
      out = original(*a, **k)
      recorded.setdefault(key, []).append(out)
      return out
    setattr(module, name, wrapper)

  record(lite, 'lite_conv_stem', 'stem')
  record(asn, 'rgb_conv_stem', 'stem')
  record(asn, 'flow_conv_stem', 'stem')
  record(asnp, 'object_conv_stem', 'stem')
  record(asnp, 'fusion_with_peer_attention', 'fusion')
  record(asn, 'multi_connection_fusion', 'fusion')
  record(lite, 'block_group', 'block_group')
  record(asn, 'block_group', 'block_group')
  record(rf, 'rep_flow', 'flow')

  def network_fn(net, num_layers, depth=None):
    if net == 'lite':
      return lite.assemblenet_plus_lite(
          num_layers=num_layers, num_classes=args.num_classes,
          data_format='channels_last')
    block = asn.bottleneck_block_interleave
    if net == 'asn':
      if depth:
        return asn.assemblenet_v1(depth, args.num_classes)
      return asn.assemblenet_v1_generator(block, num_layers, args.num_classes)
    if depth:
      return asnp.assemblenet_plus(depth, args.num_classes)
    return asnp.assemblenet_plus_generator(block, num_layers,
                                           args.num_classes)

  def build(shape, is_training, num_layers, net=network, depth=None,
            objects=False):
    """(graph, placeholders {'clip'[, 'objects']}, logits, recorded)."""
    graph = tf.Graph()
    recorded.clear()
    with graph.as_default():
      tf.set_random_seed(args.seed)
      feeds = {'clip': tf.placeholder(tf.float32, shape)}
      inputs = feeds['clip']
      if net != 'lite':  # The original's 4-D (N*T)HWC clips.
        inputs = tf.reshape(inputs, [shape[0] * shape[1]] + shape[2:])
      if objects:  # One channel per object class, at the clip's size.
        feeds['objects'] = tf.placeholder(tf.float32,
                                          shape[:4] + [FLAGS.num_object_classes])
        inputs = [inputs, tf.reshape(feeds['objects'], [
            shape[0] * shape[1]] + shape[2:4] + [FLAGS.num_object_classes])]
      logits = network_fn(net, num_layers, depth)(inputs, is_training)
    return graph, feeds, logits, dict(recorded)

  start = time.time()

  def log(stage):
    print(f'tf1_reference: {stage} at {time.time() - start:.1f} s',
          file=sys.stderr, flush=True)

  def count(variables):
    return int(sum(np.prod(v.shape.as_list()) for v in variables))

  # The published networks' trainable counts (graphs only).
  published = {}
  published_params = None
  if network == 'lite':
    # At the published 224^2 (its count depends on the resolution, the
    # fusion taking its width from the input width).
    graph, _, _, _ = build([1, 32, 224, 224, 3], False, PUBLISHED_BLOCKS)
    with graph.as_default():
      published_params = count(tf.trainable_variables())
  elif network == 'asn':  # Once, in the AssembleNet run: every network.
    saved = (FLAGS.model_structure, FLAGS.model_edge_weights,
             FLAGS.attention_mode, FLAGS.use_object_input,
             FLAGS.num_object_classes, FLAGS.num_frames)
    FLAGS.num_frames = 32
    FLAGS.num_object_classes = 151
    for name, net, depth, s, w, objects in (
        ('asn50', 'asn', 50, model_structures.asn50_structure,
         model_structures.asn_structure_weights, False),
        ('asn101', 'asn', 101, model_structures.asn101_structure,
         model_structures.asn_structure_weights, False),
        ('asnp50_objects', 'asnp', 50, model_structures.full_asnp50_structure,
         model_structures.full_asnp_structure_weights, True),
        ('asnp101_objects', 'asnp', 101,
         model_structures.full_asnp50_structure,
         model_structures.full_asnp_structure_weights, True),
        ('asnp50_asn50', 'asnp', 50, model_structures.asn50_structure,
         model_structures.asn_structure_weights, False)):
      FLAGS.model_structure, FLAGS.model_edge_weights = (json.dumps(s),
                                                         json.dumps(w))
      FLAGS.attention_mode = 'peer' if net == 'asnp' else None
      FLAGS.use_object_input = objects
      graph, _, _, _ = build([1, 32, 224, 224, 3], False, None, net, depth,
                             objects)
      with graph.as_default():
        published[name] = count(tf.trainable_variables())
      log(f'published {name} built')
    (FLAGS.model_structure, FLAGS.model_edge_weights, FLAGS.attention_mode,
     FLAGS.use_object_input, FLAGS.num_object_classes,
     FLAGS.num_frames) = saved
  log('published networks built')

  # One Session.run for all variables: each distinct run prunes the whole
  # graph (~17,000 ops) anew, seconds apiece for 1,206 variables one by one.
  def read_all(sess):
    variables = tf.global_variables()
    return dict(zip([v.op.name for v in variables], sess.run(variables)))

  def assign_all(sess, values):
    feeds, ops = {}, []
    for v in tf.global_variables():
      value = tf.placeholder(v.dtype.base_dtype, v.shape)
      feeds[value] = values[v.op.name]
      ops.append(tf.assign(v, value))
    sess.run(ops, feeds)

  rng = np.random.RandomState(args.seed)
  clip_value = rng.uniform(0.0, 1.0, [batch, frames, height, width, 3])
  # Clips of different ranges: the flow's rescaling by the batch's min/max
  # (the original) then differs from each clip's own.
  clip_value[1:] *= 0.5
  clip_value = clip_value.astype(np.float32)
  shape = [batch, frames, height, width, 3]
  with_objects = network == 'asnp'
  object_ids = None
  if with_objects:
    # Regions of 3 x 3 pixels of one random class each: the 4 x 4 max pool
    # of their one-hot maps holds one to four classes a window.
    coarse = rng.randint(0, num_objects, [batch, frames, -(-height // 3),
                                          -(-width // 3)])
    object_ids = np.repeat(np.repeat(coarse, 3, axis=2), 3,
                           axis=3)[:, :, :height, :width].astype(np.int32)

  def feed(placeholders):
    out = {placeholders['clip']: clip_value}
    if 'objects' in placeholders:
      out[placeholders['objects']] = np.eye(
          num_objects, dtype=np.float32)[object_ids]
    return out

  # 1. Non-trivial values: batch-norm scales and offsets, attention dense
  #    layers and softmax weights drawn at random (their initial values make
  #    attention nearly constant and residual branches zero); conv kernels
  #    keep the original's initializers; edge weights are the published ones.
  #    Then the moving statistics are the batch statistics of each batch
  #    norm's input in training mode on this clip (bn_decay 0: one update
  #    sets them), so activations stay of order 1 through the network, and
  #    are then perturbed, so inference mode differs from training mode.
  FLAGS.bn_decay = 0.0
  graph, placeholders, _, _ = build(shape, True, blocks, objects=with_objects)
  with graph.as_default(), tf.Session(graph=graph) as sess:
    sess.run(tf.global_variables_initializer())
    values = read_all(sess)
    for name, value in values.items():
      leaf = name.split('/')[-1]
      if leaf == 'gamma':
        value = rng.uniform(0.5, 1.5, value.shape)
      elif leaf in ('beta', 'bias'):
        value = rng.normal(0.0, 0.1, value.shape)
      elif leaf == 'kernel' and value.ndim == 2:  # dense layers
        value = rng.normal(0.0, 1.0, value.shape) / np.sqrt(value.shape[0])
      elif leaf == 'peer_attention_weights':
        value = rng.normal(0.0, 1.0, value.shape)
      values[name] = value.astype(np.float32)
    assign_all(sess, values)
    sess.run(tf.get_collection(tf.GraphKeys.UPDATE_OPS), feed(placeholders))
    values = read_all(sess)
  log('moving statistics calibrated')
  for name in values:
    if name.endswith('/moving_mean'):
      std = np.sqrt(values[name[:-len('mean')] + 'variance'])
      values[name] = (values[name] + 0.2 * std * rng.normal(
          size=std.shape)).astype(np.float32)
  for name in values:
    if name.endswith('/moving_variance'):
      values[name] = (values[name] * rng.uniform(
          0.5, 2.0, values[name].shape)).astype(np.float32)
  FLAGS.bn_decay = 0.99

  # 2. Inference (is_training False) with those values.
  graph, placeholders, logits, rec = build(shape, False, blocks,
                                           objects=with_objects)
  with graph.as_default(), tf.Session(graph=graph) as sess:
    sess.run(tf.global_variables_initializer())
    variables = tf.global_variables()
    names = sorted(v.op.name for v in variables)
    if names != sorted(values):
      raise RuntimeError('the training and inference graphs have different '
                         'variables')
    trainable = sorted(v.op.name for v in tf.trainable_variables())
    assign_all(sess, values)
    fetch = {'logits': logits, 'flow': rec['flow'][0]}
    stems = iter(rec['stem'])
    fusions = iter(rec['fusion'])
    groups = iter(rec['block_group'])
    for i, node in enumerate(structure):
      if node[0] < 0:
        fetch[f'node/{i}'] = next(stems)
      else:
        fetch[f'fusion/{i}'] = next(fusions)
        fetch[f'node/{i}'] = next(groups)
    out = sess.run(fetch, feed(placeholders))
  log('inference run')
  if four_d:  # [B * T, ...] -> [B, T, ...]
    out = {k: v if k == 'logits' else v.reshape([batch, frames] +
                                                list(v.shape[1:]))
           for k, v in out.items()}

  arrays = {f'var/{k}': v for k, v in values.items()}
  arrays.update(out)
  arrays['clip'] = clip_value
  if object_ids is not None:
    arrays['objects'] = object_ids
  arrays['meta'] = np.array(json.dumps(dict(
      network=network, structure=structure, edge_weights=edge_weights,
      blocks_per_level=blocks, trainable=trainable,
      published_blocks_per_level=PUBLISHED_BLOCKS,
      published_trainable_params_224=published_params,
      published_trainable_params=published,
      num_classes=args.num_classes,
      num_object_classes=num_objects if with_objects else None)))
  np.savez(args.output, **arrays)


if __name__ == '__main__':
  main()
