"""`python -m official_ext.assemblenet.extract_features`: a trained
AssembleNet++lite's features of your videos at a stated rate, as YouTube-8M
frame-level records (float or PCA-quantized), written whole or not at all
(docs/assemblenet.md#features-for-youtube-8m-models-the-feature-bridge)."""
import dataclasses
import os
import sys
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf, tf_keras

from official.core import config_definitions
from official_ext.assemblenet import dataloader
from official_ext.assemblenet.modeling import assemblenet_plus_lite
from official_ext.assemblenet import task as task_lib
from official_ext.assemblenet import video_records
from official_ext.assemblenet import videos as videos_lib
from official_ext.core import checkpoints
from official_ext.core import experiment_params
from official_ext.core import frame_features
from official_ext.core.kernels import kernel_policy
from official_ext.core import output_files

FEATURE_LAYERS = ('head', 'backbone')
DEFAULT_FEATURE_LAYER = 'head'
ENCODINGS = ('float', 'quantized')
FEATURE_NAME = 'rgb'
PCA_SUFFIX = '.pca.npz'


def num_features(num_frames: int, fps: float, rate: float) -> int:
  """Features of a video of `num_frames` at `fps`: max(1, floor(seconds x
  rate))."""
  return max(1, int(np.floor(num_frames / fps * rate + 1e-6)))


def clip_windows(num_frames: int, fps: float, rate: float,
                 clip_frames: int) -> List[Tuple[int, int]]:
  """[start, end) frame ranges of the clips, one per feature: clip i, of
  `clip_frames` frames, centred at (i + 0.5) / rate seconds and shifted inside
  the video (a shorter video: the whole video).

  Raises:
    ValueError: `fps` or `rate` not positive (naming it)."""
  if not fps > 0:
    raise ValueError(f'frame rate {fps!r}: expected > 0 frames per second.')
  if not rate > 0:
    raise ValueError(f'--rate={rate!r}: expected > 0 features per second.')
  last = max(0, num_frames - clip_frames)
  windows = []
  for i in range(num_features(num_frames, fps, rate)):
    centre = (i + 0.5) / rate * fps
    start = min(max(0, int(round(centre - clip_frames / 2))), last)
    windows.append((start, min(num_frames, start + clip_frames)))
  return windows


