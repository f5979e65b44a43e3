r"""Generated YouTube-8M-format data, for experiments without a download.

  python -m official_ext.yt8m.demo_data --output_dir=/tmp/yt8m_demo \
      [--record_type=video] [--overwrite]
"""
import os
from typing import Dict, List, Optional, Sequence, Tuple

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.core import frame_features
from official_ext.core.input import demo_cache
from official_ext.core import output_files
from official_ext.yt8m import configs
from official_ext.yt8m import dataloader

# Bump when the generated data changes for the same arguments.
FORMAT_VERSION = 1

SEGMENT_SIZE = 5
MAX_LABELS_PER_VIDEO = 5
_NUM_LABELS_PROBS = np.array([0.45, 0.25, 0.15, 0.10, 0.05])
_LENGTH_ONE_FRACTION = 0.03
# Signal and noise, in dequantized units (the uint8 range covers [-2, 2]).
_PROTOTYPE_STD = 0.35
_VIDEO_OFFSET_STD = 0.25
_FRAME_NOISE_STD = 0.8
_SPLITS = ('train', 'validation')


# Inverse of `dataloader.dequantize`: float array -> uint8 (clipped).
quantize = frame_features.quantize


def _bytes_feature_list(frames: np.ndarray) -> tf.train.FeatureList:
  return tf.train.FeatureList(feature=[
      tf.train.Feature(bytes_list=tf.train.BytesList(value=[row.tobytes()]))
      for row in frames
  ])


def make_sequence_example(
    video_id: str,
    labels: Sequence[int],
    rgb: np.ndarray,
    audio: np.ndarray,
    segment_labels: Optional[Sequence[int]] = None,
    segment_start_times: Optional[Sequence[int]] = None,
    segment_scores: Optional[Sequence[float]] = None,
) -> tf.train.SequenceExample:
  """One YouTube-8M frame-level record (uint8 `rgb`, `audio` [T, size]).

  Raises:
    ValueError: naming the argument with a wrong dtype, rank or length.
  """
  rgb = np.asarray(rgb)
  audio = np.asarray(audio)
  for name, array in (('rgb', rgb), ('audio', audio)):
    if array.dtype != np.uint8 or array.ndim != 2:
      raise ValueError(f'make_sequence_example: {name} must be uint8 '
                       f'[frames, size]; got {array.dtype} {array.shape}.')
  if rgb.shape[0] != audio.shape[0]:
    raise ValueError(f'make_sequence_example: rgb has {rgb.shape[0]} frames '
                     f'but audio has {audio.shape[0]}.')
  segment = (segment_labels, segment_start_times, segment_scores)
  if any(s is not None for s in segment):
    if any(s is None for s in segment) or len(set(map(len, segment))) != 1:
      raise ValueError(
          'make_sequence_example: segment_labels, segment_start_times and '
          'segment_scores must be given together, with equal lengths.')
  example = tf.train.SequenceExample()
  context = example.context.feature
  context['id'].bytes_list.value.append(video_id.encode('utf-8'))
  context['labels'].int64_list.value.extend(int(l) for l in labels)
  if segment_labels is not None:
    context['segment_labels'].int64_list.value.extend(
        int(l) for l in segment_labels)
    context['segment_start_times'].int64_list.value.extend(
        int(s) for s in segment_start_times)
    context['segment_scores'].float_list.value.extend(
        float(s) for s in segment_scores)
  feature_lists = example.feature_lists.feature_list
  feature_lists['rgb'].CopyFrom(_bytes_feature_list(rgb))
  feature_lists['audio'].CopyFrom(_bytes_feature_list(audio))
  return example


def make_video_level_example(video_id: str, labels: Sequence[int],
                             mean_rgb: np.ndarray,
                             mean_audio: np.ndarray) -> tf.train.Example:
  """One YouTube-8M video-level record.

  Raises:
    ValueError: naming the argument that is not a float vector.
  """
  example = tf.train.Example()
  feature = example.features.feature
  feature['id'].bytes_list.value.append(video_id.encode('utf-8'))
  feature['labels'].int64_list.value.extend(int(l) for l in labels)
  for name, values in (('mean_rgb', mean_rgb), ('mean_audio', mean_audio)):
    values = np.asarray(values)
    if values.ndim != 1 or values.dtype.kind != 'f':
      raise ValueError(f'make_video_level_example: {name} must be a float '
                       f'vector [size]; got {values.dtype} {values.shape}.')
    feature[name].float_list.value.extend(values.tolist())
  return example


