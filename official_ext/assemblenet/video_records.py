"""The video converter: a folder of video files as Model Garden video TFRecords
(one SequenceExample of JPEG frames and class ids a video), written whole or
not at all; `encode_video` is the per-video function of this and of the Beam
pipeline (docs/assemblenet.md#experiments-and-data)."""
import os
import re
import sys
import tempfile
from typing import Callable, List, Optional, Sequence, Tuple

from official_ext.assemblenet import videos as videos_lib
from official_ext.core import output_files

VIDEO_EXTENSIONS = videos_lib.VIDEO_EXTENSIONS

# Suffixes of the files beside the shards.
CLASSES_SUFFIX = '.classes.txt'
FAILURES_SUFFIX = '.failures.tsv'


def make_example(frames, labels: Sequence[int], clip_id: str,
                 jpeg_quality: int = 90):
  """The `tf.train.SequenceExample` of one video: uint8 RGB `frames` [N, H, W,
  3] as JPEGs of `jpeg_quality`, its class ids and `clip_id` (its path
  relative to the video folder)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  ex = tf.train.SequenceExample()
  ex.context.feature['clip/label/index'].int64_list.value.extend(labels)
  ex.context.feature['clip/id'].bytes_list.value.append(clip_id.encode())
  fl = ex.feature_lists.feature_list['image/encoded']
  for frame in frames:
    fl.feature.add().bytes_list.value.append(
        tf.io.encode_jpeg(frame, quality=jpeg_quality).numpy())
  return ex


def read_video_file(path: str, fps: Optional[float] = None,
                    short_side: Optional[int] = None) -> videos_lib.Video:
  """`videos.read_video`, for a remote file (`gs://...`) through a local
  copy (OpenCV reads local files only); ValueError naming the file."""
  if '://' not in path:
    return videos_lib.read_video(path, fps, short_side)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as folder:
    local = os.path.join(folder, os.path.basename(path))
    try:
      tf.io.gfile.copy(path, local)
    except tf.errors.OpError as e:
      raise ValueError(f'cannot copy video file {path}: {e.message}') from e
    try:
      return videos_lib.read_video(local, fps, short_side)
    except ValueError as e:
      raise ValueError(f'{path} (copied to {local}): {e}') from e


def encode_video(video_dir: str, video: str, labels: Sequence[int],
                 fps: Optional[float] = None, short_side: Optional[int] = None,
                 jpeg_quality: int = 90) -> bytes:
  """The serialized record of `video` (a path relative to `video_dir`, local or
  `gs://`): decoded (`fps`, `short_side`: `videos.read_video`'s), encoded.

  Raises:
    ValueError: the video cannot be read (naming the file)."""
  frames = read_video_file(os.path.join(video_dir, video), fps,
                           short_side).frames
  return make_example(frames, labels, video, jpeg_quality).SerializeToString()


def shard_paths(output: str, num_shards: int) -> List[str]:
  """`OUTPUT-0000i-of-0000n.tfrecord` for i < n."""
  if num_shards < 1:
    raise ValueError(f'--num_shards={num_shards}; expected at least 1.')
  return [f'{output}-{i:05d}-of-{num_shards:05d}.tfrecord'
          for i in range(num_shards)]


def previous_output(output: str,
                    suffixes: Sequence[str] = (CLASSES_SUFFIX,
                                               FAILURES_SUFFIX)) -> List[str]:
  """Files of an earlier run to the prefix `output` (local or `gs://`),
  sorted: its shards of any count and `output + suffix` of each of
  `suffixes`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  folder, name = os.path.split(output if '://' in output
                               else os.path.abspath(output))
  if not tf.io.gfile.isdir(folder):
    return []
  shard = re.compile(re.escape(name) + r'-\d{5}-of-\d{5}\.tfrecord$')
  return sorted(os.path.join(folder, f) for f in tf.io.gfile.listdir(folder)
                if shard.match(f) or f in {name + s for s in suffixes})


def refuse_previous_output(output: str, overwrite: bool,
                           suffixes: Sequence[str] = (CLASSES_SUFFIX,
                                                      FAILURES_SUFFIX)
                           ) -> List[str]:
  """`previous_output(output, suffixes)`; FileExistsError naming them unless
  `overwrite` (call before any video is read)."""
  previous = previous_output(output, suffixes)
  if previous and not overwrite:
    shown = ', '.join(os.path.basename(f) for f in previous[:5])
    more = f' and {len(previous) - 5} more' if len(previous) > 5 else ''
    raise FileExistsError(
        f'--output={output}: {len(previous)} file(s) of a previous '
        f'run are there ({shown}{more} in {os.path.dirname(previous[0])}); '
        'nothing was written. '
        'Choose another --output, or pass --overwrite to replace them once '
        'the new shards are complete.')
  return previous


def check_output(output: str, num_shards: int, suffixes: Sequence[str] = (),
                 inputs: Sequence[Tuple[str, Optional[str]]] = (),
                 models: Sequence[Tuple[str, Optional[str]]] = ()) -> None:
  """Refuses, before any video is read, an --output prefix one of whose files
  is one of `inputs` or would lie inside a model_dir or SavedModel directory
  (`output_files.check_output_file`)."""
  for path in shard_paths(output, num_shards) + [output + s
                                                 for s in suffixes]:
    output_files.check_output_file(path, '--output', inputs, models,
                                   creates_folder=True)


def list_videos(video_dir: str) -> List[str]:
  """`videos.find_videos` of a local or `gs://` folder; ValueError naming the
  folder if it holds no video file."""
  if '://' in video_dir:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    found = sorted(
        os.path.relpath(os.path.join(root, f), video_dir)
        for root, _, files in tf.io.gfile.walk(video_dir) for f in files
        if videos_lib.is_video(f))
  else:
    found = videos_lib.find_videos(video_dir)
  if not found:
    raise ValueError(f'no video file ({", ".join(VIDEO_EXTENSIONS)}) under '
                     f'{video_dir}')
  return found


def check_shards_filled(num_shards: int, written: int, failed: int) -> None:
  """ValueError naming --num_shards when some shard would hold no video
  (training refuses empty files)."""
  if written < num_shards:
    raise ValueError(
        f'--num_shards={num_shards} but {written} video(s) were written '
        f'({failed} unreadable skipped): {num_shards - written} '
        f'shard(s) would be empty; nothing was written. Use --num_shards '
        f'of at most {written}.')


def convert(video_dir: str, output: str, labels_csv: Optional[str] = None,
            num_shards: int = 1, fps: Optional[float] = None,
            short_side: Optional[int] = None, jpeg_quality: int = 90,
            skip_unreadable: bool = False, overwrite: bool = False,
            log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
            ) -> Tuple[List[str], List[str]]:
  """Writes OUTPUT-0000i-of-0000n.tfrecord shards, all or none; returns (files,
  skipped); `log` gets a line per skipped video.

  Raises:
    FileExistsError: files of a previous conversion to `output` are there
      and not `overwrite` (before any video is read).
    ValueError: an unreadable video (unless `skip_unreadable`), a labels
      problem, more shards than videos written, or an output that is
      --labels_csv or lies inside a model (naming the file or flag)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  check_output(output, num_shards, (CLASSES_SUFFIX,),
               [('--labels_csv', labels_csv)])
  previous = refuse_previous_output(output, overwrite)
  found = list_videos(video_dir)
  label_of, classes = videos_lib.video_labels(video_dir, found, labels_csv)
  files = shard_paths(output, num_shards)
  classes_file = output + CLASSES_SUFFIX
  skipped = []
  with output_files.write_together(
      files + ([classes_file] if classes else []),
      replaces=previous) as staged:
    if classes:
      with tf.io.gfile.GFile(staged[classes_file], 'w') as f:
        f.write('\n'.join(classes) + '\n')
    writers = [tf.io.TFRecordWriter(staged[f]) for f in files]
    written = 0
    try:
      for v in found:
        try:
          record = encode_video(video_dir, v, label_of[v], fps, short_side,
                                jpeg_quality)
        except ValueError as e:
          if not skip_unreadable:
            raise
          log(f'skipping: {e}')
          skipped.append(v)
          continue
        writers[written % num_shards].write(record)
        written += 1
    finally:
      for w in writers:
        w.close()
    check_shards_filled(num_shards, written, len(skipped))
  return files, skipped
