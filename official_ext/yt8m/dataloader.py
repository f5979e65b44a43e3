"""Input pipeline of YouTube-8M frame- and video-level records.

The record formats, the pipeline and the examples: docs/yt8m.md#data; bad
input: docs/bad_input.md.
"""
import io
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.core import frame_features
from official_ext.core.input import bad_records as bad_records_lib
from official_ext.core.input import graph_checks
from official_ext.core.input import tfrecord_input
from official_ext.core import timelines
from official_ext.yt8m import configs

# Quantization of the YouTube-8M uint8 features (the starter code's
# `Dequantize` with max_quantized_value=2, min_quantized_value=-2):
# x -> x * 4 / 255 + 4 / 512 - 2.
# Defined with the rest of the format in `core.frame_features`.
MAX_QUANTIZED_VALUE = frame_features.MAX_QUANTIZED_VALUE
MIN_QUANTIZED_VALUE = frame_features.MIN_QUANTIZED_VALUE
QUANTIZATION_SCALE = frame_features.QUANTIZATION_SCALE
QUANTIZATION_BIAS = frame_features.QUANTIZATION_BIAS

_DTYPES = {'uint8': tf.uint8, 'float32': tf.float32}

# Keys of the decoded dict (`Decoder.decode`).
VIDEO_ID = 'video_id'
LABELS = 'labels'
FEATURES = 'features'
SOURCE = tfrecord_input.SOURCE_KEY  # The record's file.
SEGMENT_LABELS = 'segment_labels'
SEGMENT_START_TIMES = 'segment_start_times'
SEGMENT_SCORES = 'segment_scores'
SAMPLE_SEED = 'sample_seed'

# Key of the bool [batch] level flag of `build_video_and_segment_dataset`'s
# batches: True for a segment-level row, False for a video-level row.
SEGMENT_LEVEL = 'segment_level'


def dequantize(x: tf.Tensor,
               max_quantized_value: float = MAX_QUANTIZED_VALUE,
               min_quantized_value: float = MIN_QUANTIZED_VALUE) -> tf.Tensor:
  """Quantized features -> float32 x * range / 255 + range / 512 + min."""
  quantized_range = max_quantized_value - min_quantized_value
  scale = quantized_range / 255.0
  bias = quantized_range / 512.0 + min_quantized_value
  return tf.cast(x, tf.float32) * scale + bias


# Added to sqrt(eigenvalue) by the reverse whitening (the NeXtVLAD authors').
REVERSE_WHITENING_EPSILON = 1e-4


def reverse_whitening_scale(params: configs.DataConfig
                            ) -> Optional[Tuple[int, np.ndarray]]:
  """(feature index, float32 [width] sqrt(e) + 1e-4) of the feature whose
  whitening is undone, or None.

  Raises:
    ValueError: naming the key at fault: an unknown feature; an empty,
      missing or non-.npy path; eigenvalues too few, not a vector, negative
      or not finite.
  """
  feature = params.reverse_whitening_feature
  if not feature:
    return None
  names = tuple(params.feature_names or ())
  if feature not in names:
    raise ValueError(
        f'DataConfig.reverse_whitening_feature={feature!r} is not one of '
        f'DataConfig.feature_names {names}.')
  index = names.index(feature)
  width = int(params.feature_sizes[index])
  path = params.pca_eigenvalues_path
  key = f'DataConfig.pca_eigenvalues_path={path!r}'
  if not path:
    raise ValueError(
        f'DataConfig.reverse_whitening_feature={feature!r} needs the PCA '
        'eigenvalues of that feature: DataConfig.pca_eigenvalues_path is '
        "empty (a .npy file, e.g. the NeXtVLAD authors' "
        "yt8m_pca/eigenvals.npy; or set reverse_whitening_feature='').")
  if not tf.io.gfile.exists(path):
    raise ValueError(f'{key}: no such file (the PCA eigenvalues of feature '
                     f'{feature!r}, a .npy array).')
  with tf.io.gfile.GFile(path, 'rb') as f:
    try:
      values = np.load(io.BytesIO(f.read()), allow_pickle=False)
    except ValueError as e:
      raise ValueError(f'{key} is not a .npy array: {e}') from e
  if values.ndim == 2 and values.shape[1] == 1:
    values = values[:, 0]
  if values.ndim != 1 or values.shape[0] < width:
    raise ValueError(
        f'{key} holds an array of shape {values.shape}; expected [n] or '
        f'[n, 1] with n >= {width}, the width of feature {feature!r}.')
  values = values[:width].astype(np.float64)
  bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
  if bad.size:
    raise ValueError(
        f'{key}: eigenvalue {bad[0]} is {float(values[bad[0]])}; expected '
        f'finite values >= 0 ({bad.size} are not).')
  return index, (np.sqrt(values) + REVERSE_WHITENING_EPSILON).astype(
      np.float32)


