"""The `von_mises` readout type: angular targets, registered in
`readout_types` when `configs` imports this module (docs/readout.md)."""
import math

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.readout import readout_types

NAME = 'von_mises'
_MIN_KAPPA = 1e-6


def concentration(outputs: tf.Tensor) -> tf.Tensor:
  """kappa = ||(x, y)||, floored at 1e-6; float32 [..., 2] -> [...]."""
  squared = tf.reduce_sum(tf.square(outputs), axis=-1)
  return tf.sqrt(tf.maximum(squared, _MIN_KAPPA ** 2))


def negative_log_likelihood(spec, outputs: tf.Tensor,
                            targets: tf.Tensor) -> tf.Tensor:
  """Von Mises NLL of the angles `targets` [n, 1] (radians) under the head
  outputs `outputs` [n, 2] = (x, y); float32 -> [n]."""
  del spec
  theta = targets[:, 0]
  kappa = concentration(outputs)
  # kappa cos(theta - mu) = x cos(theta) + y sin(theta).
  kappa_cos = outputs[:, 0] * tf.cos(theta) + outputs[:, 1] * tf.sin(theta)
  log_i0 = tf.math.log(tf.math.bessel_i0e(kappa)) + kappa
  return -kappa_cos + math.log(2 * math.pi) + log_i0


def angular_difference(predictions: np.ndarray,
                       targets: np.ndarray) -> np.ndarray:
  """theta - mu wrapped to (-pi, pi]: predictions [n, 2], targets [n, 1]."""
  mu = np.arctan2(predictions[:, 1], predictions[:, 0])
  d = targets[:, 0] - mu
  return np.arctan2(np.sin(d), np.cos(d))


def angular_metrics(spec, predictions: np.ndarray, targets: np.ndarray,
                    weights: np.ndarray):
  """{'mean_cosine', 'angular_error_deg'}, weighted; NaN without a query."""
  del spec
  if weights.size == 0:
    return {'mean_cosine': float('nan'), 'angular_error_deg': float('nan')}
  d = angular_difference(predictions, targets)
  total = weights.sum()
  return {'mean_cosine': float(np.sum(weights * np.cos(d)) / total),
          'angular_error_deg': float(
              np.degrees(np.sum(weights * np.abs(d)) / total))}


def serve(spec, outputs: tf.Tensor) -> tf.Tensor:
  """(mu, kappa) [..., 2] of the head outputs (x, y) [..., 2]."""
  del spec
  mu = tf.atan2(outputs[..., 1], outputs[..., 0])
  kappa = tf.sqrt(tf.reduce_sum(tf.square(outputs), axis=-1))
  return tf.stack([mu, kappa], axis=-1)


readout_types.register_readout_type(readout_types.ReadoutType(
    name=NAME, loss=negative_log_likelihood,
    metrics=('mean_cosine', 'angular_error_deg'),
    compute_metrics=angular_metrics, target_size=lambda spec: 1,
    target_doc='1 angle in radians', min_dim=2, max_dim=2,
    dim_doc='the head outputs (x, y): mean direction atan2(y, x), '
            'concentration ||(x, y)||',
    serve=serve))
