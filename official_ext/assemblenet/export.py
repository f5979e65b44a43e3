"""SavedModel export of AssembleNet++lite video classifiers.

Signature `serving_default(frames)`: uint8 frames [batch, frames, height,
width, 3] (any number of frames and any size) -> `probabilities` float32
[batch, num_classes] (softmax, or sigmoid for multi-label), with the
evaluation preprocessing of `dataloader.Parser.eval_views` (evenly spaced
clips, resize, center/multi crops, normalization) and the evaluation's
aggregation of a video's views (`task.eval_aggregation`). The clips the
model scores have the *validation* shape, `validation_data.feature_shape`
[T, H, W, 3], which may have more frames than training clips.

What cannot be scored is refused, naming `frames`: a shape other than
[batch, frames, height, width, 3] (InvalidArgumentError giving the shape;
TF Serving and concrete functions do not check a signature's rank), a clip
of 0 frames, 0 rows or 0 columns (the dimension), and, in-process, frames
that are not uint8 (TypeError): uint8 pixels cannot be NaN or infinite, and
float frames (0..1 or 0..255?) would be cast to uint8 whatever they hold.
"""
from typing import Dict, List, Mapping

import tensorflow as tf, tf_keras

from official.core import base_task
from official.core import config_definitions
from official.core import export_base
from official_ext.assemblenet import dataloader
from official_ext.core import graph_checks
from official_ext.core import kernel_policy

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
    """uint8 frames [batch, T, H, W, 3] -> {'probabilities': [batch, K]}.

    Refuses what it cannot score (see the module docstring).
    """
    frames = tf.convert_to_tensor(frames)
    if frames.dtype != tf.uint8:
      raise TypeError(
          f'AssembleNet serving: input `frames` is {frames.dtype.name}; '
          'expected uint8 pixel values (0..255) [batch, frames, height, '
          'width, 3], which cannot be NaN or infinite. Convert float frames '
          'first, e.g. tf.image.convert_image_dtype(frames, tf.uint8, '
          'saturate=True) for values in [0, 1].')
    name = 'AssembleNet serving: input `frames`'
    steps = [lambda: graph_checks.require_shape(
        frames, name, [None, None, None, None, 3],
        '[batch, frames, height, width, 3] (uint8 RGB)')]
    for axis, what in ((1, '0 frames'), (2, 'height 0'), (3, 'width 0')):
      steps.append(
          lambda axis=axis, what=what: graph_checks.require(
              tf.shape(frames)[axis] > 0, lambda: graph_checks.join(
                  name, f' has {what} (dimension {axis}) in shape ',
                  graph_checks.shape_text(tf.shape(frames)),
                  '; expected at least 1.')))
    with tf.control_dependencies(graph_checks.in_order(steps)):
      frames = tf.identity(frames)
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

  def tflite_input_shape(self) -> List[int]:
    """The fixed `frames` shape of the TFLite model (`tflite_function`).

    [1, num_test_clips * T * temporal_stride, min_image_size, min_image_size,
    3] of `validation_data` (T = `feature_shape[0]`): one video, as many
    frames as the evaluation's clips span laid end to end, the short side
    already at the evaluation's `min_image_size` (square).
    """
    data = self.params.task.validation_data
    frames = data.num_test_clips * self._num_frames * data.temporal_stride
    size = data.min_image_size
    return [1, frames, size, size, 3]

  def tflite_function(self) -> tf.types.experimental.ConcreteFunction:
    """`serve` traced for one video of `tflite_input_shape` uint8 frames.

    For TFLite (`official_ext.export_tflite`), which takes a fixed input
    shape: the same preprocessing (clip sampling, center or multi crops to
    `feature_shape`'s height and width, normalization) and model as the
    SavedModel's `serving_default`; returns {'probabilities': float32
    [1, num_classes]}.

    Traced with every 3-D convolution as 2-D convolutions and matmuls
    (`kernel_policy.TFLITE`), whatever CPU kernels this process has: TFLite
    has builtins for them (no 5-D SpaceToBatchND for a temporal dilation),
    and a TFLite model runs on the device's kernels, not this machine's
    oneDNN ones.
    """
    with kernel_policy.use(kernel_policy.TFLITE):
      return tf.function(self.serve).get_concrete_function(
          tf.TensorSpec(self.tflite_input_shape(), tf.uint8, name='frames'))

  def get_inference_signatures(
      self, function_keys: Mapping[str, str]) -> Dict[str, object]:
    signatures = {}
    for key, name in function_keys.items():
      if key != 'serving_default':
        raise ValueError(f'Unknown AssembleNet signature {key!r}; expected '
                         f'one of {SIGNATURES}.')
      # Traced for devices unknown here (`kernel_policy.for_export`: the
      # stock ops unless runtime.kernel_policy is 'fast').
      with kernel_policy.use(kernel_policy.for_export(
          kernel_policy.setting_of(self.params))):
        signatures[name] = tf.function(self.serve).get_concrete_function(
            tf.TensorSpec([None, None, None, None, 3], tf.uint8,
                          name='frames'))
    return signatures