class FeatureExtractor:
  """A trained AssembleNet++lite model's per-clip features: the model, its
  evaluation preprocessing (one clip, one centre crop) and the traced feature
  function; no global state."""

  def __init__(self, params: config_definitions.ExperimentConfig,
               model: tf_keras.Model,
               feature_layer: str = DEFAULT_FEATURE_LAYER,
               batch_size: int = 16):
    """Args: params: the model's experiment; model: the restored
    `AssembleNetPlusLiteModel`; feature_layer: one of FEATURE_LAYERS;
    batch_size: clips per model call."""
    if feature_layer not in FEATURE_LAYERS:
      raise ValueError(f'--feature_layer={feature_layer!r}: expected one of '
                       f'{FEATURE_LAYERS}.')
    if not isinstance(model, assemblenet_plus_lite.AssembleNetPlusLiteModel):
      raise ValueError(
          f'task.model.model_type {params.task.model.model_type!r} built a '
          f'{type(model).__name__}; features come from an '
          'AssembleNetPlusLiteModel.')
    if batch_size < 1:
      raise ValueError(f'--batch_size={batch_size}: expected >= 1.')
    self.params = params
    self.model = model
    self.feature_layer = feature_layer
    self.batch_size = batch_size
    data = params.task.validation_data.replace(num_test_clips=1,
                                               num_test_crops=1)
    self._parser = dataloader.Parser(data)
    self._clip_shape = list(data.feature_shape)
    self.clip_frames = data.feature_shape[0] * data.temporal_stride
    self._policy = kernel_policy.resolve(kernel_policy.setting_of(params))
    self._features = tf.function(self._features_fn, reduce_retracing=True)

  @classmethod
  def from_checkpoint(cls, checkpoint_path: str,
                      experiment: Optional[str] = None,
                      config_files: Sequence[str] = (),
                      params_override: str = '', **kwargs
                      ) -> 'FeatureExtractor':
    """The model of a training checkpoint (a model_dir or a `ckpt-N` prefix in
    one) and its params.yaml, with `config_files` and `params_override` on top
    (`core.experiment_params`; `experiment` needed only without a params.yaml);
    `kwargs`: `FeatureExtractor`'s."""
    params = experiment_params.load_model_params(
        'assemblenet_plus_lite_demo', experiment, config_files,
        params_override, checkpoint_path=checkpoint_path)
    tf_keras.mixed_precision.set_global_policy('float32')
    task = task_lib.AssembleNetTask(params.task)
    with kernel_policy.use(kernel_policy.resolve(
        kernel_policy.setting_of(params))):
      model = task.build_model()
    checkpoints.restore_model(model, checkpoint_path)
    return cls(params, model, **kwargs)

  @property
  def dim(self) -> int:
    """Width D of a feature."""
    if self.feature_layer == 'head':
      return int(self.model.head.get_config()['filters'][1])
    return int(self.model.backbone.output_specs['output'][-1])

  def _features_fn(self, windows: tf.Tensor, source: tf.Tensor) -> tf.Tensor:
    images = tf.map_fn(
        lambda w: self._parser.eval_views(w, source), windows,
        fn_output_signature=tf.TensorSpec(self._clip_shape, tf.float32))
    x = self.model.backbone(images, training=False)['output']
    if self.feature_layer == 'head':
      return self.model.head.embedding(x, training=False)
    return tf.cast(tf.reduce_mean(x, axis=[1, 2, 3]), tf.float32)

  def clip_features(self, windows: np.ndarray, source: str) -> np.ndarray:
    """float32 [n, D] features of n clips of one length: `windows` uint8 [n,
    frames, H, W, 3] or [n, frames] JPEG/PNG strings; `source` names the video
    in errors."""
    out = []
    with kernel_policy.use(self._policy):
      for i in range(0, len(windows), self.batch_size):
        batch = windows[i:i + self.batch_size]
        out.append(self._features(tf.constant(batch), tf.constant(source))
                   .numpy())
    features = np.concatenate(out, axis=0)
    if not np.isfinite(features).all():
      raise ValueError(f'{source}: the model gave NaN or infinite features.')
    return features


def extract_video(extractor: FeatureExtractor, frames: np.ndarray,
                  fps: float, rate: float = 1.0,
                  name: str = 'video') -> np.ndarray:
  """float32 [S, D] features of one video (`frames` uint8 [N, H, W, 3] or [N]
  JPEG/PNG strings at `fps`), `rate` per second: S = `num_features(N, fps,
  rate)`; `name` names it in errors."""
  frames = np.asarray(frames)
  if not len(frames):
    raise ValueError(f'{name}: no frames.')
  if not fps or not fps > 0:
    raise ValueError(f'{name}: frame rate {fps!r} (the file states none?); '
                     'features per second need the frame rate.')
  windows = clip_windows(len(frames), fps, rate, extractor.clip_frames)
  clips = np.stack([frames[a:b] for a, b in windows])
  return extractor.clip_features(clips, name)


def make_yt8m_example(video_id: str, labels: Sequence[int],
                      features: np.ndarray, encoding: str = 'float',
                      pca: Optional[frame_features.Pca] = None
                      ) -> tf.train.SequenceExample:
  """A YouTube-8M frame-level record (context `id`, `labels`; float32 [S, D]
  `features` as `rgb`): `encoding` 'float' (float32 lists, after `pca` if
  given) or 'quantized' (`pca` applied, one byte a value)."""
  if encoding not in ENCODINGS:
    raise ValueError(f'--encoding={encoding!r}: expected one of {ENCODINGS}.')
  if encoding == 'quantized' and pca is None:
    raise ValueError("--encoding=quantized needs a PCA (--pca_dim to fit one "
                     'or --pca_file to load one): YouTube-8M quantizes '
                     'whitened PCA features, which lie in [-2, 2].')
  values = np.asarray(features, np.float32)
  if pca is not None:
    values = pca.apply(values, f'video {video_id!r}')
  if encoding == 'quantized':
    values = frame_features.quantize(values)
  return frame_features.make_sequence_example(video_id, labels,
                                              {FEATURE_NAME: values})


