"""Layers of AssembleNet++lite (5-D `[batch, time, height, width, channels]`).

Each layer has `get_config`; variable names are chosen on purpose (they are the
checkpoint interface): a node's fusion holds `agg_weights` (edge weights),
`peer_dense_<k>` (peer candidate vectors), `attention_<i>` /
`attention_<i>_peer_weights` (per-connection attention) and `project_<c>`
(1x1x1 projection of the inputs with c channels); a block holds `conv_a`,
`conv_b` (and `conv_b_temporal` when strided), `conv_c`, `shortcut` and their
`bn_*`.

Gradient checkpointing (`recompute_grad` of stems, fusions and block groups)
goes through `recompute_grad` here: the backward pass reruns a segment in
training mode, and its batch norms must not update their moving statistics a
second time in that rerun.
"""
import math
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf, tf_keras

from official_ext.core import kernel_policy
from official_ext.core import tf_internals

BATCH_NORM_DECAY = 0.99
BATCH_NORM_EPSILON = 1e-5
ATTENTION_MODES = (None, 'self', 'peer')


_RECOMPUTATION = threading.local()


def in_recomputation() -> bool:
  """True while this thread reruns a `recompute_grad` segment for gradients.

  The flag is per thread: `MirroredStrategy` runs each replica (and its
  backward pass) in a thread of its own. It is read when a layer is called,
  so it holds in eager mode and while a `tf.function` (with or without XLA)
  is traced alike.
  """
  return getattr(_RECOMPUTATION, 'depth', 0) > 0


def recompute_grad(forward: Callable[..., Any]) -> Callable[..., Any]:
  """Gradient checkpointing of `forward`, like `tf.recompute_grad`, with

  a backward rerun that updates no state and one segment's rerun at a time.

  The forward pass runs `forward` once (the tape keeps only its inputs); the
  backward pass runs it again, on the same inputs and variables, and takes
  the gradients of that rerun. The batch norms in `forward` run in training
  mode both times; the first run updates their moving statistics, the rerun
  (marked by `in_recomputation`) does not (`BatchNormalization.add_update`),
  so a step decays them by `bn_decay` once, as without recomputation, and the
  rerun gives the same outputs and gradients as the first run.

  In a graph (`tf.function`), a segment's rerun starts when its output
  gradients exist and the previous segment's backward pass (the one whose
  gradient the tape built before this one's) has produced its gradients
  (control dependencies). Without that order the executor runs the backward
  passes of independent segments (the two level-0 block groups, the two
  level-2 block groups) at the same time, each holding all its recomputed
  activations: measured at 8 x 32 x 224^2, the two level-0 block groups'
  reruns together held ~4 GB of the step's 9.0 GB live-tensor peak; in
  order, the step's peak RSS fell from 11.9 to 7.8 GB. The tape builds a
  gradient only after every gradient that feeds it, so the order adds no
  cycle. Unlike `tf.recompute_grad`, the rerun's inputs are not copied
  (`tf.recompute_grad` adds 0 to every input, a data dependency for XLA,
  which ignores control dependencies), and inputs no tape watches (the RGB
  stem's clip) get no gradient. The gradients are those of
  `tf.recompute_grad`.

  The ordered rerun is a CPU fast path (`core.kernel_policy`,
  'assemblenet.ordered_recompute', measured for host memory): where the
  kernel policy does not take it, and inside an XLA-compiled function
  (which ignores control dependencies), the segment runs through
  `tf.recompute_grad`, its rerun still marked by `in_recomputation`.

  `forward` must otherwise be deterministic: a random op (dropout) would
  draw a different mask in the rerun than in the forward pass and give wrong
  gradients. No segment checkpointed here has one (the head's dropout is not
  checkpointed).

  Args:
    forward: f(*tensors) -> tensor or nest of tensors.

  Returns:
    A function with the signature and outputs of `forward`.
  """

  def rerun(*args):
    _RECOMPUTATION.depth = getattr(_RECOMPUTATION, 'depth', 0) + 1
    try:
      return forward(*args)
    finally:
      _RECOMPUTATION.depth -= 1

  @tf.custom_gradient
  def segment(*args):
    # Inputs no tape watches (the clip of the RGB stem) get no gradient:
    # one in the order's token would keep the executor from pruning it.
    needed = [tf_internals.should_record_backprop([a]) for a in args]
    with tf_internals.stop_recording():
      result = forward(*args)

    def grad(*dys, variables=None):
      variables = list(variables or [])
      waits = [d for d in dys if d is not None] + _previous_backward()
      with tf.control_dependencies(waits):
        xs = [tf.identity(a) for a in args]
      with tf.GradientTape() as tape:
        tape.watch(xs)
        tape.watch(variables)
        outputs = tf.nest.flatten(rerun(*xs))
      sources = [x for x, n in zip(xs, needed) if n] + variables
      grads = iter(tape.gradient(
          outputs, sources, output_gradients=list(dys),
          unconnected_gradients=tf.UnconnectedGradients.ZERO))
      input_grads = [next(grads) if n else None for n in needed]
      variable_grads = list(grads)
      _BACKWARD_ORDER.last = (tf.compat.v1.get_default_graph(), [
          g for g in input_grads + variable_grads if g is not None])
      return input_grads, variable_grads

    return result, grad

  def call(*args):
    if (not kernel_policy.current().takes('assemblenet.ordered_recompute') or
        (not tf.executing_eagerly() and
         tf_internals.in_xla_context(tf.compat.v1.get_default_graph()))):
      runs = []

      def run(*xs):  # First call: the forward pass; later: reruns.
        if not runs:
          runs.append(True)
          return forward(*xs)
        return rerun(*xs)
      return tf.recompute_grad(run)(*args)
    return segment(*args)

  return call


# Per thread (a replica builds its backward pass in a thread of its own):
# (graph, gradients) of the segment whose backward pass was built last.
_BACKWARD_ORDER = threading.local()


def _previous_backward() -> List[tf.Tensor]:
  """The last-built segment's gradients, where they are in this graph."""
  if tf.executing_eagerly():  # Op by op: one segment at a time anyway.
    return []
  graph, grads = getattr(_BACKWARD_ORDER, 'last', (None, ()))
  if graph is not tf.compat.v1.get_default_graph():
    return []
  return [g for g in grads if g is not None]


class BatchNormalization(tf_keras.layers.BatchNormalization):
  """tf_keras `BatchNormalization` that skips its moving-statistics update
  while a `recompute_grad` segment is rerun (`in_recomputation`).

  Otherwise identical (same variables, same `synchronized` option); the
  normalization itself (batch statistics in training mode, cross-replica
  ones when synchronized) is computed in the rerun as in the forward pass.
  """

  def add_update(self, updates):
    if in_recomputation():
      return  # The forward run of this step made this update already.
    super().add_update(updates)


