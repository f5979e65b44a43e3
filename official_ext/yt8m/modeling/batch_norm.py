"""Training-mode batch norm and dense bias over [batch, frames, K] with
written-out gradients: YT8M's CPU fast paths (docs/yt8m.md#speed).
"""
from typing import Optional

import tensorflow as tf, tf_keras

from official_ext.core.kernels import kernel_policy


def _frame_weights(x: tf.Tensor, mask: Optional[tf.Tensor]) -> tf.Tensor:
  """[batch, frames] float32 weights of `x`'s frames: `mask`, or all ones."""
  if mask is None:
    return tf.ones(tf.shape(x)[:2], tf.float32)
  return tf.cast(tf.reshape(mask, tf.shape(x)[:2]), tf.float32)


def _column_sums(weights: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
  """sum_n weights[n] x[n, :] as one matrix-vector product: [K]."""
  k = x.shape[-1] if x.shape[-1] is not None else tf.shape(x)[-1]
  return tf.matmul(tf.reshape(weights, [1, -1]), tf.reshape(x, [-1, k]))[0]


def masked_moments(x: tf.Tensor, mask: Optional[tf.Tensor] = None):
  """(mean [K], biased variance [K], count) over the valid frames of `x`;
  0, 0 when no frame is valid.
  """
  w = _frame_weights(x, mask)
  count = tf.reduce_sum(w)
  mean = tf.math.divide_no_nan(_column_sums(w, x), count)
  # Two passes, as tf.nn.moments: the squared deviations from the mean.
  variance = tf.math.divide_no_nan(
      _column_sums(w, tf.math.squared_difference(x, mean)), count)
  return mean, variance, count


def batch_norm_relu_average_pool(x: tf.Tensor, gamma: tf.Tensor,
                                 beta: tf.Tensor, epsilon: float,
                                 mask: Optional[tf.Tensor] = None):
  """Training-mode batch norm, ReLU and the mean over the valid frames, fused.

  What `BatchNormalization(training=True, mask=mask)`, `relu` and
  `pool_frames(..., 'average', mask)` compute in turn, with a written-out
  gradient. Returns (pooled [batch, K], mean [K], variance [K], count).
  """
  w = _frame_weights(x, mask)
  mean, variance, count = masked_moments(tf.stop_gradient(x), mask)
  inv = tf.math.rsqrt(variance + epsilon)
  frames = tf.reduce_sum(w, axis=1, keepdims=True)  # [batch, 1]
  w3 = w[:, :, tf.newaxis]

  @tf.custom_gradient
  def fused(x, gamma, beta):
    yhat = (x - mean) * inv
    active = w3 * tf.cast(gamma * yhat + beta > 0, tf.float32)
    c = tf.reduce_sum(active, axis=1)  # [batch, K]
    s = tf.reduce_sum(active * yhat, axis=1)
    pooled = tf.math.divide_no_nan(gamma * s + beta * c, frames)

    def grad(d_pooled):
      g = tf.math.divide_no_nan(d_pooled, frames)  # [batch, K]
      d_beta = tf.reduce_sum(g * c, axis=0)
      d_gamma = tf.reduce_sum(g * s, axis=0)
      yhat = (x - mean) * inv
      relu = tf.cast(gamma * yhat + beta > 0, tf.float32)
      d_x = (w3 * (gamma * inv)) * (
          relu * g[:, tf.newaxis, :] -
          tf.math.divide_no_nan(d_beta + yhat * d_gamma, count))
      return d_x, d_gamma, d_beta

    return pooled, grad

  return fused(x, gamma, beta), mean, variance, count


def batch_norm_training(x: tf.Tensor, gamma: Optional[tf.Tensor],
                        beta: Optional[tf.Tensor], epsilon: float,
                        mask: Optional[tf.Tensor] = None):
  """Training-mode batch norm over every axis but the last, gradient written
  out; returns (y, mean, variance, count).
  """
  channels = x.shape[-1]
  rows = tf.reshape(x, [-1, channels])
  w = (tf.ones(tf.shape(rows)[:1], tf.float32) if mask is None else
       tf.cast(tf.reshape(mask, [-1]), tf.float32))
  mean, variance, count = masked_moments(
      tf.stop_gradient(rows)[tf.newaxis], w[tf.newaxis])
  inv = tf.math.rsqrt(variance + epsilon)
  scale = tf.ones([channels], tf.float32) if gamma is None else gamma
  offset = tf.zeros([channels], tf.float32) if beta is None else beta
  ones = tf.ones_like(w)[tf.newaxis]  # [1, rows]
  share = tf.math.divide_no_nan(w, count)[:, tf.newaxis]

  @tf.custom_gradient
  def normalize(rows, scale, offset):
    def grad(dy):
      yhat = (rows - mean) * inv
      d_offset = _column_sums(ones, dy[tf.newaxis])
      d_scale = _column_sums(ones, (dy * yhat)[tf.newaxis])
      d_rows = (scale * inv) * (dy - share * (d_offset + yhat * d_scale))
      return d_rows, d_scale, d_offset

    return (rows - mean) * (inv * scale) + offset, grad

  y = tf.reshape(normalize(rows, scale, offset), tf.shape(x))
  return y, mean, variance, count


class BatchNormalization(tf_keras.layers.BatchNormalization):
  """`tf_keras.layers.BatchNormalization` whose float32 training call is
  `batch_norm_training` where the kernel policy takes that path.
  """

  def _written_out(self, inputs, training) -> bool:
    rank = inputs.shape.rank
    axes = self.axis if isinstance(self.axis, (list, tuple)) else [self.axis]
    return (kernel_policy.current().takes('yt8m.batch_norm_gradient') and
            training is True and self.trainable and rank is not None and
            rank >= 2 and [a % rank for a in axes] == [rank - 1] and
            inputs.dtype == tf.float32 and self.compute_dtype == 'float32' and
            not self.synchronized and not self.renorm and
            self.virtual_batch_size is None and self.adjustment is None)

  def call(self, inputs, training=None, mask=None):
    if not self._written_out(inputs, training):
      return super().call(inputs, training=training, mask=mask)
    y, mean, variance, count = batch_norm_training(
        inputs, tf.convert_to_tensor(self.gamma) if self.scale else None,
        tf.convert_to_tensor(self.beta) if self.center else None,
        self.epsilon, mask)
    update_moving_moments(self, mean, variance, count)
    return y


def bias_add(x: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
  """x + bias over the last axis; the bias gradient one matrix-vector product."""
  @tf.custom_gradient
  def add(x, bias):
    def grad(dy):
      rows = tf.reshape(dy, [1, -1, bias.shape[0]])
      return dy, _column_sums(tf.ones_like(rows[:, :, 0]), rows)
    return x + bias, grad

  return add(x, bias)


class Dense(tf_keras.layers.Dense):
  """`tf_keras.layers.Dense` whose bias gradient over frames is `bias_add`'s
  where the kernel policy takes that path.
  """

  def call(self, inputs):
    if not (kernel_policy.current().takes('yt8m.bias_gradient') and
            self.use_bias and inputs.shape.rank is not None and
            inputs.shape.rank >= 3 and inputs.dtype == tf.float32 and
            self.compute_dtype == 'float32'):
      return super().call(inputs)
    y = tf.matmul(tf.reshape(inputs, [-1, inputs.shape[-1]]), self.kernel)
    y = bias_add(y, tf.convert_to_tensor(self.bias))
    if self.activation is not None:
      y = self.activation(y)
    out = tf.reshape(y, tf.concat([tf.shape(inputs)[:-1], [self.units]], 0))
    out.set_shape(inputs.shape[:-1].concatenate([self.units]))
    return out


def update_moving_moments(norm: tf_keras.layers.BatchNormalization,
                          mean: tf.Tensor, variance: tf.Tensor,
                          count: tf.Tensor) -> None:
  """Updates `norm`'s moving mean and variance as its training call does;
  nothing when `count` is 0.
  """
  decay = 1.0 - norm.momentum
  for variable, value in ((norm.moving_mean, mean),
                          (norm.moving_variance, variance)):
    delta = (variable - tf.cast(value, variable.dtype)) * decay
    variable.assign_sub(tf.where(count > 0, delta, tf.zeros_like(delta)))
