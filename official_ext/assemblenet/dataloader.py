"""The AssembleNet++lite input pipeline: video clip TFRecords (JPEG/PNG frames)
or TFDS to batches of clips, Model Garden's training values, evaluation views
folded into the batch, optionally each frame's object class map cropped and
flipped with it (docs/assemblenet.md#experiments-and-data, #object-stream)."""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.vision.configs import common
from official.vision.ops import augment
from official.vision.ops import preprocess_ops_3d
from official_ext.assemblenet import configs
from official_ext.core.input import bad_records as bad_records_lib
from official_ext.core.input import eval_padding
from official_ext.core.input import graph_checks
from official_ext.core.input import tfrecord_input

# Keys of the decoded dict (`Decoder`).
FRAMES = 'frames'
LABELS = 'labels'
OBJECTS = 'objects'  # Object class maps (with num_object_classes > 0).
# The TFDS feature of the object class maps (uint8 [N, H, W, 1]).
TFDS_OBJECTS = 'objects'
MAX_OBJECT_CLASSES = 256  # The maps' uint8.
# The sequence feature of the object class maps in a record: one 8-bit grey
# PNG a frame, beside `image/encoded` (Model Garden's segmentation key).
OBJECT_FIELD_KEY = 'image/segmentation/class/encoded'
# The PNG signature, and an 8-bit grey image's IHDR bit depth and colour type
# (bytes 24-25).
_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
_PNG_GREY_8BIT = b'\x08\x00'
SOURCE = tfrecord_input.SOURCE_KEY  # The record's file (or TFDS split).



def encode_jpeg_frames(video: np.ndarray, quality: int = 95) -> List[bytes]:
  """uint8 RGB frames [T, H, W, 3] as JPEGs of `quality`, one a frame."""
  return [tf.io.encode_jpeg(f, quality=quality).numpy() for f in video]


def encode_object_maps(objects: np.ndarray) -> List[bytes]:
  """uint8 object class maps [T, H, W] as 8-bit grey PNGs, one a frame."""
  return [tf.io.encode_png(m[..., np.newaxis]).numpy()
          for m in np.asarray(objects, np.uint8)]


def make_sequence_example(frames: Sequence[bytes], labels: Sequence[int],
                          object_maps: Optional[Sequence[bytes]] = None,
                          clip_id: Optional[str] = None
                          ) -> tf.train.SequenceExample:
  """The clip record this pipeline reads: encoded `frames` under
  `image/encoded`, `labels` under `clip/label/index`, `clip_id` under
  `clip/id`; with `object_maps` (`encode_object_maps`) also
  `OBJECT_FIELD_KEY`."""
  ex = tf.train.SequenceExample()
  ex.context.feature['clip/label/index'].int64_list.value.extend(
      int(l) for l in labels)
  if clip_id is not None:
    ex.context.feature['clip/id'].bytes_list.value.append(clip_id.encode())
  fl = ex.feature_lists.feature_list['image/encoded']
  for f in frames:
    fl.feature.add().bytes_list.value.append(f)
  if object_maps is not None:
    ol = ex.feature_lists.feature_list[OBJECT_FIELD_KEY]
    for m in object_maps:
      ol.feature.add().bytes_list.value.append(m)
  return ex


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
  k = params.num_object_classes
  if k < 0 or k > MAX_OBJECT_CLASSES:
    raise ValueError(
        f'DataConfig.num_object_classes must be in [0, {MAX_OBJECT_CLASSES}] '
        f'(0: no object maps; the maps are uint8); got {k}.')
  if bool(params.input_path) == bool(params.tfds_name):
    raise ValueError('Set exactly one of DataConfig.input_path (TFRecords) and '
                     'DataConfig.tfds_name (TFDS); got input_path='
                     f'{params.input_path!r}, tfds_name={params.tfds_name!r}.')
  _check_augmentation(params)
  if k:
    for key in ('aug_type', 'mixup_and_cutmix'):
      if getattr(params, key) is not None:
        raise ValueError(
            f'DataConfig.{key} and DataConfig.num_object_classes '
            f'({k}) are both set: {key} would change the frames without '
            'their object maps (geometric ops, mixed or pasted clips); turn '
            'one off.')


