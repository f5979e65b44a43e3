r"""Turns a folder of video files into Model Garden video TFRecords.

Each video becomes one `tf.train.SequenceExample`: sequence feature
`image/encoded` (one JPEG per kept frame) and context `clip/label/index`
(int64 class ids), plus `clip/id` (bytes, the file's path relative to the
folder) -- the format `official_ext.assemblenet.dataloader` (and Model
Garden's `video_input`) reads.

Labels come either from class sub-folders (`VIDEO_DIR/<class>/<video>`; class
ids are the sorted folder names' indices, written to OUTPUT.classes.txt) or
from a CSV (`--labels_csv`: lines `relative/path.mp4,3;17` with
';'-separated class ids, for multi-label data such as Charades).

    python scripts/assemblenet_videos_to_tfrecord.py --video_dir=/data/videos \
        --output=/data/tfrecords/train --num_shards=16 --fps=12 --short_side=256

Frames are decoded with OpenCV (`official_ext.assemblenet.videos`, the
reader `predict` and `extract_features` use too), optionally resampled to `--fps` and resized so
their short side is `--short_side`. An unreadable video stops the run with an
error naming the file (or, with --skip_unreadable, is listed and skipped).

The output is written whole or not at all: the shards and OUTPUT.classes.txt
are written into a hidden staging folder beside them and moved into place
only once every video was written (`official_ext.core.output_files.
write_together`); a failed run leaves the folder as it was (a killed one
leaves the hidden `.NAME-...partial-*` folder, which can be deleted). Files
of a previous conversion to the same OUTPUT prefix (`OUTPUT-*-of-*.tfrecord`,
OUTPUT.classes.txt) are an error naming them, before any video is read,
unless --overwrite is given: then they are replaced once the new shards are
complete, shards of another --num_shards included.
"""
import argparse
import os
import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from official_ext.assemblenet import videos
from official_ext.core import output_files

VIDEO_EXTENSIONS = videos.VIDEO_EXTENSIONS
find_videos = videos.find_videos
read_frames = videos.read_frames
read_labels_csv = videos.read_labels_csv
video_labels = videos.video_labels


def make_example(frames, labels: Sequence[int], clip_id: str,
                 jpeg_quality: int = 90):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  ex = tf.train.SequenceExample()
  ex.context.feature['clip/label/index'].int64_list.value.extend(labels)
  ex.context.feature['clip/id'].bytes_list.value.append(clip_id.encode())
  fl = ex.feature_lists.feature_list['image/encoded']
  for frame in frames:
    fl.feature.add().bytes_list.value.append(
        tf.io.encode_jpeg(frame, quality=jpeg_quality).numpy())
  return ex


def previous_output(output: str) -> List[str]:
  """Files of an earlier conversion to the prefix `output`: its shards (of
  any count) and `output.classes.txt`, sorted."""
  folder, name = os.path.split(os.path.abspath(output))
  if not os.path.isdir(folder):
    return []
  shard = re.compile(re.escape(name) + r'-\d{5}-of-\d{5}\.tfrecord$')
  return sorted(os.path.join(folder, f) for f in os.listdir(folder)
                if shard.match(f) or f == name + '.classes.txt')


def convert(video_dir: str, output: str, labels_csv: Optional[str] = None,
            num_shards: int = 1, fps: Optional[float] = None,
            short_side: Optional[int] = None, jpeg_quality: int = 90,
            skip_unreadable: bool = False,
            overwrite: bool = False) -> Tuple[List[str], List[str]]:
  """Writes OUTPUT-0000i-of-0000n.tfrecord shards; returns (files, skipped).

  All files or none (module docstring). Raises FileExistsError naming the
  files of a previous conversion to `output` unless `overwrite` (before any
  video is read); ValueError naming an unreadable video (unless
  `skip_unreadable`) or a labels problem.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  previous = previous_output(output)
  if previous and not overwrite:
    shown = ', '.join(os.path.basename(f) for f in previous[:5])
    more = f' and {len(previous) - 5} more' if len(previous) > 5 else ''
    raise FileExistsError(
        f'--output={output}: {len(previous)} file(s) of a previous '
        f'conversion are there ({shown}{more} in '
        f'{os.path.dirname(os.path.abspath(output))}); nothing was written. '
        'Choose another --output, or pass --overwrite to replace them once '
        'the new shards are complete.')
  videos = find_videos(video_dir)
  if not videos:
    raise ValueError(f'no video file ({", ".join(VIDEO_EXTENSIONS)}) under '
                     f'{video_dir}')
  labels, classes = video_labels(video_dir, videos, labels_csv)
  label_of = labels.__getitem__
  files = [f'{output}-{i:05d}-of-{num_shards:05d}.tfrecord'
           for i in range(num_shards)]
  classes_file = output + '.classes.txt'
  skipped = []
  with output_files.write_together(
      files + ([classes_file] if classes else []),
      replaces=previous) as staged:
    if classes:
      with open(staged[classes_file], 'w') as f:
        f.write('\n'.join(classes) + '\n')
    writers = [tf.io.TFRecordWriter(staged[f]) for f in files]
    written = 0
    try:
      for v in videos:
        try:
          frames = read_frames(os.path.join(video_dir, v), fps, short_side)
        except ValueError as e:
          if not skip_unreadable:
            raise
          print(f'skipping: {e}', file=sys.stderr)
          skipped.append(v)
          continue
        writers[written % num_shards].write(
            make_example(frames, label_of(v), v, jpeg_quality)
            .SerializeToString())
        written += 1
    finally:
      for w in writers:
        w.close()
    if written < num_shards:  # Training refuses empty files.
      raise ValueError(
          f'--num_shards={num_shards} but {written} video(s) were written '
          f'({len(skipped)} unreadable skipped): {num_shards - written} '
          f'shard(s) would be empty; nothing was written. Use --num_shards '
          f'of at most {written}.')
  return files, skipped


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--video_dir', required=True)
  p.add_argument('--output', required=True, help='output path prefix')
  p.add_argument('--labels_csv', default=None)
  p.add_argument('--num_shards', type=int, default=1)
  p.add_argument('--fps', type=float, default=None)
  p.add_argument('--short_side', type=int, default=None)
  p.add_argument('--jpeg_quality', type=int, default=90)
  p.add_argument('--skip_unreadable', action='store_true')
  p.add_argument('--overwrite', action='store_true',
                 help='replace the files of a previous conversion to '
                 '--output (once the new shards are complete)')
  a = p.parse_args(argv)
  files, skipped = convert(a.video_dir, a.output, a.labels_csv, a.num_shards,
                           a.fps, a.short_side, a.jpeg_quality,
                           a.skip_unreadable, a.overwrite)
  print(f'wrote {len(files)} shard(s): {files[0]} ...; skipped '
        f'{len(skipped)} unreadable video(s)')


if __name__ == '__main__':
  main()