@dataclasses.dataclass
class VideoSource:
  """One video to extract: `load()` -> (frames, fps); errors name `path`."""
  video_id: str
  labels: List[int]
  path: str
  load: Callable[[], Tuple[np.ndarray, float]]


def videos_in_folder(video_dir: str, labels_csv: Optional[str] = None,
                     short_side: Optional[int] = None) -> List[VideoSource]:
  """The videos under `video_dir`, labelled as the converter labels them."""
  found = videos_lib.find_videos(video_dir)
  if not found:
    raise ValueError(f'--video_dir={video_dir}: no video file '
                     f'({", ".join(videos_lib.VIDEO_EXTENSIONS)}) under it.')
  labels, _ = videos_lib.video_labels(video_dir, found, labels_csv)

  def loader(path):
    def load():
      video = videos_lib.read_video(path, short_side=short_side)
      return video.frames, video.fps
    return load

  return [VideoSource(v, labels[v], os.path.join(video_dir, v),
                      loader(os.path.join(video_dir, v))) for v in found]


def videos_in_records(input_path: str, fps: Optional[float],
                      params: config_definitions.ExperimentConfig
                      ) -> Iterator[VideoSource]:
  """The clip records of the files `input_path` matches (a glob or comma-
  separated globs), frames as JPEG/PNG strings at `fps`."""
  if not fps or fps <= 0:
    raise ValueError(f'--fps={fps!r}: clip records do not store their frame '
                     'rate; give the rate their frames were written at (the '
                     "converter's --fps, else the videos').")
  files = sorted(f for p in input_path.split(',') for f in tf.io.gfile.glob(p))
  if not files:
    raise ValueError(f'--input_path={input_path!r} matches no file.')
  data = params.task.validation_data
  for path in files:
    for i, record in enumerate(tf.data.TFRecordDataset(path)):
      name = f'{path}:{i}'
      try:
        example = tf.train.SequenceExample.FromString(record.numpy())
      except Exception as e:  # pylint: disable=broad-except
        raise ValueError(f'record {name} is not a SequenceExample: '
                         f'{e}') from e
      context = example.context.feature
      frames = np.array(
          [f.bytes_list.value[0] for f in
           example.feature_lists.feature_list[data.image_field_key].feature],
          dtype=object)
      clip_id = context['clip/id'].bytes_list.value
      video_id = clip_id[0].decode() if clip_id else (
          f'{os.path.basename(path)}:{i}')
      labels = list(context[data.label_field_key].int64_list.value)
      yield VideoSource(video_id, labels, name,
                        lambda frames=frames: (frames, fps))


def shard_paths(output: str, num_shards: int) -> List[str]:
  """`OUTPUT-0000i-of-0000n.tfrecord` (the converter's naming)."""
  return video_records.shard_paths(output, num_shards)


def previous_output(output: str) -> List[str]:
  """Files of an earlier run to the prefix `output` (shards of any count,
  its .pca.npz), sorted."""
  return video_records.previous_output(output, (PCA_SUFFIX,))


@dataclasses.dataclass
class Summary:
  """What `extract` wrote."""
  files: List[str]
  num_videos: int
  features_per_video: List[int]
  dim: int
  pca_file: Optional[str]
  skipped: List[str]
  clipped_fraction: float  # Quantized values at 0 or 255.


def check_encoding(encoding: str, pca_dim: Optional[int],
                   pca_file: Optional[str]) -> None:
  """ValueError naming the flag when --encoding, --pca_dim and --pca_file
  do not go together (the single-process and the Beam extractor's check)."""
  if encoding not in ENCODINGS:
    raise ValueError(f'--encoding={encoding!r}: expected one of {ENCODINGS}.')
  if pca_dim is not None and pca_file:
    raise ValueError(f'--pca_dim={pca_dim} and --pca_file={pca_file}: give '
                     'one (fit a PCA on this split, or load the one fitted '
                     'on the training split).')
  if encoding == 'quantized' and pca_dim is None and not pca_file:
    raise ValueError('--encoding=quantized needs --pca_dim (fit the PCA on '
                     'this, the training, split) or --pca_file (load it).')


