"""The 3-D convolutions of AssembleNet++lite, and their CPU fast paths.

Every convolution of the model is a `Conv3D` (`conv3d_same_padding`):
`tf_keras.layers.Conv3D` whose convolution is, where the kernel policy takes
a fast path (`core.kernels.kernel_policy`: on CPUs), computed in 2-D ops
(`conv3d_as_2d`: 2-D convolutions, matmuls and time shifts) or, for a
temporally dilated kernel, as TensorFlow's Conv3D over the clip's time phases
(`conv3d_native`); `conv3d_implementation` says which. Elsewhere, and under
`runtime.kernel_policy: stock`, it is tf_keras' own. Tensors are 5-D,
`[batch, time, height, width, channels]`.
"""
from typing import Any, List, Optional, Sequence

import tensorflow as tf, tf_keras

from official_ext.core.kernels import kernel_policy


def dims(x: tf.Tensor) -> List[Any]:
  """x's dimensions: python ints where static, scalar tensors elsewhere."""
  dynamic = tf.shape(x)
  return [d if d is not None else dynamic[i] for i, d in enumerate(x.shape)]



# Frames of at most this many pixels are convolved as one matmul over all
# taps (`conv3d_as_2d`): forward and backward of a 3 x 3 SAME conv of 32
# frames with Eigen's CPU kernels (AVX2), matmul / Conv2D time:
# 4 x 4 x 1296 -> 432: 0.6-0.7; 7 x 7 x 456 -> 152: 0.9-1.1; 14 x 14:
# 1.5-2.0; 28 x 28: 2.1-2.4.
MAX_IM2COL_PIXELS = 16
# Frames of at most this many pixels take the input gradient of a stride-1
# 2-D convolution as a forward convolution (`conv2d_same`):
# Conv2D(flipped) / Conv2DBackpropInput time with Eigen's CPU kernels
# (AVX2), 3 x 3 kernel, 32 frames: 7 x 7 x 456 -> 152: 0.72;
# 14 x 14 x 162 -> 54: 0.96; 28 x 28 x 81 -> 27: 1.42.
MAX_FLIPPED_GRAD_PIXELS = 64



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
  convolution's and the matmul's (with them the training step's backward
  pass costs about six forward passes); these ops are also all TFLite
  builtins (no 5-D SpaceToBatchND for the dilation). A CPU fast path of the
  kernel policy ('assemblenet.conv3d_as_2d'); with oneDNN's CPU kernels on,
  `Conv3D` takes it only for 1x1x1 kernels and dilated ones on small frames
  (`conv3d_implementation`, where the timings are).

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
  b, t, h, w, _ = dims(inputs)
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
    _, oh, ow, _ = dims(z)
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
  channel slices is a zero-padded copy of K * F channels per tap, summed
  (those `Pad` ops took about 11 % of a training step's op time on CPU).
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
  fast path 'assemblenet.conv3d_time_phases'). The rule below comes from
  timings on CPUs; a fast path runs only where `policy` (default
  `kernel_policy.current()`) takes it, else the stock op:

  Where TensorFlow's oneDNN CPU kernels are on (`policy.onednn`), a kernel
  of more than one tap is TensorFlow's Conv3D op, a temporally dilated one
  (odd kt) on frames of more than `MAX_IM2COL_PIXELS` pixels the time
  phases; 1x1x1 kernels and dilated ones on small frames `conv3d_as_2d`.
  Without oneDNN (Eigen's CPU kernels, or 'fast' on another device) every
  kernel is `conv3d_as_2d`. Native / `conv3d_as_2d` time with oneDNN on
  (AVX-512; forward and both gradients; the shapes of the published network
  at 2 clips x 16 x 112^2, [H x W x C -> F]):
  3x3x3: 7^2 x 152: 0.82-0.87; 14^2 x 54: 0.88-0.89; 28^2 x 27: 0.79-0.81;
  (4^2 x 432: 0.93). 3x1x1: 56^2 x 24: 0.55-0.64; 28^2 x 27: 0.64-0.71;
  14^2 x 54: 0.89-0.91; 7^2 x 152: 1.01-1.06 (one layer; kept native for
  one rule). 1x3x3 stride 2: 112^2 .. 14^2: 0.98-1.04; 7^2 x 432: 0.84-0.91.
  1x1x1 (the matmul): stride 1: 1.1-2.0 (432 -> 2048 at 4^2: 0.85-0.92,
  one layer); stride 2: 0.90-1.14: kept in `conv3d_as_2d`. Temporally
  dilated, phases folded into the batch: 3x3x3 d 4,
  7^2 x 152: 0.76-0.77; d 2, 14^2 x 54: 0.84-0.85; 3x1x1 d 4, 28^2 x 27:
  0.74; 3x3x3 d 2, 4^2 x 432: 0.98-1.01 (the small-frame matmul, kept).
  TensorFlow's own dilated forms are slower (SpaceToBatchND / Conv3D with
  dilations: 3x3x3 d 2, 4^2: 1.27-1.40 / 1.81-1.95; d 4, 7^2 .. 28^2:
  0.77-1.13 / 0.86-1.74), and TFLite cannot take a 5-D SpaceToBatchND.
  Without oneDNN (Eigen, AVX2) `conv3d_as_2d` is the faster everywhere
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
  b, t, h, w, c = dims(inputs)
  x = inputs
  if not (isinstance(t, int) and t % d == 0):
    x = tf.pad(x, [[0, 0], [0, (-t) % d], [0, 0], [0, 0], [0, 0]])
  n = (t + (-t) % d) // d  # Frames per phase.
  x = tf.reshape(x, [b, n, d, h * w, c])
  x = tf.reshape(tf.transpose(x, [0, 2, 1, 3, 4]), [b * d, n, h, w, c])
  y = tf.nn.conv3d(x, kernel, conv_strides, 'SAME')
  _, _, oh, ow, f = dims(y)
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
  takes them (`core.kernels.kernel_policy`: on CPUs) `conv3d_as_2d` (2-D
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
    A `Conv3D` (`tf_keras.layers.Conv3D`, with the kernel policy's fast
    paths) mapping [B, T, H, W, C] to [B, T, ceil(H / s), ceil(W / s),
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
