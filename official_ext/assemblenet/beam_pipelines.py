"""`python -m official_ext.assemblenet.beam_pipelines convert|extract_features`:
the video converter and the feature extractor as Apache Beam pipelines, each
video by the single-process command's function, whole or not at all
(docs/assemblenet.md#large-corpora-with-apache-beam)."""
import json
import os
import threading
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from absl import app
from absl import flags

from official_ext.assemblenet import extract_features
from official_ext.assemblenet import video_records
from official_ext.assemblenet import videos
from official_ext.core import frame_features
from official_ext.core import output_files

try:
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  _BEAM_IMPORT_ERROR = None
except ImportError as _error:  # The `beam` extra is optional.
  beam = None
  _BEAM_IMPORT_ERROR = _error

FLAGS = flags.FLAGS

PIPELINES = ('convert', 'extract_features')

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
               short_side: Optional[int], jpeg_quality: int,
               object_maps_dir: Optional[str] = None,
               segmenter: Optional[str] = None):
    super().__init__()
    self._video_dir = video_dir
    self._fps = fps
    self._short_side = short_side
    self._jpeg_quality = jpeg_quality
    self._object_maps_dir = object_maps_dir
    self._segmenter_path = segmenter
    self._segmenter = None

  def setup(self):
    if self._segmenter_path:
      self._segmenter = _load_segmenter(self._segmenter_path)

  def process(self, line: str):
    item = json.loads(line)
    try:
      record = video_records.encode_video(
          self._video_dir, item['video'], item['labels'], self._fps,
          self._short_side, self._jpeg_quality, self._object_maps_dir,
          self._segmenter)
    except Exception as e:  # pylint: disable=broad-except
      # Listed, not raised: one bad file does not stop the corpus.
      yield beam.pvalue.TaggedOutput(FAILED, (item['video'], _error_text(e)))
      return
    yield record


# Segmenters loaded in this process, by path.
_SEGMENTERS = {}
_SEGMENTERS_LOCK = threading.Lock()


def _load_segmenter(path: str) -> video_records.Segmenter:
  """`video_records.Segmenter(path)`, once per process."""
  with _SEGMENTERS_LOCK:
    if path not in _SEGMENTERS:
      _SEGMENTERS[path] = video_records.Segmenter(path)
    return _SEGMENTERS[path]


def _failure_line(failure) -> str:
  """`video<TAB>error` (tabs and line breaks in the path as spaces)."""
  video, error = failure
  return f'{video.replace(chr(9), " ").replace(chr(10), " ")}\t{error}'


class Result(NamedTuple):
  """What a pipeline wrote."""
  files: List[str]  # The shards, `OUTPUT-0000i-of-0000n.tfrecord`.
  failures_file: str  # `OUTPUT.failures.tsv`.
  failed: List[Sequence[str]]  # [(video, error)] not written, sorted.
  num_videos: int  # Videos listed.
  # `extract_features`: the PCA fitted (`OUTPUT.pca.npz`) or applied.
  pca_file: Optional[str] = None


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