def extract(extractor: FeatureExtractor, sources: Sequence[VideoSource],
            output: str, rate: float = 1.0, encoding: str = 'float',
            pca_dim: Optional[int] = None, pca_file: Optional[str] = None,
            num_shards: int = 1, overwrite: bool = False,
            skip_unreadable: bool = False) -> Summary:
  """Extracts every video and writes the records (the arguments are the
  flags').

  Raises:
    FileExistsError: files of an earlier run to `output` (unless
      `overwrite`), before any video is read.
    ValueError: an unreadable video (naming it; unless `skip_unreadable`),
      an encoding / PCA flag problem (naming the flag)."""
  check_encoding(encoding, pca_dim, pca_file)
  if num_shards < 1:
    raise ValueError(f'--num_shards={num_shards}: expected >= 1.')
  previous = previous_output(output)
  if previous and not overwrite:
    raise FileExistsError(
        f'--output={output}: files of an earlier run are there ('
        f'{", ".join(os.path.basename(f) for f in previous[:5])}); nothing '
        'was written. Choose another --output or pass --overwrite.')
  pca = frame_features.load_pca(pca_file) if pca_file else None
  if pca is not None and pca.input_dim != extractor.dim:
    raise ValueError(
        f'--pca_file={pca_file} was fitted on {pca.input_dim}-wide features; '
        f'this model\'s --feature_layer={extractor.feature_layer} gives '
        f'{extractor.dim}.')
  extracted, skipped = [], []
  for source in sources:
    try:
      frames, fps = source.load()
    except ValueError as e:
      if not skip_unreadable:
        raise
      print(f'skipping: {e}', file=sys.stderr)
      skipped.append(source.path)
      continue
    extracted.append((source, extract_video(extractor, frames, fps, rate,
                                            source.path)))
  if len(extracted) < num_shards:
    raise ValueError(
        f'--num_shards={num_shards} but {len(extracted)} video(s) were '
        f'extracted ({len(skipped)} unreadable skipped); nothing was written.')
  fitted = None
  if pca_dim is not None:
    fitted = pca = frame_features.fit_pca(
        np.concatenate([f for _, f in extracted]), pca_dim)
  files = shard_paths(output, num_shards)
  pca_path = output + PCA_SUFFIX if fitted is not None else None
  clipped, values = 0, 0
  with output_files.write_together(
      files + ([pca_path] if pca_path else []), replaces=previous) as staged:
    writers = [tf.io.TFRecordWriter(staged[f]) for f in files]
    try:
      for i, (source, features) in enumerate(extracted):
        example = make_yt8m_example(source.video_id, source.labels, features,
                                    encoding, pca)
        if encoding == 'quantized':
          for entry in example.feature_lists.feature_list[FEATURE_NAME].feature:
            q = np.frombuffer(entry.bytes_list.value[0], np.uint8)
            clipped += int(np.sum((q == 0) | (q == 255)))
            values += q.size
        writers[i % num_shards].write(example.SerializeToString())
    finally:
      for w in writers:
        w.close()
    if fitted is not None:
      fitted.save(staged[pca_path])
  summary = Summary(files=files, num_videos=len(extracted),
                    features_per_video=[len(f) for _, f in extracted],
                    dim=pca.dim if pca is not None else extractor.dim,
                    pca_file=pca_path or pca_file, skipped=skipped,
                    clipped_fraction=clipped / values if values else 0.0)
  if summary.clipped_fraction > 0.01:
    logging.warning('%.1f%% of the quantized values lie outside [-2, 2] and '
                    'were clipped.', 100 * summary.clipped_fraction)
  return summary


FLAGS = flags.FLAGS


# The flags of this command that the Beam pipeline (`beam_pipelines
# extract_features`) takes too: defined once, by `define_shared_flags`.
SHARED_FLAGS = ('checkpoint_path', 'experiment', 'config_file',
                'params_override', 'video_dir', 'labels_csv', 'short_side',
                'rate', 'feature_layer', 'encoding', 'pca_dim', 'pca_file',
                'output', 'num_shards', 'batch_size', 'overwrite')