def _dims(x: tf.Tensor) -> List[Any]:
  """x's dimensions: python ints where static, scalar tensors elsewhere."""
  dynamic = tf.shape(x)
  return [d if d is not None else dynamic[i] for i, d in enumerate(x.shape)]


def spatial_max_pool(x: tf.Tensor, r: int) -> tf.Tensor:
  """`tf.nn.max_pool3d(x, [1, 1, r, r, 1], [1, 1, r, r, 1], 'SAME')`.

  Computed as a 2-D max pool of every frame (the window holds one frame), so
  the values are the same, in an op TFLite has (it has no 3-D max pool).

  Args:
    x: [B, T, H, W, C].
    r: the spatial window and stride.

  Returns:
    [B, T, ceil(H / r), ceil(W / r), C], x's dtype.
  """
  b, t, h, w, c = _dims(x)
  pooled = tf.nn.max_pool2d(tf.reshape(x, [-1, h, w, c]), r, r, 'SAME')
  out = tf.reshape(pooled, [b, t, *_dims(pooled)[1:]])
  out.set_shape([x.shape[0], x.shape[1], *pooled.shape[1:]])
  return out


# Frames of at most this many pixels are convolved as one matmul over all
# taps (`conv3d_as_2d`): measured fwd + bwd of a 3 x 3 SAME conv of 32 frames,
# matmul / Conv2D time: 4 x 4 x 1296 -> 432: 0.6-0.7; 7 x 7 x 456 -> 152:
# 0.9-1.1; 14 x 14: 1.5-2.0; 28 x 28: 2.1-2.4 (2 shared CPU cores, AVX2).
MAX_IM2COL_PIXELS = 16
# Frames of at most this many pixels take the input gradient of a stride-1
# 2-D convolution as a forward convolution (`conv2d_same`): measured
# Conv2D(flipped) / Conv2DBackpropInput time, 3 x 3 kernel, 32 frames:
# 7 x 7 x 456 -> 152: 0.72; 14 x 14 x 162 -> 54: 0.96; 28 x 28 x 81 -> 27:
# 1.42 (2 shared CPU cores, AVX2, under load).
MAX_FLIPPED_GRAD_PIXELS = 64


class SpatialMaxPool(tf_keras.layers.Layer):
  """`spatial_max_pool(x, ratio)` as a layer: [B, T, H, W, C] ->

  [B, T, ceil(H / ratio), ceil(W / ratio), C]. The backbone pools a node's
  output once per ratio and gives the pooled copy to every fusion that takes
  the node at that size (`AssembleNetPlusLite(share_fusion_inputs=True)`).
  """

  def __init__(self, ratio: int, **kwargs):
    super().__init__(**kwargs)
    if ratio < 2:
      raise ValueError(f'{self.name}: pooling ratio must be >= 2; got '
                       f'{ratio}.')
    self._ratio = ratio

  def call(self, inputs):
    return spatial_max_pool(inputs, self._ratio)

  def get_config(self):
    config = super().get_config()
    config.update(ratio=self._ratio)
    return config


class SpatialMean(tf_keras.layers.Layer):
  """Mean over height and width: [B, T, H, W, C] -> [B, T, C].

  A node's peer-attention vector source: the backbone averages each node's
  output once and gives the mean to every fusion that has the node as a
  peer (`PeerAttentionFusion` takes peers as such means).
  """

  def call(self, inputs):
    return tf.reduce_mean(inputs, axis=[2, 3])