def dequantized_mean(frames: np.ndarray) -> np.ndarray:
  """uint8 frames [T, size] -> float32 [size], the mean over the frames of
  `dataloader.dequantize` (accumulated in float64)."""
  mean = frames.astype(np.float64).mean(axis=0)
  return (mean * dataloader.QUANTIZATION_SCALE +
          dataloader.QUANTIZATION_BIAS).astype(np.float32)


def _prototypes(rng: np.random.Generator, num_classes: int,
                feature_sizes: Sequence[int]) -> List[np.ndarray]:
  return [
      rng.standard_normal((num_classes, size), dtype=np.float32) *
      np.float32(_PROTOTYPE_STD) for size in feature_sizes
  ]


def _split_examples(rng: np.random.Generator, split: str, num_videos: int,
                    num_classes: int, max_frames: int,
                    class_log_weights: np.ndarray,
                    prototypes: List[np.ndarray], segment_fraction: float,
                    record_type: str = 'frame'):
  """The serialized records of one split, in order."""
  max_length = max(max_frames + 1, int(1.5 * max_frames))
  lengths = rng.integers(2, max_length + 1, num_videos)
  lengths[rng.random(num_videos) < _LENGTH_ONE_FRACTION] = 1
  if num_videos >= 2:  # Make sure both extremes occur.
    lengths[0] = 1
    lengths[1] = max_length
  max_labels = min(MAX_LABELS_PER_VIDEO, num_classes)
  probs = _NUM_LABELS_PROBS[:max_labels] / _NUM_LABELS_PROBS[:max_labels].sum()
  num_labels = rng.choice(np.arange(1, max_labels + 1), num_videos, p=probs)
  # Weighted sampling without replacement (Gumbel top-k).
  keys = class_log_weights[None, :] + rng.gumbel(size=(num_videos,
                                                       num_classes))
  ranked = np.argsort(-keys, axis=1)[:, :max_labels]
  has_segments = rng.random(num_videos) < segment_fraction
  for i in range(num_videos):
    t = int(lengths[i])
    labels = np.sort(ranked[i, :num_labels[i]])
    frame_labels = labels[rng.integers(0, len(labels), t)]
    seg_labels, seg_starts, seg_scores = None, None, None
    if has_segments[i] and t >= SEGMENT_SIZE:
      candidates = np.arange(0, t - SEGMENT_SIZE + 1, SEGMENT_SIZE)
      num_segments = min(len(candidates), int(rng.integers(1, 4)))
      starts = np.sort(rng.choice(candidates, num_segments, replace=False))
      negatives = np.setdiff1d(np.arange(num_classes), labels)
      seg_labels, seg_starts, seg_scores = [], [], []
      for start in starts:
        positive = int(labels[rng.integers(0, len(labels))])
        frame_labels[start:start + SEGMENT_SIZE] = positive
        seg_labels.append(positive)
        seg_starts.append(int(start))
        seg_scores.append(1.0)
        if len(negatives) and rng.random() < 0.7:
          seg_labels.append(int(negatives[rng.integers(0, len(negatives))]))
          seg_starts.append(int(start))
          seg_scores.append(0.0)
    features = []
    for prototype in prototypes:
      size = prototype.shape[1]
      offset = rng.standard_normal(size, dtype=np.float32) * np.float32(
          _VIDEO_OFFSET_STD)
      noise = rng.standard_normal((t, size), dtype=np.float32)
      noise *= np.float32(_FRAME_NOISE_STD)
      noise += prototype[frame_labels]
      noise += offset
      features.append(quantize(noise))
    video_id = f'{split[:2]}{i:06d}'
    if record_type == 'video':
      example = make_video_level_example(
          video_id, labels.tolist(), dequantized_mean(features[0]),
          dequantized_mean(features[1]))
    else:
      example = make_sequence_example(
          video_id, labels.tolist(), features[0], features[1], seg_labels,
          seg_starts, seg_scores)
    yield example.SerializeToString()


def _shard_pattern(output_dir: str, split: str, num_shards: int) -> str:
  return os.path.join(output_dir, f'{split}-*-of-{num_shards:05d}.tfrecord')