def _run(options, video_dir: str, output: str, num_shards: int,
         labels_csv: Optional[str], previous: Sequence[str],
         extra_files: Sequence[str],
         expand: Callable[..., Tuple[object, object]],
         write_classes: bool = False) -> Result:
  """Lists and labels the videos (a JSON-lines manifest in the staging folder,
  which the workers read: the job graph stays small), runs the pipeline into
  the staging folder and moves its files into place once it succeeded.

  `expand(manifest_lines, staged)` adds the per-video steps: given the
  PCollection of manifest lines and {file: staging path}, it returns
  (serialized records, (video, error) failures) and writes `extra_files`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  found = video_records.list_videos(video_dir)
  label_of, classes = videos.video_labels(video_dir, found, labels_csv)
  files = video_records.shard_paths(output, num_shards)
  failures_file = output + video_records.FAILURES_SUFFIX
  classes_file = output + video_records.CLASSES_SUFFIX
  if not (write_classes and classes):
    classes_file = None
  with output_files.write_together(
      files + [failures_file] + list(extra_files) +
      ([classes_file] if classes_file else []), replaces=previous) as staged:
    staging = os.path.dirname(staged[failures_file])
    manifest = os.path.join(staging, _MANIFEST)
    with tf.io.gfile.GFile(manifest, 'w') as f:
      for v in found:
        f.write(json.dumps({'video': v, 'labels': label_of[v]}) + '\n')
    if classes_file:
      with tf.io.gfile.GFile(staged[classes_file], 'w') as f:
        f.write('\n'.join(classes) + '\n')
    with beam.Pipeline(options=options) as pipeline:
      lines = pipeline | 'ReadManifest' >> beam.io.ReadFromText(manifest)
      records, failures = expand(lines, staged)
      _ = records | 'WriteShards' >> beam.io.WriteToTFRecord(
          os.path.join(staging, os.path.basename(output)),
          file_name_suffix='.tfrecord', num_shards=num_shards,
          shard_name_template='-SSSSS-of-NNNNN')
      _ = (failures
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
  return Result(files, failures_file, failed, len(found))


def convert(video_dir: str, output: str, labels_csv: Optional[str] = None,
            num_shards: int = 1, fps: Optional[float] = None,
            short_side: Optional[int] = None, jpeg_quality: int = 90,
            overwrite: bool = False, object_maps_dir: Optional[str] = None,
            segmenter: Optional[str] = None,
            beam_pipeline_options: str = '') -> Result:
  """Runs the conversion pipeline to the end; the arguments are
  `video_records.convert`'s, plus `beam_pipeline_options` ('key=value,...';
  '': the DirectRunner).

  Raises:
    ImportError: Apache Beam is not installed.
    FileExistsError: a previous conversion to `output` and not `overwrite`.
    ValueError: a labels problem, both object sources, a segmenter of
      another signature, or fewer videos converted than `num_shards`
      (naming the flag and the failures); nothing written."""
  _require_beam()
  options = pipeline_options(beam_pipeline_options)
  video_records.check_object_source(object_maps_dir, segmenter)
  video_records.check_output(
      output, num_shards, (video_records.CLASSES_SUFFIX,
                           video_records.FAILURES_SUFFIX),
      inputs=[('--labels_csv', labels_csv)],
      models=[('--segmenter', segmenter)])
  previous = video_records.refuse_previous_output(output, overwrite)
  if segmenter:
    _load_segmenter(segmenter)  # Its signature checked before the pipeline.

  def expand(lines, staged):
    del staged
    results = lines | 'EncodeVideos' >> beam.ParDo(EncodeVideoFn(
        video_dir, fps, short_side, jpeg_quality, object_maps_dir,
        segmenter)).with_outputs(
            FAILED, main='records')
    return results.records, results[FAILED]

  return _run(options, video_dir, output, num_shards, labels_csv, previous,
              (), expand, write_classes=True)


# Models loaded in this process, by `load_extractor`'s arguments.
_EXTRACTORS = {}
_EXTRACTORS_LOCK = threading.Lock()


def load_extractor(checkpoint_path: str, experiment: Optional[str] = None,
                   config_files: Sequence[str] = (),
                   params_override: str = '',
                   feature_layer: str = extract_features.DEFAULT_FEATURE_LAYER,
                   batch_size: int = 16
                   ) -> extract_features.FeatureExtractor:
  """`FeatureExtractor.from_checkpoint`, once per process for the same
  arguments: a worker's DoFn instances (one per thread) share one model."""
  key = (checkpoint_path, experiment, tuple(config_files), params_override,
         feature_layer, batch_size)
  with _EXTRACTORS_LOCK:
    if key not in _EXTRACTORS:
      _EXTRACTORS[key] = extract_features.FeatureExtractor.from_checkpoint(
          checkpoint_path, experiment, config_files, params_override,
          feature_layer=feature_layer, batch_size=batch_size)
    return _EXTRACTORS[key]


class ExtractFeaturesFn(beam.DoFn if beam else object):
  """Manifest line -> (video, labels, float32 [S, D] features), or (video,
  error) to the `FAILED` output (`extract_features.extract_video`). The
  model is loaded once per worker process (`setup`, `load_extractor`)."""

  def __init__(self, video_dir: str, model: Dict[str, object],
               short_side: Optional[int], rate: float,
               pca_file: Optional[str], pca_input_dim: Optional[int]):
    """`model`: `load_extractor`'s keyword arguments;
    `pca_input_dim`: the width the --pca_file PCA takes, checked against the
    model's features."""
    super().__init__()
    self._video_dir = video_dir
    self._model = model
    self._short_side = short_side
    self._rate = rate
    self._pca_file = pca_file
    self._pca_input_dim = pca_input_dim
    self._extractor = None

  def setup(self):
    self._extractor = load_extractor(**self._model)
    if (self._pca_input_dim is not None and
        self._pca_input_dim != self._extractor.dim):
      raise ValueError(
          f'--pca_file={self._pca_file} was fitted on '
          f'{self._pca_input_dim}-wide features; this model\'s '
          f'--feature_layer={self._extractor.feature_layer} gives '
          f'{self._extractor.dim}.')

  def process(self, line: str):
    item = json.loads(line)
    path = os.path.join(self._video_dir, item['video'])
    try:
      video = video_records.read_video_file(path,
                                            short_side=self._short_side)
      features = extract_features.extract_video(
          self._extractor, video.frames, video.fps, self._rate, path)
    except Exception as e:  # pylint: disable=broad-except
      # Listed, not raised: one bad file does not stop the corpus.
      yield beam.pvalue.TaggedOutput(FAILED, (item['video'], _error_text(e)))
      return
    yield item['video'], item['labels'], features