# RandAugment's ops and the AutoAugment policies that take a clip alone (the
# others move bounding boxes), as Model Garden names them.
RANDAUG_OPS = tuple(augment.RandAugment().available_ops)
AUTOAUG_POLICIES = tuple(
    name for name, policy in augment.AutoAugment().available_policies.items()
    if not any(op in augment.REQUIRE_BOXES_FUNCS
               for sub_policy in policy for op, _, _ in sub_policy))


def _check_range(key: str, value, low, high=None) -> None:
  if value is None or value < low or (high is not None and value > high):
    bound = f'>= {low}' if high is None else f'in [{low}, {high}]'
    raise ValueError(f'DataConfig.{key} must be {bound}; got {value!r}.')


def _check_augmentation(params: configs.DataConfig) -> None:
  """ValueError naming the `aug_type` / `mixup_and_cutmix` key that is
  invalid, or set on evaluation data (`is_training=False`)."""
  aug, mix = params.aug_type, params.mixup_and_cutmix
  for key, value in (('aug_type', aug), ('mixup_and_cutmix', mix)):
    if value is not None and not params.is_training:
      raise ValueError(
          f'DataConfig.{key} is set on evaluation data (is_training=False): '
          'augmentation is for training data only; set it on '
          f'task.train_data.{key}.')
  if aug is not None:
    if aug.type == 'randaug':
      r = aug.randaug
      _check_range('aug_type.randaug.num_layers', r.num_layers, 1)
      _check_range('aug_type.randaug.magnitude', r.magnitude, 0,
                   augment._MAX_LEVEL)  # pylint: disable=protected-access
      _check_range('aug_type.randaug.magnitude_std', r.magnitude_std, 0)
      if r.prob_to_apply is not None:
        _check_range('aug_type.randaug.prob_to_apply', r.prob_to_apply, 0, 1)
      _check_range('aug_type.randaug.cutout_const', r.cutout_const, 0)
      _check_range('aug_type.randaug.translate_const', r.translate_const, 0)
      unknown = [op for op in r.exclude_ops if op not in RANDAUG_OPS]
      if unknown or set(RANDAUG_OPS) <= set(r.exclude_ops):
        raise ValueError(
            'DataConfig.aug_type.randaug.exclude_ops must name some, not all, '
            f'of RandAugment\'s ops {list(RANDAUG_OPS)}; got '
            f'{list(r.exclude_ops)}' + (f' (unknown: {unknown}).' if unknown
                                        else ' (all of them).'))
    elif aug.type == 'autoaug':
      a = aug.autoaug
      if a.augmentation_name not in AUTOAUG_POLICIES:
        raise ValueError(
            'DataConfig.aug_type.autoaug.augmentation_name must be one of '
            f'{list(AUTOAUG_POLICIES)} (the AutoAugment policies without '
            f'bounding boxes); got {a.augmentation_name!r}.')
      _check_range('aug_type.autoaug.cutout_const', a.cutout_const, 0)
      _check_range('aug_type.autoaug.translate_const', a.translate_const, 0)
    else:
      raise ValueError(
          "DataConfig.aug_type.type must be 'randaug' or 'autoaug' (or "
          f'aug_type None: no augmentation); got {aug.type!r}.')
  if mix is not None:
    _check_range('mixup_and_cutmix.mixup_alpha', mix.mixup_alpha, 0)
    _check_range('mixup_and_cutmix.cutmix_alpha', mix.cutmix_alpha, 0)
    if not mix.mixup_alpha and not mix.cutmix_alpha:
      raise ValueError(
          'DataConfig.mixup_and_cutmix: mixup_alpha and cutmix_alpha are both '
          '0 (neither is on); set mixup_and_cutmix None for no mixing.')
    _check_range('mixup_and_cutmix.prob', mix.prob, 0, 1)
    _check_range('mixup_and_cutmix.switch_prob', mix.switch_prob, 0, 1)
    if not 0 <= mix.label_smoothing < 1:
      raise ValueError('DataConfig.mixup_and_cutmix.label_smoothing must be in '
                       f'[0, 1); got {mix.label_smoothing!r}.')


