r"""YouTube-8M inference: writes the challenge's submission CSV files.

  python -m official_ext.yt8m.predict --saved_model=/tmp/export \
      --input_path='/data/yt8m/test*.tfrecord' --output_file=/tmp/pred.csv
  python -m official_ext.yt8m.predict --checkpoint_path=/tmp/yt8m_demo \
      --input_path=... --output_file=...
  # 3rd challenge (segment level), on its unrated test records:
  python -m official_ext.yt8m.predict --saved_model=/tmp/export \
      --segment_labels --segment_label_ids=segment_label_ids.csv \
      --input_path='/data/yt8m/3/frame/test/test*.tfrecord' \
      --output_file=/tmp/segments.csv

Configuration: the model and its input pipeline (features, frames, L2
normalisation, segment_size, num_classes) come from the `params.yaml` next to
the model: `export_saved_model` writes one into the SavedModel directory and
`official_ext.train` into the model_dir (--checkpoint_path is that directory
or a `ckpt-N` prefix inside it). Without --experiment, a model without a
params.yaml is an error naming the file (a default pipeline, e.g. 300 frames
for a model exported with 64, would score every video differently without
one); --experiment gives the config class and the values no params.yaml
sets. --config_file and --params_override apply on top, and contradicting
params.yaml in a model-affecting key is an error naming the key and both
values (`core.experiment_params.load_model_params`, shared with
`official_ext.assemblenet.predict`); `run` checks the config it is given
against the model's params.yaml the same way.

An --output_file whose folder is missing, that is one of the inputs
(--input_path's files, --segment_label_ids, --vocabulary), or that lies
inside a model_dir or a SavedModel directory (the model's, or any directory
above it holding `saved_model.pb` or a `checkpoint` file) is refused before
anything is read or written (`core.output_files.check_output_file`); so is
an existing file there (or at its `_names.csv`, --plot) that predict did not
write (it begins with none of its outputs' headers, `is_own_output`),
unless --overwrite.

The output is written whole or not at all: into a temporary file beside
--output_file, renamed into place after the last record was read and the
last line written. On any failure (an unreadable or truncated input, a
video read twice, ...) an existing --output_file is left as it was and the
temporary file removed.

Video level (default): header `VideoId,LabelConfidencePairs`, one line a
video: `<id>,<label> <score> <label> <score> ...`, the top_k (20) classes by
descending score (ties: lower class id first).
A model trained on video-level records (`record_type` 'video') reads its
own records the same way (its SavedModel's `serve_features` takes no
`num_frames`); `--segment_labels` needs frame-level records.

With `--vocabulary` (the dataset's vocabulary.csv, `official_ext.yt8m.
class_names`), the same predictions are also written with class names beside
the ids, to `<output_file stem>_names.csv` (header
`VideoId,Rank,LabelId,Name,Score`, one row per video and rank, CSV-quoted);
the submission CSV is unchanged.

Segment level (`--segment_labels`), as the 3rd YouTube-8M challenge defines
it: every segment of `segment_size` (5) frames of every video is scored,
starting at frames 0, 5, 10, ... of the whole video (not cut at max_frames);
ratings in the records, if any, are not used. Only full segments are scored
(a segment is 5 frames); a last segment shorter than segment_size frames is
skipped unless `--segment_short_last`, which scores it with its true frame
count as the challenge's starter `inference.py` does. Output: header
`Class,Segments`, one line a class, `<class>,<id>:<start> <id>:<start> ...`
by descending score (ties: the segment read first), at most
`--segment_max_per_class` (100,000) segments a class. `--segment_label_ids`
(the challenge's `segment_label_ids.csv`: one class id a line, optionally
under a header line such as `Index`) restricts the classes scored and
written; without it every class is written. An input without a single
segment to score is an error naming it. Evaluate a submission against rated
records with `python -m official_ext.yt8m.segment_eval`.
`--segment_top_classes=20` applies the starter `inference.py`'s rule: a
segment enters a class's list only if the class is among the segment's 20
best (`SegmentRanking`); by default every segment is ranked for every class.

`--output_probabilities=DIR` also stores every video's (segment's) scores,
ids and labels as float16 shards (`stored_predictions`), written with the
CSV, whole or not at all, for `python -m official_ext.yt8m.ensemble`.

Timeline (`--window_seconds`, `--stride_seconds`, optionally `--plot`;
`run_timeline`): windows of the whole video (not cut at max_frames; YT8M
features are one a second, so seconds are frames, rounded), by
`core.timelines.window_bounds`, each scored as a video of its own
(`dataloader.Parser.every_window_fn`); one CSV row a window, the PNG of each
video's top classes over time (`core.timelines`, shared with
`official_ext.assemblenet.predict`). With a DBoF model of pooling 'none' a
window's scores are the mean of the model's per-frame probabilities over
its frames. Frame-level records only.

Memory: one batch, plus for segments the per-class top lists
(`SegmentRanking`: 10 bytes per kept segment, classes x cap at most, plus a
fixed 48 MiB candidate buffer and the interned video ids): 1.05 GB for the
1,000 rated classes and 3.91 GB for all 3,862 at the default cap.
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
  """Whether a file's first bytes are those of an output of this command
  (submission, named, segment or timeline CSV, timeline plot)."""
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
  """Writes the video-level CSV from batches with `video_ids`, predictions.

  Args:
    batches: dicts with `video_ids` (bytes or str [b]) and `probabilities`
      float [b, num_classes].
    out: text stream.
    top_k: pairs per video.
    names: class names by id (`class_names.load_vocabulary`), with
    named_out: the stream of the same predictions with names: header
      `NAMED_HEADER`, one row per (video, rank), CSV-quoted.

  Returns:
    Number of videos written.
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
  """Where `--vocabulary` writes the named predictions: `pred.csv` ->
  `pred_names.csv`, beside the submission CSV."""
  root, ext = os.path.splitext(output_file)
  return f'{root}_names{ext or ".csv"}'


