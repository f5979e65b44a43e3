r"""Apache Beam pipelines for corpora too large for one process.

    python -m official_ext.assemblenet.beam_pipelines convert \
        --video_dir=/data/videos --output=/data/tfrecords/train --num_shards=256
    # On Dataflow (or Flink, Spark: their runner's options):
    python -m official_ext.assemblenet.beam_pipelines convert \
        --video_dir=gs://$BUCKET/videos --output=gs://$BUCKET/records/train \
        --num_shards=1024 --beam_pipeline_options="runner=DataflowRunner,\
project=$PROJECT,region=$REGION,temp_location=gs://$BUCKET/tmp,\
setup_file=./setup.py"

`convert` is `video_records.convert` (the single-process converter) as a
Beam pipeline: the launcher lists the videos and resolves their labels
(`video_records.list_videos`, `videos.video_labels`; a labels problem is an error
before the pipeline starts), writes the list as a JSON-lines manifest into
the staging folder (so the job graph stays small for any corpus; workers
read it), and the pipeline decodes and encodes each video on the workers
with `video_records.encode_video` (the same function, so the same record
bytes) and writes `OUTPUT-0000i-of-0000n.tfrecord` with
`beam.io.WriteToTFRecord` (`num_shards` fixed; which shard holds a video is
the runner's choice). A video that cannot be read or encoded does not stop
the corpus: it goes to a tagged side output, written as
`OUTPUT.failures.tsv` (header `video<TAB>error`, one line per failed video:
its path relative to --video_dir and the error naming it; the header alone
when none failed). With class sub-folders, OUTPUT.classes.txt as the
single-process converter writes it.

Whole or not at all: the pipeline writes into a hidden staging folder beside
the output (`core.output_files.write_together`; Beam's own temporary files
inside it), and the launcher moves the shards, the failures file and the
classes file into place only after the pipeline succeeded and every shard
holds a video. A failed pipeline (an error raised, the job cancelled, a
shard left empty because fewer videos than --num_shards were written) leaves
the output folder as it was and removes the staging folder; a killed
launcher leaves the hidden `.NAME-...partial-*` folder, which can be
deleted. Files of a previous conversion to the same --output prefix
(`video_records.previous_output`) are refused before anything is read,
unless --overwrite: then they are replaced once the new files are complete.

Pipeline options (runner, project, workers, ...) are given as TFDS gives
them, in --beam_pipeline_options: comma-separated `key=value` pairs, each
passed to Beam as `--key=value` (no comma inside a value); none: Beam's
DirectRunner in this process. Workers need this package and its
dependencies (Dataflow: `setup_file=./setup.py` from a checkout, or a
custom container). Beam is an optional dependency: `pip install
"official_ext[beam]"` (docs/assemblenet.md); without it, the pipelines raise
an ImportError saying so, and this module still imports.
"""
import json
import os
import sys
from typing import List, NamedTuple, Optional, Sequence

from absl import app
from absl import flags

from official_ext.assemblenet import video_records
from official_ext.assemblenet import videos
from official_ext.core import output_files

try:
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  _BEAM_IMPORT_ERROR = None
except ImportError as _error:  # The `beam` extra is optional.
  beam = None
  _BEAM_IMPORT_ERROR = _error

FLAGS = flags.FLAGS

PIPELINES = ('convert',)

# The side output of the videos that failed.
FAILED = 'failed'
FAILURES_HEADER = 'video\terror'

# The manifest the launcher writes for the workers (in the staging folder).
_MANIFEST = 'videos.jsonl'


def _require_beam() -> None:
  if beam is None:
    raise ImportError(
        f'Apache Beam is not installed ({_BEAM_IMPORT_ERROR}); the Beam '
        'pipelines need it: pip install "official_ext[beam]" (see '
        'docs/assemblenet.md, "Large corpora with Apache Beam").')


