"""The video converter: a folder of video files as Model Garden video TFRecords
(one SequenceExample of JPEG frames and class ids a video, optionally each
frame's object class map), written whole or not at all; `encode_video` is
the per-video function of this and of the Beam pipeline
(docs/assemblenet.md#experiments-and-data, #object-stream)."""
import io
import os
import re
import sys
import tempfile
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from official_ext.assemblenet import dataloader
from official_ext.assemblenet import videos as videos_lib
from official_ext.core import output_files

VIDEO_EXTENSIONS = videos_lib.VIDEO_EXTENSIONS

# Suffixes of the files beside the shards.
CLASSES_SUFFIX = '.classes.txt'
FAILURES_SUFFIX = '.failures.tsv'

SEGMENTER_BATCH = 16  # Frames per call of a --segmenter.


def make_example(frames, labels: Sequence[int], clip_id: str,
                 jpeg_quality: int = 90, objects=None):
  """The `tf.train.SequenceExample` of one video: uint8 RGB `frames` [N, H, W,
  3] as JPEGs of `jpeg_quality`, its class ids and `clip_id` (its path
  relative to the video folder); `objects` (uint8 [N, H, W] class ids) as
  object maps (`dataloader.make_sequence_example`)."""
  maps = None
  if objects is not None:
    objects = np.asarray(objects)
    if (objects.dtype != np.uint8 or objects.ndim != 3 or
        objects.shape != np.shape(frames)[:3]):
      raise ValueError(
          f'{clip_id}: object maps must be uint8 [N, H, W] of the frames\' '
          f'{tuple(np.shape(frames)[:3])}; got {objects.dtype} '
          f'{objects.shape}')
    maps = dataloader.encode_object_maps(objects)
  return dataloader.make_sequence_example(
      dataloader.encode_jpeg_frames(frames, jpeg_quality), labels, maps,
      clip_id)


def _resize_nearest(maps: np.ndarray, height: int, width: int) -> np.ndarray:
  """uint8 [N, h, w] -> [N, height, width], nearest neighbour."""
  if maps.shape[1:] == (height, width):
    return maps
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.image.resize(maps[..., np.newaxis], (height, width),
                         method='nearest').numpy()[..., 0].astype(np.uint8)


def object_maps_folder(object_maps_dir: str, video: str) -> str:
  """`object_maps_dir/<video's relative path without extension>`."""
  return os.path.join(object_maps_dir, os.path.splitext(video)[0])


def _read_map(path: str) -> np.ndarray:
  """uint8 [h, w] class ids of an 8-bit grey or palette PNG (palette: the
  indices); ValueError naming the file otherwise."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  try:
    with tf.io.gfile.GFile(path, 'rb') as f:
      image = Image.open(io.BytesIO(f.read()))
      image.load()
  except (OSError, tf.errors.OpError) as e:
    raise ValueError(f'object map {path} does not read as an image: '
                     f'{e}') from e
  if image.format != 'PNG' or image.mode not in ('L', 'P'):
    raise ValueError(
        f'object map {path} is a {image.format} image of mode {image.mode}; '
        'expected a single-channel 8-bit PNG (grey or palette), each pixel '
        'a class id.')
  return np.asarray(image, np.uint8)


def read_object_maps(object_maps_dir: str, video: str,
                     decoded: videos_lib.Video) -> np.ndarray:
  """uint8 [N, H, W] class ids of `decoded`'s frames (a video's, `video` its
  path relative to the video folder) from `object_maps_folder(...)/<i>.png`,
  i the frame's index among the file's decoded frames (`source_indices`),
  resized to the frames' size by nearest neighbour.

  Raises:
    ValueError: naming the video and folder or file: no such folder, maps
      that are not the file's decoded frames 0 ... n-1 one each, a map that
      is not an 8-bit single-channel PNG, maps of differing sizes or of
      another aspect ratio than the frames."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  folder = object_maps_folder(object_maps_dir, video)
  if not tf.io.gfile.isdir(folder):
    raise ValueError(f'video {video}: no object maps: {folder} is not a '
                     'folder (--object_maps_dir: one PNG a decoded frame, '
                     '<frame index>.png).')
  by_index: Dict[int, str] = {}
  for name in sorted(tf.io.gfile.listdir(folder)):
    name = name.rstrip('/')
    stem, ext = os.path.splitext(name)
    if ext.lower() != '.png':
      continue
    if not stem.isdigit():
      raise ValueError(f'video {video}: object map {os.path.join(folder, name)}'
                       ' is not named <frame index>.png.')
    index = int(stem)
    if index in by_index:
      raise ValueError(f'video {video}: {by_index[index]} and {name} in '
                       f'{folder} are both the map of frame {index}.')
    by_index[index] = name
  n = decoded.num_source_frames
  missing = sorted(set(range(n)) - set(by_index))
  extra = sorted(set(by_index) - set(range(n)))
  if missing or extra:
    raise ValueError(
        f'video {video} decodes {n} frames but {folder} holds {len(by_index)}'
        ' object maps' + (f'; missing frame(s) {missing[:5]}' if missing
                          else '') +
        (f'; maps of no frame: {[by_index[i] for i in extra[:5]]}' if extra
         else '') + '. Give one map a decoded frame, <frame index>.png from 0.')
  height, width = decoded.frames.shape[1:3]
  maps, first = [], None
  for i in decoded.source_indices:
    path = os.path.join(folder, by_index[int(i)])
    m = _read_map(path)
    if first is None:
      first = (path, m.shape)
      mh, mw = m.shape
      if (abs(mw * height / mh - width) > 1 or
          abs(mh * width / mw - height) > 1):
        raise ValueError(
            f'video {video}: object map {path} is {mh} x {mw}, not the '
            f'aspect ratio of its frames ({height} x {width} as stored).')
    elif m.shape != first[1]:
      raise ValueError(f'video {video}: object map {path} is {m.shape[0]} x '
                       f'{m.shape[1]} but {first[0]} is {first[1][0]} x '
                       f'{first[1][1]}.')
    maps.append(m)
  return _resize_nearest(np.stack(maps), height, width)


