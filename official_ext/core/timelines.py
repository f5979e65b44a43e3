"""Timelines of long videos for the predict commands: windows, the per-window
CSV, the plot."""
import csv
import dataclasses
import io
from typing import IO, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.core import output_files

CSV_HEADER = ('VideoId', 'Start', 'End')
# The PNG text chunk `Software` of `render_plot`'s plots.
PLOT_SOFTWARE = 'official_ext.core.timelines'


def define_flags(flag_values, window_help: str = 'seconds a window.'
                 ) -> None:
  """Defines --window_seconds, --stride_seconds, --plot, --plot_classes."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  define = dict(flag_values=flag_values)
  flags.DEFINE_float('window_seconds', None, f'Timeline: {window_help}',
                     **define)
  flags.DEFINE_float('stride_seconds', None,
                     'Timeline: seconds between window starts.', **define)
  flags.DEFINE_string('plot', None, 'Timeline: PNG of the top classes over '
                      'time.', **define)
  flags.DEFINE_integer('plot_classes', 5, 'Classes a video in --plot.',
                       **define)
ERROR_COLUMN = 'Error'


def window_frames(seconds: float, fps: float, flag: str,
                  video: str = 'the video') -> int:
  """Frames of `seconds` at `fps` (rounded, >= 1); ValueError naming `flag`."""
  if not (np.isfinite(seconds) and seconds > 0):
    raise ValueError(f'{flag}={seconds}: expected a positive number of '
                     'seconds.')
  if not (np.isfinite(fps) and fps > 0):
    raise ValueError(f'{flag}={seconds}: {video} has no frame rate '
                     f'({fps}); seconds cannot be turned into frames.')
  return max(1, int(round(seconds * fps)))


def window_bounds(num_frames: Union[int, tf.Tensor], window: int,
                  stride: int) -> Tuple[tf.Tensor, tf.Tensor]:
  """(starts, ends) int32 [W] of a video's windows, in TensorFlow ops."""
  if window < 1 or stride < 1:
    raise ValueError(f'window_bounds: window={window} and stride={stride} '
                     'frames; expected >= 1 each.')
  n = tf.cast(num_frames, tf.int32)
  starts = tf.range(0, n, stride, dtype=tf.int32)
  full = tf.reduce_sum(tf.cast(starts + window <= n, tf.int32))
  # Frames after the last full window (all of them without one): the next
  # window, cut at the end, takes them.
  last_end = tf.where(full > 0, (full - 1) * stride + window, 0)
  keep = tf.minimum(full + tf.cast(last_end < n, tf.int32), tf.size(starts))
  starts = starts[:keep]
  return starts, tf.minimum(starts + window, n)


@dataclasses.dataclass
class Timeline:
  """One video's window `starts`, `ends` (seconds) and `scores` [W, C]."""
  video_id: str
  starts: np.ndarray
  ends: np.ndarray
  scores: np.ndarray

  def __post_init__(self):
    self.starts = np.asarray(self.starts, np.float64)
    self.ends = np.asarray(self.ends, np.float64)
    self.scores = np.asarray(self.scores, np.float64)
    w = self.starts.shape[0]
    if self.ends.shape != (w,) or self.scores.ndim != 2 or (
        self.scores.shape[0] != w):
      raise ValueError(
          f'Timeline of {self.video_id}: starts {self.starts.shape}, ends '
          f'{self.ends.shape} and scores {self.scores.shape} do not describe '
          'the same windows ([W], [W], [W, classes]).')
    if not np.isfinite(self.scores).all():
      w = int(np.flatnonzero(~np.isfinite(self.scores).all(axis=1))[0])
      raise ValueError(
          f'Timeline of {self.video_id}: the window [{self.starts[w]:g} s, '
          f'{self.ends[w]:g} s) has a non-finite score; nothing was written.')


