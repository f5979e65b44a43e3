"""AssembleNet++lite `recompute_grad`: one training step with gradient
checkpointing equals one without it, gradients and batch-norm moving
statistics alike.

`tf.recompute_grad` runs a checkpointed segment (stem, fusion, block group)
forward, then again in the backward pass; in that second run the batch norms
are in training mode again and must not update their moving averages a second
time (which decayed them at momentum ** 2 per step: after the first step
from zero, a moving mean of 0.0199 * the batch mean instead of 0.01 *).
"""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official_ext.assemblenet.modeling import assemblenet_plus_lite as anet
from official_ext.assemblenet.modeling import blocks
from official_ext.assemblenet.modeling import fusion
from official_ext.assemblenet.modeling import recompute
from official_ext.assemblenet import structures
from official_ext.core.kernels import kernel_policy

GPU = kernel_policy.resolve('auto', 'GPU')

T, S, BATCH = 4, 16, 4


def _full_model(checkpointed: bool, use_sync_bn: bool = False):
  """The tiny backbone + head: {'image': [BATCH, T, S, S, 3]} -> [BATCH, 5].

  Without `checkpointed`, the straightforward network: no checkpointing, and
  each fusion pools and averages its own inputs (`share_fusion_inputs=
  False`); with it, the memory-saving one (pooled copies and peer means
  computed once per node and shared), so the comparison also checks that
  sharing keeps the maths.
  """
  backbone = anet.AssembleNetPlusLite(
      structures.TINY_STRUCTURE, None, structures.TINY_BLOCKS_PER_LEVEL,
      input_specs=tf_keras.layers.InputSpec(shape=[None, T, S, S, 3]),
      stem_filters=8, attention_mode='peer', use_sync_bn=use_sync_bn,
      recompute_grad=checkpointed, rep_flow_options={'num_iter': 2},
      share_fusion_inputs=checkpointed)
  return anet.AssembleNetPlusLiteModel(backbone, 5, head_filters=(16, 24))


def _segments_model(checkpointed: bool, use_sync_bn: bool = False):
  """Checkpointed segments of every kind (two stems, a peer-attention fusion
  of inputs with different channel counts, a strided 2-block group):
  {'image': [BATCH, T, S, S, 3]} -> [BATCH, T, S/4, S/4, 8]. Few variables,
  so quick to build and trace (also under a strategy)."""
  bn = dict(use_sync_bn=use_sync_bn)
  inputs = tf_keras.Input([T, S, S, 3], name='image')
  stems = [anet.LiteStem(4, d, recompute_grad=checkpointed, name=f'stem_{d}',
                         **bn)(inputs) for d in (1, 2)]
  stems[1] = tf_keras.layers.Conv3D(6, 1, name='widen')(stems[1])
  fused = fusion.PeerAttentionFusion(
      2, 'peer', recompute_grad=checkpointed, name='fusion')(stems + stems)
  out = blocks.BlockGroup([8, 8, 8], 2, 2, recompute_grad=checkpointed,
                          name='group', **bn)(fused)
  return tf_keras.Model({'image': inputs}, out)


def _clips():
  rng = np.random.default_rng(0)
  return tf.constant(rng.uniform(0.0, 1.0, (BATCH, T, S, S, 3)), tf.float32)


def _grads(model, clips):
  """Gradients of one training-mode forward pass, [variable shape] each."""
  with tf.GradientTape() as tape:
    outputs = model({'image': clips}, training=True)
    loss = tf.reduce_sum(tf.square(outputs - 1.0))
  return tape.gradient(loss, model.trainable_variables)


def _moving_statistics(model):
  return {v.name: v.numpy() for v in model.non_trainable_variables
          if 'moving_' in v.name}


def _one_step(model, mode, strategy=None):
  """Gradients and moving statistics after one step of `model`."""
  clips = _clips()
  if strategy is not None:
    # Eagerly, each replica in a thread of its own (tracing the step under
    # the strategy costs about 30 s on 2 CPU cores).
    batch = next(iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(clips).batch(BATCH))))
    grads = strategy.run(_grads, args=(model, batch))
    grads = [strategy.reduce('SUM', g, axis=None) for g in grads]
  elif mode == 'function':
    grads = tf.function(_grads)(model, clips)
  else:
    grads = _grads(model, clips)
  assert all(g is not None for g in grads)
  return [g.numpy() for g in grads], _moving_statistics(model)


