"""Representation flow: TV-L1-style optical flow of RGB frames, as a layer
(the flow stem's input)."""
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf, tf_keras


def _diff_kernel(taps: Sequence[float], axis: str) -> np.ndarray:
  """A [kh, kw, 1, 1] conv2d kernel holding `taps` along x or y."""
  taps = np.asarray(taps, np.float32)
  shape = (1, len(taps), 1, 1) if axis == 'x' else (len(taps), 1, 1, 1)
  return taps.reshape(shape)


class RepresentationFlow(tf_keras.layers.Layer):
  """TV-L1-style optical flow of RGB frames ("representation flow"), as the
  original `rep_flow` with bottleneck 1: grey frames rescaled to 0..255 by each
  clip's min/max (`rescale_per_batch`: the batch's, as the original), flow of
  each pair (t, t+1) by `num_iter` TV-L1 iterations (theta 0.3, lambda 0.15,
  tau 0.25), the last flow repeated; positive x: motion right, positive y:
  down. Kernels and hyper-parameters train only when asked (`train_*`).

  Input: [B, T, H, W, C] (T >= 2). Output: float32 [B, T, H, W, 2] (x, y)."""

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
    # One XLA program: each iteration is many small element-wise ops and
    # tiny convolutions, which TensorFlow runs one kernel at a time.
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
