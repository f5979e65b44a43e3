"""Video clip input pipeline: TFRecord `SequenceExample`s (JPEG frames) or TFDS.

TFRecord format (Model Garden's video format, `official.vision.dataloaders.
video_input`): sequence feature `image/encoded` (one JPEG/PNG string per
frame), context `clip/label/index` (int64 class ids). TFDS: elements with
`video` (uint8 [N, H, W, 3]) and `label` (int64) features.

Pipeline (`build_dataset`), on `official_ext.core.tfrecord_input` (files or
TFDS, sharding, bad records, evaluation padding, Model Garden's InputReader):

    files --> (file name, record) --decode--> {frames, labels, source}
    --parse--> temporal sampling (num_frames, temporal_stride; training: a
    random window; evaluation: the middle clip, or `num_test_clips` linearly
    spaced clips) --> frame decoding (sampled frames only) --> training:
    random resized crop + random flip; evaluation: short side resized to
    `min_image_size`, center crop (or `num_test_crops` crops) --> [0, 1] (or
    [-1, 1]) float32 --> batch --> evaluation views folded into the batch.

Bad input fails loudly: a label outside [0, num_classes), a video without
a label, or (single-label) with several labels is an InvalidArgumentError
naming the record's file and its labels; a frame that does not decode is an
error naming the file and the frame index (`name_file_in_decode_errors`); a
record that is not a SequenceExample or a feature of another dtype fails in
TensorFlow's parser naming the file and feature; a truncated or corrupted file
fails naming the file and byte offset (`official_ext.core.bad_records`). With
`skip_bad_records` the invalid record, or the damaged records of a
file, are skipped, logged and counted instead. JPEG frames cannot be NaN.

Outputs: ({'image': float32 [B * views, T, H, W, 3]}, float32 [B, K] labels,
one-hot (single-label) or multi-hot (multi-label)); views = num_test_clips x
num_test_crops in evaluation, 1 in training. Evaluation with `drop_remainder`
(static batch shapes) drops no video: the last batch is filled with copies of
a video marked padding (`official_ext.core.eval_padding.pad_final_batches`)
and the features carry `eval_mask` bool [B] (False: padding).
"""
from typing import Dict, Optional

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.vision.ops import preprocess_ops_3d
from official_ext.assemblenet import configs
from official_ext.core import bad_records as bad_records_lib
from official_ext.core import eval_padding
from official_ext.core import graph_checks
from official_ext.core import tfrecord_input

# Keys of the decoded dict (`Decoder`).
FRAMES = 'frames'
LABELS = 'labels'
SOURCE = tfrecord_input.SOURCE_KEY  # The record's file (or TFDS split).


def check_params(params: configs.DataConfig) -> None:
  """ValueError naming the DataConfig key that is inconsistent."""
  if len(params.feature_shape) != 4 or params.feature_shape[3] != 3:
    raise ValueError('DataConfig.feature_shape must be [num_frames, height, '
                     f'width, 3]; got {list(params.feature_shape)}.')
  if params.num_classes <= 0:
    raise ValueError(f'DataConfig.num_classes must be > 0; got '
                     f'{params.num_classes}.')
  if params.temporal_stride < 1:
    raise ValueError('DataConfig.temporal_stride must be >= 1; got '
                     f'{params.temporal_stride}.')
  if params.num_test_crops not in (1, 3):
    raise ValueError('DataConfig.num_test_crops must be 1 or 3; got '
                     f'{params.num_test_crops}.')
  if params.num_test_clips < 1:
    raise ValueError('DataConfig.num_test_clips must be >= 1; got '
                     f'{params.num_test_clips}.')
  if bool(params.input_path) == bool(params.tfds_name):
    raise ValueError('Set exactly one of DataConfig.input_path (TFRecords) and '
                     'DataConfig.tfds_name (TFDS); got input_path='
                     f'{params.input_path!r}, tfds_name={params.tfds_name!r}.')


