r"""YouTube-8M inference: writes the challenge's submission CSV files.

  python -m official_ext.yt8m.predict --saved_model=/tmp/export \
      --input_path='/data/yt8m/test*.tfrecord' --output_file=/tmp/pred.csv
  python -m official_ext.yt8m.predict --experiment=yt8m_demo \
      --checkpoint_path=/tmp/yt8m_demo --input_path=... --output_file=...

Video level (default): header `VideoId,LabelConfidencePairs`, one line a
video: `<id>,<label> <score> <label> <score> ...`, the top_k (20) classes by
descending score (ties: lower class id first).

Segment level (`--segment_labels`): records carry segment ratings
(`segment_start_times`); every rated segment is scored and the output is
`Class,Segments`, one line a class: `<class>,<id>:<start> <id>:<start> ...`
by descending score, at most `--segment_max_per_class` segments a class.

Streaming: records are read batch by batch; memory holds one batch plus, for
segments, the per-class top lists (classes x cap), never all videos.
"""
from typing import Callable, Dict, Iterable, Iterator, List, Optional, TextIO

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf, tf_keras

from official.core import config_definitions
from official.core import task_factory
from official_ext.core import checkpoints
from official_ext.yt8m import dataloader

VIDEO_HEADER = 'VideoId,LabelConfidencePairs'
SEGMENT_HEADER = 'Class,Segments'

Predictor = Callable[[tf.Tensor, tf.Tensor], np.ndarray]


def top_k_pairs(probabilities: np.ndarray, k: int) -> List[List[tuple]]:
  """Per row, the k (class, score) pairs of highest score (ties: lower id)."""
  order = np.argsort(-probabilities, axis=1, kind='stable')[:, :k]
  return [[(int(c), float(row[c])) for c in idx]
          for row, idx in zip(probabilities, order)]


def write_video_predictions(batches: Iterable[Dict[str, np.ndarray]],
                            out: TextIO, top_k: int = 20) -> int:
  """Writes the video-level CSV from batches with `video_ids`, predictions.

  Args:
    batches: dicts with `video_ids` (bytes or str [b]) and `probabilities`
      float [b, num_classes].
    out: text stream.
    top_k: pairs per video.

  Returns:
    Number of videos written.
  """
  out.write(VIDEO_HEADER + '\n')
  count = 0
  for batch in batches:
    for vid, pairs in zip(batch['video_ids'],
                          top_k_pairs(batch['probabilities'], top_k)):
      vid = vid.decode() if isinstance(vid, bytes) else str(vid)
      out.write(vid + ',' + ' '.join(f'{c} {s:.6f}' for c, s in pairs) + '\n')
      count += 1
  return count


class SegmentRanking:
  """Per-class top `cap` segments by score, in O(classes x cap) memory.

  Scores are buffered and pruned to the `cap` best per class whenever the
  buffer exceeds 2 x cap (amortized cost O(log cap) per score); ids no class
  keeps are dropped at each prune. Ties: the segment seen first ranks first.
  """

  def __init__(self, num_classes: int, cap: int):
    if cap <= 0:
      raise ValueError(f'--segment_max_per_class={cap}; expected > 0.')
    self._cap = int(cap)
    self._num_classes = int(num_classes)
    self._scores = np.zeros([num_classes, 0], np.float64)
    self._orders = np.zeros([num_classes, 0], np.int64)
    self._pending_scores: List[np.ndarray] = []
    self._pending_orders: List[np.ndarray] = []
    self._ids: Dict[int, str] = {}
    self._seen = 0

  def add(self, segment_ids: List[str], probabilities: np.ndarray) -> None:
    """segment_ids [b] ('<video>:<start>'); probabilities [b, classes]."""
    b = len(segment_ids)
    if not b:
      return
    orders = np.arange(self._seen, self._seen + b)
    self._ids.update(zip(orders.tolist(), segment_ids))
    self._seen += b
    self._pending_scores.append(np.asarray(probabilities, np.float64).T)
    self._pending_orders.append(orders)
    width = self._scores.shape[1] + sum(o.size for o in self._pending_orders)
    if width > 2 * self._cap:
      self._prune()

  def _prune(self) -> None:
    c = self._num_classes
    scores = np.concatenate([self._scores] + self._pending_scores, axis=1)
    orders = np.concatenate(
        [self._orders] + [np.broadcast_to(o, (c, o.size))
                          for o in self._pending_orders], axis=1)
    self._pending_scores, self._pending_orders = [], []
    keep = np.lexsort((orders, -scores), axis=1)[:, :self._cap]
    self._scores = np.take_along_axis(scores, keep, 1)
    self._orders = np.take_along_axis(orders, keep, 1)
    kept = set(np.unique(self._orders).tolist())
    self._ids = {o: i for o, i in self._ids.items() if o in kept}

  def write(self, out: TextIO) -> None:
    """Writes `Class,Segments` lines, best segment first."""
    self._prune()
    out.write(SEGMENT_HEADER + '\n')
    for cls in range(self._num_classes):
      out.write(f'{cls},' + ' '.join(self._ids[o] for o in self._orders[cls])
                + '\n')


