"""Video files in and out (OpenCV): the one reader and labeller of every command
that takes a user's videos (converter, `predict`, `extract_features`, the Beam
pipelines), the writer, and `python -m official_ext.assemblenet.videos`, the
demo's moving shapes as encoded videos in class sub-folders."""
import csv
import dataclasses
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

VIDEO_EXTENSIONS = ('.mp4', '.avi', '.mkv', '.webm', '.mov', '.m4v', '.mpg',
                    '.mpeg')

# FourCC codes `write_video` uses per file extension.
_FOURCC = {'.mp4': 'mp4v', '.mov': 'mp4v', '.m4v': 'mp4v', '.avi': 'MJPG',
           '.mkv': 'MJPG', '.webm': 'VP80'}


def is_video(path: str) -> bool:
  return path.lower().endswith(VIDEO_EXTENSIONS)


def find_videos(video_dir: str,
                extensions: Sequence[str] = VIDEO_EXTENSIONS) -> List[str]:
  """Paths (relative to `video_dir`, sorted) of the video files under it."""
  out = []
  for root, _, files in os.walk(video_dir):
    for f in files:
      if f.lower().endswith(tuple(extensions)):
        out.append(os.path.relpath(os.path.join(root, f), video_dir))
  return sorted(out)


def read_labels_csv(path: str) -> Dict[str, List[int]]:
  """{relative video path: class ids} from lines `path.mp4,3;17` (';'-
  separated ids; lines starting with '#' skipped); ValueError naming the
  file and line of a malformed one, or of a video's second row."""
  return {video: ids for video, (_, ids) in _labels_csv_rows(path).items()}


def _labels_csv_rows(path: str) -> Dict[str, Tuple[int, List[int]]]:
  """`read_labels_csv` with each row's line: {video: (line, class ids)}."""
  labels = {}
  with open(path, newline='') as f:
    for lineno, row in enumerate(csv.reader(f), 1):
      if not row or row[0].startswith('#'):
        continue
      if len(row) != 2:
        raise ValueError(f'{path}:{lineno}: expected "video,ids"; got {row}')
      try:
        ids = [int(x) for x in row[1].split(';') if x.strip()]
      except ValueError as e:
        raise ValueError(f'{path}:{lineno}: class ids must be ints separated '
                         f'by ";"; got {row[1]!r}') from e
      if not ids:
        raise ValueError(f'{path}:{lineno}: video {row[0]!r} has no label.')
      if row[0] in labels:
        raise ValueError(
            f'{path}:{lineno}: video {row[0]!r} is labelled on line '
            f'{labels[row[0]][0]} already; give each video one row (its '
            'class ids ";"-separated).')
      labels[row[0]] = (lineno, ids)
  return labels


def video_labels(video_dir: str, videos: Sequence[str],
                 labels_csv: Optional[str] = None
                 ) -> Tuple[Dict[str, List[int]], Optional[List[str]]]:
  """({video: class ids}, sorted class folder names or None) of `videos`
  (paths relative to `video_dir`): from `labels_csv` (every video in it, every
  row naming one), else from class sub-folders (ids: the sorted names'
  indices).

  Raises:
    ValueError: naming the CSV and the videos it lacks or its lines naming
      no video (a case-only mismatch said so), or (without a CSV) a video
      outside a class sub-folder."""
  if labels_csv:
    rows = _labels_csv_rows(labels_csv)
    check_labels_match(labels_csv, rows, video_dir, videos)
    table = {video: ids for video, (_, ids) in rows.items()}
    missing = [v for v in videos if v not in table]
    if missing:
      raise ValueError(f'{labels_csv} has no label for {len(missing)} videos, '
                       f'e.g. {missing[:3]}')
    return {v: table[v] for v in videos}, None
  outside = [v for v in videos if os.sep not in v]
  if outside:
    raise ValueError('without --labels_csv every video must be in a class '
                     f'sub-folder of {video_dir}; {outside[:3]} are not')
  classes = sorted({v.split(os.sep)[0] for v in videos})
  index = {c: i for i, c in enumerate(classes)}
  return {v: [index[v.split(os.sep)[0]]] for v in videos}, classes


