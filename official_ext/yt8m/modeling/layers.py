"""Layers of the YouTube-8M models: context gating and masked frame pooling."""
from typing import Any, Mapping, Optional

import tensorflow as tf, tf_keras

from official.modeling import tf_utils
from official_ext.core import kernel_policy


def frame_mask(num_frames: Optional[tf.Tensor], max_frames: tf.Tensor,
               dtype: tf.DType) -> Optional[tf.Tensor]:
  """Returns a [batch, max_frames, 1] mask of valid frames, or None.

  Args:
    num_frames: int [batch] true frame counts, or None (all frames valid).
    max_frames: int scalar, the padded frame axis length.
    dtype: dtype of the returned mask.
  """
  if num_frames is None:
    return None
  mask = tf.sequence_mask(tf.reshape(num_frames, [-1]), max_frames, dtype=dtype)
  return mask[:, :, tf.newaxis]


def _large_negative(dtype: tf.DType) -> float:
  return float(dtype.min) if dtype in (tf.float16, tf.bfloat16) else -1e9


def pool_frames(frames: tf.Tensor, method: str,
                mask: Optional[tf.Tensor] = None) -> tf.Tensor:
  """Pools `frames` [batch, frames, features] over the valid frames.

  Args:
    frames: [batch, max_frames, features] per-frame activations.
    method: 'average' (mean of valid frames), 'max' (max of valid frames) or
      'swap' (self-weighted average: sum x|x| / sum |x| per feature, as in
      Model Garden's `frame_swap`).
    mask: optional [batch, max_frames, 1] 0/1 mask of valid frames, same dtype
      as `frames`. None: all frames are valid. Invalid frames are left out by
      selection (`tf.where`), so whatever they hold (NaN, Inf) is ignored.

  Returns:
    [batch, features].
  """
  valid = None if mask is None else mask > 0
  if method == 'average':
    if mask is None:
      return tf.reduce_mean(frames, axis=1)
    return tf.math.divide_no_nan(
        tf.reduce_sum(tf.where(valid, frames, tf.zeros_like(frames)), axis=1),
        tf.reduce_sum(mask, axis=1))
  if method == 'max':
    if mask is not None:
      frames = tf.where(valid, frames,
                        tf.cast(_large_negative(frames.dtype), frames.dtype))
    return tf.reduce_max(frames, axis=1)
  if method == 'swap':
    if mask is not None:
      frames = tf.where(valid, frames, tf.zeros_like(frames))
    weights = tf.abs(frames)
    return tf.math.divide_no_nan(
        tf.reduce_sum(weights * frames, axis=1), tf.reduce_sum(weights, axis=1))
  raise ValueError(
      f'Unknown pooling method {method!r}; expected one of average, max, swap '
      '(or none, handled by the model).')


def _frame_weights(x: tf.Tensor, mask: Optional[tf.Tensor]) -> tf.Tensor:
  """[batch, frames] float32 weights of `x`'s frames: `mask`, or all ones."""
  if mask is None:
    return tf.ones(tf.shape(x)[:2], tf.float32)
  return tf.cast(tf.reshape(mask, tf.shape(x)[:2]), tf.float32)