def _dataset(params: config_definitions.ExperimentConfig, input_path: str,
             segment_labels: bool, batch_size: int) -> tf.data.Dataset:
  data = params.task.validation_data.replace(
      input_path=input_path, include_video_id=True, is_training=False,
      segment_labels=segment_labels, global_batch_size=batch_size,
      drop_remainder=False, num_sample_frames=None)
  return dataloader.build_dataset(data)


def _checkpoint_predictor(params, checkpoint_path: str) -> Predictor:
  tf_keras.mixed_precision.set_global_policy('float32')
  model = task_factory.get_task(params.task).build_model()
  checkpoints.restore_model(model, checkpoint_path)

  @tf.function
  def predict(features, num_frames):
    return model(features, num_frames=num_frames, training=False)[
        'predictions']
  return lambda f, n: predict(f, n).numpy()


def _saved_model_predictor(saved_model_dir: str) -> Predictor:
  loaded = tf.saved_model.load(saved_model_dir)
  fn = loaded.signatures['serve_features']
  return lambda f, n: fn(features=f, num_frames=tf.cast(n, tf.int32))[
      'probabilities'].numpy()


def predict_batches(dataset: tf.data.Dataset, predictor: Predictor
                    ) -> Iterator[Dict[str, np.ndarray]]:
  for batch in dataset:
    out = {'video_ids': batch['video_ids'].numpy(),
           'probabilities': predictor(batch['video_matrix'],
                                      batch['num_frames'])}
    if 'segment_start_times' in batch:
      out['segment_start_times'] = batch['segment_start_times'].numpy()
    yield out


def run(params: config_definitions.ExperimentConfig, input_path: str,
        output_file: str, saved_model: Optional[str] = None,
        checkpoint_path: Optional[str] = None, top_k: int = 20,
        segment_labels: bool = False, segment_max_per_class: int = 100000,
        batch_size: int = 64) -> int:
  """Predicts every record of `input_path` into `output_file`; returns rows."""
  if bool(saved_model) == bool(checkpoint_path):
    raise ValueError('Pass exactly one of --saved_model and --checkpoint_path.')
  predictor = (_saved_model_predictor(saved_model) if saved_model else
               _checkpoint_predictor(params, checkpoint_path))
  batches = predict_batches(
      _dataset(params, input_path, segment_labels, batch_size), predictor)
  with tf.io.gfile.GFile(output_file, 'w') as out:
    if not segment_labels:
      count = write_video_predictions(batches, out, top_k)
    else:
      ranking = SegmentRanking(params.task.validation_data.num_classes,
                               segment_max_per_class)
      count = 0
      for batch in batches:
        ids = [f'{v.decode()}:{int(s)}' for v, s in
               zip(batch['video_ids'], batch['segment_start_times'])]
        ranking.add(ids, batch['probabilities'])
        count += len(ids)
      ranking.write(out)
  logging.info('Wrote %d %s to %s', count,
               'segments' if segment_labels else 'videos', output_file)
  return count


FLAGS = flags.FLAGS


def main(_):
  from official_ext import export_saved_model  # pylint: disable=g-import-not-at-top
  params = export_saved_model.load_params(
      FLAGS.experiment, FLAGS.config_file, FLAGS.params_override)
  count = run(params, FLAGS.input_path, FLAGS.output_file,
              saved_model=FLAGS.saved_model,
              checkpoint_path=FLAGS.checkpoint_path, top_k=FLAGS.top_k,
              segment_labels=FLAGS.segment_labels,
              segment_max_per_class=FLAGS.segment_max_per_class,
              batch_size=FLAGS.batch_size)
  print(f'Wrote {count} rows to {FLAGS.output_file}')


if __name__ == '__main__':
  flags.DEFINE_string('experiment', 'yt8m', 'Experiment of the data config.')
  flags.DEFINE_multi_string('config_file', None, 'YAML config overrides.')
  flags.DEFINE_string('params_override', '', 'Comma-separated overrides.')
  flags.DEFINE_string('saved_model', None, 'SavedModel directory.')
  flags.DEFINE_string('checkpoint_path', None, 'Or a training checkpoint.')
  flags.DEFINE_string('input_path', None, 'TFRecord file pattern.')
  flags.DEFINE_string('output_file', None, 'CSV file to write.')
  flags.DEFINE_integer('top_k', 20, 'Pairs per video.')
  flags.DEFINE_bool('segment_labels', False, 'Segment-level predictions.')
  flags.DEFINE_integer('segment_max_per_class', 100000,
                       'Segments kept per class (segment level).')
  flags.DEFINE_integer('batch_size', 64, 'Inference batch size.')
  flags.mark_flags_as_required(['input_path', 'output_file'])
  app.run(main)
