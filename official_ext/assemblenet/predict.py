"""`python -m official_ext.assemblenet.predict`: AssembleNet++lite's scores of
video files, folders of them or TFRecords, by the evaluation's protocol, as a
top-k CSV / JSON or a timeline of windows (docs/assemblenet.md#predict-on-your-videos)."""
import csv
import dataclasses
import json
import os
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf, tf_keras

from official.core import config_definitions
from official.core import task_factory
from official.vision.ops import preprocess_ops_3d
from official_ext.assemblenet import dataloader
from official_ext.assemblenet import export
# Registers AssembleNetTask with task_factory (a checkpoint's model).
from official_ext.assemblenet import task  # pylint: disable=unused-import
from official_ext.assemblenet import videos
from official_ext.core import checkpoints
from official_ext.core import experiment_params
from official_ext.core.kernels import kernel_policy
from official_ext.core import output_files
from official_ext.core import timelines

# The config class when the model's params.yaml gives the values.
DEFAULT_EXPERIMENT = 'assemblenet_plus_lite_demo'
CSV_HEADER = ('VideoId', 'Rank', 'LabelId', 'Name', 'Score', 'Error')
# How a JSON output begins (`write_json`).
JSON_START = '{\n "videos": ['
ERROR_COLUMN = 'Error'
# Context feature of the converter's record id.
CLIP_ID_KEY = 'clip/id'

# uint8 RGB frames [T, H, W, 3] of one video -> float [num_classes].
Predictor = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass
class Input:
  """One video to score."""
  video_id: str  # Its name in the outputs.
  frames: Optional[np.ndarray]  # uint8 RGB [T, H, W, 3]; None: unreadable.
  fps: float = 0.0  # 0.0 when unknown (records).
  error: str = ''  # Why it could not be read.


def load_class_names(path: str, num_classes: int) -> List[str]:
  """Class names, one a line in class id order (OUTPUT.classes.txt).

  Raises:
    ValueError: naming `path`: a line count other than `num_classes` (a
      trailing empty line aside) or an empty name.
  """
  with tf.io.gfile.GFile(path) as f:
    names = f.read().split('\n')
  if names and names[-1] == '':
    names.pop()
  names = [n.rstrip('\r') for n in names]
  if len(names) != num_classes:
    raise ValueError(f'--vocabulary={path} has {len(names)} class names; the '
                     f'model has {num_classes} classes (one name a line, in '
                     'class id order).')
  empty = [i + 1 for i, n in enumerate(names) if not n.strip()]
  if empty:
    raise ValueError(f'--vocabulary={path}: line {empty[0]} is empty; '
                     'expected a class name.')
  return names


def checkpoint_predictor(params: config_definitions.ExperimentConfig,
                         checkpoint_path: str) -> Predictor:
  """The model of a training checkpoint behind the export module's `serve`,
  built in float32 under the kernel policy an evaluation here takes."""
  tf_keras.mixed_precision.set_global_policy('float32')
  policy = kernel_policy.resolve(kernel_policy.setting_of(params))
  with kernel_policy.use(policy):
    anet_task = task_factory.get_task(params.task)
    model = anet_task.build_model()
  checkpoints.restore_model(model, checkpoint_path)
  module = export.AssembleNetExportModule(params, model, anet_task)
  # One trace for every frame count and size (as the SavedModel's).
  serve = tf.function(module.serve, input_signature=[tf.TensorSpec(
      [1, None, None, None, 3], tf.uint8)])

  def predict(frames: np.ndarray) -> np.ndarray:
    with kernel_policy.use(policy):  # The first call traces.
      return serve(tf.constant(frames[np.newaxis]))['probabilities'].numpy()[0]
  return predict


def saved_model_predictor(saved_model: str) -> Predictor:
  """The `serving_default` signature of an exported model."""
  fn = tf.saved_model.load(saved_model).signatures['serving_default']
  return lambda frames: fn(frames=tf.constant(frames[np.newaxis]))[
      'probabilities'].numpy()[0]


def _is_video_input(path: str) -> bool:
  return os.path.isdir(path) or videos.is_video(path)