def pipeline_options(beam_pipeline_options: str):
  """`beam.options.pipeline_options.PipelineOptions` of 'k=v,k2=v2'.

  ValueError naming --beam_pipeline_options and the item without '='.
  """
  _require_beam()
  from apache_beam.options import pipeline_options as options_lib  # pylint: disable=g-import-not-at-top
  args = []
  for item in filter(None, (i.strip() for i in
                            beam_pipeline_options.split(','))):
    key, eq, value = item.partition('=')
    if not eq or not key:
      raise ValueError(f'--beam_pipeline_options={beam_pipeline_options}: '
                       f'{item!r} is not key=value.')
    args.append(f'--{key.lstrip("-")}={value}')
  return options_lib.PipelineOptions(args)


def _error_text(error: Exception) -> str:
  """One line: the error's type and message (no tab or newline)."""
  return ' '.join(f'{type(error).__name__}: {error}'.split())


class EncodeVideoFn(beam.DoFn if beam else object):
  """Manifest line -> the video's serialized record, or (video, error) to
  the `FAILED` output (`video_records.encode_video`)."""

  def __init__(self, video_dir: str, fps: Optional[float],
               short_side: Optional[int], jpeg_quality: int):
    super().__init__()
    self._video_dir = video_dir
    self._fps = fps
    self._short_side = short_side
    self._jpeg_quality = jpeg_quality

  def process(self, line: str):
    item = json.loads(line)
    try:
      yield video_records.encode_video(
          self._video_dir, item['video'], item['labels'], self._fps,
          self._short_side, self._jpeg_quality)
    except Exception as e:  # pylint: disable=broad-except
      # Listed, not raised: one bad file does not stop the corpus.
      yield beam.pvalue.TaggedOutput(FAILED, (item['video'], _error_text(e)))


def _failure_line(failure) -> str:
  """`video<TAB>error` (tabs and line breaks in the path as spaces)."""
  video, error = failure
  return f'{video.replace(chr(9), " ").replace(chr(10), " ")}\t{error}'


class ConvertResult(NamedTuple):
  """What `convert` wrote.

  Attributes:
    files: the shards, `OUTPUT-0000i-of-0000n.tfrecord`.
    failures_file: `OUTPUT.failures.tsv`.
    failed: [(video, error)] of the videos not converted, sorted.
    num_videos: videos listed.
  """
  files: List[str]
  failures_file: str
  failed: List[Sequence[str]]
  num_videos: int