def _check_one_step(build, mode, strategy=None):
  """Same gradients; same moving statistics (which did move).

  Returns the number of moving statistics compared.
  """
  models = []
  for checkpointed in (False, True):
    if strategy is None:
      models.append(build(checkpointed))
    else:
      with strategy.scope():
        models.append(build(checkpointed, use_sync_bn=True))
  models[1].set_weights(models[0].get_weights())
  before = _moving_statistics(models[0])
  g_ref, m_ref = _one_step(models[0], mode, strategy)
  g_chk, m_chk = _one_step(models[1], mode, strategy)
  assert len(g_ref) == len(g_chk)
  # Float32 rounding of a traced step (another graph with recomputation)
  # reaches ~1e-7 of the largest gradient, e.g. in a bias gradient that is a
  # small sum of large terms.
  scale = max(np.abs(g).max() for g in g_ref)
  for g0, g1 in zip(g_ref, g_chk):
    np.testing.assert_allclose(g1, g0, rtol=1e-4, atol=1e-6 * scale)
  assert list(m_ref) == list(m_chk)
  for name in m_ref:
    np.testing.assert_allclose(
        m_chk[name], m_ref[name], rtol=1e-6, atol=1e-7,
        err_msg=f'{name}: moving statistic after one step with recompute_grad')
  moved = [n for n in m_ref if not np.allclose(m_ref[n], before[n])]
  assert len(moved) >= len(m_ref) // 2, moved
  return len(m_ref)


def test_recompute_grad_updates_batch_norm_statistics_once():
  """The whole tiny network (6 stems/fusions/block groups), eagerly; the
  reference also without shared fusion inputs (see `_full_model`)."""
  assert _check_one_step(_full_model, 'eager') >= 40
  shared = [l.name for l in _full_model(True).backbone.layers
            if isinstance(l, (fusion.SpatialMean, fusion.SpatialMaxPool))]
  assert 'node_0_mean' in shared and 'node_0_pool_2' in shared, shared


def test_recompute_grad_updates_once_in_a_function():
  """In a traced step the rerun creates no assign ops."""
  assert _check_one_step(_segments_model, 'function') >= 20


def test_recompute_grad_updates_once_on_two_replicas(mirrored):
  """Each replica thread recomputes its own segments; sync batch norm."""
  assert _check_one_step(_segments_model, 'eager', mirrored) >= 20


def test_block_group_recomputes_without_a_second_update(monkeypatch):
  """The recomputation still happens (the forward runs twice per step); the
  moving mean is one update towards the batch mean: 0.01 * mean from 0."""
  calls = []
  forward = blocks.BlockGroup._forward

  def counting_forward(self, x, training):
    calls.append(training)
    return forward(self, x, training)

  monkeypatch.setattr(blocks.BlockGroup, '_forward', counting_forward)
  x = tf.random.stateless_normal([2, 2, 4, 4, 4], seed=[1, 2])
  groups = [blocks.BlockGroup([4, 4, 8], 1, 1, recompute_grad=r)
            for r in (False, True)]
  groups[0](x, training=False)
  groups[1](x, training=False)
  groups[1].set_weights(groups[0].get_weights())
  calls.clear()
  grads = []
  for group in groups:
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(group(x, training=True)))
    grads.append(tape.gradient(loss, group.trainable_variables))
  assert calls == [True, True, True]  # once without, twice with recompute.
  for g0, g1 in zip(*grads):
    np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-7)
  bn = groups[1]._blocks[0]._layers[1]._bn  # bn_a after conv_a (4 channels).
  batch_mean = tf.reduce_mean(groups[1]._blocks[0]._layers[0](x), [0, 1, 2, 3])
  np.testing.assert_allclose(bn.moving_mean, 0.01 * batch_mean, rtol=1e-5,
                             atol=1e-7)
  for v0, v1 in zip(groups[0].non_trainable_variables,
                    groups[1].non_trainable_variables):
    np.testing.assert_allclose(v1, v0, rtol=1e-6, atol=1e-7, err_msg=v1.name)
  assert not recompute.in_recomputation()


@pytest.mark.parametrize('onednn', [False, True])
def test_2d_convolutions_give_conv3d_gradients(onednn):
  """Training with `convolutions.Conv3D`'s implementations as the CPU kernel
  policy picks them for either setting of oneDNN (`conv3d_implementation`:
  the convolutions in 2-D ops, `convolutions.conv3d_as_2d`, or, oneDNN on, the
  native op for undilated kernels of more than one tap) gives the outputs
  and gradients of the stock policy's (tf_keras' Conv3D) to float32
  rounding, eagerly: stems
  ([1, 3, 3] strided, [3, 1, 1] plain and dilated), a fusion's 1x1x1
  projection, a strided block (strided 1x1x1 shortcut) and an unstrided one
  ([3, 3, 3])."""
  model = _segments_model(False)
  clips = _clips()

  def run():
    with tf.GradientTape() as tape:
      outputs = model({'image': clips}, training=True)
      loss = tf.reduce_sum(tf.square(outputs - 1.0))
    grads = tape.gradient(loss, model.trainable_variables)
    return outputs.numpy(), [g.numpy() for g in grads]

  with kernel_policy.use(kernel_policy.resolve('auto', 'CPU', onednn)):
    fast_out, fast = run()
  with kernel_policy.use(kernel_policy.resolve('stock', 'CPU')):
    slow_out, slow = run()
  np.testing.assert_allclose(fast_out, slow_out, rtol=1e-5, atol=1e-5)
  assert len(fast) == len(slow) == len(model.trainable_variables) > 20
  # As `_check_one_step`: float32 rounding, relative to the largest gradient.
  scale = max(np.abs(g).max() for g in slow)
  for v, g0, g1 in zip(model.trainable_variables, slow, fast):
    np.testing.assert_allclose(g1, g0, rtol=1e-4, atol=1e-6 * scale,
                               err_msg=v.name)