def build_augmenter(aug: Optional[common.Augmentation]
                    ) -> Optional[augment.ImageAugment]:
  """Model Garden's RandAugment / AutoAugment from `DataConfig.aug_type`
  (checked by `check_params`), or None."""
  if aug is None:
    return None
  if aug.type == 'randaug':
    r = aug.randaug
    return augment.RandAugment(
        num_layers=r.num_layers, magnitude=r.magnitude,
        cutout_const=r.cutout_const, translate_const=r.translate_const,
        magnitude_std=r.magnitude_std, prob_to_apply=r.prob_to_apply,
        exclude_ops=list(r.exclude_ops))
  a = aug.autoaug
  return augment.AutoAugment(augmentation_name=a.augmentation_name,
                             cutout_const=a.cutout_const,
                             translate_const=a.translate_const)


def mix_clips(mix: common.MixupAndCutmix, num_classes: int,
              max_batch_size: int, images: tf.Tensor, labels: tf.Tensor
              ) -> Tuple[tf.Tensor, tf.Tensor]:
  """Model Garden's mixup / cutmix of a training batch of clips and labels.

  `augment.MixupAndCutmix` is given the clips' batch indices as class ids (of
  at most `max_batch_size` classes, unsmoothed), so its labels are the mixing
  matrix M (row i: lam_i at i, 1 - lam_i at B-1-i); the labels returned are
  M @ (y * (1 - s) + s / num_classes), s = `mix.label_smoothing`: Model
  Garden's smoothing and mixing, for one-hot and multi-hot labels alike.

  Args:
    mix: the `mixup_and_cutmix` config.
    num_classes: K.
    max_batch_size: an upper bound of B (the global batch size).
    images: float32 [B, T, H, W, 3] clips.
    labels: float32 [B, K] one-hot / multi-hot labels."""
  batch_size = tf.shape(labels)[0]
  mixer = augment.MixupAndCutmix(
      num_classes=max_batch_size, mixup_alpha=mix.mixup_alpha,
      cutmix_alpha=mix.cutmix_alpha, prob=mix.prob,
      switch_prob=mix.switch_prob, label_smoothing=0.0)
  images, mixing = mixer(images, tf.range(batch_size))
  s = mix.label_smoothing
  smoothed = labels * (1.0 - s) + s / num_classes
  return images, tf.matmul(mixing[:, :batch_size], smoothed)


class Decoder:
  """Record (or TFDS element) -> {frames, labels int64 [L], source string},
  with `num_object_classes` also the object maps (PNG strings [M], M = 0 if
  the record has none; TFDS: uint8 [N, H, W])."""

  def __init__(self, params: configs.DataConfig):
    self._image_key = params.image_field_key
    self._label_key = params.label_field_key
    self._object_key = (params.object_field_key if params.num_object_classes
                        else None)
    self._tfds = bool(params.tfds_name)
    self.source = tfrecord_input.tfds_source(params)

  def decode_record(self, filename: tf.Tensor, record: tf.Tensor
                    ) -> Dict[str, tf.Tensor]:
    sequence_features = {
        self._image_key: tf.io.FixedLenSequenceFeature((), tf.string)}
    if self._object_key:
      # Missing: empty, refused by the parser naming the file.
      sequence_features[self._object_key] = tf.io.FixedLenSequenceFeature(
          (), tf.string, allow_missing=True)
    context, sequences = tf.io.parse_single_sequence_example(
        record,
        context_features={self._label_key: tf.io.VarLenFeature(tf.int64)},
        sequence_features=sequence_features,
        example_name=filename)  # Parse errors name the file.
    decoded = {FRAMES: sequences[self._image_key],
               LABELS: tf.sparse.to_dense(context[self._label_key]),
               SOURCE: filename}
    if self._object_key:
      decoded[OBJECTS] = sequences[self._object_key]
    return decoded

  def decode_tfds(self, features: Dict[str, tf.Tensor]
                  ) -> Dict[str, tf.Tensor]:
    decoded = {FRAMES: features['video'],
               LABELS: tf.reshape(tf.cast(features['label'], tf.int64), [-1]),
               SOURCE: tf.constant(self.source)}
    if self._object_key:
      if TFDS_OBJECTS not in features:
        raise ValueError(
            f'{self.source} has no {TFDS_OBJECTS!r} feature (its features: '
            f'{sorted(features)}) but DataConfig.num_object_classes > 0 '
            'needs each frame\'s object class map.')
      objects = features[TFDS_OBJECTS]
      if objects.shape.rank == 4:
        objects = objects[..., 0]
      decoded[OBJECTS] = tf.cast(objects, tf.uint8)
    return decoded