# Validation helpers.


def _check_params(params: configs.DataConfig) -> None:
  """Raises ValueError naming the DataConfig key that is inconsistent."""
  names = tuple(params.feature_names or ())
  if not names:
    raise ValueError('DataConfig.feature_names is empty; expected the sequence '
                     "features to read, e.g. ('rgb', 'audio').")
  if len(set(names)) != len(names):
    raise ValueError(f'DataConfig.feature_names {names} repeats a name.')
  for key in ('feature_sizes', 'feature_dtypes', 'feature_from_bytes'):
    value = getattr(params, key)
    if value is None or len(value) != len(names):
      raise ValueError(
          f'DataConfig.{key} is {value!r}: expected one entry per feature of '
          f'DataConfig.feature_names {names}.')
  for name, size in zip(names, params.feature_sizes):
    if size is None or int(size) <= 0:
      raise ValueError(f'DataConfig.feature_sizes: feature {name!r} has size '
                       f'{size!r}; expected a positive int.')
  for name, dtype in zip(names, params.feature_dtypes):
    if dtype not in _DTYPES:
      raise ValueError(f'DataConfig.feature_dtypes: feature {name!r} has dtype '
                       f'{dtype!r}; expected one of {sorted(_DTYPES)}.')
  for key in ('num_classes', 'max_frames', 'segment_size'):
    value = getattr(params, key)
    if value is None or int(value) <= 0:
      raise ValueError(f'DataConfig.{key} is {value!r}; expected a positive '
                       'int.')
  if (params.num_sample_frames is not None and
      int(params.num_sample_frames) <= 0):
    raise ValueError(f'DataConfig.num_sample_frames is '
                     f'{params.num_sample_frames!r}; expected None or a '
                     'positive int.')
  if params.record_type not in configs.RECORD_TYPES:
    raise ValueError(f'DataConfig.record_type is {params.record_type!r}; '
                     f'expected one of {configs.RECORD_TYPES}.')
  if params.record_type == 'video':
    _check_video_level_params(params)


def _check_video_level_params(params: configs.DataConfig) -> None:
  """Raises ValueError naming the DataConfig key that video-level records
  (one float list per feature) cannot honour."""
  video = "video-level records (DataConfig.record_type='video')"
  for key, expected in (('feature_dtypes', 'float32'),
                        ('feature_from_bytes', False)):
    values = tuple(getattr(params, key))
    if any(v != expected for v in values):
      raise ValueError(f'DataConfig.{key} is {values}; {video} store each '
                       f'feature as one float list: expected {expected!r} '
                       'for every feature.')
  if params.num_sample_frames is not None:
    raise ValueError(f'DataConfig.num_sample_frames is '
                     f'{params.num_sample_frames!r}; {video} have no frames '
                     'to sample: set it to None.')
  if params.segment_labels:
    raise ValueError(f'DataConfig.segment_labels is True; {video} carry no '
                     "segment ratings: use frame-level records (record_type="
                     "'frame') for segment labels.")


# Decoder.


