"""SavedModel export of the YT8M model (serving signatures).

Signatures:
* `serving_default(examples)`: a batch of serialized `tf.SequenceExample`
  strings in the dataset's own format, decoded and parsed by the same
  `dataloader.Decoder`/`Parser` as evaluation (first `max_frames` frames, no
  random sampling) -> `video_id` string [batch], `top_k_classes` int32
  [batch, k], `top_k_scores` float32 [batch, k], `probabilities` float32
  [batch, num_classes].
* `serve_features(features, num_frames)`: dequantized features float32
  [batch, frames, sum(feature_sizes)] and int32 [batch] valid frame counts ->
  `top_k_classes`, `top_k_scores`, `probabilities`.

Serving is deterministic, and `serve_features` fed the dequantized first
`max_frames` frames of a record returns what `serving_default` returns for
the serialized record.
"""
from typing import Dict, Mapping

import tensorflow as tf, tf_keras

from official.core import config_definitions
from official.core import export_base
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
    self._decoder = dataloader.Decoder(data)
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
    parsed = tf.map_fn(
        parse, (examples, indices),
        fn_output_signature={
            'video_matrix': tf.TensorSpec([self._max_frames,
                                           self._num_features], tf.float32),
            'num_frames': tf.TensorSpec([], tf.int32),
            'video_ids': tf.TensorSpec([], tf.string),
        })
    outputs = self._predict(parsed['video_matrix'], parsed['num_frames'])
    outputs['video_id'] = parsed['video_ids']
    return outputs

  def serve_features(self, features: tf.Tensor,
                     num_frames: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Dequantized features [batch, frames, F], num_frames [batch]."""
    width = tf.shape(features)[2]
    check = tf.debugging.assert_equal(
        width, self._num_features, message=(
            f'serve_features: input `features` has the wrong width (last '
            f'dimension); expected {self._num_features} '
            f'({self._feature_desc}).'))
    with tf.control_dependencies([check]):
      features = tf.identity(features)
    frames = tf.shape(features)[1]
    num_frames = tf.minimum(tf.cast(num_frames, tf.int32), frames)
    return self._predict(features, num_frames)

  def get_inference_signatures(
      self, function_keys: Mapping[str, str]) -> Dict[str, object]:
    signatures = {}
    for key, name in function_keys.items():
      if key == 'serving_default':
        signatures[name] = tf.function(self.serve).get_concrete_function(
            tf.TensorSpec([None], tf.string, name='examples'))
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