def test_larger_pooled_copies_are_pooled_from_the_smaller():
  """A node pooled by 4 is the 2 x 2 max pool of its copy pooled by 2 (the
  same values: `test_recompute_grad_updates_batch_norm_statistics_once`
  compares the gradients with the unshared network's), so its gradient reaches the node through
  the smaller copy: one full-size gradient of the node fewer."""
  pools = {l.name: l for l in _full_model(True).backbone.layers
           if isinstance(l, fusion.SpatialMaxPool)}
  assert {'node_0_pool_2', 'node_0_pool_4', 'node_3_pool_5'} <= set(pools)
  layer = pools['node_0_pool_4']
  assert layer._ratio == 2
  (source,) = [n.inbound_layers for n in layer._inbound_nodes]
  assert source.name == 'node_0_pool_2', source.name
  # An odd ratio (4 x 4 -> 1 x 1: ratio 5) pools the node itself.
  layer = pools['node_3_pool_5']
  assert layer._ratio == 5
  assert [n.inbound_layers.name for n in layer._inbound_nodes] == ['node_3']


def _ancestors(tensor):
  """Every op `tensor` depends on in its graph (inputs and control inputs)."""
  seen, stack = set(), [tensor.op]
  while stack:
    op = stack.pop()
    for parent in [t.op for t in op.inputs] + list(op.control_inputs):
      if parent not in seen:
        seen.add(parent)
        stack.append(parent)
  return seen


def test_independent_segments_rerun_one_after_the_other():
  """Two block groups on the same input (as the level-0 and level-2 nodes):
  in a traced step, one group's backward pass (its rerun and gradients)
  waits for the other's gradients, so their recomputed activations are
  never held at the same time (the CPU fast path
  'assemblenet.ordered_recompute': host memory). With `tf.recompute_grad`,
  as the kernel policy takes on a GPU, the two are independent; the
  gradients are the same either way."""
  x = tf.random.stateless_normal([2, 2, 8, 8, 4], seed=[3, 4])
  groups = [blocks.BlockGroup([4, 4, 8], 1, 2, recompute_grad=True,
                              name=f'group_{i}') for i in range(2)]
  reference = [blocks.BlockGroup([4, 4, 8], 1, 2, name=f'ref_{i}')
               for i in range(2)]
  for group, ref in zip(groups, reference):
    group(x, training=False)
    ref(x, training=False)
    ref.set_weights(group.get_weights())

  def grads(layers):
    variables = [v for l in layers for v in l.trainable_variables]
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = sum(tf.reduce_sum(tf.square(l(x, training=True)))
                 for l in layers)
    return tape.gradient(loss, variables + [x])

  def ordered(policy):
    with kernel_policy.use(policy):
      graph = tf.function(grads).get_concrete_function(groups).graph
    # The gradients of the two groups' first variables (a function's
    # outputs are identities of the returned tensors).
    n = len(groups[0].trainable_variables)
    first, second = (graph.outputs[i].op.inputs[0] for i in (0, n))
    return (first.op in _ancestors(second)) or (second.op in
                                                _ancestors(first))

  cpu = kernel_policy.resolve('auto', 'CPU')
  assert ordered(cpu), 'the two groups\' backward passes are not ordered'
  assert not ordered(GPU), 'a GPU run took the ordered CPU fast path'
  want = grads(reference)
  for policy in (cpu, GPU):
    with kernel_policy.use(policy):
      got = tf.function(grads)(groups)
    for g0, g1 in zip(want, got):
      np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-6)


def test_recompute_grad_of_the_accelerator_policy_updates_once():
  """On a GPU or TPU the kernel policy takes `tf.recompute_grad`: its rerun
  too updates no batch-norm statistics, in a traced step."""
  with kernel_policy.use(GPU):
    assert _check_one_step(_segments_model, 'function') >= 20


def test_recompute_grad_under_xla_takes_tf_recompute_grad():
  """XLA ignores control dependencies: inside a jit-compiled function the
  segment is `tf.recompute_grad`'s (a data dependency orders its rerun);
  same gradients as without checkpointing."""
  x = tf.random.stateless_normal([3, 5], seed=[5, 6])
  w = tf.Variable(tf.random.stateless_normal([5, 4], seed=[7, 8]))

  def forward(inputs):
    return tf.nn.relu(tf.matmul(inputs, w)) ** 2

  def grads(checkpointed):
    with tf.GradientTape() as tape:
      tape.watch(x)
      f = recompute.recompute_grad(forward) if checkpointed else forward
      loss = tf.reduce_sum(f(x))
    return tape.gradient(loss, [w, x])

  want = grads(False)
  for fn in (tf.function(grads, jit_compile=True), tf.function(grads), grads):
    for g0, g1 in zip(want, fn(True)):
      np.testing.assert_allclose(g1, g0, rtol=1e-6, atol=1e-6)
