"""The five original readout types (continuous, binary, multinomial,
multilabel, event_rate), registered in `readout_types` when `configs` imports
this module (docs/readout.md#readout-types)."""
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.readout import metrics
from official_ext.readout import readout_types


def _mean_squared_error(spec, p, y):
  del spec
  return tf.reduce_mean(tf.math.squared_difference(p, y), axis=-1)


def _sigmoid_cross_entropy(spec, p, y):
  del spec
  return tf.reduce_mean(
      tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=p), axis=-1)


def _softmax_cross_entropy(spec, p, y):
  labels = tf.cast(tf.round(y[:, 0]), tf.int32)
  return tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=tf.clip_by_value(labels, 0, spec.dim - 1), logits=p)


def _poisson_nll(spec, p, y):
  del spec
  return tf.reduce_mean(tf.exp(p) - y * p, axis=-1)


def _continuous_metrics(spec, p, y, w):
  del spec
  return {'r2': metrics.r2_score(p, y, w), 'pearson': metrics.pearson(p, y, w)}


def _not_label(values, dims):
  del dims
  return tf.logical_or(values < 0, values > 1)


_LABEL_CHECK = (('a label outside [0, 1]', _not_label),)
# torch_brain scores classification by plain (micro) accuracy.
_TORCH_BRAIN_CLASS_METRICS = ('accuracy', 'balanced_accuracy', 'macro_f1')


readout_types.register_readout_type(readout_types.ReadoutType(
    name='continuous', loss=_mean_squared_error, metrics=('r2', 'pearson'),
    compute_metrics=_continuous_metrics, dim_doc='the number of channels'))

readout_types.register_readout_type(readout_types.ReadoutType(
    name='binary', loss=_sigmoid_cross_entropy,
    metrics=('balanced_accuracy', 'macro_f1'),
    compute_metrics=lambda spec, p, y, w: metrics.binary_scores(
        p, y, w, accuracy=True),
    dim_doc='the number of independent labels',
    invalid_targets=_LABEL_CHECK,
    torch_brain_metrics=_TORCH_BRAIN_CLASS_METRICS))

readout_types.register_readout_type(readout_types.ReadoutType(
    name='multinomial', loss=_softmax_cross_entropy,
    metrics=('balanced_accuracy', 'macro_f1'),
    compute_metrics=lambda spec, p, y, w: metrics.multinomial_scores(
        p, y, w, accuracy=True),
    target_size=lambda spec: 1, target_doc='1 class id', min_dim=2,
    dim_doc='the number of classes',
    invalid_targets=(('a class id that is not an integer in [0, dim)',
                      lambda values, dims: tf.logical_or(
                          tf.logical_or(values < 0, values >= dims),
                          tf.not_equal(values, tf.round(values)))),),
    torch_brain_metrics=_TORCH_BRAIN_CLASS_METRICS))

readout_types.register_readout_type(readout_types.ReadoutType(
    name='multilabel', loss=_sigmoid_cross_entropy, metrics=('map',),
    compute_metrics=lambda spec, p, y, w: {
        'map': metrics.mean_average_precision(p, y, w)},
    dim_doc='the number of labels', invalid_targets=_LABEL_CHECK))

readout_types.register_readout_type(readout_types.ReadoutType(
    name='event_rate', loss=_poisson_nll, metrics=('poisson_d2',),
    compute_metrics=lambda spec, p, y, w: {
        'poisson_d2': metrics.poisson_d2(p, y, w)},
    dim_doc='the number of event channels',
    invalid_targets=(('a negative count (event_rate targets are counts >= 0)',
                      lambda values, dims: values < 0),)))