def define_shared_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines `SHARED_FLAGS` in `flag_values` (this command's and the Beam
  pipelines')."""
  d = dict(flag_values=flag_values)
  experiment_params.define_model_flags(
      flag_values, default_experiment='assemblenet_plus_lite_demo')
  flags.DEFINE_string('video_dir', None, 'Folder of video files (class '
                      'sub-folders or --labels_csv).', **d)
  flags.DEFINE_string('labels_csv', None, 'Lines `video,ids` (";"-separated '
                      'ids), paths relative to --video_dir.', **d)
  flags.DEFINE_integer('short_side', None, 'Resize decoded videos to this '
                       'short side first.', **d)
  flags.DEFINE_float('rate', 1.0, 'Features per second.', **d)
  flags.DEFINE_enum('feature_layer', DEFAULT_FEATURE_LAYER, FEATURE_LAYERS,
                    'head: pre-logits; backbone: pooled backbone output.', **d)
  flags.DEFINE_enum('encoding', 'float', ENCODINGS, 'float32 features, or '
                    "YouTube-8M's PCA + uint8 quantization.", **d)
  flags.DEFINE_integer('pca_dim', None, 'Fit a PCA of this many dimensions '
                       'on these features (the training split).', **d)
  flags.DEFINE_string('pca_file', None, 'Or apply this stored PCA (.npz).',
                      **d)
  flags.DEFINE_string('output', None, 'Output prefix (its folder is created '
                      'if missing).', **d)
  flags.DEFINE_integer('num_shards', 1, 'Output files.', **d)
  flags.DEFINE_integer('batch_size', 16, 'Clips per model call.', **d)
  flags.DEFINE_bool('overwrite', False, 'Replace an earlier run\'s files.', **d)


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the command's flags in `flag_values`."""
  d = dict(flag_values=flag_values)
  define_shared_flags(flag_values)
  flags.DEFINE_string('input_path', None, 'Or clip TFRecords (glob).', **d)
  flags.DEFINE_float('fps', None, 'Frame rate of --input_path records.', **d)
  flags.DEFINE_bool('skip_unreadable', False, 'List and skip unreadable '
                    'videos.', **d)
  flags.mark_flags_as_required(['checkpoint_path', 'output'],
                               flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  del argv
  fv = flag_values
  if bool(fv.video_dir) == bool(fv.input_path):
    raise ValueError('Pass exactly one of --video_dir and --input_path; got '
                     f'--video_dir={fv.video_dir!r}, '
                     f'--input_path={fv.input_path!r}.')
  video_records.check_output(
      fv.output, fv.num_shards, (PCA_SUFFIX,),
      inputs=[('--input_path', fv.input_path), ('--pca_file', fv.pca_file),
              ('--labels_csv', fv.labels_csv)],
      models=[('--checkpoint_path', fv.checkpoint_path)])
  extractor = FeatureExtractor.from_checkpoint(
      fv.checkpoint_path, fv.experiment, fv.config_file or (),
      fv.params_override, feature_layer=fv.feature_layer,
      batch_size=fv.batch_size)
  sources = (videos_in_folder(fv.video_dir, fv.labels_csv, fv.short_side)
             if fv.video_dir else
             videos_in_records(fv.input_path, fv.fps, extractor.params))
  summary = extract(extractor, sources, fv.output, fv.rate, fv.encoding,
                    fv.pca_dim, fv.pca_file, fv.num_shards, fv.overwrite,
                    fv.skip_unreadable)
  print(f'Wrote {summary.num_videos} videos ({sum(summary.features_per_video)}'
        f' features of width {summary.dim}, {fv.encoding}) to '
        f'{summary.files[0]} ...' +
        (f'; PCA in {summary.pca_file}' if summary.pca_file else '') +
        (f'; skipped {len(summary.skipped)} unreadable: {summary.skipped}'
         if summary.skipped else ''))


if __name__ == '__main__':
  define_flags()
  app.run(main)
