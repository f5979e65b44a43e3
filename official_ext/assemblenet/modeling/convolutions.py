"""The 3-D convolutions of AssembleNet++lite (`Conv3D`, `conv3d_same_padding`)
and their CPU fast paths (`conv3d_as_2d`, `conv3d_native`'s time phases),
picked by `conv3d_implementation`
(docs/assemblenet.md#gradient-checkpointing-and-the-cpu-kernels). Tensors are
[batch, time, height, width, channels]."""
from typing import Any, List, Optional, Sequence

import tensorflow as tf, tf_keras

from official_ext.core.kernels import kernel_policy


def dims(x: tf.Tensor) -> List[Any]:
  """x's dimensions: python ints where static, scalar tensors elsewhere."""
  dynamic = tf.shape(x)
  return [d if d is not None else dynamic[i] for i, d in enumerate(x.shape)]


# Frames of at most this many pixels are convolved as one matmul over all
# taps (`conv3d_as_2d`), faster there than Conv2D with Eigen's CPU kernels.
MAX_IM2COL_PIXELS = 16
# Frames of at most this many pixels take the input gradient of a stride-1
# 2-D convolution as a forward convolution (`conv2d_same`).
MAX_FLIPPED_GRAD_PIXELS = 64


def conv3d_as_2d(inputs: tf.Tensor, kernel: tf.Tensor, strides=(1, 1),
                 temporal_dilation: int = 1) -> tf.Tensor:
  """A 'same'-padded 3-D convolution computed with 2-D ops (no Conv3D).

  `tf.nn.convolution(inputs, kernel, [1, sh, sw], 'SAME', dilations=[d, 1,
  1])` (temporal stride 1) as one 2-D convolution of every frame (a matmul
  for 1x1 at stride 1) with the kernel as [kh, kw, C, kt * F], each temporal
  tap's outputs then shifted in time by its offset (zero outside the clip)
  and summed; frames of at most `MAX_IM2COL_PIXELS` pixels are one matmul
  over every tap's shifted input. Equal to float32 rounding; its gradients
  are much faster than Eigen's Conv3D's on CPU, and its ops are TFLite
  builtins.

  Args:
    inputs: [B, T, H, W, C] (B and T may be dynamic).
    kernel: [kt, kh, kw, C, F].
    strides: (sh, sw), the spatial strides.
    temporal_dilation: d, the dilation along time.

  Returns:
    [B, T, ceil(H / sh), ceil(W / sw), F], the inputs' dtype."""
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
  """`tf.nn.conv2d(x, kernel, strides, 'SAME')`, channels last; at stride 1,
  for an odd kernel on frames of at most `MAX_FLIPPED_GRAD_PIXELS` pixels, the
  input's gradient is a forward convolution of the output's gradient with the
  flipped, transposed kernel (the same sums), faster than
  Conv2DBackpropInput on small frames on CPU."""
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
  """sum_k z_k[:, i + offsets[k]] (zero outside the clip), z_k = tap k's
  channels [k * F, (k + 1) * F) of `z` [B, T, H, W, K * F]; returns [B, T, H,
  W, F]. The gradient is written out: the output's gradient shifted back by
  each offset, concatenated along channels in one pass (the automatic
  gradient pads K * F channels per tap)."""
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

  'stock' (`tf_keras.layers.Conv3D`'s own: TensorFlow's Conv3D, with
  SpaceToBatchND for a temporal dilation), 'as_2d' (`conv3d_as_2d`, fast path
  'assemblenet.conv3d_as_2d') or 'time_phases' (`conv3d_native` of the time
  phases folded into the batch, 'assemblenet.conv3d_time_phases'), by a rule
  that follows timings on CPUs; a fast path only where `policy` (default
  `kernel_policy.current()`) takes it. With oneDNN's CPU kernels
  (`policy.onednn`): a kernel of more than one tap is the Conv3D op, a
  temporally dilated one (odd kt) on frames of more than `MAX_IM2COL_PIXELS`
  pixels the time phases, 1x1x1 kernels and dilated ones on small frames
  `conv3d_as_2d`. Without oneDNN every kernel is `conv3d_as_2d`.

  Args:
    kernel_size: (kt, kh, kw).
    temporal_dilation: the dilation along time.
    frame_pixels: H * W of the input frames, None if unknown.
    policy: the kernel policy; None: `kernel_policy.current()`."""
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
  """`conv3d_as_2d`'s convolution as TensorFlow's Conv3D op: a temporal
  dilation d as an undilated Conv3D of the clip's d time phases folded into
  the batch (5-D reshapes and transposes, which TFLite has, not
  SpaceToBatchND); a frame count not divisible by d is zero-padded at the end
  and the padding sliced off.

  Args:
    inputs: [B, T, H, W, C] (B and T may be dynamic).
    kernel: [kt, kh, kw, C, F]; kt odd if `temporal_dilation` > 1.
    strides: (sh, sw), the spatial strides.
    temporal_dilation: d, the dilation along time.

  Returns:
    [B, T, ceil(H / sh), ceil(W / sw), F], the inputs' dtype."""
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
  """`tf_keras.layers.Conv3D` (the same variables, config and outputs to
  float32 rounding) whose convolution, for padding 'same', channels last,
  temporal stride 1 and no spatial dilation, is the one
  `conv3d_implementation` picks when the layer is called."""

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
  """A bias-free 'same'-padded `Conv3D`, as the original `conv3d_same_padding`:
  [B, T, H, W, C] -> [B, T, ceil(H / s), ceil(W / s), filters].

  Args:
    filters: output channels.
    kernel_size: int k: [1, k, k] with `do_2d_conv`, else [k, k, k]; or a
      3-list [time, height, width].
    strides: spatial stride (the temporal stride is 1).
    temporal_dilation: dilation along time only.
    do_2d_conv: see `kernel_size`.
    kernel_initializer: default variance scaling (scale 1, fan_in, truncated
      normal), as TF1's `tf.variance_scaling_initializer()`.
    kernel_regularizer: optional regularizer of the kernel.
    name: layer name."""
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


class FixedPaddingConv3D(Conv3D):
  """`Conv3D` of a per-frame [1, k, k] kernel padded as the original's
  `conv2d_fixed_padding`: at spatial stride 1 'same'; at stride s > 1
  (built with padding 'valid') each frame is zero-padded by (k - 1) // 2
  before and k // 2 after in height and width, then convolved 'valid':
  [B, T, H, W, C] -> [B, T, ceil(H / s), ceil(W / s), filters]."""

  def call(self, inputs):
    if self.padding == 'valid' and max(self.strides[1:]) > 1:
      _, kh, kw = self.kernel_size
      inputs = tf.pad(inputs, [[0, 0], [0, 0],
                               [(kh - 1) // 2, kh // 2],
                               [(kw - 1) // 2, kw // 2], [0, 0]])
    return super().call(inputs)


def conv2d_fixed_padding(filters: int, kernel_size: int, strides: int = 1,
                         kernel_initializer=None, kernel_regularizer=None,
                         name: Optional[str] = None) -> FixedPaddingConv3D:
  """A bias-free per-frame k x k convolution as the original AssembleNet's
  `conv2d_fixed_padding` (explicit symmetric padding when strided, not
  'same'), variance scaling initializer by default."""
  return FixedPaddingConv3D(
      filters=filters,
      kernel_size=[1, kernel_size, kernel_size],
      strides=[1, strides, strides],
      padding='same' if strides == 1 else 'valid',
      use_bias=False,
      kernel_initializer=(kernel_initializer or
                          tf_keras.initializers.VarianceScaling()),
      kernel_regularizer=kernel_regularizer,
      name=name)