def _column_sums(weights: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
  """sum_n weights[n] x[n, :] as one matrix-vector product.

  The one spelling of a column sum over frame rows here (moments, the
  batch-norm and bias gradients).

  Args:
    weights: [batch, frames] float32.
    x: [batch, frames, K] float32.

  Returns:
    [K]. XLA runs this as a matrix-vector product at memory speed; its
    reduction of `x` over the batch and frame axes ran at a third of that on
    this project's CPU (issue 16: 3.0 vs 8.9 ms at [32, 300, 3000]).
  """
  k = x.shape[-1] if x.shape[-1] is not None else tf.shape(x)[-1]
  return tf.matmul(tf.reshape(weights, [1, -1]), tf.reshape(x, [-1, k]))[0]


def masked_moments(x: tf.Tensor, mask: Optional[tf.Tensor] = None):
  """Mean and (biased) variance over the valid frames of `x`, per feature.

  What `tf_keras.layers.BatchNormalization(x, mask=mask)` computes in
  training (`tf.nn.weighted_moments` with the mask as frequency weights), in
  another summation order.

  Args:
    x: float32 [batch, frames, K].
    mask: optional [batch, frames] (bool or 0/1) valid frames; None: all.

  Returns:
    (mean [K], variance [K], count): count is the number of valid frames, a
    float32 scalar; with none, the mean and variance are 0.
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

  pooled[b] = mean over the valid frames t of relu(gamma * (x[b, t] - mean)
  / sqrt(variance + epsilon) + beta), with the batch's masked moments
  (`masked_moments`): what `BatchNormalization(training=True, mask=mask)`,
  `relu` and `pool_frames(..., 'average', mask)` compute one after the other,
  to float32 rounding, with no normalized or activated frames kept for the
  backward pass (XLA still writes the two per-video reductions' operands).
  The gradient is written out: with yhat the normalized frames, r = [gamma
  yhat + beta > 0] and g[b] = d pooled[b] / (valid frames of b),

    d beta = sum_b g[b] c[b],  d gamma = sum_b g[b] s[b],
    d x[b, t] = m[b, t] gamma / sqrt(variance + epsilon) *
                (r[b, t] g[b] - (d beta + yhat[b, t] d gamma) / n),

  where c[b] = sum_t m r and s[b] = sum_t m r yhat are reduced in the
  forward pass (they also give the pooled value, gamma s + beta c), m is the
  mask and n the number of valid frames: one pass over the frames in the
  backward pass, where the automatic gradient took five (issue 16).

  Args:
    x: float32 [batch, frames, K] pre-normalization activations.
    gamma: float32 [K] batch-norm scale.
    beta: float32 [K] batch-norm offset.
    epsilon: batch-norm epsilon.
    mask: optional [batch, frames] valid frames (bool or 0/1); None: all.

  Returns:
    (pooled [batch, K], mean [K], variance [K], count): the moments and the
    number of valid frames, for the moving averages (no gradient).
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
  """Training-mode batch norm over every axis but the last, gradient written out.

  y = gamma * (x - mean) / sqrt(variance + epsilon) + beta for every row,
  with the moments of the valid rows (`masked_moments`), as
  `tf_keras.layers.BatchNormalization(training=True, mask=mask)`; with xhat
  the normalized rows, w the mask and n the number of valid rows, the
  gradient is d beta = sum dy, d gamma = sum dy xhat (over all rows) and

    d x = gamma / sqrt(variance + epsilon) * (dy - w (d beta + xhat d gamma) / n),

  its column sums matrix-vector products: XLA's reductions of the
  automatic gradient over the [batch x frames] rows ran at a third of memory
  speed on this project's CPU (issue 16).

  Args:
    x: float32 [..., C] (e.g. [batch, frames, C]).
    gamma: float32 [C] scale, or None (1).
    beta: float32 [C] offset, or None (0).
    epsilon: variance epsilon.
    mask: optional valid rows, shaped as x without its last axis (bool or
      0/1); None: all rows.

  Returns:
    (y shaped as x, mean [C], variance [C], count): the moments and the
    number of valid rows, for the moving averages (no gradient).
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
  """`tf_keras.layers.BatchNormalization` whose training call is
  `batch_norm_training` (same variables, values to float32 rounding, same
  moving-average updates: `update_moving_moments`).

  A CPU fast path of the kernel policy ('yt8m.batch_norm_gradient',
  `core.kernel_policy`), taken where the policy takes it for float32 inputs
  of rank >= 2 normalized over the last axis, with `training=True`, a
  trainable layer, no synchronization, renorm, virtual batch or adjustment;
  every other call is tf_keras' own.
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
  """x + bias over the last axis; the bias gradient (the column sums of the
  output gradient) as one matrix-vector product (see `batch_norm_training`).

  Args:
    x: float32 [..., C].
    bias: float32 [C].
  """
  @tf.custom_gradient
  def add(x, bias):
    def grad(dy):
      rows = tf.reshape(dy, [1, -1, bias.shape[0]])
      return dy, _column_sums(tf.ones_like(rows[:, :, 0]), rows)
    return x + bias, grad

  return add(x, bias)


class Dense(tf_keras.layers.Dense):
  """`tf_keras.layers.Dense` whose bias gradient over frames is `bias_add`'s
  (same variables and values): a CPU fast path of the kernel policy
  ('yt8m.bias_gradient', `core.kernel_policy`), taken where the policy takes
  it for float32 inputs of rank >= 3."""

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
  """Updates `norm`'s moving mean and variance as its training call does.

  moving <- moving - (moving - value) * (1 - momentum), as
  `BatchNormalization._assign_moving_average`; nothing when `count` (the
  number of frames the moments are over) is 0.
  """
  decay = 1.0 - norm.momentum
  for variable, value in ((norm.moving_mean, mean),
                          (norm.moving_variance, variance)):
    delta = (variable - tf.cast(value, variable.dtype)) * decay
    variable.assign_sub(tf.where(count > 0, delta, tf.zeros_like(delta)))


class ContextGate(tf_keras.layers.Layer):
  """Context gating (Miech et al., 2017): y = x * sigmoid(BN(W x + b)).

  The gate is linear -> (batch norm) -> sigmoid, as in the YouTube-8M
  starter code's `context_gating`; Model Garden 2.20 normalizes after the
  sigmoid instead, which lets the "gate" leave [0, 1].

  Input/output: [..., features]; the gate acts on the last axis. With
  `bottleneck_size >= 2` the gate is factorized as
  features -> bottleneck (relu6, batch norm) -> features.
  """

  def __init__(self,
               bottleneck_size: int = 0,
               use_batch_norm: bool = True,
               norm_momentum: float = 0.99,
               norm_epsilon: float = 1e-3,
               use_sync_bn: bool = False,
               kernel_regularizer: Optional[Any] = None,
               **kwargs):
    super().__init__(**kwargs)
    self._bottleneck_size = bottleneck_size
    self._use_batch_norm = use_batch_norm
    self._norm_momentum = norm_momentum
    self._norm_epsilon = norm_epsilon
    self._use_sync_bn = use_sync_bn
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)

  def _norm(self, name):
    return tf_keras.layers.BatchNormalization(
        momentum=self._norm_momentum, epsilon=self._norm_epsilon,
        synchronized=self._use_sync_bn, name=name)

  def build(self, input_shape):
    features = int(input_shape[-1])
    self._bottleneck = None
    if self._bottleneck_size >= 2:
      self._bottleneck = tf_keras.layers.Dense(
          self._bottleneck_size, activation='relu6',
          kernel_regularizer=self._kernel_regularizer, name='bottleneck')
      self._bottleneck_norm = (self._norm('bottleneck_norm')
                               if self._use_batch_norm else None)
    self._gates = tf_keras.layers.Dense(
        features, use_bias=not self._use_batch_norm,
        kernel_regularizer=self._kernel_regularizer, name='gates')
    self._gates_norm = self._norm('gates_norm') if self._use_batch_norm else None
    super().build(input_shape)

  def call(self, inputs, training=None):
    context = inputs
    if self._bottleneck is not None:
      context = self._bottleneck(context)
      if self._bottleneck_norm is not None:
        context = self._bottleneck_norm(context, training=training)
    gates = self._gates(context)
    if self._gates_norm is not None:
      gates = self._gates_norm(gates, training=training)
    return inputs * tf.sigmoid(gates)

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(
        bottleneck_size=self._bottleneck_size,
        use_batch_norm=self._use_batch_norm,
        norm_momentum=self._norm_momentum,
        norm_epsilon=self._norm_epsilon,
        use_sync_bn=self._use_sync_bn,
        kernel_regularizer=serialize_regularizer(self._kernel_regularizer))
    return config


class SeContextGate(tf_keras.layers.Layer):
  """SE context gating of NeXtVLAD: y = x * sigmoid(W2 relu(BN(W1 x))).

  Squeeze-and-excitation style gating (Lin et al., 2018, Fig. 4; the
  authors' `nextvlad.py`, github.com/linrongc/youtube-8m): a bottleneck
  `squeeze` [F, F // reduction] without bias, batch norm (`squeeze_bn`),
  ReLU, `excite` [F // reduction, F] without bias, sigmoid. 2F^2 / reduction
  weights against F^2 of `ContextGate`, whose bottleneck is ordered
  differently (dense with bias and relu6, then batch norm; batch norm on the
  gates).

  Input/output: [batch, features]; the gate acts on the last axis.
  """

  def __init__(self,
               reduction: int = 8,
               norm_momentum: float = 0.99,
               norm_epsilon: float = 1e-3,
               use_sync_bn: bool = False,
               kernel_regularizer: Optional[Any] = None,
               **kwargs):
    """Args: reduction r (bottleneck width features // r); batch norm
    momentum, epsilon and synchronization; the kernels' regularizer."""
    super().__init__(**kwargs)
    self._config = dict(reduction=reduction, norm_momentum=norm_momentum,
                        norm_epsilon=norm_epsilon, use_sync_bn=use_sync_bn)
    self._kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)

  def build(self, input_shape):
    features = int(input_shape[-1])
    bottleneck = features // self._config['reduction']
    if bottleneck < 1:
      raise ValueError(
          f'SeContextGate: {features} features // reduction '
          f'{self._config["reduction"]} leaves no bottleneck unit.')
    self._squeeze = tf_keras.layers.Dense(
        bottleneck, use_bias=False,
        kernel_initializer=variance_scaling_fan_in(),
        kernel_regularizer=self._kernel_regularizer, name='squeeze')
    self._squeeze_bn = tf_keras.layers.BatchNormalization(
        momentum=self._config['norm_momentum'],
        epsilon=self._config['norm_epsilon'],
        synchronized=self._config['use_sync_bn'], name='squeeze_bn')
    self._excite = tf_keras.layers.Dense(
        features, use_bias=False,
        kernel_initializer=variance_scaling_fan_in(),
        kernel_regularizer=self._kernel_regularizer, name='excite')
    super().build(input_shape)

  def call(self, inputs, training=None):
    gates = tf.nn.relu(self._squeeze_bn(self._squeeze(inputs),
                                        training=training))
    return inputs * tf.sigmoid(self._excite(gates))

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    config['kernel_regularizer'] = serialize_regularizer(
        self._kernel_regularizer)
    return config


def variance_scaling_fan_in() -> tf_keras.initializers.Initializer:
  """`slim.variance_scaling_initializer()` as the NeXtVLAD authors use it:
  truncated normal of variance 2 / fan_in."""
  return tf_keras.initializers.VarianceScaling(
      scale=2.0, mode='fan_in', distribution='truncated_normal')


def serialize_regularizer(regularizer) -> Optional[Mapping[str, Any]]:
  """A regularizer's get_config form for a layer config (None stays None)."""
  return (tf_keras.regularizers.serialize(regularizer)
          if regularizer is not None else None)


def get_activation(name: str):
  return tf_utils.get_activation(name)