def check_labels_match(labels_csv: str,
                       rows: Dict[str, Tuple[int, List[int]]],
                       video_dir: str, videos: Sequence[str]) -> None:
  """ValueError naming `labels_csv` and the lines of its `rows` ({video:
  (line, ids)}) that name none of `videos`, saying which differ from a
  video only in letter case."""
  present = set(videos)
  by_case = {v.lower(): v for v in videos}
  unmatched = sorted((line, video) for video, (line, _) in rows.items()
                     if video not in present)
  if not unmatched:
    return
  shown = []
  for line, video in unmatched[:5]:
    near = by_case.get(video.lower())
    shown.append(f'line {line} {video!r}' + (
        f' (differs only in case from {near!r})' if near else ''))
  more = f', and {len(unmatched) - 5} more' if len(unmatched) > 5 else ''
  raise ValueError(
      f'{labels_csv}: {len(unmatched)} row(s) name no video under '
      f'{video_dir}: {", ".join(shown)}{more}. Each row must name a video '
      'file by its path relative to the folder, exactly.')


@dataclasses.dataclass
class Video:
  """Decoded frames of one file."""
  frames: np.ndarray  # uint8 RGB [N, H, W, 3].
  fps: float  # Of `frames`, after resampling; 0.0 when none is stated.
  source_fps: float  # The file's stated rate (0.0 if none).
  # Each kept frame's index among the file's decoded frames, and their count.
  source_indices: Optional[np.ndarray] = None
  num_source_frames: int = 0

  @property
  def duration(self) -> float:
    """Seconds the frames span (0.0 without a frame rate)."""
    return len(self.frames) / self.fps if self.fps else 0.0


def read_video(path: str, fps: Optional[float] = None,
               short_side: Optional[int] = None) -> Video:
  """Decodes a video file whole (OpenCV's FFmpeg decoder, RGB): resampled to
  `fps` (frames nearest a regular grid; never more than the source's) and
  resized to `short_side` (`cv2.INTER_AREA`) if given.

  Raises:
    ValueError: naming the file: it cannot be read, or it decodes fewer
      frames than its container states (naming both counts; a container
      stating none is not checked)."""
  import cv2  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(path):
    raise ValueError(f'video file {path} does not exist')
  cap = cv2.VideoCapture(path)
  if not cap.isOpened():
    raise ValueError(f'cannot open video file {path}')
  src_fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
  stated = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
  step = (src_fps / fps) if (fps and src_fps > fps) else 1.0
  frames, kept, index, next_keep = [], [], 0, 0.0
  try:
    while True:
      ok, frame = cap.read()
      if not ok:
        break
      if index >= next_keep - 1e-6:
        next_keep += step
        frame = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
        if short_side:
          h, w = frame.shape[:2]
          scale = short_side / min(h, w)
          if scale != 1.0:
            frame = cv2.resize(frame, (max(1, round(w * scale)),
                                       max(1, round(h * scale))),
                               interpolation=cv2.INTER_AREA)
        frames.append(frame)
        kept.append(index)
      index += 1
  finally:
    cap.release()
  if not frames:
    raise ValueError(f'video file {path} has no decodable frame')
  if index < stated:
    raise ValueError(
        f'video file {path} is incomplete: {index} of the {stated} frames its '
        'container states decode (a truncated or damaged file); it is not '
        'read as a shorter video.')
  kept_fps = src_fps / step if src_fps else 0.0
  return Video(np.stack(frames), kept_fps, src_fps,
               np.asarray(kept, np.int64), index)


def read_frames(path: str, fps: Optional[float] = None,
                short_side: Optional[int] = None) -> np.ndarray:
  """uint8 RGB frames [N, H, W, 3] of a video (`read_video`'s frames)."""
  return read_video(path, fps, short_side).frames