class Decoder:
  """Record (or TFDS element) -> {frames, labels int64 [L], source string}."""

  def __init__(self, params: configs.DataConfig):
    self._image_key = params.image_field_key
    self._label_key = params.label_field_key
    self._tfds = bool(params.tfds_name)
    self.source = tfrecord_input.tfds_source(params)

  def decode_record(self, filename: tf.Tensor, record: tf.Tensor
                    ) -> Dict[str, tf.Tensor]:
    context, sequences = tf.io.parse_single_sequence_example(
        record,
        context_features={self._label_key: tf.io.VarLenFeature(tf.int64)},
        sequence_features={
            self._image_key: tf.io.FixedLenSequenceFeature((), tf.string)},
        example_name=filename)  # Parse errors name the file.
    return {FRAMES: sequences[self._image_key],
            LABELS: tf.sparse.to_dense(context[self._label_key]),
            SOURCE: filename}

  def decode_tfds(self, features: Dict[str, tf.Tensor]
                  ) -> Dict[str, tf.Tensor]:
    return {FRAMES: features['video'],
            LABELS: tf.reshape(tf.cast(features['label'], tf.int64), [-1]),
            SOURCE: tf.constant(self.source)}


def _decode_frames_py(frames, source):
  """Decodes JPEG/PNG strings [N] in python; errors name file and frame."""
  out = []
  name = source.numpy().decode('utf-8', 'replace')
  for i, f in enumerate(frames.numpy()):
    try:
      img = tf.io.decode_image(f, channels=3, expand_animations=False)
    except (tf.errors.InvalidArgumentError, ValueError) as e:
      raise ValueError(
          f'Corrupt frame in a record of file `{name}`: sampled frame {i} '
          f'({len(f)} bytes) does not decode as JPEG/PNG: '
          f'{getattr(e, "message", e)}') from e
    if out and img.shape != out[0].shape:
      raise ValueError(
          f'Frames of a record of file `{name}` differ in size: sampled frame '
          f'{i} is {tuple(img.shape)}, frame 0 is {tuple(out[0].shape)}.')
    out.append(img.numpy())
  return np.stack(out, axis=0)


class Parser:
  """Decoded dict -> ({'image': float32 [views*T, H, W, 3]}, labels [K])."""

  def __init__(self, params: configs.DataConfig):
    self._p = params
    self._num_frames, self._height, self._width, _ = params.feature_shape

  def _decode(self, frames: tf.Tensor, source: tf.Tensor) -> tf.Tensor:
    if frames.dtype != tf.string:
      return tf.cast(frames, tf.uint8)
    if self._p.name_file_in_decode_errors:
      images = tf.py_function(_decode_frames_py, [frames, source], tf.uint8)
      return tf.ensure_shape(images, [None, None, None, 3])
    return preprocess_ops_3d.decode_image(frames, 3)

  def _labels(self, labels: tf.Tensor, source: tf.Tensor) -> tf.Tensor:
    """int64 [L] class ids -> float32 [num_classes] one-hot / multi-hot,
    after checking them (errors name the record's file `source`)."""
    k = self._p.num_classes
    n = tf.size(labels)
    as_text = lambda: tf.strings.reduce_join(tf.strings.as_string(labels),
                                             separator=',')
    checks = [
        graph_checks.require(n > 0, lambda: graph_checks.join(
            'Record of file `', source, '` has no label (',
            self._p.label_field_key, ' is empty).')),
        graph_checks.require(
            tf.reduce_all((labels >= 0) & (labels < k)),
            lambda: graph_checks.join(
                'Record of file `', source, '` has label(s) [', as_text(),
                f'] outside [0, {k}) ({self._p.label_field_key}, '
                f'num_classes={k}).')),
    ]
    if not self._p.is_multilabel:
      checks.append(graph_checks.require(n <= 1, lambda: graph_checks.join(
          'Record of file `', source, '` has ', n, ' labels [', as_text(),
          '] but the data is single-label (is_multilabel=False).')))
    with tf.control_dependencies(checks):
      hot = tf.reduce_max(tf.one_hot(labels, k, dtype=tf.float32), axis=0)
    return tf.ensure_shape(hot, [k])

  def parse_fn(self, is_training: bool):
    p = self._p

    def parse(decoded: Dict[str, tf.Tensor]):
      frames, source = decoded[FRAMES], decoded[SOURCE]
      has_frames = graph_checks.require(
          tf.shape(frames)[0] > 0, lambda: graph_checks.join(
              'Record of file `', source, '` has no frames (',
              p.image_field_key, ' is empty).'))
      with tf.control_dependencies([has_frames]):
        frames = tf.identity(frames)
      if not is_training:
        images = self.eval_views(frames, source)
        return {'image': images}, self._labels(decoded[LABELS], source)
      t = self._num_frames
      frames = preprocess_ops_3d.sample_sequence(frames, t, True,
                                                 p.temporal_stride)
      images = self._decode(frames, source)
      images = preprocess_ops_3d.random_crop_resize(
          images, self._height, self._width, t, 3,
          (p.aug_min_aspect_ratio, p.aug_max_aspect_ratio),
          (p.aug_min_area_ratio, p.aug_max_area_ratio))
      if p.random_flip:
        images = preprocess_ops_3d.random_flip_left_right(images)
      images = preprocess_ops_3d.normalize_image(images,
                                                 p.zero_centering_image)
      images = tf.ensure_shape(images, [t, self._height, self._width, 3])
      return {'image': images}, self._labels(decoded[LABELS], source)

    return parse

  def eval_views(self, frames: tf.Tensor, source: tf.Tensor) -> tf.Tensor:
    """Evaluation views of one video (also the SavedModel's preprocessing).

    Args:
      frames: [T_video] JPEG strings or uint8 [T_video, H, W, 3] frames.
      source: string scalar naming the record, for errors.

    Returns:
      float32 [views * T, height, width, 3], views = num_test_clips x
      num_test_crops: clips evenly spaced in time (or the first clip),
      smallest side resized to min_image_size, center (or multi) crops,
      normalized.
    """
    p = self._p
    t = self._num_frames
    if p.num_test_clips > 1:
      frames = preprocess_ops_3d.sample_linspace_sequence(
          frames, p.num_test_clips, t, p.temporal_stride)
    else:
      frames = preprocess_ops_3d.sample_sequence(frames, t, False,
                                                 p.temporal_stride)
    images = self._decode(frames, source)
    images = preprocess_ops_3d.resize_smallest(images, p.min_image_size)
    images = preprocess_ops_3d.crop_image(
        images, self._height, self._width, False, p.num_test_crops)
    images = preprocess_ops_3d.normalize_image(images, p.zero_centering_image)
    views = p.num_test_clips * p.num_test_crops
    return tf.ensure_shape(images, [views * t, self._height, self._width, 3])