def _read_video(path: str, video_id: str, fps: Optional[float],
                short_side: Optional[int]) -> Input:
  try:
    video = videos.read_video(path, fps=fps, short_side=short_side)
  except Exception as e:  # pylint: disable=broad-except
    # Any decoding failure (ValueError, OpenCV's error): raised or listed
    # by `_readable`, naming the file.
    message = str(e)
    return Input(video_id, None, error=(
        message if path in message else f'{path}: {message}'))
  return Input(video_id, video.frames, video.fps)


def _records(data, pattern: str) -> Iterator[Input]:
  """The records of a TFRecord pattern as decoded uint8 frames."""
  files = sorted(tf.io.gfile.glob(pattern))
  if not files:
    raise ValueError(f'--input={pattern} is neither a video file, a folder '
                     'nor a TFRecord pattern matching a file.')
  decoder = dataloader.Decoder(data)
  for path in files:
    index = -1
    try:
      for index, record in enumerate(tf.data.TFRecordDataset(path)):
        default_id = f'{path}:{index}'
        try:
          context, _ = tf.io.parse_single_sequence_example(
              record, context_features={CLIP_ID_KEY: tf.io.FixedLenFeature(
                  [], tf.string, default_value='')})
          video_id = context[CLIP_ID_KEY].numpy().decode() or default_id
          decoded = decoder.decode_record(tf.constant(path), record)
          encoded = decoded[dataloader.FRAMES]
          if not encoded.shape[0]:
            raise ValueError(f'record {index} of {path} has no frames '
                             f'({data.image_field_key} is empty)')
          frames = preprocess_ops_3d.decode_image(encoded, 3).numpy()
        except (tf.errors.InvalidArgumentError, ValueError) as e:
          message = getattr(e, 'message', None) or str(e)
          yield Input(default_id, None, error=(
              f'record {index} of {path} cannot be read: {message}'))
          continue
        yield Input(video_id, frames)
    except tf.errors.OpError as e:  # A truncated or corrupted file.
      yield Input(path, None, error=(
          f'{path} cannot be read after record {index}: {e.message}'))


def read_inputs(input_path: str, data, fps: Optional[float] = None,
                short_side: Optional[int] = None) -> Iterator[Input]:
  """The videos of `--input` (module docstring), one at a time; one that
  cannot be read comes with its `error` instead of frames."""
  if os.path.isdir(input_path):
    found = videos.find_videos(input_path)
    if not found:
      raise ValueError(f'--input={input_path} is a folder without a video '
                       f'file ({", ".join(videos.VIDEO_EXTENSIONS)}).')
    for relative in found:
      yield _read_video(os.path.join(input_path, relative), relative, fps,
                        short_side)
  elif videos.is_video(input_path):
    yield _read_video(input_path, input_path, fps, short_side)
  else:
    yield from _records(data, input_path)


def _readable(inputs: Iterator[Input], skip_unreadable: bool,
              skipped: List[Tuple[str, str]]) -> Iterator[Input]:
  for item in inputs:
    if item.frames is not None:
      yield item
      continue
    if not skip_unreadable:
      raise ValueError(f'Unreadable input {item.video_id}: {item.error}. '
                       'Nothing was written (--skip_unreadable lists it and '
                       'goes on).')
    logging.warning('Skipped unreadable input %s: %s', item.video_id,
                    item.error)
    skipped.append((item.video_id, item.error))


def _finite(video_id: str, probabilities: np.ndarray) -> np.ndarray:
  if not np.isfinite(probabilities).all():
    raise ValueError(f'The model scored {video_id} with a non-finite '
                     'probability (a damaged checkpoint?); nothing was '
                     'written.')
  return probabilities


def top_k(probabilities: np.ndarray, k: int) -> List[Tuple[int, float]]:
  """The k (class, score) pairs of highest score (ties: lower id)."""
  order = np.argsort(-probabilities, kind='stable')[:k]
  return [(int(c), float(probabilities[c])) for c in order]


