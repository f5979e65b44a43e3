r"""YouTube-8M inference (docs/yt8m.md): submission CSVs, timelines, scores.

  python -m official_ext.yt8m.predict --saved_model=/tmp/export \
      --input_path='/data/yt8m/test*.tfrecord' --output_file=/tmp/pred.csv
"""
import csv
import os
from typing import (Callable, Dict, Iterable, Iterator, List, Optional,
                    Sequence, TextIO)

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf, tf_keras

from official.core import config_definitions
from official.core import task_factory
from official_ext.core import checkpoints
from official_ext.core import experiment_params
from official_ext.core import output_files
from official_ext.core import timelines
from official_ext.yt8m import class_names
from official_ext.yt8m import dataloader
from official_ext.yt8m import segment_eval
from official_ext.yt8m import stored_predictions
# Registers YT8MTask with task_factory (a checkpoint's model is built by it).
from official_ext.yt8m import task  # pylint: disable=unused-import

# The config class when the model's params.yaml gives the values.
DEFAULT_EXPERIMENT = 'yt8m'
VIDEO_HEADER = 'VideoId,LabelConfidencePairs'
# The predictions with class names (`--vocabulary`).
NAMED_HEADER = ('VideoId', 'Rank', 'LabelId', 'Name', 'Score')
SEGMENT_HEADER = segment_eval.SEGMENT_HEADER
# YouTube-8M's frame features: one a second.
FEATURES_PER_SECOND = 1.0

Predictor = Callable[[tf.Tensor, tf.Tensor], np.ndarray]


def is_own_output(head: bytes) -> bool:
  """Whether a file's first bytes are those of an output of this command."""
  return (timelines.is_own_output(head) or output_files.begins_with(
      VIDEO_HEADER + '\n', ','.join(NAMED_HEADER) + '\n',
      SEGMENT_HEADER + '\n')(head.replace(b'\r\n', b'\n')))


def top_k_pairs(probabilities: np.ndarray, k: int) -> List[List[tuple]]:
  """Per row, the k (class, score) pairs of highest score (ties: lower id)."""
  order = np.argsort(-probabilities, axis=1, kind='stable')[:, :k]
  return [[(int(c), float(row[c])) for c in idx]
          for row, idx in zip(probabilities, order)]


def write_video_predictions(batches: Iterable[Dict[str, np.ndarray]],
                            out: TextIO, top_k: int = 20,
                            names: Optional[Sequence[str]] = None,
                            named_out: Optional[TextIO] = None) -> int:
  """Writes the video-level CSV of `batches` (`video_ids`, `probabilities`).

  With `names` (class names by id), also the named rows to `named_out`.
  Returns the number of videos written.
  """
  if (names is None) != (named_out is None):
    raise ValueError('names and named_out go together.')
  out.write(VIDEO_HEADER + '\n')
  named = None
  if named_out is not None:
    named = csv.writer(named_out, lineterminator='\n')
    named.writerow(NAMED_HEADER)
  count = 0
  for batch in batches:
    for vid, pairs in zip(batch['video_ids'],
                          top_k_pairs(batch['probabilities'], top_k)):
      vid = vid.decode() if isinstance(vid, bytes) else str(vid)
      out.write(vid + ',' + ' '.join(f'{c} {s:.6f}' for c, s in pairs) + '\n')
      if named is not None:
        named.writerows([vid, rank, c, names[c], f'{s:.6f}']
                        for rank, (c, s) in enumerate(pairs, 1))
      count += 1
  return count


def named_predictions_path(output_file: str) -> str:
  """`pred.csv` -> `pred_names.csv`: where `--vocabulary` writes."""
  root, ext = os.path.splitext(output_file)
  return f'{root}_names{ext or ".csv"}'


# Bytes per entry of the ranking: kept (float32 score, int32 video index,
# uint16 segment index) and pending (the same plus an int16 class index).
_KEPT_BYTES = 4 + 4 + 2
_PENDING_BYTES = _KEPT_BYTES + 2
DEFAULT_PENDING_SIZE = 1 << 22  # 4,194,304 candidates: 48 MiB.