def build_dataset(params: configs.DataConfig,
                  input_context: Optional[tf.distribute.InputContext] = None,
                  bad_records: Optional[bad_records_lib.BadRecordLog] = None
                  ) -> tf.data.Dataset:
  """Builds the batched dataset of one split (see the module docstring).

  Files or TFDS, sharding, the bad-record modes and the evaluation padding
  are `official_ext.core.tfrecord_input.build_dataset`'s; this adds the
  AssembleNet decoder, parser and the folding of evaluation views.

  Args:
    params: the split's DataConfig (`input_path` or `tfds_name` set).
    input_context: from tf.distribute; shards files (or TFDS shards) per
      input pipeline and sets the per-replica batch size.
    bad_records: where `skip_bad_records` mode counts what it skips (default
      `official_ext.core.bad_records.bad_record_log()`).

  Returns:
    A Dataset of ({'image': float32 [B * views, T, H, W, 3]},
    float32 [B, num_classes]); training: shuffled and repeated; evaluation:
    every record once (with `drop_remainder`: full batches, the last one
    padded, and `eval_mask` bool [B] in the features).
  """
  check_params(params)
  decoder = Decoder(params)
  parser = Parser(params)
  t = params.feature_shape[0]

  def fold_views(features, labels):
    # [B, views * T, H, W, 3] -> [B * views, T, H, W, 3].
    features = dict(features)
    image = features['image']
    features['image'] = tf.reshape(image, [-1, t] + image.shape[2:].as_list())
    return features, labels

  def attach_mask(example, valid):
    # The evaluation mask goes with the features: ({..., eval_mask}, labels).
    features, labels = example
    return dict(features, **{eval_padding.MASK_KEY: valid}), labels

  stages = tfrecord_input.Stages(
      decoder_fn=decoder.decode_record,
      tfds_decoder_fn=decoder.decode_tfds,
      parser_fn=parser.parse_fn(params.is_training),
      attach_mask=attach_mask,
      postprocess_fn=fold_views)
  return tfrecord_input.build_dataset(params, input_context, bad_records,
                                      lambda seeded_params: stages)