def class_columns(num_classes: int,
                  names: Optional[Sequence[str]] = None) -> List[str]:
  """The CSV's class columns: the vocabulary's names, or the class ids."""
  if names is None:
    return [str(c) for c in range(num_classes)]
  if len(names) != num_classes:
    raise ValueError(f'{len(names)} class names for {num_classes} classes.')
  return list(names)


def write_csv(timelines: Sequence[Timeline], out: IO,
              names: Optional[Sequence[str]] = None,
              skipped: Sequence[Tuple[str, str]] = ()) -> int:
  """Writes the timelines' rows and one per `skipped` video; the rows."""
  if not timelines:
    raise ValueError('No timeline to write (no video had a window).')
  num_classes = timelines[0].scores.shape[1]
  writer = csv.writer(out, lineterminator='\n')
  writer.writerow(CSV_HEADER + tuple(class_columns(num_classes, names)) +
                  (ERROR_COLUMN,))
  count = 0
  for timeline in timelines:
    if timeline.scores.shape[1] != num_classes:
      raise ValueError(f'Timeline of {timeline.video_id} has '
                       f'{timeline.scores.shape[1]} classes; the first has '
                       f'{num_classes}.')
    for start, end, row in zip(timeline.starts, timeline.ends,
                               timeline.scores):
      writer.writerow([timeline.video_id, f'{start:.6f}', f'{end:.6f}'] +
                      [f'{s:.6f}' for s in row] + [''])
      count += 1
  for video_id, error in skipped:
    writer.writerow([video_id, '', ''] + [''] * num_classes + [error])
  return count


def top_classes(timeline: Timeline, top: int) -> List[int]:
  """The `top` classes of highest score in any window (ties: lower id)."""
  best = timeline.scores.max(axis=0)
  return [int(c) for c in np.argsort(-best, kind='stable')[:top]]


def render_plot(timelines: Sequence[Timeline], top: int = 5,
                names: Optional[Sequence[str]] = None) -> bytes:
  """A PNG (bytes) of each video's `top` classes over time, one panel each."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  if not timelines:
    raise ValueError('No timeline to plot (no video had a window).')
  if top < 1:
    raise ValueError(f'--plot_classes={top}; expected >= 1.')
  columns = class_columns(timelines[0].scores.shape[1], names)
  figure, axes = pyplot.subplots(
      len(timelines), 1, figsize=(8, 2.5 * len(timelines)), squeeze=False)
  try:
    for axis, timeline in zip(axes[:, 0], timelines):
      centres = (timeline.starts + timeline.ends) / 2
      for c in top_classes(timeline, top):
        axis.plot(centres, timeline.scores[:, c], marker='.',
                  label=columns[c])
      axis.set_title(timeline.video_id)
      axis.set_xlabel('time (s)')
      axis.set_ylabel('score')
      axis.set_ylim(bottom=0)
      axis.legend(loc='upper right', fontsize='small')
    figure.tight_layout()
    image = io.BytesIO()
    figure.savefig(image, format='png',
                   metadata={'Software': PLOT_SOFTWARE})
  finally:
    pyplot.close(figure)
  return image.getvalue()


def is_own_output(head: bytes) -> bool:
  """Whether a file's first bytes are a timeline CSV or plot of this module."""
  return (head.startswith((','.join(CSV_HEADER) + ',').encode()) or
          (head.startswith(b'\x89PNG') and
           b'tEXtSoftware\x00' + PLOT_SOFTWARE.encode() in head))


def write_outputs(timelines: Sequence[Timeline], csv_path: str,
                  plot_path: Optional[str] = None, top: int = 5,
                  names: Optional[Sequence[str]] = None,
                  skipped: Sequence[Tuple[str, str]] = ()) -> int:
  """Writes the CSV and the PNG (rendered first), each whole; the rows."""
  image = render_plot(timelines, top, names) if plot_path else None
  rows = output_files.write_atomically(
      csv_path, lambda out: write_csv(timelines, out, names, skipped))
  if plot_path:
    output_files.write_atomically(plot_path, lambda out: out.write(image),
                                  binary=True)
  return rows