def write_csv(predictions, skipped, out, k: int,
              names: Optional[Sequence[str]]) -> int:
  """The top-k CSV (module docstring); returns the videos written."""
  writer = csv.writer(out, lineterminator='\n')
  writer.writerow(CSV_HEADER)
  for video_id, probabilities in predictions:
    for rank, (c, s) in enumerate(top_k(probabilities, k), 1):
      writer.writerow([video_id, rank, c, names[c] if names else '',
                       f'{s:.6f}', ''])
  for video_id, error in skipped:
    writer.writerow([video_id, '', '', '', '', error])
  return len(predictions)


def write_json(predictions, skipped, out, k: int,
               names: Optional[Sequence[str]]) -> int:
  """The top-k JSON (module docstring); returns the videos written."""
  doc = {'videos': [{'id': video_id, 'top_k': [
      {'rank': rank, 'label_id': c, 'name': names[c] if names else None,
       'score': s} for rank, (c, s) in enumerate(top_k(p, k), 1)]}
                    for video_id, p in predictions],
         'skipped': [{'id': v, 'error': e} for v, e in skipped]}
  json.dump(doc, out, indent=1)
  out.write('\n')
  return len(predictions)


def score_timeline(item: Input, predictor: Predictor, window_seconds: float,
                   stride_seconds: float) -> timelines.Timeline:
  """Every window of a decoded video scored as a video of its own."""
  window = timelines.window_frames(window_seconds, item.fps,
                                   '--window_seconds', item.video_id)
  stride = timelines.window_frames(stride_seconds, item.fps,
                                   '--stride_seconds', item.video_id)
  starts, ends = (t.numpy() for t in timelines.window_bounds(
      len(item.frames), window, stride))
  scores = [predictor(item.frames[a:b]) for a, b in zip(starts, ends)]
  return timelines.Timeline(item.video_id, starts / item.fps,
                            ends / item.fps, np.stack(scores))


def run(params: config_definitions.ExperimentConfig, input_path: str,
        output_file: str, saved_model: Optional[str] = None,
        checkpoint_path: Optional[str] = None, k: int = 5,
        vocabulary: Optional[str] = None, skip_unreadable: bool = False,
        fps: Optional[float] = None, short_side: Optional[int] = None,
        window_seconds: Optional[float] = None,
        stride_seconds: Optional[float] = None, plot: Optional[str] = None,
        plot_classes: int = 5, predictor: Optional[Predictor] = None,
        overwrite: bool = False) -> int:
  """Scores every video of `input_path` into `output_file` (and `plot`); the
  arguments are the flags'; returns the number of videos scored.

  `predictor`: the model at `saved_model` / `checkpoint_path` already loaded
  (`checkpoint_predictor`, `saved_model_predictor`), for callers that score
  several inputs with one model.

  Raises:
    ValueError: naming the flag: an output that is an input, lies inside a
      model, or has another extension; a timeline flag without the other,
      or on TFRecords; an unreadable input (without `skip_unreadable`); no
      input scored; `params` contradicting the model's params.yaml.
    FileNotFoundError: an output's folder does not exist.
    output_files.OutputExistsError: an existing output that predict did not
      write, without `overwrite`."""
  model = experiment_params.model_path(saved_model, checkpoint_path)
  timeline = window_seconds is not None or stride_seconds is not None
  if timeline and (window_seconds is None or stride_seconds is None):
    raise ValueError('--window_seconds and --stride_seconds go together; got '
                     f'--window_seconds={window_seconds}, --stride_seconds='
                     f'{stride_seconds}.')
  if plot and not timeline:
    raise ValueError(f'--plot={plot} draws a timeline: pass --window_seconds '
                     'and --stride_seconds.')
  if timeline and not _is_video_input(input_path):
    raise ValueError(
        f'--window_seconds needs video files (their frame rate turns seconds '
        f'into frames); --input={input_path} is read as TFRecords.')
  ext = os.path.splitext(output_file)[1].lower()
  allowed = ('.csv',) if timeline else ('.csv', '.json')
  if ext not in allowed:
    raise ValueError(f'--output_file={output_file}: expected a '
                     f'{" or ".join(allowed)} file'
                     f'{" (a timeline is a CSV)" if timeline else ""}.')
  if plot and not plot.lower().endswith('.png'):
    raise ValueError(f'--plot={plot}: expected a .png file.')
  inputs = [('--input', input_path), ('--vocabulary', vocabulary)]
  models = [('--saved_model', saved_model),
            ('--checkpoint_path', checkpoint_path)]
  own = lambda head: (timelines.is_own_output(head) or
                      output_files.begins_with(','.join(CSV_HEADER),
                                               JSON_START)(head))
  for path, flag in ((output_file, '--output_file'), (plot, '--plot')):
    if path:  # Before anything is read or written.
      output_files.check_output_file(path, flag, inputs=inputs,
                                     models=models, own=own,
                                     overwrite=overwrite)
  if k < 1:
    raise ValueError(f'--top_k={k}; expected >= 1.')
  experiment_params.check_model_params(params, model, 'predict')
  data = params.task.validation_data
  names = load_class_names(vocabulary, data.num_classes) if vocabulary else None
  if predictor is None:
    predictor = (saved_model_predictor(saved_model) if saved_model else
                 checkpoint_predictor(params, checkpoint_path))
  skipped: List[Tuple[str, str]] = []
  readable = _readable(read_inputs(input_path, data, fps, short_side),
                       skip_unreadable, skipped)
  if timeline:
    results = [score_timeline(item, predictor, window_seconds, stride_seconds)
               for item in readable]
  else:
    results = [(item.video_id, _finite(item.video_id, predictor(item.frames)))
               for item in readable]
  if not results:
    raise ValueError(f'--input={input_path}: no input could be scored '
                     f'({len(skipped)} unreadable); nothing was written.')
  if timeline:
    timelines.write_outputs(results, output_file, plot, plot_classes, names,
                            skipped)
  else:
    write = write_csv if ext == '.csv' else write_json
    output_files.write_atomically(
        output_file, lambda out: write(results, skipped, out, k, names))
  logging.info('Scored %d videos (%d skipped) into %s', len(results),
               len(skipped), output_file)
  return len(results)


FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  define = dict(flag_values=flag_values)
  experiment_params.define_model_flags(
      flag_values, ('saved_model', 'checkpoint_path'), DEFAULT_EXPERIMENT)
  flags.DEFINE_string('input', None, 'A video file, a folder of videos, or '
                      'a TFRecord file pattern.', **define)
  flags.DEFINE_string('output_file', None, '.csv or .json file to write.',
                      **define)
  flags.DEFINE_integer('top_k', 5, 'Classes a video.', **define)
  flags.DEFINE_string('vocabulary', None,
                      'Class names, one a line in class id order.', **define)
  flags.DEFINE_bool('skip_unreadable', False,
                    'List and skip unreadable inputs instead of failing.',
                    **define)
  flags.DEFINE_float('fps', None, 'Decode videos at this frame rate (as '
                     'the TFRecord converter).', **define)
  flags.DEFINE_integer('short_side', None, 'Resize decoded frames to this '
                       'short side (as the TFRecord converter).', **define)
  flags.DEFINE_bool('overwrite', False, 'Replace an existing --output_file '
                    'or --plot that predict did not write.', **define)
  timelines.define_flags(flag_values, 'seconds a window.')
  flags.mark_flags_as_required(['input', 'output_file'],
                               flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Writes the predictions the parsed `flag_values` ask for."""
  del argv
  fv = flag_values
  params = experiment_params.params_from_flags(fv, DEFAULT_EXPERIMENT)
  count = run(params, fv.input, fv.output_file, saved_model=fv.saved_model,
              checkpoint_path=fv.checkpoint_path, k=fv.top_k,
              vocabulary=fv.vocabulary, skip_unreadable=fv.skip_unreadable,
              fps=fv.fps, short_side=fv.short_side,
              window_seconds=fv.window_seconds,
              stride_seconds=fv.stride_seconds, plot=fv.plot,
              plot_classes=fv.plot_classes, overwrite=fv.overwrite)
  plot = f' and {fv.plot}' if fv.plot else ''
  print(f'Wrote {count} videos to {fv.output_file}{plot}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