def _decode_frames_py(frames, source):
  """Decodes JPEG/PNG strings [N] in python; errors name file and frame."""
  out = []
  name = source.numpy().decode('utf-8', 'replace')
  for i, f in enumerate(frames.numpy()):
    try:
      img = tf.io.decode_image(f, channels=3, expand_animations=False)
    except (tf.errors.InvalidArgumentError, ValueError) as e:
      raise _corrupt_frame(name, i, f, e) from e
    if out and img.shape != out[0].shape:
      raise ValueError(
          f'Frames of a record of file `{name}` differ in size: sampled frame '
          f'{i} is {tuple(img.shape)}, frame 0 is {tuple(out[0].shape)}.')
    out.append(img.numpy())
  return np.stack(out, axis=0)


@tf.function(jit_compile=True)
def _floor_flip_normalize(images: tf.Tensor, flip: tf.Tensor,
                          divisor: tf.Tensor, zero_centering_image: bool
                          ) -> tf.Tensor:
  """`floor_flip_normalize`'s XLA program (`divisor`: 255)."""
  images = tf.floor(images)
  images = tf.where(flip, tf.reverse(images, [2]), images)
  if zero_centering_image:
    return images * (2.0 / 255.0) - 1.0
  # A division, as normalize_image's (XLA would multiply by the constant's
  # reciprocal, one rounding off): the divisor is an input of the program.
  return images / divisor


def floor_flip_normalize(images: tf.Tensor, flip: tf.Tensor,
                         zero_centering_image: bool) -> tf.Tensor:
  """Resized frames (float32 [T, H, W, 3] in [0, 255]) -> Model Garden's
  training values in one fused XLA loop: floor (its uint8 cast), flipped if
  `flip`, / 255 (or to [-1, 1] with `zero_centering_image`); `video_input.
  process_image` makes three passes of it."""
  return _floor_flip_normalize(images, flip, tf.constant(255.0),
                               zero_centering_image)


def _corrupt_frame(name: str, i: int, frame: bytes, e: Exception
                   ) -> ValueError:
  return ValueError(
      f'Corrupt frame in a record of file `{name}`: sampled frame {i} '
      f'({len(frame)} bytes) does not decode as JPEG/PNG: '
      f'{getattr(e, "message", e)}')


# JPEG start-of-frame markers (baseline, progressive, ...): not DHT (C4),
# JPG (C8) or DAC (CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_size(data: bytes) -> Tuple[int, int]:
  """(height, width) from a JPEG's frame header, read in python.

  Raises:
    ValueError: saying what is wrong (no start marker, a broken segment, no
      frame header before the scan or the end of the data).
  """
  if data[:2] != b'\xff\xd8':
    raise ValueError('no JPEG start marker')
  i, n = 2, len(data)
  while i + 4 <= n:
    if data[i] != 0xFF:
      raise ValueError(f'no JPEG marker at byte {i}')
    marker = data[i + 1]
    if marker == 0xFF:  # Fill byte.
      i += 1
      continue
    length = int.from_bytes(data[i + 2:i + 4], 'big')
    if marker in _JPEG_SOF:
      if i + 9 > n or length < 7:
        raise ValueError(f'frame header at byte {i} is cut short')
      height = int.from_bytes(data[i + 5:i + 7], 'big')
      width = int.from_bytes(data[i + 7:i + 9], 'big')
      if not height or not width:
        raise ValueError(f'frame header gives size {height} x {width}')
      return height, width
    if marker == 0xDA or length < 2:
      raise ValueError(f'no frame header before byte {i}')
    i += 2 + length
  raise ValueError(f'the data ({n} bytes) end before a frame header')