def write_demo_dataset(output_dir: str,
                       *,
                       num_classes: int,
                       max_frames: int,
                       num_train_videos: int,
                       num_validation_videos: int,
                       num_shards: int,
                       seed: int,
                       segment_fraction: float,
                       feature_sizes: Sequence[int] = (1024, 128),
                       record_type: str = 'frame'
                      ) -> Dict[str, str]:
  """Writes train and validation shards of generated data (docs/yt8m.md).

  Returns:
    {'train': glob pattern, 'validation': glob pattern}.
  """
  feature_sizes = tuple(int(s) for s in feature_sizes)
  if num_classes < 2:
    raise ValueError(f'num_classes is {num_classes}; expected >= 2.')
  if max_frames < 1:
    raise ValueError(f'max_frames is {max_frames}; expected >= 1.')
  if num_train_videos < 1 or num_validation_videos < 1:
    raise ValueError(
        f'num_train_videos ({num_train_videos}) and num_validation_videos '
        f'({num_validation_videos}) must be >= 1.')
  if num_shards < 1:
    raise ValueError(f'num_shards is {num_shards}; expected >= 1.')
  if not 0.0 <= segment_fraction <= 1.0:
    raise ValueError(f'segment_fraction is {segment_fraction}; expected a '
                     'value in [0, 1].')
  if record_type not in configs.RECORD_TYPES:
    raise ValueError(f'record_type is {record_type!r}; expected one of '
                     f'{configs.RECORD_TYPES}.')
  if len(feature_sizes) != 2 or min(feature_sizes) < 1:
    raise ValueError(f'feature_sizes is {feature_sizes}; expected positive '
                     '(rgb, audio) widths.')
  tf.io.gfile.makedirs(output_dir)
  base = np.random.default_rng([seed, 0])
  prototypes = _prototypes(base, num_classes, feature_sizes)
  class_log_weights = -0.5 * np.log(base.permutation(num_classes) + 1.0)
  counts = {'train': num_train_videos, 'validation': num_validation_videos}
  patterns = {}
  for split_id, split in enumerate(_SPLITS, start=1):
    rng = np.random.default_rng([seed, split_id])
    records = _split_examples(rng, split, counts[split], num_classes,
                              max_frames, class_log_weights, prototypes,
                              segment_fraction, record_type)
    bounds = np.linspace(0, counts[split], num_shards + 1).astype(int)
    for shard in range(num_shards):
      path = os.path.join(
          output_dir, f'{split}-{shard:05d}-of-{num_shards:05d}.tfrecord')
      with tf.io.TFRecordWriter(path) as writer:
        for _ in range(bounds[shard + 1] - bounds[shard]):
          writer.write(next(records))
    patterns[split] = _shard_pattern(output_dir, split, num_shards)
  return patterns


def demo_data_params(task_config: configs.YT8MTask) -> Dict[str, object]:
  """Every parameter that determines the generated data (and its cache key).

  Raises:
    ValueError: naming the config key the generator cannot honour.
  """
  train, val = task_config.train_data, task_config.validation_data
  record_type = train.record_type
  video = record_type == 'video'
  names = ('mean_rgb', 'mean_audio') if video else ('rgb', 'audio')
  for key, data in (('task.train_data', train), ('task.validation_data', val)):
    if data.record_type != record_type:
      raise ValueError(f'{key}.record_type is {data.record_type!r} but '
                       f'task.train_data.record_type is {record_type!r}; '
                       'demo data has one record type.')
    if tuple(data.feature_names) != names:
      raise ValueError(f'{key}.feature_names is {tuple(data.feature_names)}; '
                       f'{record_type}-level demo data has {names}.')
    if video and (tuple(data.feature_dtypes) != ('float32', 'float32') or
                  any(data.feature_from_bytes)):
      raise ValueError(f'{key}.feature_dtypes / feature_from_bytes: '
                       'video-level demo data is float32 stored as float '
                       'lists.')
    if not video and (tuple(data.feature_dtypes) != ('uint8', 'uint8') or
                      not all(data.feature_from_bytes)):
      raise ValueError(f'{key}.feature_dtypes / feature_from_bytes: demo data '
                       'is uint8 stored as bytes.')
  if tuple(val.feature_sizes) != tuple(train.feature_sizes):
    raise ValueError(
        f'task.validation_data.feature_sizes {tuple(val.feature_sizes)} '
        'differs from task.train_data.feature_sizes '
        f'{tuple(train.feature_sizes)}.')
  demo = task_config.demo_data
  return {
      'format_version': FORMAT_VERSION,
      'num_classes': int(train.num_classes),
      'max_frames': int(train.max_frames),
      'feature_sizes': [int(s) for s in train.feature_sizes],
      'num_train_videos': int(demo.num_train_videos),
      'num_validation_videos': int(demo.num_validation_videos),
      'num_shards': int(demo.num_shards),
      'seed': int(demo.seed),
      'segment_fraction': float(demo.segment_fraction),
      'record_type': record_type,
  }


