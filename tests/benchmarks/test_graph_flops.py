"""The traced-graph FLOP counter, and its agreement with the hand formulas
(tests/benchmarks/flop_formulas.py): exact, at tiny and published sizes."""
import dataclasses

import pytest
import tensorflow as tf, tf_keras

from official_ext.assemblenet import structures
from official_ext.assemblenet.modeling import assemblenet_plus_lite as anet
from official_ext.benchmarks import assemblenet as assemblenet_bench
from official_ext.benchmarks import graph_flops
from official_ext.benchmarks import yt8m as yt8m_bench
from official_ext.core.kernels import kernel_policy
from tests.benchmarks import flop_formulas


def test_graph_flops_counts_each_contraction():
  a = tf.ones([3, 4])
  b = tf.ones([4, 5])
  x = tf.ones([2, 3, 4])
  y = tf.ones([2, 5, 4])

  def fn():
    return (tf.matmul(a, b), tf.matmul(b, a, transpose_a=True,
                                       transpose_b=True),
            tf.matmul(x, y, adjoint_b=True), tf.einsum('bij,bkj->bik', x, y))

  graph = tf.function(fn).get_concrete_function().graph
  counts = graph_flops.graph_flops(graph)
  # 2 x (3*4*5) twice; 2 x (2*3*4*5) as a batch matmul and as an einsum.
  assert counts == {'MatMul': 240, 'BatchMatMulV2': 240, 'Einsum': 240}


def test_graph_flops_counts_convolutions_and_their_gradients():
  x = tf.ones([1, 4, 4, 2])
  kernel = tf.Variable(tf.ones([3, 3, 2, 5]))
  # 16 output positions x 3*3*2*5 multiply-adds; 9 positions at stride 2.
  assert graph_flops.function_flops(
      lambda: tf.nn.conv2d(x, kernel, 1, 'SAME')) == 2 * 16 * 90
  assert graph_flops.function_flops(lambda: tf.nn.conv2d(
      tf.ones([1, 5, 5, 2]), kernel, 2, 'SAME')) == 2 * 9 * 90
  # Channels first: the positions exclude dimension 1 (traced, not run).
  assert graph_flops.function_flops(lambda: tf.nn.conv2d(
      tf.ones([1, 2, 4, 4]), kernel, 1, 'SAME', data_format='NCHW')) == (
          2 * 16 * 90)
  # 3-D: 2 x 16 positions x 3*3*3*2*5; depthwise: each of 16 x 4 outputs
  # 3 x 3 taps.
  assert graph_flops.function_flops(lambda: tf.nn.conv3d(
      tf.ones([1, 2, 4, 4, 2]), tf.ones([3, 3, 3, 2, 5]), [1] * 5,
      'SAME')) == 2 * 32 * 270
  assert graph_flops.function_flops(lambda: tf.nn.depthwise_conv2d(
      x, tf.ones([3, 3, 2, 2]), [1] * 4, 'SAME')) == 2 * 64 * 9

  def train(inputs):
    with tf.GradientTape() as tape:
      tape.watch(inputs)
      loss = tf.reduce_sum(tf.nn.conv2d(inputs, kernel, 1, 'SAME'))
    return loss, tape.gradient(loss, [inputs, kernel])

  # Forward, input gradient, filter gradient: the same work each.
  counts = graph_flops.graph_flops(tf.function(train).get_concrete_function(
      x).graph)
  assert counts == {'Conv2D': 2880, 'Conv2DBackpropInput': 2880,
                    'Conv2DBackpropFilter': 2880}


def test_graph_flops_follows_nested_functions():
  inner = tf.function(lambda m: tf.matmul(m, tf.ones([2, 3])))
  assert graph_flops.function_flops(lambda: inner(tf.ones([4, 2]))) == 48
  twice = tf.function(lambda: inner(tf.ones([4, 2])) + inner(tf.ones([4, 2])))
  assert graph_flops.function_flops(twice) == 96
  # A function traced for any batch holds no static shape, even when a
  # static batch calls it later (TensorFlow reuses the trace).
  inner.get_concrete_function(tf.TensorSpec([None, 2], tf.float32))
  with pytest.raises(ValueError, match=r"MatMul op 'MatMul'.*unknown shape"):
    graph_flops.function_flops(lambda: inner(tf.ones([5, 2])))
  looping = tf.function(lambda: tf.while_loop(
      lambda m: tf.reduce_sum(m) > -1.0,
      lambda m: tf.matmul(m, tf.ones([2, 2])), [tf.ones([2, 2])],
      maximum_iterations=3))
  with pytest.raises(ValueError, match=r"function '.*' called by "
                     r"(Stateless)?While op .* holds \['MatMul'\], which this counter does not "
                     'follow'):
    graph_flops.function_flops(looping)