def _jpeg_size_py(frames, source):
  """[height, width] of JPEG strings [N] (`jpeg_size`); errors name the file
  and frame (a header that does not read, sizes that differ)."""
  name = source.numpy().decode('utf-8', 'replace')
  first = None
  for i, f in enumerate(frames.numpy()):
    try:
      size = jpeg_size(f)
    except ValueError as e:
      raise _corrupt_frame(name, i, f, e) from e
    if first is None:
      first = size
    elif size != first:
      raise ValueError(
          f'Frames of a record of file `{name}` differ in size: sampled frame '
          f'{i} is ({size[0]}, {size[1]}, 3), frame 0 is ({first[0]}, '
          f'{first[1]}, 3).')
  return np.asarray(first, np.int32)


class Parser:
  """Decoded dict -> ({'image': float32 [views*T, H, W, 3]}, labels [K]);
  with `num_object_classes` also 'objects': int32 [views*T, H, W], the maps
  of the same frames, window and flip."""

  def __init__(self, params: configs.DataConfig):
    self._p = params
    self._num_frames, self._height, self._width, _ = params.feature_shape
    self._augmenter = build_augmenter(params.aug_type)
    self._objects = params.num_object_classes > 0

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

  def _object_count_check(self, frames: tf.Tensor, objects: tf.Tensor,
                          source: tf.Tensor) -> tf.Tensor:
    """Fails naming the file unless there is one object map a frame."""
    p = self._p
    n, m = tf.shape(frames)[0], tf.shape(objects)[0]
    return graph_checks.require(tf.equal(n, m), lambda: tf.cond(
        tf.equal(m, 0),
        lambda: graph_checks.join(
            'Record of file `', source, '` has no object maps (',
            p.object_field_key, f') but DataConfig.num_object_classes='
            f'{p.num_object_classes} needs them: convert the videos with '
            '--object_maps_dir or --segmenter.'),
        lambda: graph_checks.join(
            'Record of file `', source, '` has ', m, ' object maps (',
            p.object_field_key, ') for ', n, ' frames (',
            p.image_field_key, ').')))

  def _decode_objects(self, objects: tf.Tensor, source: tf.Tensor
                      ) -> tf.Tensor:
    """Sampled maps (8-bit grey PNG strings [T] or uint8 [T, H, W]) -> uint8
    [T, H, W], after checking that every id is < num_object_classes (errors
    name the file)."""
    p = self._p
    if objects.dtype == tf.string:
      n = tf.shape(objects)[0]
      header = tf.strings.substr(objects, 0, 8)
      depth = tf.strings.substr(objects, 24, 2)
      grey = tf.equal(header, _PNG_SIGNATURE) & tf.equal(depth, _PNG_GREY_8BIT)
      is_grey = graph_checks.require(
          tf.reduce_all(grey), lambda: graph_checks.join(
              'Object map in a record of file `', source, '`: sampled frame ',
              graph_checks.first_where(tf.range(n), tf.logical_not(grey)),
              ' is not an 8-bit single-channel (grey) PNG (',
              p.object_field_key, ').'))
      with tf.control_dependencies([is_grey]):
        objects = tf.map_fn(
            lambda m: tf.io.decode_png(m, channels=1)[..., 0], objects,
            fn_output_signature=tf.TensorSpec([None, None], tf.uint8))
    k = p.num_object_classes
    largest = tf.reduce_max(tf.cast(objects, tf.int32))
    in_range = graph_checks.require(largest < k, lambda: graph_checks.join(
        'Record of file `', source, '` has object class id ', largest,
        f' >= DataConfig.num_object_classes={k} (', p.object_field_key,
        ').'))
    with tf.control_dependencies([in_range]):
      return tf.identity(objects)

  def _same_size(self, objects: tf.Tensor, frame_hw: tf.Tensor,
                 source: tf.Tensor) -> tf.Tensor:
    """`objects` [T, h, w] after checking that [h, w] is `frame_hw`."""
    hw = tf.shape(objects)[1:3]
    ok = graph_checks.require(
        tf.reduce_all(tf.equal(hw, frame_hw)), lambda: graph_checks.join(
            'Object maps of a record of file `', source, '` are ',
            graph_checks.shape_text(hw), ' but its frames are ',
            graph_checks.shape_text(frame_hw), ' (', self._p.object_field_key,
            ' must match ', self._p.image_field_key, ').'))
    with tf.control_dependencies([ok]):
      return tf.identity(objects)

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
      if self._objects:
        return self._parse_with_objects(decoded, frames, source, is_training)
      if not is_training:
        images = self.eval_views(frames, source)
        return {'image': images}, self._labels(decoded[LABELS], source)
      t = self._num_frames
      frames = preprocess_ops_3d.sample_sequence(frames, t, True,
                                                 p.temporal_stride)
      images = self.train_clip(frames, source)
      images = tf.ensure_shape(images, [t, self._height, self._width, 3])
      return {'image': images}, self._labels(decoded[LABELS], source)

    return parse

  def _parse_with_objects(self, decoded: Dict[str, tf.Tensor],
                          frames: tf.Tensor, source: tf.Tensor,
                          is_training: bool):
    """`parse` with the object maps: the same frame indices, window, resize
    (nearest neighbour) and flip as the frames."""
    p = self._p
    objects = decoded[OBJECTS]
    with tf.control_dependencies([self._object_count_check(frames, objects,
                                                           source)]):
      objects = tf.identity(objects)
    labels = self._labels(decoded[LABELS], source)
    if not is_training:
      images, objects = self.eval_views(frames, source, objects)
      return {'image': images, 'objects': objects}, labels
    t = self._num_frames
    indices = preprocess_ops_3d.sample_sequence(
        tf.range(tf.shape(frames)[0]), t, True, p.temporal_stride)
    images, objects = self.train_clip(tf.gather(frames, indices), source,
                                      tf.gather(objects, indices))
    images = tf.ensure_shape(images, [t, self._height, self._width, 3])
    objects = tf.ensure_shape(objects, [t, self._height, self._width])
    return {'image': images, 'objects': objects}, labels

  def _crop_box(self, frame_shape: tf.Tensor) -> tf.Tensor:
    """The random resized crop's window [y, x, height, width] of frames of
    `frame_shape` ([height, width, channels]): Model Garden's
    `preprocess_ops_3d.random_crop_resize` sampling (its aspect ratios scaled
    by the output's width / height)."""
    p = self._p
    factor = self._width / self._height
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        frame_shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        min_object_covered=0.1,
        aspect_ratio_range=(p.aug_min_aspect_ratio * factor,
                            p.aug_max_aspect_ratio * factor),
        area_range=(p.aug_min_area_ratio, p.aug_max_area_ratio),
        max_attempts=100, use_image_if_no_bounding_boxes=True)
    return tf.stack([begin[0], begin[1], size[0], size[1]])

  def _decode_jpeg_crops(self, frames: tf.Tensor, source: tf.Tensor,
                         with_box: bool = False):
    """JPEG strings [T] (T static) -> uint8 crops [T, h, w, 3] of one random
    window, only the window decoded (`tf.io.decode_and_crop_jpeg`); with
    `with_box` (crops, the window [y, x, h, w], the frames' [H, W]). Every
    frame's size must be frame 0's; with `name_file_in_decode_errors` the
    headers are read in python (`jpeg_size`) and each frame must end with the
    JPEG end marker, errors naming the file and the frame."""
    n = frames.shape[0]
    if self._p.name_file_in_decode_errors:
      hw = tf.ensure_shape(
          tf.py_function(_jpeg_size_py, [frames, source], tf.int32), [2])
      cut = tf.not_equal(tf.strings.substr(frames, -2, 2), b'\xff\xd9')
      whole = graph_checks.require(
          tf.logical_not(tf.reduce_any(cut)), lambda: graph_checks.join(
              'Corrupt frame in a record of file `', source, '`: sampled '
              'frame ', graph_checks.first_where(tf.range(n), cut), ' (',
              graph_checks.first_where(tf.strings.length(frames), cut),
              ' bytes) does not decode as JPEG/PNG: no JPEG end marker '
              '(truncated).'))
      checks = [whole]
    else:
      shapes = tf.stack([tf.io.extract_jpeg_shape(frames[i])
                         for i in range(n)])[:, :2]
      hw = shapes[0]
      other = tf.reduce_any(tf.not_equal(shapes, shapes[:1]), axis=1)

      def size_text(size):
        return graph_checks.join('(', size[0], ', ', size[1], ', 3)')

      checks = [graph_checks.require(
          tf.logical_not(tf.reduce_any(other)), lambda: graph_checks.join(
              'Frames of a record of file `', source, '` differ in size: '
              'sampled frame ', graph_checks.first_where(tf.range(n), other),
              ' is ', size_text(tf.boolean_mask(shapes, other)[0]),
              ', frame 0 is ', size_text(shapes[0]), '.'))]
    with tf.control_dependencies(checks):
      box = self._crop_box(tf.concat([hw, [3]], 0))
    crops = tf.stack([tf.io.decode_and_crop_jpeg(frames[i], box, channels=3)
                      for i in range(n)])
    return (crops, box, tf.cast(hw, tf.int32)) if with_box else crops

  def _decode_crops(self, frames: tf.Tensor, source: tf.Tensor,
                    with_box: bool = False):
    """Sampled frames -> uint8 crops [T, h, w, 3] of one random window (the
    frames decoded whole, `_decode`, then cut); with `with_box` (crops, the
    window [y, x, h, w], the frames' [H, W])."""
    images = self._decode(frames, source)
    box = self._crop_box(tf.shape(images)[1:])
    crops = tf.slice(images, tf.stack([0, box[0], box[1], 0]),
                     tf.stack([-1, box[2], box[3], -1]))
    return (crops, box, tf.shape(images)[1:3]) if with_box else crops

  def train_clip(self, frames: tf.Tensor, source: tf.Tensor,
                 objects: Optional[tf.Tensor] = None):
    """A training clip from its T sampled frames (JPEG/PNG strings [T] or uint8
    [T, H, W, 3]; `source` names the record in errors): Model Garden's
    training preprocessing (`video_input.process_image`), float32 [T, height,
    width, 3] in [0, 1] ([-1, 1] with `zero_centering_image`). With
    `objects` (the frames' maps, `_decode_objects`' input): (clip, int32 maps
    [T, height, width] of the same window, resized by nearest neighbour, and
    flip)."""
    p = self._p
    with_box = objects is not None
    if frames.dtype == tf.string and frames.shape[0] is not None:
      # (Frames too short to hold a JPEG's markers take the generic path.)
      is_jpeg = tf.reduce_all(
          (tf.strings.length(frames) >= 4) &
          tf.equal(tf.strings.substr(frames, 0, 3), b'\xff\xd8\xff'))
      crops = tf.cond(
          is_jpeg, lambda: self._decode_jpeg_crops(frames, source, with_box),
          lambda: self._decode_crops(frames, source, with_box))
    else:
      crops = self._decode_crops(frames, source, with_box)
    size = (self._height, self._width)
    if with_box:
      crops, box, frame_hw = crops
      maps = self._same_size(self._decode_objects(objects, source), frame_hw,
                             source)
      maps = tf.slice(maps, tf.stack([0, box[0], box[1]]),
                      tf.stack([-1, box[2], box[3]]))
      maps = tf.image.resize(maps[..., tf.newaxis], size,
                             method='nearest')[..., 0]
      if self._augmenter is not None:  # check_params refuses it.
        raise ValueError('DataConfig.aug_type and DataConfig.'
                         'num_object_classes are both set.')
    if self._augmenter is not None:
      images = tf.cast(tf.image.resize(crops, size), tf.uint8)
      if p.random_flip:
        images = preprocess_ops_3d.random_flip_left_right(images)
      # One call on the uint8 [T, H, W, 3] clip: the same ops and
      # magnitudes on every frame (see DataConfig.aug_type).
      images = self._augmenter.distort(images)
      return preprocess_ops_3d.normalize_image(images, p.zero_centering_image)
    if p.random_flip:  # preprocess_ops_3d.random_flip_left_right's draw.
      flip = tf.equal(tf.random.uniform((), 0, 2, dtype=tf.int32), 1)
    else:
      flip = tf.constant(False)
    images = floor_flip_normalize(tf.image.resize(crops, size), flip,
                                  p.zero_centering_image)
    if not with_box:
      return images
    maps = tf.where(flip, tf.reverse(maps, [2]), maps)
    return images, tf.cast(maps, tf.int32)

  def eval_views(self, frames: tf.Tensor, source: tf.Tensor,
                 objects: Optional[tf.Tensor] = None):
    """Evaluation views of one video (also the SavedModel's preprocessing):
    float32 [views * T, height, width, 3] of `frames` ([T_video] strings or
    uint8 [T_video, H, W, 3]); `source` names the record in errors. With
    `objects` (a map a frame): (views, int32 maps [views * T, height,
    width] of the same frames and crops, resized by nearest neighbour)."""
    p = self._p
    t = self._num_frames
    if objects is not None:
      return self._eval_views_with_objects(frames, source, objects)
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

  def _eval_views_with_objects(self, frames: tf.Tensor, source: tf.Tensor,
                               objects: tf.Tensor
                               ) -> Tuple[tf.Tensor, tf.Tensor]:
    """`eval_views` of frames and maps: one sampling of frame indices, the
    maps resized by nearest neighbour and cropped as the frames."""
    p = self._p
    t = self._num_frames
    indices = tf.range(tf.shape(frames)[0])
    if p.num_test_clips > 1:
      indices = preprocess_ops_3d.sample_linspace_sequence(
          indices, p.num_test_clips, t, p.temporal_stride)
    else:
      indices = preprocess_ops_3d.sample_sequence(indices, t, False,
                                                  p.temporal_stride)
    images = self._decode(tf.gather(frames, indices), source)
    maps = self._same_size(
        self._decode_objects(tf.gather(objects, indices), source),
        tf.shape(images)[1:3], source)
    images = preprocess_ops_3d.resize_smallest(images, p.min_image_size)
    images = preprocess_ops_3d.crop_image(
        images, self._height, self._width, False, p.num_test_crops)
    images = preprocess_ops_3d.normalize_image(images, p.zero_centering_image)
    maps = resize_smallest_nearest(maps[..., tf.newaxis], p.min_image_size)
    maps = preprocess_ops_3d.crop_image(
        maps, self._height, self._width, False, p.num_test_crops)[..., 0]
    views = p.num_test_clips * p.num_test_crops
    return (tf.ensure_shape(images,
                            [views * t, self._height, self._width, 3]),
            tf.ensure_shape(tf.cast(maps, tf.int32),
                            [views * t, self._height, self._width]))


