"""SavedModel export of AssembleNet++lite video classifiers.

Signature `serving_default(frames)`: uint8 frames [batch, frames, height,
width, 3] -> `probabilities` float32 [batch, num_classes] (softmax, or sigmoid
for multi-label), with the evaluation preprocessing of
`dataloader.Parser.eval_views` (evenly spaced clips, resize, center/multi
crops, normalization) and the evaluation's averaging over a video's views.
"""
from typing import Dict, Mapping

import tensorflow as tf, tf_keras

from official.core import base_task
from official.core import config_definitions
from official.core import export_base
from official_ext.assemblenet import dataloader

SIGNATURES = ('serving_default',)


class AssembleNetExportModule(export_base.ExportModule):
  """Export module of `official_ext.assemblenet.task.AssembleNetTask`."""

  def __init__(self, params: config_definitions.ExperimentConfig,
               model: tf_keras.Model, task: base_task.Task):
    """Args: params: experiment; model: restored model; task: its task."""
    super().__init__(params, model)
    data = params.task.validation_data
    self._parser = dataloader.Parser(data)
    self._task = task
    self._num_frames, self._height, self._width, _ = data.feature_shape
    self._views = data.num_test_clips * data.num_test_crops

  def serve(self, frames: tf.Tensor) -> Dict[str, tf.Tensor]:
    """uint8 frames [batch, T, H, W, 3] -> {'probabilities': [batch, K]}."""
    images = tf.map_fn(
        lambda f: self._parser.eval_views(f, tf.constant('input `frames`')),
        frames,
        fn_output_signature=tf.TensorSpec(
            [self._views * self._num_frames, self._height, self._width, 3],
            tf.float32))
    images = tf.reshape(
        images, [-1, self._num_frames, self._height, self._width, 3])
    probabilities = self._task.inference_step({'image': images}, self.model)
    return {'probabilities': tf.cast(probabilities, tf.float32)}

  def get_inference_signatures(
      self, function_keys: Mapping[str, str]) -> Dict[str, object]:
    signatures = {}
    for key, name in function_keys.items():
      if key != 'serving_default':
        raise ValueError(f'Unknown AssembleNet signature {key!r}; expected '
                         f'one of {SIGNATURES}.')
      signatures[name] = tf.function(self.serve).get_concrete_function(
          tf.TensorSpec([None, None, None, None, 3], tf.uint8, name='frames'))
    return signatures