def ensure_demo_data(task_config: configs.YT8MTask) -> Tuple[str, str]:
  """Generates the demo data once (cached); its (train, validation) patterns.

  Raises:
    ValueError: `task.demo_data.enabled` is False, or a data config key does
      not fit the generator.
  """
  if not task_config.demo_data.enabled:
    raise ValueError('task.demo_data.enabled is False: demo data is generated '
                     'only when it is True (or set task.train_data.input_path '
                     'and task.validation_data.input_path).')
  params = demo_data_params(task_config)
  root = os.path.join(demo_cache.cache_root(task_config.demo_data.cache_dir),
                      'yt8m_demo')
  final_dir = demo_cache.ensure(
      root, params, lambda directory: write_demo_dataset(
          directory,
          num_classes=params['num_classes'],
          max_frames=params['max_frames'],
          num_train_videos=params['num_train_videos'],
          num_validation_videos=params['num_validation_videos'],
          num_shards=params['num_shards'],
          seed=params['seed'],
          segment_fraction=params['segment_fraction'],
          feature_sizes=params['feature_sizes'],
          record_type=params['record_type']), 'YT8M')
  num_shards = params['num_shards']
  return (_shard_pattern(final_dir, 'train', num_shards),
          _shard_pattern(final_dir, 'validation', num_shards))


# ---------------------------------------------------------------------------
# CLI.
# ---------------------------------------------------------------------------


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  define = dict(flag_values=flag_values)
  task = configs.yt8m_demo().task
  flags.DEFINE_string('output_dir', None, 'Directory for the shards.', **define)
  flags.DEFINE_integer('num_classes', task.train_data.num_classes,
                       'Number of classes.', **define)
  flags.DEFINE_integer('max_frames', task.train_data.max_frames,
                       'Pipeline max_frames (lengths go to 1.5x).', **define)
  flags.DEFINE_integer('num_train_videos', task.demo_data.num_train_videos,
                       'Train videos.', **define)
  flags.DEFINE_integer('num_validation_videos',
                       task.demo_data.num_validation_videos,
                       'Validation videos.', **define)
  flags.DEFINE_integer('num_shards', task.demo_data.num_shards,
                       'Files per split.', **define)
  flags.DEFINE_integer('seed', task.demo_data.seed, 'Random seed.', **define)
  flags.DEFINE_float('segment_fraction', task.demo_data.segment_fraction,
                     'Share of videos with segment ratings.', **define)
  flags.DEFINE_enum('record_type', 'frame', list(configs.RECORD_TYPES),
                    "'frame': SequenceExamples; 'video': the same videos as "
                    'video-level Examples (mean_rgb, mean_audio).', **define)
  flags.DEFINE_boolean('overwrite', False,
                       'Replace files of the same names in --output_dir (a '
                       'directory that holds files is refused otherwise).',
                       **define)
  flags.mark_flag_as_required('output_dir', flag_values=flag_values)


def main(argv: Sequence[str],
         flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Writes the demo dataset the flags describe, whole or not at all."""
  del argv
  f = flag_values
  output_files.write_directory(
      f.output_dir, lambda staging: write_demo_dataset(
          staging,
          num_classes=f.num_classes,
          max_frames=f.max_frames,
          num_train_videos=f.num_train_videos,
          num_validation_videos=f.num_validation_videos,
          num_shards=f.num_shards,
          seed=f.seed,
          segment_fraction=f.segment_fraction,
          record_type=f.record_type), overwrite=f.overwrite)
  for split in _SPLITS:
    print(f'{split}: {_shard_pattern(f.output_dir, split, f.num_shards)}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