def test_graph_flops_refuses_what_it_cannot_count():
  unknown = tf.function(lambda m: tf.matmul(m, tf.ones([4, 2]))
                        ).get_concrete_function(
                            tf.TensorSpec([None, 4], tf.float32))
  with pytest.raises(ValueError, match=r"MatMul op 'MatMul'.*unknown shape"):
    graph_flops.graph_flops(unknown.graph)
  with pytest.raises(ValueError, match="Conv op 'Conv'.*not counted"):
    graph_flops.function_flops(lambda: tf.raw_ops.Conv(
        input=tf.ones([1, 4, 4, 1]), filter=tf.ones([2, 2, 1, 1]),
        strides=[1, 1, 1, 1], padding='SAME'))
  x = tf.ones([2, 2])
  with pytest.raises(ValueError, match='branches hold different'):
    graph_flops.function_flops(lambda: tf.cond(
        tf.reduce_sum(x) > 0, lambda: tf.matmul(x, x), lambda: x))
  with pytest.raises(ValueError, match='number of iterations is not static'):
    graph_flops.function_flops(lambda: tf.while_loop(
        lambda m: tf.reduce_sum(m) < 100.0, lambda m: tf.matmul(m, x), [x]))


def test_graph_flops_follows_loops_and_conditionals():
  x = tf.ones([2, 3])
  w = tf.ones([3, 3])
  # 7 iterations of a [2, 3] x [3, 3] matmul (36 FLOPs each); a conditional
  # with one in each branch counts it once.
  assert graph_flops.function_flops(lambda: tf.while_loop(
      lambda m: tf.reduce_sum(m) > -1.0, lambda m: tf.matmul(m, w), [x],
      maximum_iterations=7)) == 7 * 36
  assert graph_flops.function_flops(lambda: tf.cond(
      tf.reduce_sum(x) > 0, lambda: tf.matmul(x, w),
      lambda: 2.0 * tf.matmul(x, w))) == 36
  # A Keras LSTM (the starter's) loops once per frame: per frame and video
  # x [3] @ W [3, 16] and h [4] @ U [4, 16], each 2 FLOPs a multiply-add.
  lstm = tf_keras.layers.RNN(tf_keras.layers.LSTMCell(4))
  frames = tf.ones([2, 5, 3])
  lstm(frames)
  forward = 5 * 2 * 2 * (3 * 16 + 4 * 16)
  assert graph_flops.function_flops(lambda: lstm(frames)) == forward

  def train():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(lstm(frames))
    return tape.gradient(loss, lstm.trainable_variables)

  # Its gradient loop runs 5 times too: the weight gradients of W and U and
  # the gradient into h (none into the frames, which nothing trains).
  assert graph_flops.function_flops(train) == (
      forward + 5 * 2 * 2 * (3 * 16 + 4 * 16 + 4 * 16))


def test_dbof_formula_by_hand():
  # Published, per example: cluster forward 2*300*1152*3000 and its weight
  # gradient, hidden 2*3000*2000 x3 (forward, weight grad, input grad), MoE
  # gate+expert 2*2000*3862*11 x3. No gradient w.r.t. the frame features.
  expected = (2 * 2 * 300 * 1152 * 3000 + 3 * 2 * 3000 * 2000 +
              3 * 2 * 2000 * 3862 * 11)
  assert flop_formulas.dbof_train_flops_per_example(
      yt8m_bench.PUBLISHED) == expected == 4_692_984_000
  # TINY: 8 frames x 1152 features, cluster 32, hidden 32, 2 mixtures,
  # 20 classes.
  cluster_train = 2 * (2 * 8 * 1152 * 32)  # forward and weight gradient
  hidden_train = 3 * 2 * 32 * 32
  moe_train = 3 * 2 * 32 * 20 * (2 * 2 + 1)  # gates (M+1) + experts M
  assert flop_formulas.dbof_train_flops_per_example(yt8m_bench.TINY) == (
      cluster_train + hidden_train + moe_train) == 1_204_992


def test_nextvlad_formula_by_hand():
  # Published, per example, T = 300 frames. rgb (N 1024, λN 2048, G 8,
  # K 128, N' 256):
  rgb = (2 * (2 * 300 * 1024 * 2048)        # expansion: fwd + weight grad
         + 3 * 2 * 300 * 2048 * 8           # group attention: x3
         + 3 * 2 * 300 * 2048 * 8 * 128     # cluster assignment: x3
         + 3 * 2 * 300 * 8 * 128 * 256)     # aggregation: x3
  # audio (N 128, λN 256, G 4, K 64, N' 64):
  audio = (2 * (2 * 300 * 128 * 256) + 3 * 2 * 300 * 256 * 4 +
           3 * 2 * 300 * 256 * 4 * 64 + 3 * 2 * 300 * 4 * 64 * 64)
  # hidden [256*128 + 64*64, 2048], SE [2048, 256] + [256, 2048], logistic.
  top = 3 * 2 * (36864 * 2048 + 2 * 2048 * 256 + 2048 * 3862)
  assert flop_formulas.nextvlad_train_flops_per_example(
      yt8m_bench.NEXTVLAD_PUBLISHED) == rgb + audio + top == 7_488_159_744
  # TINY, T = 8; stream 0: N 24, λN 48, G 2, K 4, N' 24; stream 1: N 8,
  # λN 16, G 1, K 2, N' 16; hidden 16, SE r 4, 20 classes.
  stream0 = (2 * 2 * 8 * 24 * 48 + 3 * 2 * 8 * 48 * 2 * (1 + 4) +
             3 * 2 * 8 * 2 * 4 * 24)
  stream1 = (2 * 2 * 8 * 8 * 16 + 3 * 2 * 8 * 16 * 1 * (1 + 2) +
             3 * 2 * 8 * 1 * 2 * 16)
  top = 3 * 2 * ((24 * 4 + 16 * 2) * 16 + 2 * 16 * 4 + 16 * 20)
  assert flop_formulas.nextvlad_train_flops_per_example(
      yt8m_bench.NEXTVLAD_TINY) == stream0 + stream1 + top == 92_032