class MomentsFn(beam.CombineFn if beam else object):
  """(video, labels, features [S, D]) -> the `frame_features.Moments` of
  every feature vector (for `pca_from_moments`); ValueError naming
  --pca_dim when there is none (every video failed)."""

  def create_accumulator(self):
    return None

  def add_input(self, accumulator, element):
    video, _, features = element
    moments = frame_features.Moments.of(features, f'video {video!r}')
    return moments if accumulator is None else accumulator.merge(moments)

  def merge_accumulators(self, accumulators):
    merged = None
    for moments in accumulators:
      if moments is not None:
        merged = moments if merged is None else merged.merge(moments)
    return merged

  def extract_output(self, accumulator):
    if accumulator is None:
      raise ValueError('--pca_dim: no video gave features to fit the PCA '
                       'on (every one failed; see the failures file).')
    return accumulator


def _feature_record(element, encoding: str, pca) -> bytes:
  video, labels, features = element
  return extract_features.make_yt8m_example(
      video, labels, features, encoding, pca).SerializeToString()


def _save_pca(pca, path: str) -> None:
  pca.save(path)


def extract(checkpoint_path: str, video_dir: str, output: str,
            experiment: Optional[str] = None,
            config_files: Sequence[str] = (), params_override: str = '',
            labels_csv: Optional[str] = None,
            short_side: Optional[int] = None, rate: float = 1.0,
            feature_layer: str = extract_features.DEFAULT_FEATURE_LAYER,
            encoding: str = 'float',
            pca_dim: Optional[int] = None, pca_file: Optional[str] = None,
            num_shards: int = 1, batch_size: int = 16,
            overwrite: bool = False,
            beam_pipeline_options: str = '') -> Result:
  """Runs the feature-extraction pipeline to the end. The model's arguments
  are `FeatureExtractor.from_checkpoint`'s (loaded on each worker), the
  videos' `videos_in_folder`'s, the output's `extract_features.extract`'s
  (with `pca_dim` the PCA is fitted on every feature of this run);
  `beam_pipeline_options`: 'key=value,...' ('': the DirectRunner).

  Raises:
    ImportError: Apache Beam is not installed.
    FileExistsError: an earlier run's files at `output`, not `overwrite`.
    ValueError: a flag problem (naming it), a labels problem, or fewer
      videos extracted than `num_shards`; nothing written."""
  _require_beam()
  options = pipeline_options(beam_pipeline_options)
  extract_features.check_encoding(encoding, pca_dim, pca_file)
  pca_path = output + extract_features.PCA_SUFFIX
  video_records.check_output(
      output, num_shards, (extract_features.PCA_SUFFIX,
                           video_records.FAILURES_SUFFIX),
      inputs=[('--pca_file', pca_file), ('--labels_csv', labels_csv)],
      models=[('--checkpoint_path', checkpoint_path)])
  previous = video_records.refuse_previous_output(
      output, overwrite, (extract_features.PCA_SUFFIX,
                          video_records.FAILURES_SUFFIX))
  loaded = frame_features.load_pca(pca_file) if pca_file else None
  model = dict(checkpoint_path=checkpoint_path, experiment=experiment,
               config_files=tuple(config_files),
               params_override=params_override, feature_layer=feature_layer,
               batch_size=batch_size)

  def expand(lines, staged):
    results = lines | 'ExtractFeatures' >> beam.ParDo(ExtractFeaturesFn(
        video_dir, model, short_side, rate, pca_file,
        loaded.input_dim if loaded else None)).with_outputs(
            FAILED, main='features')
    pca = loaded
    if pca_dim is not None:
      fitted = (results.features
                | 'Moments' >> beam.CombineGlobally(MomentsFn())
                | 'FitPca' >> beam.Map(frame_features.pca_from_moments,
                                       pca_dim))
      _ = fitted | 'SavePca' >> beam.Map(_save_pca, staged[pca_path])
      pca = beam.pvalue.AsSingleton(fitted)
    records = results.features | 'Records' >> beam.Map(
        _feature_record, encoding, pca)
    return records, results[FAILED]

  result = _run(options, video_dir, output, num_shards, labels_csv,
                previous, [pca_path] if pca_dim is not None else [], expand)
  return result._replace(
      pca_file=pca_path if pca_dim is not None else pca_file)


