"""The SavedModel signatures of AssembleNet++lite: `serving_default` (uint8
frames) and `serve_examples` (serialized training records), both the
evaluation's preprocessing and aggregation of views, refusing what they
cannot score (docs/assemblenet.md#export); and the TFLite function."""
from typing import Dict, List, Mapping, Optional

import tensorflow as tf, tf_keras

from official.core import base_task
from official.core import config_definitions
from official.core import export_base
from official_ext.assemblenet import dataloader
from official_ext.core.input import graph_checks
from official_ext.core.kernels import kernel_policy

SIGNATURES = ('serving_default', 'serve_examples')

# Headers `tf.io.decode_image` recognizes: (offset, bytes) pairs per format.
_IMAGE_HEADERS = (((0, b'\xff\xd8\xff'),), ((0, b'\x89PNG\r\n\x1a\n'),),
                  ((0, b'GIF8'),), ((0, b'BM'),),
                  ((0, b'RIFF'), (8, b'WEBP')))


class AssembleNetExportModule(export_base.ExportModule):
  """Export module of `official_ext.assemblenet.task.AssembleNetTask`."""

  def __init__(self, params: config_definitions.ExperimentConfig,
               model: tf_keras.Model, task: base_task.Task,
               policy: Optional[kernel_policy.KernelPolicy] = None):
    """Args: params: experiment; model: restored model; task: its task;
    policy: the signatures' kernel policy (default `kernel_policy.for_export`
    of `runtime.kernel_policy` for any device)."""
    super().__init__(params, model)
    self._policy = policy or kernel_policy.for_export(
        kernel_policy.setting_of(params))
    data = params.task.validation_data
    self._parser = dataloader.Parser(data)
    # Records' frames decoded in graph ops (a py_function does not travel
    # with a SavedModel); the same decoding op as the py_function's.
    self._decoder = dataloader.Decoder(data)
    self._record_parser = dataloader.Parser(
        data.replace(name_file_in_decode_errors=False))
    self._image_key = data.image_field_key
    self._task = task
    self._num_frames, self._height, self._width, _ = data.feature_shape
    self._views = data.num_test_clips * data.num_test_crops

  def serve(self, frames: tf.Tensor) -> Dict[str, tf.Tensor]:
    """uint8 frames [batch, T, H, W, 3] -> {'probabilities': [batch, K]}; an
    InvalidArgumentError naming `frames` for another rank or an empty
    dimension (TF Serving does not check a signature's rank)."""
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
        frames, fn_output_signature=self._views_spec())
    return self._score(images)

  def _views_spec(self) -> tf.TensorSpec:
    """One video's evaluation views, `Parser.eval_views`'s output."""
    return tf.TensorSpec(
        [self._views * self._num_frames, self._height, self._width, 3],
        tf.float32)

  def _score(self, images: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Views [batch, views * T, H, W, 3] -> {'probabilities': [batch, K]}."""
    images = tf.reshape(
        images, [-1, self._num_frames, self._height, self._width, 3])
    probabilities = self._task.inference_step({'image': images}, self.model)
    return {'probabilities': tf.cast(probabilities, tf.float32)}

  def _record_views(self, serialized: tf.Tensor, index: tf.Tensor
                    ) -> tf.Tensor:
    """One serialized record -> its evaluation views: parsed by the evaluation's
    `Decoder` (errors name "input `examples`[index]"), each frame checked to be
    a known image format, decoded in graph ops, then `Parser.eval_views`."""
    source = graph_checks.join('input `examples`[', index, ']')
    frames = self._decoder.decode_record(source, serialized)[
        dataloader.FRAMES]
    count = tf.shape(frames)[0]
    prefix = 'AssembleNet serve_examples: '

    def known_format():
      # Padded: `substr` refuses a position past a string's end.
      padded = tf.strings.join([frames, '\0' * 12])
      ok = tf.zeros_like(frames, tf.bool)
      for header in _IMAGE_HEADERS:
        match = tf.ones_like(frames, tf.bool)
        for offset, magic in header:
          match = tf.logical_and(match, tf.equal(
              tf.strings.substr(padded, offset, len(magic)), magic))
        ok = tf.logical_or(ok, match)
      return ok

    def format_message():
      bad = tf.logical_not(known_format())
      return graph_checks.join(
          prefix, source, ': frame ',
          graph_checks.first_where(tf.range(count), bad), ' of ', count,
          f' (feature `{self._image_key}`, ',
          graph_checks.first_where(tf.strings.length(frames), bad),
          ' bytes) is not a JPEG, PNG, GIF, BMP or WebP image (its first '
          'bytes are none of their headers).')

    checks = graph_checks.in_order([
        lambda: graph_checks.require(count > 0, lambda: graph_checks.join(
            prefix, source, f' has 0 frames (feature `{self._image_key}` is '
            'empty); expected at least one.')),
        lambda: graph_checks.require(tf.reduce_all(known_format()),
                                     format_message),
    ])
    with tf.control_dependencies(checks):
      frames = tf.identity(frames)
    return self._record_parser.eval_views(frames, source)

  def serve_examples(self, examples: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Serialized SequenceExamples [batch] -> {'probabilities': [batch, K]}."""
    examples = tf.convert_to_tensor(examples)
    if examples.dtype != tf.string:
      raise TypeError(
          f'AssembleNet serve_examples: input `examples` is '
          f'{examples.dtype.name}; expected serialized tf.train.'
          'SequenceExample strings [batch].')
    with tf.control_dependencies([graph_checks.require_shape(
        examples, 'AssembleNet serve_examples: input `examples`', [None],
        '[batch] (serialized tf.train.SequenceExample strings)')]):
      examples = tf.reshape(examples, [-1])
    images = tf.map_fn(
        lambda args: self._record_views(*args),
        (examples, tf.range(tf.shape(examples)[0])),
        fn_output_signature=self._views_spec())
    return self._score(images)

  def tflite_input_shape(self) -> List[int]:
    """The fixed `frames` shape of the TFLite model: one video of
    `num_test_clips * T * temporal_stride` frames (the evaluation's clips end to
    end), square at `min_image_size`, of `validation_data`."""
    data = self.params.task.validation_data
    frames = data.num_test_clips * self._num_frames * data.temporal_stride
    size = data.min_image_size
    return [1, frames, size, size, 3]

  def tflite_function(self) -> tf.types.experimental.ConcreteFunction:
    """`serve` traced for one video of `tflite_input_shape` uint8 frames, for
    TFLite (a fixed input shape), with every 3-D convolution as 2-D ops and
    matmuls (`kernel_policy.TFLITE`: TFLite builtins, whatever this machine's
    CPU kernels)."""
    with kernel_policy.use(kernel_policy.TFLITE):
      return tf.function(self.serve).get_concrete_function(
          tf.TensorSpec(self.tflite_input_shape(), tf.uint8, name='frames'))

  def get_inference_signatures(
      self, function_keys: Mapping[str, str]) -> Dict[str, object]:
    signatures = {}
    inputs = {
        'serving_default': (self.serve, tf.TensorSpec(
            [None, None, None, None, 3], tf.uint8, name='frames')),
        'serve_examples': (self.serve_examples, tf.TensorSpec(
            [None], tf.string, name='examples')),
    }
    for key, name in function_keys.items():
      if key not in inputs:
        raise ValueError(f'Unknown AssembleNet signature {key!r}; expected '
                         f'one of {SIGNATURES}.')
      fn, spec = inputs[key]
      with kernel_policy.use(self._policy):
        signatures[name] = tf.function(fn).get_concrete_function(spec)
    return signatures