class Decoder:
  """Decodes one serialized frame-level `tf.SequenceExample` into raw tensors.

  Frame widths, frame counts, segment lists, uint8 ranges and float
  finiteness are checked, errors naming the file, video and feature.
  """

  def __init__(self, params: configs.DataConfig):
    _check_params(params)
    if params.record_type != 'frame':
      raise ValueError(f'Decoder reads frame-level records; '
                       f'DataConfig.record_type is {params.record_type!r} '
                       '(use make_decoder).')
    self._params = params
    self._names = tuple(params.feature_names)
    self._sizes = tuple(int(s) for s in params.feature_sizes)
    self._dtypes = tuple(_DTYPES[d] for d in params.feature_dtypes)
    self._from_bytes = tuple(bool(b) for b in params.feature_from_bytes)
    self._context_features = {
        'id': tf.io.FixedLenFeature([], tf.string, default_value=''),
        params.label_field: tf.io.VarLenFeature(tf.int64),
    }
    if params.segment_labels:
      self._context_features.update({
          SEGMENT_LABELS: tf.io.VarLenFeature(tf.int64),
          SEGMENT_START_TIMES: tf.io.VarLenFeature(tf.int64),
          SEGMENT_SCORES: tf.io.VarLenFeature(tf.float32),
      })
    self._sequence_features = {}
    for name, dtype, from_bytes in zip(self._names, self._dtypes,
                                       self._from_bytes):
      if from_bytes:
        self._sequence_features[name] = tf.io.FixedLenSequenceFeature(
            [], dtype=tf.string)
      else:
        self._sequence_features[name] = tf.io.VarLenFeature(
            tf.float32 if dtype == tf.float32 else tf.int64)

  def decode(self,
             serialized: tf.Tensor,
             source: Optional[tf.Tensor] = None) -> Dict[str, Any]:
    """Parses one record; `source` (its file) names it in errors.

    Returns:
      {`video_id`, `labels` int64 [L], `features` {name: [T, size] stored
      dtype}, `source`} and in segment mode `segment_labels`,
      `segment_start_times`, `segment_scores` [R].
    """
    if source is None:
      source = tf.constant('<unknown file>')
    context, sequence = tf.io.parse_single_sequence_example(
        serialized,
        context_features=self._context_features,
        sequence_features=self._sequence_features,
        example_name=source)
    video_id = context['id']

    def where():
      return (' of video `', video_id, '` in file `', source, '`')

    checks = []
    features = {}
    for name, size, dtype, from_bytes in zip(self._names, self._sizes,
                                             self._dtypes, self._from_bytes):
      if from_bytes:
        values, feature_checks = _frames_from_bytes(sequence[name], name, size,
                                                    dtype, where)
      else:
        values, feature_checks = _frames_from_lists(sequence[name], name, size,
                                                    dtype, where)
      checks += feature_checks
      if dtype == tf.float32:  # Quantized uint8 features cannot be NaN.
        checks.append(_check_finite(values, name, where))
        with tf.control_dependencies(checks[-1:]):
          values = tf.identity(values)
      values.set_shape([None, size])
      features[name] = values
    checks += self._check_frame_counts(features, where)

    decoded = {
        VIDEO_ID: video_id,
        LABELS: context[self._params.label_field].values,
        SOURCE: source,
    }
    if self._params.segment_labels:
      ratings, check = _segment_ratings(context, where)
      decoded.update(ratings)
      checks.append(check)
    with tf.control_dependencies(checks):
      decoded[FEATURES] = {k: tf.identity(v) for k, v in features.items()}
    return decoded

  def _check_frame_counts(self, features: Dict[str, tf.Tensor],
                          where: Callable[[], tuple]) -> List[tf.Tensor]:
    """Checks that every feature has as many frames as the first."""
    first = self._names[0]
    num_frames = {name: tf.shape(values)[0]
                  for name, values in features.items()}
    return [
        graph_checks.require(
            tf.equal(num_frames[name], num_frames[first]),
            lambda name=name: graph_checks.join(
                "Feature `", name, "`", *where(), ': has ', num_frames[name],
                " frames but feature `", first, "` has ",
                num_frames[first], '; every feature needs one entry per '
                'frame.'))
        for name in self._names[1:]
    ]


class VideoLevelDecoder:
  """Decodes one serialized video-level `tf.Example` into raw tensors.

  Feature widths and finiteness are checked, errors naming the file, video
  and feature.
  """

  def __init__(self, params: configs.DataConfig):
    _check_params(params)
    if params.record_type != 'video':
      raise ValueError(f'VideoLevelDecoder: DataConfig.record_type is '
                       f"{params.record_type!r}; expected 'video'.")
    self._params = params
    self._names = tuple(params.feature_names)
    self._sizes = tuple(int(s) for s in params.feature_sizes)
    self._features = {
        'id': tf.io.FixedLenFeature([], tf.string, default_value=''),
        params.label_field: tf.io.VarLenFeature(tf.int64),
    }
    for name in self._names:
      self._features[name] = tf.io.VarLenFeature(tf.float32)

  def decode(self,
             serialized: tf.Tensor,
             source: Optional[tf.Tensor] = None) -> Dict[str, Any]:
    """Parses one record: {`video_id`, `labels`, `features` {name: float32
    [size]}, `source`}.
    """
    if source is None:
      source = tf.constant('<unknown file>')
    parsed = tf.io.parse_single_example(serialized, self._features,
                                        example_names=source)
    video_id = parsed['id']

    def where():
      return (' of video `', video_id, '` in file `', source, '`')

    checks = []
    features = {}
    for name, size in zip(self._names, self._sizes):
      values = parsed[name].values
      count = tf.size(values)
      checks.append(graph_checks.require(
          tf.equal(count, size),
          lambda name=name, size=size, count=count: graph_checks.join(
              'Feature `', name, '`', *where(), ': has ', count,
              f' values, expected {size} (DataConfig.feature_sizes; '
              "video-level records, DataConfig.record_type='video').")))
      # Cut or zero-padded to `size` (the check above fails otherwise), not
      # `tf.reshape(values, [size])`: from such a reshape Grappler's constant
      # folding infers that `count == size` holds and drops the check, so a
      # record of the wrong width would be served.
      values = tf.reshape(
          tf.pad(values, [[0, tf.maximum(size - count, 0)]])[:size], [size])
      checks.append(_check_finite(values, name, where))
      features[name] = values
    decoded = {
        VIDEO_ID: video_id,
        LABELS: parsed[self._params.label_field].values,
        SOURCE: source,
    }
    with tf.control_dependencies(checks):
      decoded[FEATURES] = {k: tf.identity(v) for k, v in features.items()}
    return decoded