def read_failures(path: str) -> List[Sequence[str]]:
  """[(video, error)] of a failures file, sorted; ValueError naming the file
  if its header is not `FAILURES_HEADER`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.io.gfile.GFile(path) as f:
    lines = f.read().splitlines()
  if not lines or lines[0] != FAILURES_HEADER:
    raise ValueError(f'{path}: expected the header {FAILURES_HEADER!r}; got '
                     f'{lines[:1]}')
  return sorted(tuple(line.split('\t', 1)) for line in lines[1:])


def convert(video_dir: str, output: str, labels_csv: Optional[str] = None,
            num_shards: int = 1, fps: Optional[float] = None,
            short_side: Optional[int] = None, jpeg_quality: int = 90,
            overwrite: bool = False,
            beam_pipeline_options: str = '') -> ConvertResult:
  """Runs the conversion pipeline (module docstring) to the end.

  Args:
    video_dir, output, labels_csv, num_shards, fps, short_side,
      jpeg_quality, overwrite: as `video_records.convert`'s.
    beam_pipeline_options: 'key=value,...' Beam pipeline options ('': the
      DirectRunner).

  Raises:
    ImportError: Apache Beam is not installed.
    FileExistsError: a previous conversion to `output` and not `overwrite`.
    ValueError: a labels problem, or fewer videos converted than
      `num_shards` (naming the flag and the failures); nothing written.
  """
  _require_beam()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  options = pipeline_options(beam_pipeline_options)
  previous = video_records.refuse_previous_output(output, overwrite)
  found = video_records.list_videos(video_dir)
  label_of, classes = videos.video_labels(video_dir, found, labels_csv)
  files = video_records.shard_paths(output, num_shards)
  failures_file = output + video_records.FAILURES_SUFFIX
  classes_file = output + video_records.CLASSES_SUFFIX
  with output_files.write_together(
      files + [failures_file] + ([classes_file] if classes else []),
      replaces=previous) as staged:
    staging = os.path.dirname(staged[failures_file])
    manifest = os.path.join(staging, _MANIFEST)
    with tf.io.gfile.GFile(manifest, 'w') as f:
      for v in found:
        f.write(json.dumps({'video': v, 'labels': label_of[v]}) + '\n')
    if classes:
      with tf.io.gfile.GFile(staged[classes_file], 'w') as f:
        f.write('\n'.join(classes) + '\n')
    prefix = os.path.join(staging, os.path.basename(output))
    with beam.Pipeline(options=options) as pipeline:
      results = (
          pipeline
          | 'ReadManifest' >> beam.io.ReadFromText(manifest)
          | 'EncodeVideos' >> beam.ParDo(EncodeVideoFn(
              video_dir, fps, short_side, jpeg_quality)).with_outputs(
                  FAILED, main='records'))
      _ = results.records | 'WriteShards' >> beam.io.WriteToTFRecord(
          prefix, file_name_suffix='.tfrecord', num_shards=num_shards,
          shard_name_template='-SSSSS-of-NNNNN')
      _ = (results[FAILED]
           | 'FormatFailures' >> beam.Map(_failure_line)
           | 'WriteFailures' >> beam.io.WriteToText(
               staged[failures_file], num_shards=1, shard_name_template='',
               header=FAILURES_HEADER))
    missing = [f for f, s in staged.items() if not tf.io.gfile.exists(s)]
    if missing:
      raise ValueError(f'the pipeline did not write {missing}; nothing was '
                       'written.')
    failed = read_failures(staged[failures_file])
    video_records.check_shards_filled(num_shards, len(found) - len(failed),
                                      len(failed))
  return ConvertResult(files, failures_file, failed, len(found))


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  define = dict(flag_values=flag_values)
  flags.DEFINE_string('video_dir', None, 'The folder of videos (local or '
                      'gs://).', **define)
  flags.DEFINE_string('output', None, 'Output path prefix.', **define)
  flags.DEFINE_string('labels_csv', None, 'Labels CSV (default: class '
                      'sub-folders).', **define)
  flags.DEFINE_integer('num_shards', 1, 'Output shards.', **define)
  flags.DEFINE_float('fps', None, 'Keep frames at this rate.', **define)
  flags.DEFINE_integer('short_side', None, 'Resize frames to this short '
                       'side.', **define)
  flags.DEFINE_integer('jpeg_quality', 90, 'JPEG quality of the frames.',
                       **define)
  flags.DEFINE_bool('overwrite', False, 'Replace the files of a previous '
                    'conversion to --output (once the new ones are '
                    'complete).', **define)
  flags.DEFINE_string('beam_pipeline_options', '', 'Beam pipeline options, '
                      'comma-separated key=value (e.g. runner=DataflowRunner,'
                      'project=P,...); empty: the DirectRunner.', **define)


def _required(fv: flags.FlagValues, pipeline: str, names: Sequence[str]):
  missing = [f'--{n}' for n in names if fv[n].value in (None, '')]
  if missing:
    raise app.UsageError(f'{pipeline} needs {", ".join(missing)}.')


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS):
  """Runs the pipeline named by the positional argument (`PIPELINES`)."""
  fv = flag_values
  if len(argv) != 2 or argv[1] not in PIPELINES:
    raise app.UsageError(f'expected one pipeline of {PIPELINES}; got '
                         f'{list(argv[1:])}')
  _required(fv, 'convert', ('video_dir', 'output'))
  result = convert(fv.video_dir, fv.output, fv.labels_csv, fv.num_shards,
                   fv.fps, fv.short_side, fv.jpeg_quality, fv.overwrite,
                   fv.beam_pipeline_options)
  print(f'wrote {len(result.files)} shard(s) ({result.files[0]} ...) of '
        f'{result.num_videos - len(result.failed)} of {result.num_videos} '
        f'videos; {len(result.failed)} failed, listed in '
        f'{result.failures_file}', file=sys.stdout)
  return result


if __name__ == '__main__':
  define_flags()
  app.run(main)
