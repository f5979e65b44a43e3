"""SavedModel export of the YT8M model: `serving_default` (serialized records)
and `serve_features` (dequantized features); docs/yt8m.md#export-and-inference.
"""
from typing import Dict, Mapping

import tensorflow as tf, tf_keras

from official.core import config_definitions
from official.core import export_base
from official_ext.core.input import graph_checks
from official_ext.yt8m import dataloader

SIGNATURES = ('serving_default', 'serve_features')


class YT8MExportModule(export_base.ExportModule):
  """Export module of `official_ext.yt8m.task.YT8MTask` models."""

  def __init__(self, params: config_definitions.ExperimentConfig,
               model: tf_keras.Model, top_k: int = 20):
    """Args: params: the experiment; model: restored model; top_k: k."""
    super().__init__(params, model)
    data = params.task.validation_data.replace(
        segment_labels=False, include_video_id=True, num_sample_frames=None)
    self._decoder = dataloader.make_decoder(data)
    self._video_level = data.record_type == 'video'
    self._parser = dataloader.Parser(data).parse_fn(is_training=False)
    self._num_features = sum(int(s) for s in data.feature_sizes)
    self._num_classes = int(data.num_classes)
    self._max_frames = int(data.max_frames)
    self._top_k = min(int(top_k), self._num_classes)
    self._feature_desc = ' + '.join(
        f'{n} {s}' for n, s in zip(data.feature_names, data.feature_sizes))

  def _predict(self, features: tf.Tensor,
               num_frames: tf.Tensor) -> Dict[str, tf.Tensor]:
    probabilities = tf.cast(
        self.model(features, num_frames=num_frames,
                   training=False)['predictions'], tf.float32)
    scores, classes = tf.math.top_k(probabilities, k=self._top_k)
    return {'top_k_classes': tf.cast(classes, tf.int32),
            'top_k_scores': scores,
            'probabilities': probabilities}

  def serve(self, examples: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Serialized SequenceExamples [batch] -> predictions (see module doc)."""

    def parse(args):
      serialized, index = args
      # Parse errors then name the request input: "example id: input
      # `examples`[3]".
      source = tf.strings.join(
          ['input `examples`[', tf.strings.as_string(index), ']'])
      example = self._parser(self._decoder.decode(serialized, source=source))
      return {k: example[k] for k in ('video_matrix', 'num_frames',
                                       'video_ids')}

    indices = tf.range(tf.shape(examples)[0])
    frames = [] if self._video_level else [self._max_frames]
    parsed = tf.map_fn(
        parse, (examples, indices),
        fn_output_signature={
            'video_matrix': tf.TensorSpec([*frames, self._num_features],
                                          tf.float32),
            'num_frames': tf.TensorSpec([], tf.int32),
            'video_ids': tf.TensorSpec([], tf.string),
        })
    outputs = self._predict(parsed['video_matrix'], parsed['num_frames'])
    outputs['video_id'] = parsed['video_ids']
    return outputs

  def serve_features(self, features: tf.Tensor,
                     num_frames: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Dequantized features [batch, frames, F], num_frames [batch]."""
    features = tf.convert_to_tensor(features, tf.float32)
    num_frames = tf.cast(num_frames, tf.int32)
    name = 'serve_features: input'
    shape = lambda: tf.shape(features)
    rows = lambda: tf.range(tf.shape(num_frames)[0])

    def finite():
      n = tf.minimum(num_frames, shape()[1])
      valid = tf.sequence_mask(n, shape()[1])[:, :, tf.newaxis]
      bad = tf.logical_and(valid, tf.logical_not(tf.math.is_finite(features)))

      def message():
        first = tf.where(bad)[0]
        return graph_checks.join(
            'serve_features: row ', first[0], ' of input `features` has a '
            'NaN or infinite value (', tf.gather_nd(features, first),
            ') in frame ', first[1], ', a valid frame (num_frames[', first[0],
            '] = ', tf.gather(num_frames, first[0]), ').')
      return graph_checks.require(tf.logical_not(tf.reduce_any(bad)), message)

    checks = graph_checks.in_order([
        lambda: graph_checks.require_shape(
            features, f'{name} `features`', [None, None, self._num_features],
            f'[batch, frames, {self._num_features}] ({self._feature_desc})'),
        lambda: graph_checks.require_shape(
            num_frames, f'{name} `num_frames`', [None], '[batch]'),
        lambda: graph_checks.require(
            tf.equal(tf.size(num_frames), shape()[0]),
            lambda: graph_checks.join(
                f'{name} `num_frames` has ', tf.size(num_frames), ' entries '
                f'but input `features` has ', shape()[0], ' rows (batch); '
                'expected one valid frame count per row.')),
        lambda: graph_checks.require(
            tf.logical_or(tf.equal(shape()[0], 0), shape()[1] > 0),
            lambda: graph_checks.join(
                f'{name} `features` has 0 frames (dimension 1); expected at '
                'least one.')),
        lambda: graph_checks.require(
            tf.reduce_all(num_frames >= 1), lambda: graph_checks.join(
                'serve_features: row ',
                graph_checks.first_where(rows(), num_frames < 1),
                ' of input `num_frames` is ',
                graph_checks.first_where(num_frames, num_frames < 1),
                '; expected >= 1 (a video has at least one frame).')),
        finite,
    ])
    with tf.control_dependencies(checks):
      features = tf.identity(features)
      num_frames = tf.minimum(num_frames, tf.shape(features)[1])
    return self._predict(features, num_frames)

  def serve_video_features(self, features: tf.Tensor
                           ) -> Dict[str, tf.Tensor]:
    """Video-level features float32 [batch, F] -> predictions."""
    features = tf.convert_to_tensor(features, tf.float32)
    bad = lambda: tf.logical_not(tf.math.is_finite(features))

    def message():
      first = tf.where(bad())[0]
      return graph_checks.join(
          'serve_features: row ', first[0], ' of input `features` has a NaN '
          'or infinite value (', tf.gather_nd(features, first), ') in column ',
          first[1], '.')

    checks = graph_checks.in_order([
        lambda: graph_checks.require_shape(
            features, 'serve_features: input `features`',
            [None, self._num_features],
            f'[batch, {self._num_features}] ({self._feature_desc})'),
        lambda: graph_checks.require(
            tf.logical_not(tf.reduce_any(bad())), message),
    ])
    with tf.control_dependencies(checks):
      features = tf.identity(features)
    return self._predict(features, None)

  def tflite_function(self) -> tf.types.experimental.ConcreteFunction:
    """`serve_features` traced for one video at fixed shapes, for TFLite."""
    if self._video_level:
      return tf.function(self.serve_video_features).get_concrete_function(
          tf.TensorSpec([1, self._num_features], tf.float32, name='features'))
    return tf.function(self.serve_features).get_concrete_function(
        tf.TensorSpec([1, self._max_frames, self._num_features], tf.float32,
                      name='features'),
        tf.TensorSpec([1], tf.int32, name='num_frames'))

  def get_inference_signatures(
      self, function_keys: Mapping[str, str]) -> Dict[str, object]:
    signatures = {}
    for key, name in function_keys.items():
      if key == 'serving_default':
        signatures[name] = tf.function(self.serve).get_concrete_function(
            tf.TensorSpec([None], tf.string, name='examples'))
      elif key == 'serve_features' and self._video_level:
        signatures[name] = tf.function(
            self.serve_video_features).get_concrete_function(
                tf.TensorSpec([None, self._num_features], tf.float32,
                              name='features'))
      elif key == 'serve_features':
        signatures[name] = tf.function(
            self.serve_features).get_concrete_function(
                tf.TensorSpec([None, None, self._num_features], tf.float32,
                              name='features'),
                tf.TensorSpec([None], tf.int32, name='num_frames'))
      else:
        raise ValueError(f'Unknown YT8M signature {key!r}; expected one of '
                         f'{SIGNATURES}.')
    return signatures