def make_decoder(params: configs.DataConfig
                 ) -> Union[Decoder, VideoLevelDecoder]:
  """The decoder of `params.record_type`'s records."""
  _check_params(params)
  if params.record_type == 'video':
    return VideoLevelDecoder(params)
  return Decoder(params)


def _frames_from_bytes(raw: tf.Tensor, name: str, size: int,
                       dtype: tf.DType, where: Callable[[], tuple]
                       ) -> Tuple[tf.Tensor, List[tf.Tensor]]:
  """A feature stored as one bytes string per frame -> ([T, size] frames,
  [the check that every frame has size * dtype.size bytes]).
  """
  expected = size * dtype.size
  lengths = tf.strings.length(raw)  # Bytes.
  bad = tf.not_equal(lengths, expected)
  frame_ids = tf.range(tf.size(lengths))
  check = graph_checks.require(
      tf.logical_not(tf.reduce_any(bad)), lambda: graph_checks.join(
          'Feature `', name, '`', *where(), ': frame ',
          graph_checks.first_where(frame_ids, bad),
          ' has ', graph_checks.first_where(lengths, bad), ' bytes, expected ',
          str(expected), f' (feature size {size} x {dtype.name}; '
          'DataConfig.feature_sizes / feature_dtypes).'))
  with tf.control_dependencies([check]):
    values = tf.io.decode_raw(raw, dtype)
  return tf.reshape(values, [-1, size]), [check]


def _frames_from_lists(sparse: tf.SparseTensor, name: str, size: int,
                       dtype: tf.DType, where: Callable[[], tuple]
                       ) -> Tuple[tf.Tensor, List[tf.Tensor]]:
  """A feature stored as one float/int64 list per frame -> ([T, size] frames,
  checks of the widths and uint8 ranges).
  """
  ragged = tf.RaggedTensor.from_sparse(sparse)
  lengths = ragged.row_lengths()
  bad = tf.not_equal(lengths, size)
  frame_ids = tf.range(tf.size(lengths, out_type=tf.int64))
  checks = [graph_checks.require(
      tf.logical_not(tf.reduce_any(bad)), lambda: graph_checks.join(
          'Feature `', name, '`', *where(), ': frame ',
          graph_checks.first_where(frame_ids, bad),
          ' has ', graph_checks.first_where(lengths, bad), ' values, expected ',
          str(size), ' (DataConfig.feature_sizes).'))]
  with tf.control_dependencies(checks):
    values = tf.reshape(ragged.values, [-1, size])
  if dtype != tf.uint8:
    return values, checks
  in_range = tf.logical_and(values >= 0, values <= 255)
  checks.append(graph_checks.require(
      tf.reduce_all(in_range), lambda: graph_checks.join(
          "Feature `", name, "`", *where(), ': value ',
          graph_checks.first_where(tf.reshape(values, [-1]), tf.logical_not(
              tf.reshape(in_range, [-1]))),
          ' is not a uint8 (0..255) as DataConfig.feature_dtypes says.')))
  return tf.cast(values, tf.uint8), checks


def _check_finite(values: tf.Tensor, name: str,
                  where: Callable[[], tuple]) -> tf.Tensor:
  """Checks that float32 values of feature `name` are finite."""
  finite = tf.math.is_finite(values)
  flat_bad = tf.logical_not(tf.reshape(finite, [-1]))

  def message():
    if values.shape.rank == 1:
      position = (': value ', graph_checks.first_where(
          tf.range(tf.size(values)), flat_bad), ' is NaN or infinite (')
    else:
      position = (': frame ', graph_checks.first_where(
          tf.range(tf.shape(values)[0]),
          tf.logical_not(tf.reduce_all(finite, axis=1))),
                  ' has a NaN or infinite value (')
    return graph_checks.join(
        'Feature `', name, '`', *where(), *position,
        graph_checks.first_where(tf.reshape(values, [-1]), flat_bad), ').')

  return graph_checks.require(tf.reduce_all(finite), message)