def _pending_entries(num_classes: int, cap: int, pending_size: int) -> int:
  """Candidate buffer entries, between one row of classes and classes x cap."""
  return max(num_classes, min(int(pending_size), num_classes * cap))


class SegmentRanking:
  """Per-class top `cap` segments by score, in bounded memory.

  After the first `cap` segments, a segment is a candidate for a class only
  above the class's current `cap`-th best; candidates wait in a fixed-size
  buffer merged into the kept sets when full. With `top_classes` a segment
  enters only its `top_classes` best classes' lists (the starter's rule).
  """

  def __init__(self, class_ids: Sequence[int], cap: int, segment_size: int,
               pending_size: int = DEFAULT_PENDING_SIZE,
               top_classes: Optional[int] = None):
    """An empty ranking.

    Args:
      class_ids: the classes ranked (columns of the probabilities), in output
        order; at most 32,767.
      cap: segments kept per class (> 0).
      segment_size: frames per segment; start times are multiples of it.
      pending_size: candidate buffer entries (> 0).
      top_classes: None, or a segment enters only its best N classes' lists.
    """
    if cap <= 0:
      raise ValueError(f'--segment_max_per_class={cap}; expected > 0.')
    if top_classes is not None and top_classes <= 0:
      raise ValueError(f'--segment_top_classes={top_classes}; expected > 0 '
                       '(or 0 on the command line: every class).')
    self._top_classes = top_classes
    if pending_size <= 0:
      raise ValueError(f'pending_size={pending_size}; expected > 0.')
    self._class_ids = np.asarray(class_ids, np.int64)
    if not 0 < self._class_ids.size <= np.iinfo(np.int16).max:
      raise ValueError(f'{self._class_ids.size} classes to rank; expected 1 '
                       f'to {np.iinfo(np.int16).max}.')
    self._cap = int(cap)
    self._segment_size = int(segment_size)
    c = self._class_ids.size
    pending_size = _pending_entries(c, self._cap, pending_size)
    self._capacity = 0
    self._scores = np.zeros([c, 0], np.float32)
    self._videos = np.zeros([c, 0], np.int32)
    self._segments = np.zeros([c, 0], np.uint16)
    self._filled = 0  # Kept entries per class (the same for every class).
    self._threshold = np.full([c], -np.inf, np.float32)
    self._pending_size = int(pending_size)
    self._p_scores = np.zeros([pending_size], np.float32)
    self._p_videos = np.zeros([pending_size], np.int32)
    self._p_segments = np.zeros([pending_size], np.uint16)
    self._p_classes = np.zeros([pending_size], np.int16)
    self._pending = 0
    self._ids: List[str] = []
    self._seen = 0
    self.peak_pending = 0
    self.num_merges = 0

  @staticmethod
  def memory_bound(num_classes: int, cap: int,
                   pending_size: int = DEFAULT_PENDING_SIZE) -> int:
    """Bytes of the ranking's arrays at most (video id strings excluded)."""
    pending = _pending_entries(num_classes, cap, pending_size)
    return (num_classes * cap * _KEPT_BYTES + pending * _PENDING_BYTES +
            num_classes * 4)  # + the float32 thresholds.

  @property
  def nbytes(self) -> int:
    """Bytes of the ranking's arrays now."""
    return sum(a.nbytes for a in (
        self._scores, self._videos, self._segments, self._threshold,
        self._p_scores, self._p_videos, self._p_segments, self._p_classes))

  @property
  def num_segments(self) -> int:
    """Segments added so far."""
    return self._seen

  @property
  def kept_per_class(self) -> int:
    """Kept entries of each class (at most cap; candidates excluded)."""
    return self._filled

  @property
  def pending_capacity(self) -> int:
    """Entries of the candidate buffer."""
    return self._pending_size

  def stored_per_class(self) -> np.ndarray:
    """int [classes]: entries held per class, kept plus pending."""
    pending = np.bincount(self._p_classes[:self._pending],
                          minlength=self._class_ids.size)
    return self._filled + pending

  def _video_indices(self, video_ids) -> np.ndarray:
    """Interns ids (bytes or str [b]); segments of a video come together."""
    vids = np.asarray([v.decode() if isinstance(v, bytes) else str(v)
                       for v in video_ids], dtype=object)
    new = np.ones([vids.size], bool)
    new[1:] = vids[1:] != vids[:-1]
    if self._ids and self._ids[-1] == vids[0]:
      new[0] = False  # The last video of the previous batch goes on.
    base = len(self._ids) - 1
    self._ids.extend(vids[new].tolist())
    return (base + np.cumsum(new)).astype(np.int32)

  def _segment_indices(self, starts, video_ids) -> np.ndarray:
    starts = np.asarray(starts, np.int64)
    index = starts // self._segment_size
    bad = (starts % self._segment_size != 0) | (index < 0) | (
        index > np.iinfo(np.uint16).max)
    if bad.any():
      i = int(np.flatnonzero(bad)[0])
      raise ValueError(
          f'Segment start {int(starts[i])} of video {video_ids[i]!r} is not a '
          f'multiple of segment_size {self._segment_size} in [0, '
          f'{self._segment_size * (np.iinfo(np.uint16).max + 1)}).')
    return index.astype(np.uint16)

  def _grow(self, size: int) -> None:
    capacity = min(self._cap, max(size, 2 * self._capacity, 1024))
    if capacity <= self._capacity:
      return
    c = self._class_ids.size
    for name, dtype in (('_scores', np.float32), ('_videos', np.int32),
                        ('_segments', np.uint16)):
      new = np.zeros([c, capacity], dtype)
      new[:, :self._filled] = getattr(self, name)[:, :self._filled]
      setattr(self, name, new)
    self._capacity = capacity

  def add(self, video_ids, segment_start_times, probabilities) -> None:
    """Adds a batch of segments' scores for all the model's classes."""
    b = len(video_ids)
    if not b:
      return
    scores = np.asarray(probabilities, np.float32)[:, self._class_ids]
    if not np.isfinite(scores).all():
      i = int(np.flatnonzero(~np.isfinite(scores).all(axis=1))[0])
      raise ValueError(f'Non-finite score for segment {video_ids[i]!r}:'
                       f'{int(segment_start_times[i])}.')
    if self._top_classes is not None and self._top_classes < scores.shape[1]:
      # The starter's rule: only a segment's best classes list it.
      below = np.argsort(-scores, axis=1, kind='stable')[:, self._top_classes:]
      np.put_along_axis(scores, below, -np.inf, axis=1)
    videos = self._video_indices(video_ids)
    segments = self._segment_indices(segment_start_times, video_ids)
    self._seen += b
    # Fill: the first `cap` segments are kept as they come.
    take = min(b, self._cap - self._filled)
    if take > 0:
      self._grow(self._filled + take)
      end = self._filled + take
      self._scores[:, self._filled:end] = scores[:take].T
      self._videos[:, self._filled:end] = videos[:take]
      self._segments[:, self._filled:end] = segments[:take]
      self._filled = end
      if self._filled == self._cap:
        self._threshold = self._scores.min(axis=1)
      scores, videos, segments = scores[take:], videos[take:], segments[take:]
    # Candidates: above the class's cap-th best, in chunks that fit.
    rows = max(1, self._pending_size // self._class_ids.size)
    for i in range(0, scores.shape[0], rows):
      chunk = scores[i:i + rows]
      r, c = np.nonzero(chunk > self._threshold[None, :])
      if self._pending + r.size > self._pending_size:
        self._merge()
        keep = chunk[r, c] > self._threshold[c]
        r, c = r[keep], c[keep]
      n, end = self._pending, self._pending + r.size
      self._p_scores[n:end] = chunk[r, c]
      self._p_videos[n:end] = videos[i:i + rows][r]
      self._p_segments[n:end] = segments[i:i + rows][r]
      self._p_classes[n:end] = c
      self._pending = end
      self.peak_pending = max(self.peak_pending, end)

  def _merge(self) -> None:
    """Merges the candidates into the kept sets (best `cap` per class)."""
    n = self._pending
    if not n:
      return
    classes = self._p_classes[:n]
    order = np.argsort(classes, kind='stable')  # Arrival order per class.
    counts = np.bincount(classes, minlength=self._class_ids.size)
    starts = np.cumsum(counts) - counts
    for cls in np.flatnonzero(counts):
      idx = order[starts[cls]:starts[cls] + counts[cls]]
      scores = np.concatenate([self._scores[cls], self._p_scores[idx]])
      videos = np.concatenate([self._videos[cls], self._p_videos[idx]])
      segments = np.concatenate([self._segments[cls], self._p_segments[idx]])
      keep = _top(scores, videos, segments, self._cap)
      self._scores[cls] = scores[keep]
      self._videos[cls] = videos[keep]
      self._segments[cls] = segments[keep]
      self._threshold[cls] = self._scores[cls].min()
    self._pending = 0
    self.num_merges += 1

  def ranked(self, position: int) -> List[str]:
    """`<video>:<start>` ids of class `class_ids[position]`, best first."""
    self._merge()
    k = self._filled
    listed = self._scores[position, :k] > -np.inf  # See top_classes.
    scores = self._scores[position, :k][listed]
    videos = self._videos[position, :k][listed]
    segments = self._segments[position, :k][listed]
    order = np.lexsort((segments, videos, -scores))
    size = self._segment_size
    return [f'{self._ids[v]}:{int(s) * size}'
            for v, s in zip(videos[order], segments[order])]

  def write(self, out: TextIO) -> None:
    """Writes `Class,Segments` lines, best segment first."""
    self._merge()
    out.write(SEGMENT_HEADER + '\n')
    for position, cls in enumerate(self._class_ids):
      ranked = self.ranked(position)
      if len(set(ranked)) != len(ranked):
        seen = set()
        duplicate = next(s for s in ranked if s in seen or seen.add(s))
        raise ValueError(f'Segment {duplicate} was read twice: the input '
                         'holds a video id more than once.')
      out.write(f'{cls},' + ' '.join(ranked) + '\n')


def _top(scores: np.ndarray, videos: np.ndarray, segments: np.ndarray,
         k: int) -> np.ndarray:
  """Indices of the k best by (score desc, video asc, segment asc)."""
  if scores.size <= k:
    return np.arange(scores.size)
  kth = np.partition(scores, scores.size - k)[scores.size - k]
  above = np.flatnonzero(scores > kth)
  tied = np.flatnonzero(scores == kth)
  if above.size + tied.size > k:  # Ties at the k-th score: earliest first.
    tied = tied[np.lexsort((segments[tied], videos[tied]))]
  return np.concatenate([above, tied[:k - above.size]])


def check_params(params: config_definitions.ExperimentConfig,
                 model_path: str) -> None:
  """ValueError if `params` contradicts the model's params.yaml in a
  model-affecting key.
  """
  experiment_params.check_model_params(params, model_path, 'predict')


def _data_config(params: config_definitions.ExperimentConfig,
                 input_path: str, batch_size: int):
  return params.task.validation_data.replace(
      input_path=input_path, include_video_id=True, is_training=False,
      segment_labels=False, global_batch_size=batch_size,
      drop_remainder=False, num_sample_frames=None)


def _checkpoint_predictor(params, checkpoint_path: str) -> Predictor:
  tf_keras.mixed_precision.set_global_policy('float32')
  model = task_factory.get_task(params.task).build_model()
  checkpoints.restore_model(model, checkpoint_path)

  @tf.function(reduce_retracing=True)
  def predict(features, num_frames):
    return model(features, num_frames=num_frames, training=False)[
        'predictions']
  return lambda f, n: predict(f, n).numpy()


def _saved_model_predictor(saved_model_dir: str) -> Predictor:
  loaded = tf.saved_model.load(saved_model_dir)
  fn = loaded.signatures['serve_features']
  if 'num_frames' not in fn.structured_input_signature[1]:  # Video level.
    return lambda f, n: fn(features=f)['probabilities'].numpy()
  return lambda f, n: fn(features=f, num_frames=tf.cast(n, tf.int32))[
      'probabilities'].numpy()


def predict_batches(dataset: tf.data.Dataset, predictor: Predictor
                    ) -> Iterator[Dict[str, np.ndarray]]:
  for batch in dataset:
    out = {'video_ids': batch['video_ids'].numpy(),
           'probabilities': predictor(batch['video_matrix'],
                                      batch['num_frames'])}
    if 'labels' in batch:  # Video level.
      out['labels'] = batch['labels'].numpy()
    if 'segment_start_times' in batch:  # Segments, windows.
      out['segment_start_times'] = batch['segment_start_times'].numpy()
      out['num_frames'] = batch['num_frames'].numpy()
    yield out


def run(params: config_definitions.ExperimentConfig, input_path: str,
        output_file: str, saved_model: Optional[str] = None,
        checkpoint_path: Optional[str] = None, top_k: int = 20,
        segment_labels: bool = False, segment_max_per_class: int = 100000,
        batch_size: int = 64, segment_label_ids: Optional[str] = None,
        segment_short_last: bool = False,
        vocabulary: Optional[str] = None,
        segment_top_classes: Optional[int] = None,
        output_probabilities: Optional[str] = None,
        probabilities_shard_rows: int = stored_predictions.DEFAULT_SHARD_ROWS,
        overwrite: bool = False) -> int:
  """Predicts every record of `input_path` into `output_file` (written whole).

  Args:
    params: the experiment config; `task.validation_data` gives the input.
    saved_model: a SavedModel of `export_saved_model`, or
    checkpoint_path: a training checkpoint (exactly one of the two).
    segment_labels: segment level instead of video level.
    vocabulary: vocabulary.csv: also the named predictions (video level).
    segment_top_classes: a segment enters only its best N classes' lists.
    output_probabilities: also store the scores there (`stored_predictions`).
    The other arguments are the flags of the same names.

  Returns:
    Videos or segments scored.

  Raises:
    ValueError: naming the flag: a refused output, no segment to score,
      `params` contradicting the model's params.yaml, a bad vocabulary.
  """
  model_path = experiment_params.model_path(saved_model, checkpoint_path)
  _check_outputs(output_file, input_path, saved_model, checkpoint_path,
                 segment_label_ids, vocabulary, output_probabilities,
                 overwrite)
  if segment_top_classes is not None and (not segment_labels or
                                          segment_top_classes <= 0):
    raise ValueError(f'--segment_top_classes={segment_top_classes}: expected '
                     '> 0 (0 on the command line: every class), with '
                     '--segment_labels.')
  check_params(params, model_path)
  data = _data_config(params, input_path, batch_size)
  if segment_labels:
    if vocabulary:
      raise ValueError('--vocabulary names the classes of video-level '
                       'predictions; with --segment_labels the output lists '
                       'segments per class id.')
    class_ids = (segment_eval.read_class_ids(segment_label_ids,
                                             data.num_classes)
                 if segment_label_ids else list(range(data.num_classes)))
    write = _segment_writer(output_file, input_path, data, class_ids,
                            segment_max_per_class, segment_top_classes,
                            segment_short_last)
  else:
    class_ids = range(data.num_classes)
    names = (class_names.load_vocabulary(vocabulary, data.num_classes)
             if vocabulary else None)
    write = _video_writer(output_file, top_k, names)
  predictor = _predictor(params, saved_model, checkpoint_path)
  dataset = dataloader.build_dataset(
      data, every_segment=segment_labels,
      short_last_segment=segment_short_last)
  batches = predict_batches(dataset, predictor)
  level = 'segment' if segment_labels else 'video'
  if output_probabilities:
    count = stored_predictions.write(
        output_probabilities, batches, write, level=level,
        num_classes=data.num_classes, class_ids=class_ids,
        segment_size=data.segment_size if segment_labels else None,
        shard_rows=probabilities_shard_rows,
        source={'model': model_path, 'input_path': input_path})
    logging.info('Stored the scores of %d %ss in %s', count, level,
                 output_probabilities)
  else:
    count = write(batches)
  logging.info('Wrote %d %ss to %s', count, level, output_file)
  return count


def _check_outputs(output_file: str, input_path: str,
                   saved_model: Optional[str], checkpoint_path: Optional[str],
                   segment_label_ids: Optional[str], vocabulary: Optional[str],
                   output_probabilities: Optional[str],
                   overwrite: bool) -> None:
  """Refuses `run`'s outputs before anything is read or written."""
  inputs = [('--input_path', input_path),
            ('--segment_label_ids', segment_label_ids),
            ('--vocabulary', vocabulary)]
  models = [('--saved_model', saved_model),
            ('--checkpoint_path', checkpoint_path)]
  for path, flag in ((output_file, '--output_file'),
                     (named_predictions_path(output_file) if vocabulary
                      else None, '--output_file (its _names.csv)')):
    if path:
      output_files.check_output_file(path, flag, inputs=inputs, models=models,
                                     own=is_own_output, overwrite=overwrite)
  if output_probabilities:
    stored_predictions.check_output(output_probabilities,
                                    '--output_probabilities', inputs=inputs,
                                    models=models)


def _predictor(params: config_definitions.ExperimentConfig,
               saved_model: Optional[str],
               checkpoint_path: Optional[str]) -> Predictor:
  return (_saved_model_predictor(saved_model) if saved_model else
          _checkpoint_predictor(params, checkpoint_path))


def _video_writer(output_file: str, top_k: int,
                  names: Optional[Sequence[str]]
                  ) -> Callable[[Iterable[Dict[str, np.ndarray]]], int]:
  """Writes the submission CSV (and, with `names`, the named CSV) whole."""
  if names is None:
    return lambda batches: output_files.write_atomically(
        output_file, lambda out: write_video_predictions(batches, out, top_k))

  def write(batches):
    named_file = named_predictions_path(output_file)
    # Each whole; a failed read replaces neither.
    count = output_files.write_atomically(
        named_file, lambda named_out: output_files.write_atomically(
            output_file, lambda out: write_video_predictions(
                batches, out, top_k, names, named_out)))
    logging.info('Wrote the predictions with class names to %s', named_file)
    return count
  return write


def _segment_writer(output_file: str, input_path: str, data,
                    class_ids: Sequence[int], max_per_class: int,
                    top_classes: Optional[int], short_last: bool
                    ) -> Callable[[Iterable[Dict[str, np.ndarray]]], int]:
  """Ranks the batches' segments per class and writes the CSV whole."""
  def write(batches):
    ranking = SegmentRanking(class_ids, max_per_class, data.segment_size,
                             top_classes=top_classes)
    for batch in batches:
      ranking.add(batch['video_ids'], batch['segment_start_times'],
                  batch['probabilities'])
    count = ranking.num_segments
    if not count:
      raise ValueError(
          f'--input_path={input_path!r}: no segment to score (no video has '
          f'{"a" if short_last else "a full"} segment of '
          f'{data.segment_size} frames, task.validation_data.segment_size); '
          f'{output_file} not written.')
    output_files.write_atomically(output_file, ranking.write)
    logging.info('Ranked %d segments for %d classes (at most %d each).',
                 count, len(class_ids), max_per_class)
    return count
  return write


def timeline_batches(batches: Iterable[Dict[str, np.ndarray]]
                     ) -> Iterator[timelines.Timeline]:
  """One `core.timelines.Timeline` a video from window rows.

  Raises:
    ValueError: a video's windows are not consecutive (its id repeats).
  """
  seen = set()
  current, rows = None, []

  def finish():
    starts = np.asarray([r[0] for r in rows], np.float64)
    ends = starts + np.asarray([r[1] for r in rows], np.float64)
    return timelines.Timeline(current, starts / FEATURES_PER_SECOND,
                              ends / FEATURES_PER_SECOND,
                              np.stack([r[2] for r in rows]))

  for batch in batches:
    for vid, start, count, scores in zip(
        batch['video_ids'], batch['segment_start_times'], batch['num_frames'],
        batch['probabilities']):
      vid = vid.decode() if isinstance(vid, bytes) else str(vid)
      if vid != current:
        if current is not None:
          yield finish()
        if vid in seen:
          raise ValueError(f'Video {vid!r} was read twice: the input holds '
                           'its id more than once.')
        seen.add(vid)
        current, rows = vid, []
      rows.append((int(start), int(count), scores))
  if current is not None:
    yield finish()


def run_timeline(params: config_definitions.ExperimentConfig, input_path: str,
                 output_file: str, window_seconds: float,
                 stride_seconds: float, saved_model: Optional[str] = None,
                 checkpoint_path: Optional[str] = None,
                 plot: Optional[str] = None, plot_classes: int = 5,
                 batch_size: int = 64,
                 vocabulary: Optional[str] = None,
                 overwrite: bool = False) -> int:
  """Writes the timeline of every video of `input_path`; returns its windows.

  Args as `run`'s, plus the windows' `window_seconds` and `stride_seconds`,
  and `plot` (a PNG of each video's `plot_classes` top classes).

  Raises:
    ValueError: naming the flag: a refused output, video-level records, no
      video with a frame, `params` contradicting the model's params.yaml.
  """
  model_path = experiment_params.model_path(saved_model, checkpoint_path)
  if plot and not plot.lower().endswith('.png'):
    raise ValueError(f'--plot={plot}: expected a .png file.')
  for path, flag in ((output_file, '--output_file'), (plot, '--plot')):
    if path:  # Before anything is read or written.
      output_files.check_output_file(
          path, flag, inputs=[('--input_path', input_path),
                              ('--vocabulary', vocabulary)],
          models=[('--saved_model', saved_model),
                  ('--checkpoint_path', checkpoint_path)],
          own=is_own_output, overwrite=overwrite)
  window = timelines.window_frames(window_seconds, FEATURES_PER_SECOND,
                                   '--window_seconds')
  stride = timelines.window_frames(stride_seconds, FEATURES_PER_SECOND,
                                   '--stride_seconds')
  check_params(params, model_path)
  data = _data_config(params, input_path, batch_size)
  if data.record_type == 'video':
    raise ValueError('--window_seconds needs frame-level records (one '
                     'feature vector a second); the model reads video-level '
                     "records (task.validation_data.record_type='video').")
  names = (class_names.load_vocabulary(vocabulary, data.num_classes)
           if vocabulary else None)
  predictor = _predictor(params, saved_model, checkpoint_path)
  dataset = dataloader.build_dataset(data, windows=(window, stride))
  results = list(timeline_batches(predict_batches(dataset, predictor)))
  if not results:
    raise ValueError(f'--input_path={input_path!r}: no video with a frame; '
                     f'{output_file} not written.')
  rows = timelines.write_outputs(results, output_file, plot, plot_classes,
                                 names)
  logging.info('Wrote %d windows of %d videos to %s', rows, len(results),
               output_file)
  return rows


FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  define = dict(flag_values=flag_values)
  experiment_params.define_model_flags(
      flag_values, ('saved_model', 'checkpoint_path'), DEFAULT_EXPERIMENT)
  flags.DEFINE_string('input_path', None, 'TFRecord file pattern.', **define)
  flags.DEFINE_string('output_file', None, 'CSV file to write.', **define)
  flags.DEFINE_integer('top_k', 20, 'Pairs per video.', **define)
  flags.DEFINE_bool('segment_labels', False,
                    'Segment-level predictions: every segment of every video.',
                    **define)
  flags.DEFINE_integer('segment_max_per_class', 100000,
                       'Segments kept per class (segment level).', **define)
  flags.DEFINE_string('segment_label_ids', None,
                      'File of the class ids to rank, one a line (segment '
                      'level; default: every class).', **define)
  flags.DEFINE_bool('segment_short_last', False,
                    "Also score each video's last segment when shorter than "
                    'segment_size frames (segment level).', **define)
  flags.DEFINE_integer('batch_size', 64, 'Inference batch size.', **define)
  flags.DEFINE_string('vocabulary', None,
                      "The dataset's vocabulary.csv (Index and Name columns; "
                      'video level): also writes the predictions with class '
                      'names, to <output_file stem>_names.csv.', **define)
  flags.DEFINE_integer('segment_top_classes', 0,
                       "A segment enters only its best N classes' lists "
                       "(the starter inference.py's rule: 20); 0: every "
                       'segment is ranked for every class (segment level).',
                       **define)
  flags.DEFINE_string('output_probabilities', None,
                      "Also store every video's (segment's) scores, ids and "
                      'labels in this directory (float16 shards, '
                      'official_ext.yt8m.stored_predictions) for '
                      'official_ext.yt8m.ensemble.', **define)
  flags.DEFINE_integer('probabilities_shard_rows',
                       stored_predictions.DEFAULT_SHARD_ROWS,
                       'Rows (videos or segments) a shard of '
                       '--output_probabilities.', **define)
  flags.DEFINE_bool('overwrite', False, 'Replace an existing output file '
                    'that predict did not write.', **define)
  timelines.define_flags(flag_values, 'seconds (features) a window; writes '
                         'a window a row instead of the submission.')
  flags.mark_flags_as_required(['input_path', 'output_file'],
                               flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Writes the predictions the parsed `flag_values` ask for."""
  del argv
  fv = flag_values
  params = experiment_params.params_from_flags(fv, DEFAULT_EXPERIMENT)
  timeline = (fv.window_seconds, fv.stride_seconds)
  if any(v is not None for v in timeline) or fv.plot:
    if fv.output_probabilities:
      raise ValueError('--output_probabilities stores video or segment '
                       'scores; it does not go with --window_seconds.')
    if None in timeline or fv.segment_labels:
      raise ValueError(
          '--window_seconds and --stride_seconds go together (--plot needs '
          'them) and exclude --segment_labels; got --window_seconds='
          f'{fv.window_seconds}, --stride_seconds={fv.stride_seconds}, '
          f'--segment_labels={fv.segment_labels}.')
    rows = run_timeline(params, fv.input_path, fv.output_file,
                        fv.window_seconds, fv.stride_seconds,
                        saved_model=fv.saved_model,
                        checkpoint_path=fv.checkpoint_path, plot=fv.plot,
                        plot_classes=fv.plot_classes,
                        batch_size=fv.batch_size, vocabulary=fv.vocabulary,
                        overwrite=fv.overwrite)
    plot = f' and {fv.plot}' if fv.plot else ''
    print(f'Wrote {rows} windows to {fv.output_file}{plot}')
    return
  count = run(params, fv.input_path, fv.output_file,
              saved_model=fv.saved_model,
              checkpoint_path=fv.checkpoint_path, top_k=fv.top_k,
              segment_labels=fv.segment_labels,
              segment_max_per_class=fv.segment_max_per_class,
              batch_size=fv.batch_size,
              segment_label_ids=fv.segment_label_ids,
              segment_short_last=fv.segment_short_last,
              vocabulary=fv.vocabulary,
              segment_top_classes=fv.segment_top_classes or None,
              output_probabilities=fv.output_probabilities,
              probabilities_shard_rows=fv.probabilities_shard_rows,
              overwrite=fv.overwrite)
  named = (f' and {named_predictions_path(fv.output_file)}'
           if fv.vocabulary else '')
  print(f'Wrote {count} {"segments" if fv.segment_labels else "videos"} '
        f'to {fv.output_file}{named}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