# Bytes per entry of the ranking: kept (float32 score, int32 video index,
# uint16 segment index) and pending (the same plus an int16 class index).
_KEPT_BYTES = 4 + 4 + 2
_PENDING_BYTES = _KEPT_BYTES + 2
DEFAULT_PENDING_SIZE = 1 << 22  # 4,194,304 candidates: 48 MiB.


def _pending_entries(num_classes: int, cap: int, pending_size: int) -> int:
  """Candidate buffer entries: at least one row of classes, and never more
  than classes x cap (more candidates are never needed at once)."""
  return max(num_classes, min(int(pending_size), num_classes * cap))


class SegmentRanking:
  """Per-class top `cap` segments by score, in bounded memory.

  Every segment has a score for every ranked class, so all classes fill up
  together: the first `cap` segments are stored as they come. After that a
  segment is a candidate for a class only if it scores above the class's
  current `cap`-th best (a per-class threshold); candidates wait in a
  fixed-size buffer, and when it is full each class merges its candidates
  into its kept set, keeps the best `cap` (by score, ties: the segment read
  first) and raises its threshold.

  Storage: kept `scores` float32, `videos` int32 (index into the interned
  video ids) and `segments` uint16 (start // segment_size), each
  [classes, <= cap] (10 bytes an entry, grown by doubling up to cap), plus
  the candidate buffer of `pending_size` entries (12 bytes each) and one
  string per video id. `memory_bound` gives the array bytes.

  With `top_classes` (the starter `inference.py`'s rule, its `--top_k` 20)
  a segment enters a class's list only if the class is among the segment's
  `top_classes` best of the ranked classes (ties: the class earlier in
  `class_ids`); its other scores are set to -inf, which no list keeps, so a
  class's list may hold fewer than `cap` segments. Without it (None) every
  segment is ranked for every class.
  """

  def __init__(self, class_ids: Sequence[int], cap: int, segment_size: int,
               pending_size: int = DEFAULT_PENDING_SIZE,
               top_classes: Optional[int] = None):
    """An empty ranking.

    Args:
      class_ids: the classes ranked (columns of the probabilities), in output
        order; at most 32,767.
      cap: segments kept per class (> 0).
      segment_size: frames per segment; start times must be multiples of it.
      pending_size: candidate buffer entries (> 0; raised to one row of
        classes, lowered to classes x cap).
      top_classes: None (every segment in every class's list), or > 0: a
        segment enters only the lists of its `top_classes` best classes.
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
    """Adds a batch of segments.

    Args:
      video_ids: bytes or str [b], the segments' video ids.
      segment_start_times: int [b], first frame of each segment.
      probabilities: float [b, num_classes], all classes of the model (the
        ranked `class_ids` are taken from it).
    """
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


def load_params(experiment: Optional[str] = None,
                config_files: Sequence[str] = (),
                params_override: str = '',
                saved_model: Optional[str] = None,
                checkpoint_path: Optional[str] = None
                ) -> config_definitions.ExperimentConfig:
  """The config of the model predict runs (the module docstring's rules):
  `experiment_params.load_model_params` with `DEFAULT_EXPERIMENT`."""
  return experiment_params.load_model_params(
      DEFAULT_EXPERIMENT, experiment, config_files, params_override,
      saved_model=saved_model, checkpoint_path=checkpoint_path)


def check_params(params: config_definitions.ExperimentConfig,
                 model_path: str) -> None:
  """`experiment_params.check_model_params`: a model-affecting key of
  `params` (the model, features, max_frames, segment_size, normalisation,
  classes) that differs from the model's params.yaml is a ValueError."""
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
  """Predicts every record of `input_path` into `output_file`.

  Args:
    params: the experiment config (`experiment_params.load_params`); its
      `task.validation_data` gives the input pipeline.
    input_path: TFRecord file pattern.
    output_file: the CSV to write.
    saved_model: a SavedModel of `export_saved_model`, or
    checkpoint_path: a training checkpoint (exactly one of the two).
    top_k: pairs per video (video level).
    segment_labels: segment level (see the module docstring).
    segment_max_per_class: segments written per class (segment level).
    batch_size: inference batch size (videos, or segments).
    segment_label_ids: file of the class ids to rank (segment level).
    segment_short_last: also score each video's last, short segment.
    vocabulary: the dataset's vocabulary.csv (video level): the predictions
      are also written with class names, to `named_predictions_path(
      output_file)` (`write_video_predictions`).
    segment_top_classes: segment level: a segment enters only the lists of
      its best `segment_top_classes` classes (the starter's rule, 20;
      `SegmentRanking`); None: every segment is ranked for every class.
    output_probabilities: also store every video's (segment's) scores, with
      ids and labels, in this directory (`stored_predictions`), for
      `official_ext.yt8m.ensemble`.
    probabilities_shard_rows: rows a shard of `output_probabilities`.
    overwrite: replace an existing output file that predict did not write.

  Returns:
    Videos (video level) or segments (segment level) scored.

  Raises:
    FileNotFoundError: the folder of `output_file` does not exist.
    ValueError: `output_file` (or its `_names.csv`) is one of the inputs, or
      lies inside a model_dir or SavedModel directory
      (`output_files.check_output_file`, before anything is read or
      written); segment level and no video of `input_path` has a segment;
      `params` contradicts the model's params.yaml (`check_params`); a
      `vocabulary` with segment level, or one that does not load
      (`class_names.load_vocabulary`); an existing output file predict did
      not write, without `overwrite` (`output_files.OutputExistsError`).

  `output_file` is written whole or not at all (`core.output_files.write_atomically`): after
  any failure an existing file is as it was.
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
  """Ranks the segments of the batches per class and writes the CSV whole.

  Raises:
    ValueError: no segment to score.
  """
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
  """Groups window rows (video id, first frame, frame count, scores) into
  one `core.timelines.Timeline` a video; features are 1 a second, so frames
  are seconds.

  Raises:
    ValueError: a video's windows are not consecutive (the input holds a
      video id more than once).
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
  """Writes the timeline of every video of `input_path` (module docstring).

  Args:
    params: the experiment config (`load_params`); frame-level records.
    input_path: TFRecord file pattern.
    output_file: the timeline CSV (`core.timelines.write_csv`).
    window_seconds: seconds (features) a window, rounded to whole ones.
    stride_seconds: seconds between window starts, rounded likewise.
    saved_model: a SavedModel of `export_saved_model`, or
    checkpoint_path: a training checkpoint (exactly one of the two).
    plot: also a PNG of each video's top classes over time.
    plot_classes: classes a video in `plot`.
    batch_size: windows a batch.
    vocabulary: the dataset's vocabulary.csv: class names as columns.
    overwrite: replace an existing output file that predict did not write.

  Returns:
    Windows written.

  Raises:
    ValueError: naming the flag: an output that is an input or lies inside a
      model, or (without `overwrite`) an existing file predict did not
      write; video-level records; no video with a frame; `params`
      contradicting the model's params.yaml.
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
  flags.DEFINE_string('experiment', None,
                      'Experiment giving the config class and the values no '
                      "params.yaml sets; needed only when the model has no "
                      'params.yaml (default: the params.yaml beside the model '
                      f'is read into {DEFAULT_EXPERIMENT!r}).', **define)
  flags.DEFINE_multi_string('config_file', None,
                            'YAML config overrides, after params.yaml.',
                            **define)
  flags.DEFINE_string('params_override', '', 'Comma-separated overrides.',
                      **define)
  flags.DEFINE_string('saved_model', None, 'SavedModel directory.', **define)
  flags.DEFINE_string('checkpoint_path', None, 'Or a training checkpoint.',
                      **define)
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
  params = load_params(fv.experiment, fv.config_file, fv.params_override,
                       saved_model=fv.saved_model,
                       checkpoint_path=fv.checkpoint_path)
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