def _segment_ratings(context: Dict[str, tf.SparseTensor],
                     where: Callable[[], tuple]
                     ) -> Tuple[Dict[str, tf.Tensor], tf.Tensor]:
  """The segment ratings of a parsed context, and the check of their lengths."""
  seg_labels = context[SEGMENT_LABELS].values
  seg_starts = context[SEGMENT_START_TIMES].values
  seg_scores = context[SEGMENT_SCORES].values
  n_labels = tf.size(seg_labels)
  same = tf.logical_and(
      tf.equal(n_labels, tf.size(seg_starts)),
      tf.equal(n_labels, tf.size(seg_scores)))
  check = graph_checks.require(
      same, lambda: graph_checks.join(
          'Segment ratings', *where(), ': segment_labels has ',
          tf.size(seg_labels), ', segment_start_times has ',
          tf.size(seg_starts), ' and segment_scores has ',
          tf.size(seg_scores), ' entries; expected one entry each '
          'per rating.'))
  return {SEGMENT_LABELS: seg_labels, SEGMENT_START_TIMES: seg_starts,
          SEGMENT_SCORES: seg_scores}, check


# Parser.


class Parser:
  """Turns decoded tensors into model inputs (docs/yt8m.md#data)."""

  def __init__(self, params: configs.DataConfig):
    _check_params(params)
    self._params = params
    self._names = tuple(params.feature_names)
    self._sizes = tuple(int(s) for s in params.feature_sizes)
    self._dtypes = tuple(_DTYPES[d] for d in params.feature_dtypes)
    self._num_features = sum(self._sizes)
    self._num_classes = int(params.num_classes)
    self._max_frames = int(params.max_frames)
    self._num_sample_frames = (None if params.num_sample_frames is None else
                               int(params.num_sample_frames))
    self._segment_size = int(params.segment_size)
    self._whitening = reverse_whitening_scale(params)

  def parse_fn(self, is_training: bool) -> Callable[[Dict[str, Any]],
                                                     Dict[str, tf.Tensor]]:
    """The function decoded dict -> example dict of this split's mode.

    In training each example's frame sample comes from its per-example seed
    (a new sample every epoch); in evaluation from `seed` and the video id.
    """

    def parse(decoded: Dict[str, Any]) -> Dict[str, tf.Tensor]:
      if self._params.record_type == 'video':
        return self._parse_video_level(decoded)
      if self._params.segment_labels:
        return self._parse_segments(decoded)
      return self._parse_video(decoded, is_training)

    return parse

  # Helpers -------------------------------------------------------------------

  def _where(self, decoded):
    return (" of video `", decoded[VIDEO_ID], "` in file `",
            decoded.get(SOURCE, tf.constant('<unknown file>')), "`")

  def _to_float(self, frames: Sequence[tf.Tensor]) -> tf.Tensor:
    """[..., size_i] stored features -> float32 [..., sum(sizes)]: dequantized,
    whitening undone, optionally L2-normalized per feature.
    """
    blocks = []
    for i, (values, dtype) in enumerate(zip(frames, self._dtypes)):
      block = dequantize(values) if dtype == tf.uint8 else tf.cast(
          values, tf.float32)
      if self._whitening is not None and self._whitening[0] == i:
        if dtype == tf.uint8:
          block -= (MAX_QUANTIZED_VALUE - MIN_QUANTIZED_VALUE) / 512.0
        block *= tf.constant(self._whitening[1])
      if self._params.input_per_feature_l2_norm:
        block = tf.math.l2_normalize(block, axis=-1)
      blocks.append(block)
    return tf.concat(blocks, axis=-1)

  def _check_frames(self, decoded) -> Tuple[List[tf.Tensor], tf.Tensor]:
    frames = [decoded[FEATURES][name] for name in self._names]
    total = tf.shape(frames[0])[0]
    check = graph_checks.require(
        total > 0, lambda: graph_checks.join(
            "Video `", decoded[VIDEO_ID], "` in file `",
            decoded.get(SOURCE, '<unknown file>'), "` has no frames in feature "
            f"`{self._names[0]}`; expected at least one."))
    with tf.control_dependencies([check]):
      total = tf.identity(total)
    return frames, total

  def _check_class_ids(self, ids: tf.Tensor, decoded, field: str) -> tf.Tensor:
    bad = tf.logical_or(ids < 0, ids >= self._num_classes)
    return graph_checks.require(
        tf.logical_not(tf.reduce_any(bad)), lambda: graph_checks.join(
            'Label id ', graph_checks.first_where(ids, bad),
            f" in context feature `{field}`",
            *self._where(decoded), f' is outside [0, {self._num_classes}) '
            f'(DataConfig.num_classes = {self._num_classes}).'))

  def _sample_seed(self, decoded) -> tf.Tensor:
    if SAMPLE_SEED in decoded:  # Training in `build_dataset`.
      return decoded[SAMPLE_SEED]
    # Evaluation (and the parser run outside `build_dataset`): deterministic
    # per video, from `seed` and the video id alone, so the same video gets
    # the same frames run to run, whatever the file order, sharding, batch
    # size or the files' location.
    return tf.stack([
        tf.constant(self._params.seed or 0, tf.int64),
        tf.strings.to_hash_bucket_fast(decoded[VIDEO_ID], 2**62)
    ])

  def _sample_indices(self, n: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """int32 [S] frame indices in [0, n) (n >= 1), sorted in time."""
    s = self._num_sample_frames
    seed = tf.cast(seed, tf.int64)
    if self._params.sample_random_frames:

      def with_replacement():
        u = tf.random.stateless_uniform([s], seed=seed)
        idx = tf.cast(tf.floor(u * tf.cast(n, tf.float32)), tf.int32)
        return tf.sort(tf.minimum(idx, n - 1))

      if s > self._max_frames:  # n <= max_frames < s: always repeats frames.
        return with_replacement()

      def without_replacement():
        u = tf.random.stateless_uniform([self._max_frames], seed=seed)
        u = tf.where(tf.range(self._max_frames) < n, u, -1.0)
        return tf.sort(tf.math.top_k(u, k=s).indices)

      return tf.cond(n >= s, without_replacement, with_replacement)
    start = tf.random.stateless_uniform([],
                                        seed=seed,
                                        minval=0,
                                        maxval=tf.maximum(n - s, 0) + 1,
                                        dtype=tf.int32)
    return tf.math.floormod(start + tf.range(s), n)

  def _multi_hot(self, ids: tf.Tensor) -> tf.Tensor:
    one_hot = tf.one_hot(ids, self._num_classes, dtype=tf.float32)
    return tf.minimum(tf.reduce_sum(one_hot, axis=0), 1.0)

  # Video level ---------------------------------------------------------------

  def _parse_video(self, decoded, is_training: bool) -> Dict[str, tf.Tensor]:
    frames, total = self._check_frames(decoded)
    n = tf.minimum(total, self._max_frames)
    labels = decoded[LABELS]
    with tf.control_dependencies(
        [self._check_class_ids(labels, decoded, self._params.label_field)]):
      labels = self._multi_hot(labels)

    if self._num_sample_frames is not None:
      idx = self._sample_indices(n, self._sample_seed(decoded))
      matrix = self._to_float([tf.gather(f, idx) for f in frames])
      num_frames = tf.constant(self._num_sample_frames, tf.int32)
      length = self._num_sample_frames
    else:
      matrix = self._to_float([f[:self._max_frames] for f in frames])
      matrix = tf.pad(matrix, [[0, self._max_frames - n], [0, 0]])
      num_frames = tf.cast(n, tf.int32)
      length = self._max_frames
    matrix = tf.ensure_shape(matrix, [length, self._num_features])
    out = {'video_matrix': matrix, 'num_frames': num_frames, 'labels': labels}
    if self._params.include_video_id:
      out['video_ids'] = decoded[VIDEO_ID]
    return out

  def _parse_video_level(self, decoded) -> Dict[str, tf.Tensor]:
    labels = decoded[LABELS]
    with tf.control_dependencies(
        [self._check_class_ids(labels, decoded, self._params.label_field)]):
      labels = self._multi_hot(labels)
    matrix = self._to_float([decoded[FEATURES][name] for name in self._names])
    matrix.shape.assert_is_compatible_with([self._num_features])
    out = {'video_matrix': matrix, 'num_frames': tf.constant(1, tf.int32),
           'labels': labels}
    if self._params.include_video_id:
      out['video_ids'] = decoded[VIDEO_ID]
    return out

  # Segment level -------------------------------------------------------------

  def _segment_frames(self, frames: Sequence[tf.Tensor], total: tf.Tensor,
                      starts: tf.Tensor, size: Optional[int] = None
                      ) -> Tuple[tf.Tensor, tf.Tensor]:
    """float32 [R, size, F] frames from `starts` [R], and their valid counts."""
    size = size or self._segment_size
    idx = starts[:, None] + tf.range(size)[None, :]  # [R, size]
    valid = idx < total
    clipped = tf.minimum(idx, total - 1)
    matrix = self._to_float([tf.gather(f, clipped) for f in frames])
    matrix = tf.where(valid[..., None], matrix, tf.zeros_like(matrix))
    matrix = tf.ensure_shape(matrix, [None, size, self._num_features])
    return matrix, tf.reduce_sum(tf.cast(valid, tf.int32), axis=1)

  def every_segment_fn(self, short_last_segment: bool = False
                       ) -> Callable[[Dict[str, Any]], Dict[str, tf.Tensor]]:
    """decoded dict -> every segment of the video, unrated (`predict`).

    Segments start every `segment_size` frames of the whole video; only full
    ones unless `short_last_segment`.
    """
    size = self._segment_size

    def parse(decoded: Dict[str, Any]) -> Dict[str, tf.Tensor]:
      frames, total = self._check_frames(decoded)
      end = total if short_last_segment else total - size + 1
      starts = tf.range(0, tf.maximum(end, 0), size, dtype=tf.int32)
      matrix, num_frames = self._segment_frames(frames, total, starts)
      out = {'video_matrix': matrix, 'num_frames': num_frames,
             'segment_start_times': starts}
      if self._params.include_video_id:
        out['video_ids'] = tf.fill([tf.size(starts)], decoded[VIDEO_ID])
      return out

    return parse

  def every_window_fn(self, window: int, stride: int
                      ) -> Callable[[Dict[str, Any]], Dict[str, tf.Tensor]]:
    """decoded dict -> every window of `window` frames, every `stride` frames
    (`core.timelines.window_bounds`), for timelines.
    """

    def parse(decoded: Dict[str, Any]) -> Dict[str, tf.Tensor]:
      frames, total = self._check_frames(decoded)
      starts, _ = timelines.window_bounds(total, window, stride)
      matrix, num_frames = self._segment_frames(frames, total, starts, window)
      out = {'video_matrix': matrix, 'num_frames': num_frames,
             'segment_start_times': starts}
      if self._params.include_video_id:
        out['video_ids'] = tf.fill([tf.size(starts)], decoded[VIDEO_ID])
      return out

    return parse

  def _parse_segments(self, decoded) -> Dict[str, tf.Tensor]:
    frames, total = self._check_frames(decoded)
    seg_labels = decoded[SEGMENT_LABELS]
    starts = decoded[SEGMENT_START_TIMES]
    scores = tf.cast(decoded[SEGMENT_SCORES], tf.float32)
    bad_start = tf.logical_or(starts < 0, starts >= tf.cast(total, tf.int64))
    checks = [
        self._check_class_ids(seg_labels, decoded, SEGMENT_LABELS),
        graph_checks.require(
            tf.logical_not(tf.reduce_any(bad_start)), lambda: graph_checks.join(
                'Segment start time ',
                graph_checks.first_where(starts, bad_start),
                " in context feature `segment_start_times`",
                *self._where(decoded), ' is outside the video (', total,
                ' frames).')),
    ]
    with tf.control_dependencies(checks):
      order = tf.argsort(starts, stable=True)
    starts = tf.cast(tf.gather(starts, order), tf.int32)
    seg_labels = tf.cast(tf.gather(seg_labels, order), tf.int32)
    scores = tf.gather(scores, order)
    unique_starts, segment_of_rating = tf.unique(starts)  # Sorted.
    num_segments = tf.size(unique_starts)
    matrix, num_frames = self._segment_frames(frames, total, unique_starts)

    scatter_idx = tf.stack([segment_of_rating, seg_labels], axis=1)
    shape = tf.stack([num_segments, self._num_classes])
    labels = tf.tensor_scatter_nd_max(
        tf.zeros(shape, tf.float32), scatter_idx, scores)
    weights = tf.tensor_scatter_nd_max(
        tf.zeros(shape, tf.float32), scatter_idx, tf.ones_like(scores))
    out = {
        'video_matrix': matrix,
        'num_frames': num_frames,
        'labels': tf.ensure_shape(labels, [None, self._num_classes]),
        'label_weights': tf.ensure_shape(weights, [None, self._num_classes]),
        'segment_start_times': unique_starts,
    }
    if self._params.include_video_id:
      out['video_ids'] = tf.fill([num_segments], decoded[VIDEO_ID])
    return out


# build_dataset.


def build_dataset(
    params: configs.DataConfig,
    input_context: Optional[tf.distribute.InputContext] = None,
    bad_records: Optional[bad_records_lib.BadRecordLog] = None,
    every_segment: bool = False,
    short_last_segment: bool = False,
    windows: Optional[Tuple[int, int]] = None,
) -> tf.data.Dataset:
  """Builds the batched input pipeline of one split (docs/yt8m.md#data).

  `every_segment` (every segment of every video, unrated; with
  `short_last_segment` the last, shorter one too) and `windows` ((window,
  stride) frames) are evaluation-only modes of `predict`.

  Raises:
    ValueError: an inconsistent config key, or `input_path` matches no
      file (naming the key).
  """
  _check_params(params)
  for name, value in (('every_segment', every_segment), ('windows', windows)):
    if value and params.record_type == 'video':
      raise ValueError(f'build_dataset({name}={value}) scores parts of '
                       'frame-level records; DataConfig.record_type is '
                       "'video' (one vector per video, no frames).")
    if value and params.is_training:
      raise ValueError(f'build_dataset({name}={value}) is for inference; '
                       'DataConfig.is_training must be False.')
  if every_segment and windows:
    raise ValueError('build_dataset: every_segment and windows exclude each '
                     'other.')
  return tfrecord_input.build_dataset(
      params, input_context, bad_records,
      lambda p: _stages(p, every_segment, short_last_segment, windows))


def build_video_and_segment_dataset(
    params: configs.DataConfig,
    input_context: Optional[tf.distribute.InputContext] = None,
    bad_records: Optional[bad_records_lib.BadRecordLog] = None,
) -> tf.data.Dataset:
  """The validation split's video-level batches, then its segment-level
  ones, flagged by `SEGMENT_LEVEL`.

  Raises:
    ValueError: `params` is a training split or already segment-level.
  """
  if params.is_training or params.segment_labels:
    raise ValueError(
        'build_video_and_segment_dataset reads a validation split at video '
        'level and at segment level; task.validation_data must have '
        f'is_training=false and segment_labels=false (got is_training='
        f'{params.is_training}, segment_labels={params.segment_labels}).')

  def levelled(ds: tf.data.Dataset, segment_level: bool) -> tf.data.Dataset:
    def add_level(batch):
      batch = dict(batch)
      if segment_level:
        batch.pop('segment_start_times')
      else:
        batch['label_weights'] = tf.ones_like(batch['labels'])
      batch[SEGMENT_LEVEL] = tf.fill([tf.shape(batch['labels'])[0]],
                                     segment_level)
      return batch
    return ds.map(add_level, num_parallel_calls=tf.data.AUTOTUNE)

  videos = build_dataset(params, input_context, bad_records)
  segments = build_dataset(params.replace(segment_labels=True), input_context,
                           bad_records)
  return levelled(videos, False).concatenate(levelled(segments, True))


def _stages(params: configs.DataConfig, every_segment: bool,
            short_last_segment: bool,
            windows: Optional[Tuple[int, int]] = None
            ) -> tfrecord_input.Stages:
  """YT8M's decoding, parsing and batching stages for `build_dataset`."""
  decoder = make_decoder(params)
  parser = Parser(params)
  segment_mode = bool(params.segment_labels) or every_segment or bool(windows)
  is_training = bool(params.is_training)

  sample_fn = None
  if is_training and params.num_sample_frames is not None and not segment_mode:

    def sample_fn(ds: tf.data.Dataset) -> tf.data.Dataset:
      # One [2] int64 stateless seed per example, from a stream seeded by
      # params.seed: reproducible, and different every epoch.
      seeds = tf.data.Dataset.random(seed=params.seed).batch(2)

      def add_seed(decoded, seed):
        decoded = dict(decoded)
        decoded[SAMPLE_SEED] = seed
        return decoded

      return tf.data.Dataset.zip((ds, seeds)).map(
          add_seed, num_parallel_calls=tf.data.AUTOTUNE)

  transform_fn = None
  if segment_mode:

    def transform_fn(ds: tf.data.Dataset) -> tf.data.Dataset:
      ds = ds.unbatch()  # One example per (rated) segment.
      if is_training:
        ds = ds.shuffle(params.shuffle_buffer_size, seed=params.seed)
      return ds

  return tfrecord_input.Stages(
      decoder_fn=lambda filename, record: decoder.decode(record,
                                                         source=filename),
      parser_fn=(parser.every_window_fn(*windows) if windows else
                 parser.every_segment_fn(short_last_segment) if every_segment
                 else parser.parse_fn(is_training)),
      sample_fn=sample_fn,
      transform_fn=transform_fn)