class Segmenter:
  """A SavedModel (`path`) whose `serving_default` signature takes one uint8
  tensor of frames [N, H, W, 3] and returns one tensor: per-pixel class
  scores float [N, h, w, C] (argmax taken) or class ids int [N, h, w] (or
  [N, h, w, 1]); maps of another size are resized to the frames' by nearest
  neighbour; ids must lie in [0, dataloader.MAX_OBJECT_CLASSES).

  Raises (on loading):
    ValueError: naming --segmenter: not a SavedModel, no `serving_default`,
      or a signature of other inputs or outputs."""

  def __init__(self, path: str):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.path = path
    try:
      loaded = tf.saved_model.load(path)
    except (OSError, ValueError, tf.errors.OpError) as e:
      raise ValueError(f'--segmenter={path} does not load as a SavedModel: '
                       f'{getattr(e, "message", e)}') from e
    self._loaded = loaded  # Keeps the signature's variables alive.
    signatures = getattr(loaded, 'signatures', {})
    if 'serving_default' not in signatures:
      raise ValueError(f'--segmenter={path} has no serving_default signature '
                       f'(it has {sorted(signatures)}).')
    fn = signatures['serving_default']
    args, inputs = fn.structured_input_signature
    outputs = fn.structured_outputs
    contract = ('expected serving_default(one uint8 [N, H, W, 3] input) -> '
                'one output, float scores [N, h, w, classes] or int class '
                'ids [N, h, w]')
    if args or len(inputs) != 1:
      raise ValueError(f'--segmenter={path}: serving_default takes '
                       f'{sorted(inputs)}; {contract}.')
    (self._input, spec), = inputs.items()
    shape = spec.shape
    if spec.dtype != tf.uint8 or (shape.rank is not None and (
        shape.rank != 4 or shape[-1] not in (None, 3))):
      raise ValueError(f'--segmenter={path}: serving_default input '
                       f'{self._input!r} is {spec.dtype.name} {shape}; '
                       f'{contract}.')
    if not isinstance(outputs, dict) or len(outputs) != 1:
      names = sorted(outputs) if isinstance(outputs, dict) else outputs
      raise ValueError(f'--segmenter={path}: serving_default returns '
                       f'{names}; {contract}.')
    (self._output, out), = outputs.items()
    if not (out.dtype.is_floating or out.dtype.is_integer) or (
        out.shape.rank is not None and out.shape.rank not in (3, 4)):
      raise ValueError(f'--segmenter={path}: serving_default output '
                       f'{self._output!r} is {out.dtype.name} {out.shape}; '
                       f'{contract}.')
    self._fn = fn

  def __call__(self, frames: np.ndarray, video: str = '') -> np.ndarray:
    """uint8 [N, H, W] class ids of uint8 frames [N, H, W, 3]; ValueError
    naming the segmenter and `video` for an output against the contract."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    height, width = frames.shape[1:3]
    maps = []
    for start in range(0, len(frames), SEGMENTER_BATCH):
      chunk = frames[start:start + SEGMENTER_BATCH]
      out = self._fn(**{self._input: tf.constant(chunk)})[self._output]
      where = f'--segmenter={self.path} on video {video}'
      if out.dtype.is_floating:
        if out.shape.rank != 4:
          raise ValueError(f'{where}: scores of shape {out.shape}; expected '
                           '[N, h, w, classes].')
        ids = tf.argmax(out, axis=-1, output_type=tf.int64)
      else:
        ids = tf.cast(out, tf.int64)
        if ids.shape.rank == 4 and ids.shape[-1] == 1:
          ids = ids[..., 0]
        if ids.shape.rank != 3:
          raise ValueError(f'{where}: class ids of shape {out.shape}; '
                           'expected [N, h, w].')
      if ids.shape[0] != len(chunk):
        raise ValueError(f'{where}: {ids.shape[0]} maps for {len(chunk)} '
                         'frames.')
      ids = ids.numpy()
      bad = ids[(ids < 0) | (ids >= dataloader.MAX_OBJECT_CLASSES)]
      if bad.size:
        raise ValueError(f'{where}: class id {bad[0]} outside [0, '
                         f'{dataloader.MAX_OBJECT_CLASSES}) (the maps are uint8).')
      maps.append(ids.astype(np.uint8))
    return _resize_nearest(np.concatenate(maps), height, width)


def check_object_source(object_maps_dir: Optional[str],
                        segmenter) -> None:
  """ValueError naming both flags when both are given."""
  if object_maps_dir and segmenter:
    raise ValueError('--object_maps_dir and --segmenter are both given; the '
                     'object maps come from one of them.')


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
                 jpeg_quality: int = 90, object_maps_dir: Optional[str] = None,
                 segmenter: Optional[Segmenter] = None) -> bytes:
  """The serialized record of `video` (a path relative to `video_dir`, local or
  `gs://`): decoded (`fps`, `short_side`: `videos.read_video`'s), encoded;
  with object maps from `object_maps_dir` (`read_object_maps`) or
  `segmenter` (run on the stored frames).

  Raises:
    ValueError: the video or its maps cannot be read (naming the file)."""
  check_object_source(object_maps_dir, segmenter)
  decoded = read_video_file(os.path.join(video_dir, video), fps, short_side)
  objects = None
  if object_maps_dir:
    objects = read_object_maps(object_maps_dir, video, decoded)
  elif segmenter is not None:
    objects = segmenter(decoded.frames, video)
  return make_example(decoded.frames, labels, video, jpeg_quality,
                      objects).SerializeToString()


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
            object_maps_dir: Optional[str] = None,
            segmenter: Optional[str] = None,
            log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
            ) -> Tuple[List[str], List[str]]:
  """Writes OUTPUT-0000i-of-0000n.tfrecord shards, all or none; returns (files,
  skipped); `log` gets a line per skipped video. Object maps (at most one
  source): `object_maps_dir` (`read_object_maps`) or the SavedModel
  `segmenter` (`Segmenter`).

  Raises:
    FileExistsError: files of a previous conversion to `output` are there
      and not `overwrite` (before any video is read).
    ValueError: an unreadable video or its maps (unless `skip_unreadable`),
      a labels problem, more shards than videos written, both object
      sources, a segmenter of another signature, or an output that is
      --labels_csv or lies inside a model (naming the file or flag)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  check_object_source(object_maps_dir, segmenter)
  check_output(output, num_shards, (CLASSES_SUFFIX,),
               [('--labels_csv', labels_csv)], [('--segmenter', segmenter)])
  previous = refuse_previous_output(output, overwrite)
  segmenter_fn = Segmenter(segmenter) if segmenter else None
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
                                jpeg_quality, object_maps_dir, segmenter_fn)
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