# The flags each pipeline takes (besides --beam_pipeline_options); another
# one given is an error naming it. `extract_features` takes the
# single-process command's (`extract_features.SHARED_FLAGS`).
_VIDEO_FLAGS = ('video_dir', 'output', 'labels_csv', 'num_shards',
                'short_side', 'overwrite')
PIPELINE_FLAGS = {
    'convert': _VIDEO_FLAGS + ('fps', 'jpeg_quality', 'object_maps_dir',
                               'segmenter'),
    'extract_features': extract_features.SHARED_FLAGS,
}
_REQUIRED = {'convert': ('video_dir', 'output'),
             'extract_features': ('video_dir', 'output', 'checkpoint_path')}


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues):
  the single-process extractor's shared ones (`extract_features.
  define_shared_flags`; `convert` takes the video and output ones), then
  convert's own and --beam_pipeline_options."""
  d = dict(flag_values=flag_values)
  extract_features.define_shared_flags(flag_values)
  for name in extract_features.SHARED_FLAGS:
    flags.declare_key_flag(name, flag_values)  # Listed by --help.
  flags.DEFINE_string('beam_pipeline_options', '', 'Beam pipeline options, '
                      'comma-separated key=value (e.g. runner=DataflowRunner,'
                      'project=P,...); empty: the DirectRunner.', **d)
  flags.DEFINE_float('fps', None, 'convert: keep frames at this rate.', **d)
  flags.DEFINE_integer('jpeg_quality', 90, 'convert: JPEG quality of the '
                       'frames.', **d)
  flags.DEFINE_string('object_maps_dir', None, 'convert: also store object '
                      'class maps from DIR/<video path without extension>/'
                      '<frame index>.png.', **d)
  flags.DEFINE_string('segmenter', None, 'convert: also store object class '
                      'maps computed by this SavedModel.', **d)
  flags.mark_flags_as_mutual_exclusive(['object_maps_dir', 'segmenter'],
                                       flag_values=flag_values)


def _check_flags(fv: flags.FlagValues, pipeline: str) -> None:
  """UsageError naming a required flag missing, or a flag given that
  `pipeline` does not take."""
  missing = [f'--{n}' for n in _REQUIRED[pipeline]
             if fv[n].value in (None, '')]
  if missing:
    raise app.UsageError(f'{pipeline} needs {", ".join(missing)}.')
  takes = set(PIPELINE_FLAGS[pipeline]) | {'beam_pipeline_options'}
  others = {n for p in PIPELINE_FLAGS.values() for n in p} - takes
  given = sorted(f'--{n}' for n in others if fv[n].present)
  if given:
    raise app.UsageError(f'{pipeline} does not take {", ".join(given)}.')


def run_pipeline(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS
                 ) -> Result:
  """Runs the pipeline named by the positional argument (`PIPELINES`);
  prints and returns what it wrote."""
  fv = flag_values
  if len(argv) != 2 or argv[1] not in PIPELINES:
    raise app.UsageError(f'expected one pipeline of {PIPELINES}; got '
                         f'{list(argv[1:])}')
  pipeline = argv[1]
  _check_flags(fv, pipeline)
  if pipeline == 'convert':
    result = convert(fv.video_dir, fv.output, fv.labels_csv, fv.num_shards,
                     fv.fps, fv.short_side, fv.jpeg_quality, fv.overwrite,
                     fv.object_maps_dir, fv.segmenter,
                     fv.beam_pipeline_options)
  else:
    result = extract(
        fv.checkpoint_path, fv.video_dir, fv.output, fv.experiment,
        fv.config_file or (), fv.params_override, fv.labels_csv,
        fv.short_side, fv.rate, fv.feature_layer, fv.encoding, fv.pca_dim,
        fv.pca_file, fv.num_shards, fv.batch_size, fv.overwrite,
        fv.beam_pipeline_options)
  print(f'wrote {len(result.files)} shard(s) ({result.files[0]} ...) of '
        f'{result.num_videos - len(result.failed)} of {result.num_videos} '
        f'videos; {len(result.failed)} failed, listed in '
        f'{result.failures_file}' +
        (f'; PCA: {result.pca_file}' if result.pca_file else ''))
  return result


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """The command: `run_pipeline`, returning nothing (`app.run` exits 0)."""
  run_pipeline(argv, flag_values)


if __name__ == '__main__':
  define_flags()
  app.run(main)
