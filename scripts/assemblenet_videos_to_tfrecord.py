r"""Turns a folder of video files into Model Garden video TFRecords.

    python scripts/assemblenet_videos_to_tfrecord.py --video_dir=/data/videos \
        --output=/data/tfrecords/train --num_shards=16 --fps=12 --short_side=256

The command of `official_ext.assemblenet.video_records.convert` (its module
docstring: the record format, the labels, whole-or-nothing output and the
errors): each flag is the keyword argument of the same name, with its
default. For a corpus too large for one process, the same conversion runs as
an Apache Beam pipeline: `python -m official_ext.assemblenet.beam_pipelines
convert`.
"""
import os
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')  # tf_keras as tf.keras
# pylint: disable=g-import-not-at-top,wrong-import-position
from typing import Sequence

from absl import app
from absl import flags

from official_ext.assemblenet import video_records

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the command's flags in `flag_values` (tests: a fresh
  FlagValues)."""
  define = dict(flag_values=flag_values)
  flags.DEFINE_string('video_dir', None, 'The folder of video files (class '
                      'sub-folders, or --labels_csv).', **define)
  flags.DEFINE_string('output', None, 'Output path prefix: '
                      'OUTPUT-0000i-of-0000n.tfrecord.', **define)
  flags.DEFINE_string('labels_csv', None, 'Lines `video,ids` (";"-separated '
                      'class ids), videos by their path relative to '
                      '--video_dir; default: class sub-folders.', **define)
  flags.DEFINE_integer('num_shards', 1, 'Output files.', **define)
  flags.DEFINE_float('fps', None, 'Frames per second to keep (default: the '
                     "video's own).", **define)
  flags.DEFINE_integer('short_side', None, 'Resize frames to this shorter '
                       'side (default: as decoded).', **define)
  flags.DEFINE_integer('jpeg_quality', 90, 'JPEG quality of the stored '
                       'frames.', **define)
  flags.DEFINE_bool('skip_unreadable', False, 'List and skip a video that '
                    'does not decode whole, instead of failing.', **define)
  flags.DEFINE_bool('overwrite', False, 'Replace the files of a previous '
                    'conversion to --output (once the new shards are '
                    'complete).', **define)
  flags.DEFINE_string('object_maps_dir', None, 'Also store each frame\'s '
                      'object class map, read from DIR/<video path without '
                      'extension>/<frame index>.png (uint8 class ids).',
                      **define)
  flags.DEFINE_string('segmenter', None, 'Also store each frame\'s object '
                      'class map computed by this SavedModel '
                      '(serving_default: uint8 frames [N, H, W, 3] -> class '
                      'scores [N, h, w, C] or ids [N, h, w]).', **define)
  flags.mark_flags_as_required(['video_dir', 'output'],
                               flag_values=flag_values)
  flags.mark_flags_as_mutual_exclusive(['object_maps_dir', 'segmenter'],
                                       flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Converts per the flags; prints the shards written and videos skipped."""
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  fv = flag_values
  files, skipped = video_records.convert(
      fv.video_dir, fv.output, fv.labels_csv, fv.num_shards, fv.fps,
      fv.short_side, fv.jpeg_quality, fv.skip_unreadable, fv.overwrite,
      fv.object_maps_dir, fv.segmenter)
  print(f'wrote {len(files)} shard(s): {files[0]} ...; skipped '
        f'{len(skipped)} unreadable video(s)')


if __name__ == '__main__':
  define_flags()
  app.run(main)