def resize_smallest_nearest(maps: tf.Tensor, min_resize: int) -> tf.Tensor:
  """`preprocess_ops_3d.resize_smallest`'s sizes, by nearest neighbour (class
  maps [T, H, W, 1])."""
  shape = tf.shape(maps)
  input_h, input_w = shape[1], shape[2]
  output_h = tf.maximum(min_resize, (input_h * min_resize) // input_w)
  output_w = tf.maximum(min_resize, (input_w * min_resize) // input_h)
  should_resize = tf.math.logical_or(
      tf.not_equal(input_w, output_w), tf.not_equal(input_h, output_h))
  return tf.cond(
      should_resize,
      lambda: tf.cast(tf.image.resize(maps, (output_h, output_w),
                                      method='nearest'), maps.dtype),
      lambda: maps)


def build_dataset(params: configs.DataConfig,
                  input_context: Optional[tf.distribute.InputContext] = None,
                  bad_records: Optional[bad_records_lib.BadRecordLog] = None
                  ) -> tf.data.Dataset:
  """The batched dataset of one split: `core.input.tfrecord_input.build_dataset`
  (files or TFDS, sharding per `input_context`, bad records counted in
  `bad_records`, evaluation padding) with this decoder, parser and the folding
  of evaluation views; training shuffled and repeated, evaluation every
  record once."""
  check_params(params)
  decoder = Decoder(params)
  parser = Parser(params)
  t = params.feature_shape[0]

  def fold_views(features, labels):
    # [B, views * T, H, W, 3] -> [B * views, T, H, W, 3] (objects: no 3).
    features = dict(features)
    for key in ('image', 'objects'):
      if key in features:
        value = features[key]
        features[key] = tf.reshape(value,
                                   [-1, t] + value.shape[2:].as_list())
    return features, labels

  mix = params.mixup_and_cutmix  # Training data only (check_params).

  def fold_views_and_mix(features, labels):
    features, labels = fold_views(features, labels)
    features['image'], labels = mix_clips(
        mix, params.num_classes, params.global_batch_size, features['image'],
        labels)
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
      postprocess_fn=fold_views if mix is None else fold_views_and_mix)
  return tfrecord_input.build_dataset(params, input_context, bad_records,
                                      lambda seeded_params: stages)
