r"""Turns a folder of video files into Model Garden video TFRecords.

    python scripts/assemblenet_videos_to_tfrecord.py --video_dir=/data/videos \
        --output=/data/tfrecords/train --num_shards=16 --fps=12 --short_side=256

The command of `official_ext.assemblenet.video_records.convert` (its module
docstring: the record format, the labels, whole-or-nothing output and the
errors): each flag is the keyword argument of the same name. For a corpus
too large for one process, the same conversion runs as an Apache Beam
pipeline: `python -m official_ext.assemblenet.beam_pipelines convert`.
"""
import argparse
from typing import Optional, Sequence

from official_ext.assemblenet import video_records


def main(argv: Optional[Sequence[str]] = None):
  p = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
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
  files, skipped = video_records.convert(
      a.video_dir, a.output, a.labels_csv, a.num_shards, a.fps, a.short_side,
      a.jpeg_quality, a.skip_unreadable, a.overwrite)
  print(f'wrote {len(files)} shard(s): {files[0]} ...; skipped '
        f'{len(skipped)} unreadable video(s)')


if __name__ == '__main__':
  main()