def write_video(path: str, frames: np.ndarray, fps: float) -> str:
  """Encodes uint8 RGB frames [N, H, W, 3] into `path`, the codec by its
  extension (`_FOURCC`); returns `path`; ValueError naming the file if OpenCV
  cannot write it or the frames are not uint8 [N, H, W, 3]."""
  import cv2  # pylint: disable=g-import-not-at-top
  frames = np.asarray(frames)
  if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
    raise ValueError(f'write_video({path}): frames must be uint8 '
                     f'[N, H, W, 3]; got {frames.dtype} {frames.shape}')
  ext = os.path.splitext(path)[1].lower()
  if ext not in _FOURCC:
    raise ValueError(f'write_video({path}): no codec for {ext!r}; use one of '
                     f'{sorted(_FOURCC)}')
  height, width = frames.shape[1:3]
  writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*_FOURCC[ext]),
                           float(fps), (width, height))
  if not writer.isOpened():
    raise ValueError(f'OpenCV cannot write {path} (codec {_FOURCC[ext]})')
  try:
    for frame in frames:
      writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
  finally:
    writer.release()
  return path


def write_demo_videos(video_dir: str, videos_per_class: int,
                      num_frames: int = 16, size: int = 32, fps: float = 8.0,
                      seed: int = 0, extension: str = '.mp4'
                      ) -> Dict[str, int]:
  """Writes the demo's moving shapes as encoded videos, returns {path: label}:
  `video_dir/<label>_<class name>/<class name>_<i>.<ext>`, `videos_per_class`
  of each class, `num_frames` frames of `size`^2 at `fps` (deterministic in
  `seed`): class sub-folders whose sorted names give the demo's label ids."""
  from official_ext.assemblenet import demo_data  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  written = {}
  for i in range(videos_per_class):
    for label, name in enumerate(demo_data.CLASS_NAMES):
      folder = os.path.join(video_dir, f'{label}_{name}')
      os.makedirs(folder, exist_ok=True)
      path = os.path.join(folder, f'{name}_{i:04d}{extension}')
      write_video(path, demo_data.render_video(rng, label, num_frames, size),
                  fps)
      written[path] = label
  return written



def define_flags(flag_values=None) -> None:
  """The flags of `python -m official_ext.assemblenet.videos` (writes the
  demo videos) in `flag_values` (default: absl's FLAGS)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  d = dict(flag_values=flags.FLAGS if flag_values is None else flag_values)
  flags.DEFINE_string('output_dir', None, 'New or empty folder.', **d)
  flags.DEFINE_integer('videos_per_class', None, 'Videos of each class.', **d)
  flags.DEFINE_integer('num_frames', 16, 'Frames per video.', **d)
  flags.DEFINE_integer('size', 32, 'Height and width.', **d)
  flags.DEFINE_float('fps', 8.0, 'Frame rate stated in the files.', **d)
  flags.DEFINE_integer('seed', 0, 'Random seed (use another per split).', **d)
  flags.DEFINE_string('extension', '.mp4', 'File type (codec).', **d)
  flags.mark_flags_as_required(['output_dir', 'videos_per_class'],
                               flag_values=d['flag_values'])


def main(argv: Sequence[str], flag_values=None) -> None:
  """Writes `write_demo_videos(...)` into a new or empty --output_dir."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  del argv
  fv = flags.FLAGS if flag_values is None else flag_values
  if os.path.isdir(fv.output_dir) and os.listdir(fv.output_dir):
    raise ValueError(f'--output_dir={fv.output_dir} is not empty; choose a '
                     'new or empty folder.')
  written = write_demo_videos(fv.output_dir, fv.videos_per_class,
                              fv.num_frames, fv.size, fv.fps, fv.seed,
                              fv.extension)
  print(f'wrote {len(written)} videos to {fv.output_dir}')


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  define_flags()
  app.run(main)