@pytest.mark.parametrize('name', ['tiny', 'published'])
def test_yt8m_training_steps_count_as_the_formulas(name):
  """The traced training steps of DBoF + MoE and NeXtVLAD equal the
  formulas exactly (published sizes on one video: FLOPs per example do not
  depend on the batch)."""
  dbof, nextvlad = {'tiny': (yt8m_bench.TINY, yt8m_bench.NEXTVLAD_TINY),
                    'published': (yt8m_bench.PUBLISHED,
                                  yt8m_bench.NEXTVLAD_PUBLISHED)}[name]
  dbof = dataclasses.replace(dbof, batch=1)
  task = yt8m_bench.build_task(dbof)
  assert graph_flops.train_step_flops(
      task, task.build_model(), yt8m_bench.make_batch(dbof)) == (
          flop_formulas.dbof_train_flops_per_example(dbof))
  assert task.task_config.jit_compile  # Restored after the trace.
  nextvlad = dataclasses.replace(nextvlad, batch=1)
  task = yt8m_bench.build_nextvlad_task(nextvlad)
  assert graph_flops.train_step_flops(
      task, task.build_model(), yt8m_bench.make_batch(nextvlad)) == (
          flop_formulas.nextvlad_train_flops_per_example(nextvlad))


T, S = 4, 32


@pytest.mark.parametrize('attention_mode, original_width', [
    (None, False), ('self', False), ('peer', False), ('peer', True)])
def test_assemblenet_counts_as_the_formula(attention_mode, original_width):
  """Forward pass and training step of the tiny network, by op type: the
  convolutions and dense layers, and the representation flow (the
  published sizes: tests/assemblenet/test_modeling.py)."""
  backbone = anet.AssembleNetPlusLite(
      structures.TINY_STRUCTURE, None, structures.TINY_BLOCKS_PER_LEVEL,
      input_specs=tf_keras.layers.InputSpec(shape=[1, T, S, S, 3]),
      stem_filters=8, attention_mode=attention_mode,
      fusion_width_as_channels=original_width,
      rep_flow_options={'num_iter': 2})
  model = anet.AssembleNetPlusLiteModel(backbone, num_classes=7,
                                        head_filters=(16, 24))
  expected = flop_formulas.assemblenet_flops(
      structures.TINY_STRUCTURE, structures.TINY_BLOCKS_PER_LEVEL,
      attention_mode=attention_mode,
      fusion_width_as_channels=original_width, num_frames=T, height=S,
      width=S, num_classes=7, stem_filters=8, head_filters=(16, 24),
      flow_iterations=2)
  clip = tf.random.uniform([1, T, S, S, 3])
  with kernel_policy.use(kernel_policy.resolve('stock')):
    graph = tf.function(lambda: model(clip, training=False)
                        ).get_concrete_function().graph
  assert graph_flops.graph_flops(graph) == {
      k: v for k, v in expected.items() if k != 'train'}
  if attention_mode == 'peer' and not original_width:

    def train():
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(clip, training=True))
      return loss, tape.gradient(loss, model.trainable_variables)

    with kernel_policy.use(kernel_policy.resolve('stock')):
      assert graph_flops.function_flops(train) == expected['train']


def test_assemblenet_benchmark_counts_as_the_formula():
  """The benchmark's quick network, forward and the task's training step."""
  flops = assemblenet_bench.clip_flops(T, S, quick=True, training=True)
  expected = flop_formulas.assemblenet_flops(
      assemblenet_bench.QUICK_STRUCTURE,
      assemblenet_bench.QUICK_BLOCKS_PER_LEVEL, num_frames=T, height=S,
      width=S, stem_filters=8, head_filters=(16, 24), flow_iterations=2)
  assert flops == {'forward': flop_formulas.assemblenet_forward_flops(
      structure=assemblenet_bench.QUICK_STRUCTURE,
      blocks_per_level=assemblenet_bench.QUICK_BLOCKS_PER_LEVEL,
      num_frames=T, height=S, width=S, stem_filters=8,
      head_filters=(16, 24), flow_iterations=2), 'train': expected['train']}