def conv3d_as_2d(inputs: tf.Tensor, kernel: tf.Tensor, strides=(1, 1),
                 temporal_dilation: int = 1) -> tf.Tensor:
  """A 'same'-padded 3-D convolution computed with 2-D ops (no Conv3D).

  `tf.nn.convolution(inputs, kernel, [1, sh, sw], 'SAME', dilations=[d, 1,
  1])` (channels last, temporal stride 1), as: one 2-D convolution of every
  frame (a matmul for a 1x1 kernel at stride 1) with the kernel as
  [kh, kw, C, kt * F], giving each temporal tap's outputs, which are then
  shifted in time by the tap's offset (zero outside the clip, as
  TensorFlow's SAME padding) and summed. Frames of at most
  `MAX_IM2COL_PIXELS` pixels (at stride 1) are one matmul instead: every
  tap's shifted input stacked along channels. The same products, summed in
  another order: equal to float32 rounding
  (`tests/assemblenet/test_modeling.py`).

  Why: TensorFlow's Eigen CPU Conv3D gradients (Conv3DBackpropInputV2 /
  FilterV2, oneDNN off) are several times slower than the 2-D
  convolution's and the matmul's (a profile on AVX2: the training step's
  backward pass cost about six forward passes); these ops are also all
  TFLite builtins (no 5-D SpaceToBatchND for the dilation). A CPU fast path
  of the kernel policy ('assemblenet.conv3d_as_2d'); with oneDNN's CPU
  kernels on, `Conv3D` takes it only for 1x1x1 kernels and dilated ones on
  small frames (`conv3d_implementation`, measured).

  Args:
    inputs: [B, T, H, W, C] (B and T may be dynamic).
    kernel: [kt, kh, kw, C, F].
    strides: (sh, sw), the spatial strides.
    temporal_dilation: d, the dilation along time.

  Returns:
    [B, T, ceil(H / sh), ceil(W / sw), F], the inputs' dtype.
  """
  kt, kh, kw, c, f = kernel.shape
  sh, sw = strides
  d = temporal_dilation
  b, t, h, w, _ = _dims(inputs)
  total = d * (kt - 1)
  before = total // 2  # As TensorFlow splits SAME padding in time.
  time_pad = [[0, 0], [before, total - before], [0, 0], [0, 0], [0, 0]]
  if (sh == 1 and sw == 1 and kh * kw > 1 and isinstance(h, int) and
      isinstance(w, int) and h * w <= MAX_IM2COL_PIXELS):
    # Small frames (the last level's 4 x 4): every tap's shifted input
    # stacked along channels, one matmul; Conv2D's gradients are slow there.
    # tf.slice, not x[:, a:b]: its gradient is a Pad, StridedSlice's a much
    # slower StridedSliceGrad.
    x = tf.pad(inputs, [[0, 0], time_pad[1], [(kh - 1) // 2, kh // 2],
                        [(kw - 1) // 2, kw // 2], [0, 0]])
    x = tf.concat([tf.slice(x, [0, k * d, i, j, 0], [-1, t, h, w, -1])
                   for i in range(kh) for j in range(kw) for k in range(kt)],
                  axis=-1)
    y = tf.matmul(tf.reshape(x, [-1, kh * kw * kt * c]),
                  tf.reshape(tf.transpose(kernel, [1, 2, 0, 3, 4]),
                             [kh * kw * kt * c, f]))
    return tf.reshape(y, [b, t, h, w, f])
  # One 2-D convolution (a matmul for 1x1) of every frame to kt * F channels,
  # tap k's outputs in channels [k * F, (k + 1) * F); then each tap's outputs
  # shifted in time (zero-padded as SAME) and summed. Only the unshifted
  # input is kept for the gradients.
  kernel = tf.reshape(tf.transpose(kernel, [1, 2, 3, 0, 4]),
                      [kh, kw, c, kt * f])
  if kh == 1 and kw == 1 and sh == 1 and sw == 1:
    z = tf.matmul(tf.reshape(inputs, [-1, c]), kernel[0, 0])
    oh, ow = h, w
  else:
    z = conv2d_same(tf.reshape(inputs, [-1, h, w, c]), kernel, (sh, sw))
    _, oh, ow, _ = _dims(z)
  z = tf.reshape(z, [b, t, oh, ow, kt * f])
  if kt == 1:
    return z
  return shift_and_sum_taps(z, [k * d - before for k in range(kt)])


def conv2d_same(x: tf.Tensor, kernel: tf.Tensor, strides=(1, 1)) -> tf.Tensor:
  """`tf.nn.conv2d(x, kernel, strides, 'SAME')`, [N, H, W, C] channels last.

  At stride 1, for an odd kernel and frames of at most
  `MAX_FLIPPED_GRAD_PIXELS` pixels, the input's gradient is computed as a
  forward convolution of the output's gradient with the spatially flipped,
  transposed kernel (the same sums: SAME padding is symmetric for an odd
  kernel), which TensorFlow's CPU Conv2D runs faster than its
  Conv2DBackpropInput on small frames; the kernel's gradient is
  Conv2DBackpropFilter as usual.
  """
  kh, kw, _, _ = kernel.shape
  h, w = x.shape[1], x.shape[2]
  if (tuple(strides) != (1, 1) or kh % 2 == 0 or kw % 2 == 0 or
      kh * kw == 1 or h is None or w is None or
      h * w > MAX_FLIPPED_GRAD_PIXELS):
    return tf.nn.conv2d(x, kernel, [1, *strides, 1], 'SAME')

  @tf.custom_gradient
  def conv(x, kernel):
    def grad(dy):
      flipped = tf.transpose(tf.reverse(kernel, [0, 1]), [0, 1, 3, 2])
      dx = tf.nn.conv2d(dy, flipped, 1, 'SAME')
      dk = tf.raw_ops.Conv2DBackpropFilter(
          input=x, filter_sizes=tf.shape(kernel), out_backprop=dy,
          strides=[1, 1, 1, 1], padding='SAME')
      return dx, dk
    return tf.nn.conv2d(x, kernel, 1, 'SAME'), grad

  return conv(x, kernel)


def _time_shift(x: tf.Tensor, offset: int) -> tf.Tensor:
  """y[:, i] = x[:, i + offset] where 0 <= i + offset < T, else 0."""
  if offset == 0:
    return x
  t = tf.shape(x)[1]
  n = tf.minimum(abs(offset), t)  # |offset| >= T: all zeros.
  if offset > 0:
    y = tf.pad(tf.slice(x, [0, n, 0, 0, 0], [-1, t - n, -1, -1, -1]),
               [[0, 0], [0, n], [0, 0], [0, 0], [0, 0]])
  else:
    y = tf.pad(tf.slice(x, [0, 0, 0, 0, 0], [-1, t - n, -1, -1, -1]),
               [[0, 0], [n, 0], [0, 0], [0, 0], [0, 0]])
  y.set_shape(x.shape)
  return y


def shift_and_sum_taps(z: tf.Tensor, offsets: Sequence[int]) -> tf.Tensor:
  """sum_k z_k[:, i + offsets[k]] (zero outside the clip), z_k = tap k's channels.

  `z` is [B, T, H, W, K * F], tap k's outputs in channels [k * F, (k + 1) *
  F) (as `conv3d_as_2d` computes them); the result is [B, T, H, W, F]. The
  gradient is written out (`tf.custom_gradient`): tap k's gradient is the
  output's gradient shifted back by its offset, and the K of them are
  concatenated along channels, one pass; the automatic gradient of the
  channel slices was a zero-padded copy of K * F channels per tap, summed
  (the issue 16 profile: `Pad` was 11 % of the step's op time).
  """
  k_taps = len(offsets)
  f = z.shape[-1] // k_taps

  @tf.custom_gradient
  def forward(z):
    taps = tf.split(z, k_taps, axis=-1)
    y = tf.add_n([_time_shift(tap, o) for tap, o in zip(taps, offsets)])

    def grad(dy):
      return tf.concat([_time_shift(dy, -o) for o in offsets], axis=-1)

    return y, grad

  y = forward(z)
  y.set_shape([*z.shape[:-1], f])
  return y


def conv3d_implementation(kernel_size: Sequence[int], temporal_dilation: int,
                          frame_pixels: Optional[int] = None,
                          policy: Optional[kernel_policy.KernelPolicy] = None
                          ) -> str:
  """Which implementation `Conv3D` computes this kernel with.

  'stock' (`tf_keras.layers.Conv3D`'s own convolution, `tf.nn.convolution`:
  TensorFlow's Conv3D op, with SpaceToBatchND for a temporal dilation),
  'as_2d' (`conv3d_as_2d`, fast path 'assemblenet.conv3d_as_2d') or
  'time_phases' (`conv3d_native` of the time phases folded into the batch,
  fast path 'assemblenet.conv3d_time_phases'). The rule below was measured
  on CPUs; a fast path runs only where `policy` (default
  `kernel_policy.current()`) takes it, else the stock op:

  Where TensorFlow's oneDNN CPU kernels are on (`policy.onednn`), a kernel
  of more than one tap is TensorFlow's Conv3D op, a temporally dilated one
  (odd kt) on frames of more than `MAX_IM2COL_PIXELS` pixels the time
  phases; 1x1x1 kernels and dilated ones on small frames `conv3d_as_2d`.
  Without oneDNN (Eigen's CPU kernels, or 'fast' on another device) every
  kernel is `conv3d_as_2d`. Measured (2 shared Zen 5 cores, AVX-512, oneDNN
  on; fwd + both gradients, interleaved, medians of 3 x 7-15 rounds; shapes
  of the published network at 2 clips x 16 x 112^2, [H x W x C -> F]),
  native / `conv3d_as_2d` time:
  3x3x3: 7^2 x 152: 0.82-0.87; 14^2 x 54: 0.88-0.89; 28^2 x 27: 0.79-0.81;
  (4^2 x 432: 0.93). 3x1x1: 56^2 x 24: 0.55-0.64; 28^2 x 27: 0.64-0.71;
  14^2 x 54: 0.89-0.91; 7^2 x 152: 1.01-1.06 (one layer; kept native for
  one rule). 1x3x3 stride 2: 112^2 .. 14^2: 0.98-1.04; 7^2 x 432: 0.84-0.91.
  1x1x1 (the matmul): stride 1: 1.1-2.0 (432 -> 2048 at 4^2: 0.85-0.92,
  one layer); stride 2: 0.90-1.14: kept in `conv3d_as_2d`. Temporally
  dilated, phases folded into the batch (2 runs x 11 rounds): 3x3x3 d 4,
  7^2 x 152: 0.76-0.77; d 2, 14^2 x 54: 0.84-0.85; 3x1x1 d 4, 28^2 x 27:
  0.74; 3x3x3 d 2, 4^2 x 432: 0.98-1.01 (the small-frame matmul, kept).
  TensorFlow's own dilated forms were slower (SpaceToBatchND / Conv3D with
  dilations: 3x3x3 d 2, 4^2: 1.27-1.40 / 1.81-1.95; d 4, 7^2 .. 28^2:
  0.77-1.13 / 0.86-1.74), and TFLite cannot take a 5-D SpaceToBatchND.
  Without oneDNN (Eigen, AVX2) `conv3d_as_2d` was the faster everywhere
  (the whole training step 1.5x; its docstring).

  Args:
    kernel_size: (kt, kh, kw).
    temporal_dilation: the dilation along time.
    frame_pixels: H * W of the input frames, None if unknown.
    policy: the kernel policy; None: `kernel_policy.current()`.
  """
  policy = kernel_policy.current() if policy is None else policy
  kt, kh, kw = kernel_size
  if not policy.onednn or kt * kh * kw == 1:
    choice = 'as_2d'
  elif temporal_dilation == 1 or kt == 1:
    choice = 'stock'
  elif (kt % 2 == 1 and frame_pixels is not None and
        frame_pixels > MAX_IM2COL_PIXELS):
    choice = 'time_phases'
  else:
    choice = 'as_2d'
  if choice != 'stock' and not policy.takes(_CONV3D_FAST_PATHS[choice]):
    return 'stock'
  return choice


_CONV3D_FAST_PATHS = {'as_2d': 'assemblenet.conv3d_as_2d',
                      'time_phases': 'assemblenet.conv3d_time_phases'}


def conv3d_native(inputs: tf.Tensor, kernel: tf.Tensor, strides=(1, 1),
                  temporal_dilation: int = 1) -> tf.Tensor:
  """`conv3d_as_2d`'s convolution as TensorFlow's Conv3D op.

  A temporal dilation d is computed as an undilated Conv3D of the clip's d
  time phases (frames i, i + d, i + 2d, ...) folded into the batch (what
  SpaceToBatchND does, as 5-D reshapes and transposes, which TFLite has);
  for an odd kt the SAME padding of the phases is the dilated SAME padding
  (zeros outside the clip; a frame count not divisible by d is zero-padded
  at the end and the padding sliced off).

  Args:
    inputs: [B, T, H, W, C] (B and T may be dynamic).
    kernel: [kt, kh, kw, C, F]; kt odd if `temporal_dilation` > 1.
    strides: (sh, sw), the spatial strides.
    temporal_dilation: d, the dilation along time.

  Returns:
    [B, T, ceil(H / sh), ceil(W / sw), F], the inputs' dtype.
  """
  kt = kernel.shape[0]
  d = temporal_dilation
  conv_strides = [1, 1, *strides, 1]
  if d == 1 or kt == 1:
    return tf.nn.conv3d(inputs, kernel, conv_strides, 'SAME')
  if kt % 2 == 0:
    raise ValueError(f'conv3d_native: a temporal dilation ({d}) needs an '
                     f'odd temporal kernel size; got {kt}.')
  b, t, h, w, c = _dims(inputs)
  x = inputs
  if not (isinstance(t, int) and t % d == 0):
    x = tf.pad(x, [[0, 0], [0, (-t) % d], [0, 0], [0, 0], [0, 0]])
  n = (t + (-t) % d) // d  # Frames per phase.
  x = tf.reshape(x, [b, n, d, h * w, c])
  x = tf.reshape(tf.transpose(x, [0, 2, 1, 3, 4]), [b * d, n, h, w, c])
  y = tf.nn.conv3d(x, kernel, conv_strides, 'SAME')
  _, _, oh, ow, f = _dims(y)
  y = tf.reshape(y, [b, d, n, oh * ow, f])
  y = tf.reshape(tf.transpose(y, [0, 2, 1, 3, 4]), [b, n * d, oh, ow, f])
  if not (isinstance(t, int) and t % d == 0):
    y = tf.slice(y, [0, 0, 0, 0, 0], [-1, t, -1, -1, -1])
  return y


class Conv3D(tf_keras.layers.Conv3D):
  """`tf_keras.layers.Conv3D`, with the CPU fast paths of the kernel policy.

  The same layer (variables, config, outputs to float32 rounding). For
  padding 'same', channels last, temporal stride 1 and no spatial dilation
  (as `conv3d_same_padding` builds it) the convolution is the one
  `conv3d_implementation` picks when the layer is called (traced): the
  stock op (`tf_keras.layers.Conv3D`'s own), or where the kernel policy
  takes them (`core.kernel_policy`: on CPUs) `conv3d_as_2d` (2-D
  convolutions and matmuls, whose gradients are much faster than Eigen's
  Conv3D's on CPU, and TFLite builtins: no 5-D SpaceToBatchND for a temporal
  dilation) or the time phases of a dilated kernel (`conv3d_native`).
  Other settings use `tf_keras.layers.Conv3D`'s convolution.
  """

  def convolution_op(self, inputs, kernel):
    d = self.dilation_rate[0]
    if (self.padding != 'same' or self.strides[0] != 1 or
        tuple(self.dilation_rate[1:]) != (1, 1) or
        self.data_format != 'channels_last' or self.groups != 1):
      if d == 1:
        return super().convolution_op(inputs, kernel)
      raise ValueError(
          f'{self.name}: temporal dilation {d} is computed for padding '
          f"'same', temporal stride 1, no spatial dilation, channels_last; "
          f'got padding {self.padding!r}, strides {self.strides}, dilation '
          f'{self.dilation_rate}, {self.data_format}.')
    h, w = inputs.shape[2], inputs.shape[3]
    choice = conv3d_implementation(
        self.kernel_size, d, h * w if h is not None and w is not None else None)
    if choice == 'stock':
      return super().convolution_op(inputs, kernel)
    if choice == 'time_phases':
      y = conv3d_native(inputs, kernel, self.strides[1:], d)
    else:
      y = conv3d_as_2d(inputs, kernel, self.strides[1:], d)
    y.set_shape(self.compute_output_shape(inputs.shape))
    return y


def conv3d_same_padding(filters: int,
                        kernel_size,
                        strides: int = 1,
                        temporal_dilation: int = 1,
                        do_2d_conv: bool = False,
                        kernel_initializer=None,
                        kernel_regularizer=None,
                        name: Optional[str] = None) -> tf_keras.layers.Conv3D:
  """A bias-free 'same'-padded Conv3D, as the original `conv3d_same_padding`.

  Args:
    filters: output channels.
    kernel_size: int k means [1, k, k] when `do_2d_conv` else [k, k, k]; a
      3-list is used as is ([time, height, width]).
    strides: spatial stride (the temporal stride is always 1).
    temporal_dilation: dilation along time only.
    do_2d_conv: see `kernel_size`.
    kernel_initializer: default variance scaling (scale 1, fan_in, truncated
      normal), as TF1's `tf.variance_scaling_initializer()`.
    kernel_regularizer: optional regularizer of the kernel.
    name: layer name.

  Returns:
    A `Conv3D` (`tf_keras.layers.Conv3D` computed by the faster of two
    implementations, whose temporal dilation TFLite can take) mapping [B, T, H, W, C] to [B, T, ceil(H / s), ceil(W / s),
    filters].
  """
  if isinstance(kernel_size, int):
    kernel_size = ([1, kernel_size, kernel_size] if do_2d_conv else
                   [kernel_size] * 3)
  return Conv3D(
      filters=filters,
      kernel_size=list(kernel_size),
      strides=[1, strides, strides],
      padding='same',
      dilation_rate=[temporal_dilation, 1, 1],
      use_bias=False,
      kernel_initializer=(kernel_initializer or
                          tf_keras.initializers.VarianceScaling()),
      kernel_regularizer=kernel_regularizer,
      name=name)


class BatchNormRelu(tf_keras.layers.Layer):
  """Batch normalization (channels last), then an optional ReLU.

  `init_zero` initializes gamma to 0 (the last BN of a residual branch, so a
  block starts as its shortcut). `momentum` is the original's `bn_decay`.
  """

  def __init__(self, relu: bool = True, init_zero: bool = False,
               bn_decay: float = BATCH_NORM_DECAY,
               bn_epsilon: float = BATCH_NORM_EPSILON,
               use_sync_bn: bool = False, **kwargs):
    super().__init__(**kwargs)
    self._relu = relu
    self._init_zero = init_zero
    self._bn_decay = bn_decay
    self._bn_epsilon = bn_epsilon
    self._use_sync_bn = use_sync_bn
    self._bn = BatchNormalization(
        axis=-1, momentum=bn_decay, epsilon=bn_epsilon,
        gamma_initializer='zeros' if init_zero else 'ones',
        synchronized=use_sync_bn, name='bn')

  def call(self, inputs, training=None):
    x = self._bn(inputs, training=training)
    return tf.nn.relu(x) if self._relu else x

  def get_config(self):
    config = super().get_config()
    config.update(relu=self._relu, init_zero=self._init_zero,
                  bn_decay=self._bn_decay, bn_epsilon=self._bn_epsilon,
                  use_sync_bn=self._use_sync_bn)
    return config


def _diff_kernel(taps: Sequence[float], axis: str) -> np.ndarray:
  """A [kh, kw, 1, 1] conv2d kernel holding `taps` along x or y."""
  taps = np.asarray(taps, np.float32)
  shape = (1, len(taps), 1, 1) if axis == 'x' else (len(taps), 1, 1, 1)
  return taps.reshape(shape)


class RepresentationFlow(tf_keras.layers.Layer):
  """TV-L1-style optical flow of RGB frames ("representation flow").

  As the original `rep_flow` with bottleneck 1: the frames are averaged over
  channels to grey, rescaled to 0..255 with the min/max of each clip (a
  constant clip is left as is instead of dividing by zero), and the flow of each pair (t, t+1) is computed with
  `num_iter` iterations of the TV-L1 scheme with theta=0.3, lambda=0.15,
  tau=0.25, the image-gradient kernel [-0.5, 0, 0.5] and the
  divergence/forward-gradient kernels [-1, 1]. The last flow is repeated so
  the output keeps T frames. Positive x flow means motion to the right,
  positive y flow motion down. Always computed in float32.

  The original rescales with the min/max of the whole input *batch*, so a
  clip's flow depends on the other clips it is batched with, and on how a
  batch is split over replicas or grouped at serving time. Per clip is the
  default here; `rescale_per_batch=True` restores the original.

  Kernels and hyper-parameters are variables, trainable only when asked
  (`train_feature_grad`: image gradient; `train_divergence`: divergence;
  `train_flow_grad`: flow forward gradient; `train_hyper`: theta, lambda,
  tau); by default none is, and the layer has no trainable parameter.

  Input: [B, T, H, W, C] (T >= 2). Output: float32 [B, T, H, W, 2] (x, y).
  """

  def __init__(self, num_iter: int = 20, train_feature_grad: bool = False,
               train_divergence: bool = False, train_flow_grad: bool = False,
               train_hyper: bool = False, rescale_per_batch: bool = False,
               **kwargs):
    kwargs.setdefault('dtype', 'float32')
    super().__init__(**kwargs)
    if num_iter < 1:
      raise ValueError(f'rep_flow num_iter must be >= 1; got {num_iter}.')
    self._num_iter = num_iter
    self._train_feature_grad = train_feature_grad
    self._train_divergence = train_divergence
    self._train_flow_grad = train_flow_grad
    self._train_hyper = train_hyper
    self._rescale_per_batch = rescale_per_batch
    self._compiled = None

  def build(self, input_shape):
    self._check_frames(input_shape[1])

    def const(name, value, trainable):
      value = np.asarray(value, np.float32)
      return self.add_weight(
          name=name, shape=value.shape,
          initializer=tf_keras.initializers.Constant(value),
          trainable=trainable, dtype=tf.float32)

    img_grad = [-0.5, 0.0, 0.5]
    f_grad = [-1.0, 1.0]
    self.img_grad_x = const('img_grad_x', _diff_kernel(img_grad, 'x'),
                            self._train_feature_grad)
    self.img_grad_y = const('img_grad_y', _diff_kernel(img_grad, 'y'),
                            self._train_feature_grad)
    self.f_grad_x = const('f_grad_x', _diff_kernel(f_grad, 'x'),
                          self._train_divergence)
    self.f_grad_y = const('f_grad_y', _diff_kernel(f_grad, 'y'),
                          self._train_divergence)
    self.f_grad_x2 = const('f_grad_x2', _diff_kernel(f_grad, 'x'),
                           self._train_flow_grad)
    self.f_grad_y2 = const('f_grad_y2', _diff_kernel(f_grad, 'y'),
                           self._train_flow_grad)
    self.theta = const('theta', 0.3, self._train_hyper)
    self.lambda_ = const('lambda', 0.15, self._train_hyper)
    self.tau = const('tau', 0.25, self._train_hyper)
    super().build(input_shape)

  @staticmethod
  def _conv(x, kernel):
    return tf.nn.conv2d(x, kernel, [1, 1, 1, 1], 'SAME')

  def _divergence(self, p1, p2):
    p1 = tf.pad(p1[:, :, :-1, :], [[0, 0], [0, 0], [1, 0], [0, 0]])
    p2 = tf.pad(p2[:, :-1, :, :], [[0, 0], [1, 0], [0, 0], [0, 0]])
    return self._conv(p1, self.f_grad_x) + self._conv(p2, self.f_grad_y)

  def _check_frames(self, num_frames: Optional[int]) -> None:
    if num_frames is not None and num_frames < 2:
      raise ValueError(
          f'{self.name}: a clip of {num_frames} frames; the flow stem computes '
          'optical flow between consecutive frames and needs at least 2 '
          'frames (every temporal stride is 1: any count >= 2 works).')

  def call(self, inputs):
    # A clip's frame count may be unknown when the model is built (None T:
    # evaluation clips longer than training clips): checked per call, in the
    # graph when it is known only at run time.
    self._check_frames(inputs.shape[1])
    if inputs.shape[1] is None:
      check = tf.debugging.assert_greater_equal(
          tf.shape(inputs)[1], 2, message=(
              f'{self.name}: the flow stem needs clips of at least 2 frames '
              '(optical flow between consecutive frames); frames (dimension '
              '1) of the input'))
      with tf.control_dependencies([check]):
        inputs = tf.identity(inputs)
    # One XLA program: the 20 iterations are ~40 small element-wise ops and
    # 6 tiny convolutions each, which TensorFlow runs one kernel at a time
    # (measured: 3.0 s vs 0.2 s for 2 x 16 x 112^2 on 2 CPU cores).
    if self._compiled is None:
      self._compiled = tf.function(self._flow, jit_compile=True)
    return self._compiled(inputs)

  def _flow(self, inputs):
    x = tf.cast(inputs, tf.float32)
    static = x.shape
    shape = tf.shape(x)
    b, t, h, w = shape[0], shape[1], shape[2], shape[3]
    grey = tf.reduce_mean(x, axis=-1)  # [B, T, H, W]
    axes = None if self._rescale_per_batch else [1, 2, 3]
    mx = tf.reduce_max(grey, axis=axes, keepdims=True)
    mn = tf.reduce_min(grey, axis=axes, keepdims=True)
    scale = tf.math.divide_no_nan(tf.constant(255.0), mx - mn)
    grey = tf.where(mx > mn, (grey - mn) * scale, grey)
    img1 = tf.reshape(grey[:, :-1], [-1, h, w, 1])
    img2 = tf.reshape(grey[:, 1:], [-1, h, w, 1])

    theta = tf.abs(self.theta) + 1e-12
    l_t = self.lambda_ * theta
    taut = self.tau / theta

    grad2_x = self._conv(img2, self.img_grad_x)
    grad2_y = self._conv(img2, self.img_grad_y)
    grad = grad2_x ** 2 + grad2_y ** 2 + 1e-12
    zeros = tf.zeros_like(img1)
    u1, u2 = zeros, zeros
    p11 = p12 = p21 = p22 = zeros
    rho_c = img2 - img1  # the original's img2 - grad.u - img1 with u = 0.
    for _ in range(self._num_iter):
      rho = rho_c + grad2_x * u1 + grad2_y * u2 + 1e-12
      mask1 = rho < -l_t * grad
      mask2 = rho > l_t * grad
      mask3 = tf.logical_and(
          tf.logical_and(tf.logical_not(mask1), tf.logical_not(mask2)),
          grad > 1e-12)
      step = tf.where(mask1, l_t, tf.where(mask2, -l_t, zeros))
      step = tf.where(mask3, -rho / grad, step)
      v1 = step * grad2_x + u1
      v2 = step * grad2_y + u2
      u1 = v1 + theta * self._divergence(p11, p12)
      u2 = v2 + theta * self._divergence(p21, p22)
      u1x, u1y = self._conv(u1, self.f_grad_x2), self._conv(u1, self.f_grad_y2)
      u2x, u2y = self._conv(u2, self.f_grad_x2), self._conv(u2, self.f_grad_y2)
      n1 = 1.0 + taut * tf.sqrt(u1x ** 2 + u1y ** 2 + 1e-12)
      n2 = 1.0 + taut * tf.sqrt(u2x ** 2 + u2y ** 2 + 1e-12)
      p11 = (p11 + taut * u1x) / n1
      p12 = (p12 + taut * u1y) / n1
      p21 = (p21 + taut * u2x) / n2
      p22 = (p22 + taut * u2y) / n2
    flow = tf.concat([u1, u2], axis=-1)
    flow = tf.reshape(flow, [b, t - 1, h, w, 2])
    flow = tf.concat([flow, flow[:, -1:]], axis=1)
    return tf.ensure_shape(flow, static[:-1].concatenate([2]))

  def get_config(self):
    config = super().get_config()
    config.update(num_iter=self._num_iter,
                  train_feature_grad=self._train_feature_grad,
                  train_divergence=self._train_divergence,
                  train_flow_grad=self._train_flow_grad,
                  train_hyper=self._train_hyper,
                  rescale_per_batch=self._rescale_per_batch)
    return config


def original_fusion_width(shapes: Sequence[Sequence[Optional[int]]]) -> int:
  """The original's 5-D fusion target: `shape[3]` (width), not channels.

  The original loops over its inputs with `if C > lg: lg = shape[3]`, where
  `shape[3]` of an NTHWC tensor is the width, and then uses `lg` as the
  channel count of its 1x1x1 projections (and as "the largest channel count"
  that needs no projection).
  """
  lg = 0
  for s in shapes:
    if s[-1] > lg:
      lg = s[3]
  return lg


class PeerAttentionFusion(tf_keras.layers.Layer):
  """Fuses a node's inputs: edge weights, attention, 1x1x1 projections, sum.

  Called on `inputs + peers` (a list): the node's `num_inputs` input tensors
  [B, T, H_i, W_i, C_i] (same B and T), then, for attention 'peer', the
  tensors of every node of a lower level [B, T, H_k, W_k, C_k] (the peers),
  or their spatial means [B, T, C_k] (`SpatialMean`; the backbone computes
  each node's mean once and shares it among the fusions: one gradient per
  node instead of one full-size gradient per fusion).

  1. Every input is max-pooled spatially ([1, r, r], stride r, 'same',
     r = (H_i + 1) // H_min) to the smallest input size.
  2. With several inputs, input i is multiplied by sigmoid(w_i); the logits
     w are `agg_weights` ([num_inputs] float32): trainable (truncated normal,
     stddev 0.01; the one-shot connectivity search) when no `edge_weights`
     are given, else fixed (non-trainable) at logit(edge_weights). A single
     input passes through unweighted.
  3. Attention (per frame, per connection), when `attention_mode` is set:
     'self' uses the connection's own spatial mean [B, T, C_i]; 'peer' a
     softmax-weighted (`attention_<i>_peer_weights`, trainable, truncated
     normal 0.01) sum of candidate vectors, one per peer: the peer's spatial
     mean through a dense layer (`peer_dense_<k>`, with bias, normal(0.01)
     init) to the largest channel count among the peers. Either vector goes
     through a dense layer (`attention_<i>`) to C_i, a sigmoid, and scales the
     connection's channels.
  4. Inputs with equal channel counts are summed; each group whose channel
     count is not the fusion width is projected by a bias-free 1x1x1 conv
     (`project_<c>`) to the fusion width; the groups are summed.

  The fusion width is the largest input channel count (the intended
  behaviour). With `fusion_width_as_channels`, it is what the original's 5-D
  code computes (`original_fusion_width`: an input's *width*), which
  reproduces the original's variable shapes (its parameter count then
  depends on the input resolution). The original also projected only the
  first input of a multi-input group whose channel count was not the fusion
  width (dropping the others); this layer always sums a group before
  projecting it, in both modes (same variables, so the same shapes).

  The original applied self-attention to single-input nodes even with
  attention off; here attention is applied only when `attention_mode` is set.

  Output: [B, T, H_min, W_min, fusion width].

  With `recompute_grad`, training calls run through `recompute_grad` (module
  function): the backward pass keeps only the inputs (other nodes' outputs,
  kept anyway) and recomputes the pooled, weighted and attended copies of
  every input.
  """

  def __init__(self, num_inputs: int, attention_mode: Optional[str] = None,
               edge_weights: Optional[Sequence[float]] = None,
               fusion_width_as_channels: bool = False,
               kernel_regularizer=None, recompute_grad: bool = False,
               **kwargs):
    super().__init__(**kwargs)
    self._recompute_grad = recompute_grad
    if attention_mode not in ATTENTION_MODES:
      raise ValueError(f'attention_mode must be one of {ATTENTION_MODES}; '
                       f'got {attention_mode!r}.')
    if edge_weights is not None and len(edge_weights) != num_inputs:
      raise ValueError(f'{self.name}: {len(edge_weights)} edge weights for '
                       f'{num_inputs} inputs.')
    self._num_inputs = num_inputs
    self._attention_mode = attention_mode
    self._edge_weights = (None if edge_weights is None else
                          [float(w) for w in edge_weights])
    self._fusion_width_as_channels = fusion_width_as_channels
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)

  def build(self, input_shape):
    shapes = [tf.TensorShape(s).as_list() for s in input_shape]
    in_shapes, peer_shapes = shapes[:self._num_inputs], shapes[self._num_inputs:]
    for k, s in enumerate(peer_shapes):
      if len(s) not in (3, 5):
        raise ValueError(f'{self.name}: peer {k} must be a node output [B, T, '
                         f'H, W, C] or its spatial mean [B, T, C]; got shape '
                         f'{s}.')
    for s in in_shapes:
      if None in s[2:]:
        raise ValueError(f'{self.name}: fusion needs static height, width and '
                         f'channels; got input shape {s}.')
    self._sm_h = min(s[2] for s in in_shapes)
    self._sm_w = min(s[3] for s in in_shapes)
    self._ratios = []
    for s in in_shapes:
      if s[2] != self._sm_h or s[3] != self._sm_w:
        self._ratios.append((s[2] + 1) // self._sm_h)
      else:
        self._ratios.append(1)
    if self._fusion_width_as_channels:
      self._width = original_fusion_width(in_shapes)
    else:
      self._width = max(s[-1] for s in in_shapes)
    self._channels = [s[-1] for s in in_shapes]
    groups: Dict[int, List[int]] = {}
    for i, c in enumerate(self._channels):
      groups.setdefault(c, []).append(i)
    # (channels, input indices) pairs in first-seen order; a tuple so Keras
    # does not track it.
    self._groups = tuple((c, tuple(ids)) for c, ids in groups.items())

    if self._num_inputs > 1:
      if self._edge_weights is None:
        init = tf_keras.initializers.TruncatedNormal(mean=0.0, stddev=0.01)
        trainable = True
      else:
        w = np.asarray(self._edge_weights, np.float64)
        init = tf_keras.initializers.Constant(
            (-np.log(1.0 / w - 1.0)).astype(np.float32))
        trainable = False
      self.agg_weights = self.add_weight(
          name='agg_weights', shape=[self._num_inputs], initializer=init,
          trainable=trainable, dtype=tf.float32)

    dense = lambda units, name: tf_keras.layers.Dense(  # pylint: disable=g-long-lambda
        units, kernel_initializer=tf_keras.initializers.RandomNormal(
            stddev=0.01), kernel_regularizer=self._kernel_regularizer,
        name=name)
    self._peer_dense = []
    self._peer_weights = []
    self._attention_dense = []
    if self._attention_mode == 'peer':
      if not peer_shapes:
        raise ValueError(f'{self.name}: attention "peer" needs peer inputs.')
      peer_width = max(s[-1] for s in peer_shapes)
      self._peer_dense = [dense(peer_width, f'peer_dense_{k}')
                          for k in range(len(peer_shapes))]
      for i in range(self._num_inputs):
        self._peer_weights.append(self.add_weight(
            name=f'attention_{i}_peer_weights', shape=[len(peer_shapes)],
            initializer=tf_keras.initializers.TruncatedNormal(stddev=0.01),
            trainable=True, dtype=tf.float32))
    if self._attention_mode:
      for i, c in enumerate(self._channels):
        self._attention_dense.append(dense(c, f'attention_{i}'))
    projections = {}
    for c, _ in self._groups:
      if c != self._width:
        conv = conv3d_same_padding(
            self._width, 1, kernel_regularizer=self._kernel_regularizer,
            name=f'project_{c}')
        projections[str(c)] = conv
    self._projections = projections
    super().build(input_shape)

  def call(self, inputs, training=None):
    inputs = list(inputs)
    if self._recompute_grad and training is True:
      return recompute_grad(lambda *xs: self._fuse(list(xs)))(*inputs)
    return self._fuse(inputs)

  def _fuse(self, inputs):
    xs = list(inputs[:self._num_inputs])
    peers = list(inputs[self._num_inputs:])
    dtype = xs[0].dtype
    candidates = None
    if self._attention_mode == 'peer':
      candidates = [d(p if p.shape.rank == 3 else tf.reduce_mean(p, [2, 3]))
                    for d, p in zip(self._peer_dense, peers)]
    if self._num_inputs > 1:
      weights = tf.cast(tf.math.sigmoid(self.agg_weights), dtype)
    for i, x in enumerate(xs):
      r = self._ratios[i]
      if r > 1:
        x = spatial_max_pool(x, r)
      if self._num_inputs > 1:
        x = weights[i] * x
      if self._attention_mode:
        if self._attention_mode == 'peer':
          mix = tf.cast(tf.nn.softmax(self._peer_weights[i]), candidates[0].dtype)
          vec = tf.add_n([mix[k] * v for k, v in enumerate(candidates)])
        else:
          vec = tf.reduce_mean(x, axis=[2, 3])
        attn = tf.math.sigmoid(self._attention_dense[i](vec))
        x = x * tf.cast(attn[:, :, tf.newaxis, tf.newaxis, :], x.dtype)
      xs[i] = x
    outs = []
    for c, members in self._groups:
      y = xs[members[0]] if len(members) == 1 else tf.add_n(
          [xs[j] for j in members])
      if c != self._width:
        y = self._projections[str(c)](y)
      outs.append(y)
    return outs[0] if len(outs) == 1 else tf.add_n(outs)

  @property
  def fusion_width(self) -> int:
    return self._width

  def get_config(self):
    config = super().get_config()
    config.update(
        num_inputs=self._num_inputs, attention_mode=self._attention_mode,
        edge_weights=self._edge_weights,
        fusion_width_as_channels=self._fusion_width_as_channels,
        recompute_grad=self._recompute_grad,
        kernel_regularizer=tf_keras.regularizers.serialize(
            self._kernel_regularizer) if self._kernel_regularizer else None)
    return config


class InvertedBottleneckBlock3D(tf_keras.layers.Layer):
  """The lite inverted-bottleneck 3-D residual block.

  filters [f_a, f_b, f_out]: 1x1x1 conv to f_a (BN, ReLU); then, when
  strided, a [1, 3, 3] conv with the spatial stride to f_b (BN, ReLU) and a
  [3, 1, 1] temporal conv (dilated by `temporal_dilation`; truncated-normal
  init with stddev sqrt(2 / (3 * f_b)) when dilated, as the original) to f_b
  (BN, ReLU), else a [3, 3, 3] conv dilated in time to f_b (BN, ReLU); then a
  1x1x1 conv to f_out with BN (gamma initialized to 0, no ReLU). The shortcut
  is the input, or (`use_projection`) a strided 1x1x1 conv to f_out with BN.
  Output: ReLU(branch + shortcut), [B, T, ceil(H / s), ceil(W / s), f_out].
  """

  def __init__(self, filters: Sequence[int], strides: int = 1,
               use_projection: bool = False, temporal_dilation: int = 1,
               bn_decay: float = BATCH_NORM_DECAY,
               bn_epsilon: float = BATCH_NORM_EPSILON,
               use_sync_bn: bool = False, kernel_regularizer=None, **kwargs):
    super().__init__(**kwargs)
    self._filters = list(filters)
    self._strides = strides
    self._use_projection = use_projection
    self._temporal_dilation = temporal_dilation
    self._bn_decay = bn_decay
    self._bn_epsilon = bn_epsilon
    self._use_sync_bn = use_sync_bn
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    reg = self._kernel_regularizer
    bn = lambda name, **kw: BatchNormRelu(  # pylint: disable=g-long-lambda
        bn_decay=bn_decay, bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn,
        name=name, **kw)
    f_a, f_b, f_out = self._filters
    self._layers = []
    if use_projection:
      self._shortcut = conv3d_same_padding(f_out, 1, strides,
                                           kernel_regularizer=reg,
                                           name='shortcut')
      self._shortcut_bn = bn('bn_shortcut', relu=False)
    elif strides != 1:
      raise ValueError(f'{self.name}: strides > 1 needs use_projection.')
    self._layers += [conv3d_same_padding(f_a, 1, kernel_regularizer=reg,
                                         name='conv_a'), bn('bn_a')]
    if strides > 1:
      temporal_init = None
      if temporal_dilation > 1:
        temporal_init = tf_keras.initializers.TruncatedNormal(
            stddev=math.sqrt(2.0 / (3 * f_b)))
      self._layers += [
          conv3d_same_padding(f_b, 3, strides, do_2d_conv=True,
                              kernel_regularizer=reg, name='conv_b'),
          bn('bn_b'),
          conv3d_same_padding(f_b, [3, 1, 1], 1, temporal_dilation,
                              kernel_initializer=temporal_init,
                              kernel_regularizer=reg, name='conv_b_temporal'),
          bn('bn_b_temporal')]
    else:
      self._layers += [
          conv3d_same_padding(f_b, [3, 3, 3], 1, temporal_dilation,
                              kernel_regularizer=reg, name='conv_b'),
          bn('bn_b')]
    self._layers += [conv3d_same_padding(f_out, 1, kernel_regularizer=reg,
                                         name='conv_c'),
                     bn('bn_c', relu=False, init_zero=True)]

  def call(self, inputs, training=None):
    shortcut = inputs
    if self._use_projection:
      shortcut = self._shortcut_bn(self._shortcut(inputs), training=training)
    x = inputs
    for layer in self._layers:
      if isinstance(layer, BatchNormRelu):
        x = layer(x, training=training)
      else:
        x = layer(x)
    return tf.nn.relu(x + shortcut)

  def get_config(self):
    config = super().get_config()
    config.update(
        filters=self._filters, strides=self._strides,
        use_projection=self._use_projection,
        temporal_dilation=self._temporal_dilation, bn_decay=self._bn_decay,
        bn_epsilon=self._bn_epsilon, use_sync_bn=self._use_sync_bn,
        kernel_regularizer=tf_keras.regularizers.serialize(
            self._kernel_regularizer) if self._kernel_regularizer else None)
    return config


class BlockGroup(tf_keras.layers.Layer):
  """`num_blocks` inverted-bottleneck blocks; the first projects and strides.

  With `recompute_grad`, training calls run through `recompute_grad` (module
  function): only the group's input is kept for the backward pass and its
  activations are recomputed there (gradient checkpointing; less memory,
  about one more forward pass of compute). The recomputation runs the batch
  norms in training mode again (same batch statistics, same gradients) but
  does not update their moving statistics: they take one update per step,
  as without recomputation.
  """

  def __init__(self, filters: Sequence[int], num_blocks: int, strides: int,
               temporal_dilation: int = 1, recompute_grad: bool = False,
               bn_decay: float = BATCH_NORM_DECAY,
               bn_epsilon: float = BATCH_NORM_EPSILON,
               use_sync_bn: bool = False, kernel_regularizer=None, **kwargs):
    super().__init__(**kwargs)
    self._config = dict(
        filters=list(filters), num_blocks=num_blocks, strides=strides,
        temporal_dilation=temporal_dilation, recompute_grad=recompute_grad,
        bn_decay=bn_decay, bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    self._blocks = [
        InvertedBottleneckBlock3D(
            filters, strides=strides if b == 0 else 1,
            use_projection=(b == 0), temporal_dilation=temporal_dilation,
            bn_decay=bn_decay, bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn,
            kernel_regularizer=self._kernel_regularizer, name=f'block_{b}')
        for b in range(num_blocks)]

  def _forward(self, x, training):
    for block in self._blocks:
      x = block(x, training=training)
    return x

  def call(self, inputs, training=None):
    if self._config['recompute_grad'] and training is True:
      fn = recompute_grad(lambda x: self._forward(x, True))
      return fn(inputs)
    return self._forward(inputs, training)

  def get_config(self):
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = (
        tf_keras.regularizers.serialize(self._kernel_regularizer)
        if self._kernel_regularizer else None)
    return config
