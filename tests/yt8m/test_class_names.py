"""Class names: vocabulary.csv in the evaluation log's best/worst classes
(`task.evaluation.vocabulary_path`) and beside predict's submission CSV
(`--vocabulary`)."""
import csv
import logging as std_logging

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.yt8m import class_names
from official_ext.yt8m import demo_data
from official_ext.yt8m import metrics as yt8m_metrics
from official_ext.yt8m import predict

HEADER = ('Index,TrainVideoCount,KnowledgeGraphId,Name,WikiUrl,Vertical1,'
          'Vertical2,Vertical3,WikiDescription')
ROWS = ('0,378135,/m/03bt1gh,Game,https://en.wikipedia.org/wiki/Game,Games,,,'
        'A game.',
        '1,286532,/m/01mw1,Video game,x,Games,,,"A game, on a screen."',
        '2,241488,/m/07yv9,Vehicle,x,Autos & Vehicles,,,A vehicle.',
        '3,5,/m/0k4j,"Car, sports",x,Autos & Vehicles,,,A car.')
NAMES = ['Game', 'Video game', 'Vehicle', 'Car, sports']


def _vocab(tmp_path, header=HEADER, rows=ROWS, name='vocabulary.csv'):
  path = tmp_path / name
  path.write_text('\n'.join((header,) + tuple(rows)) + '\n')
  return str(path)


def test_load_vocabulary_reads_index_and_name(tmp_path):
  assert class_names.load_vocabulary(_vocab(tmp_path), 4) == NAMES


@pytest.mark.parametrize('header,rows,num_classes,match', [
    (HEADER.replace('Name', 'Label'), ROWS, 4,
     r"vocabulary.csv'.*no column 'Name' in the header \['Index'"),
    (HEADER.replace('Index', 'Id'), ROWS, 4, r"no column 'Index'"),
    (HEADER, ROWS + ('2,1,/m/x,Again,x,,,,',), 4,
     r'vocabulary.csv.*line 6: Index 2 repeats \(first on line 4\)'),
    (HEADER, ROWS[:3], 4, r'no row for 1 of the 4 class ids \(first: \[3\]\)'),
    (HEADER, ROWS, 3, r'line 5: Index 3 is outside \[0, 3\)'),
    (HEADER, ('x,1,/m/x,Game,x,,,,',), 1, r"line 2: Index 'x' is not an"),
])
def test_load_vocabulary_errors_name_the_file_and_line(tmp_path, header, rows,
                                                       num_classes, match):
  with pytest.raises(ValueError, match=match):
    class_names.load_vocabulary(_vocab(tmp_path, header, rows), num_classes)


def test_best_and_worst_classes_skip_classes_without_positives():
  text = class_names.best_and_worst_classes(
      per_class_ap=np.array([0.5, 0.0, 1.0, 0.25, 0.5]),
      class_positives=np.array([2, 0, 1, 4, 3]), n=2,
      names=['a', 'b', 'c', 'd', 'e'])
  assert text == ('Per-class AP of the 4 classes with positives:\n'
                  'best:\n'
                  '  2 (c): AP 1.0000, 1 positives\n'
                  '  0 (a): AP 0.5000, 2 positives\n'
                  'worst:\n'
                  '  3 (d): AP 0.2500, 4 positives\n'
                  '  4 (e): AP 0.5000, 3 positives')


def _params(tmp_path, **evaluation):
  params = exp_factory.get_exp_config('yt8m_demo')
  data = {'num_classes': 4, 'max_frames': 6, 'global_batch_size': 4}
  params.override({'task': {
      'model': {'backbone': {'dbof': {'cluster_size': 8, 'hidden_size': 8}},
                'head': {'moe': {'num_mixtures': 2}}},
      'train_data': dict(data, num_sample_frames=None),
      'validation_data': data,
      'evaluation': evaluation,
      'demo_data': {'cache_dir': str(tmp_path / 'cache'),
                    'num_train_videos': 4, 'num_validation_videos': 6,
                    'num_shards': 1}}}, is_strict=True)
  return params


def test_evaluation_log_names_the_best_and_worst_classes(tmp_path, caplog):
  params = _params(tmp_path, vocabulary_path=_vocab(tmp_path),
                   num_best_worst_classes=1)
  task = task_factory.get_task(params.task)
  acc = yt8m_metrics.AveragePrecisionAccumulator(num_classes=4, top_k=4)
  acc.accumulate(predictions=np.array([[0.9, 0.1, 0.8, 0.2],
                                       [0.1, 0.7, 0.9, 0.3]]),
                 labels=np.array([[1, 0, 0, 1], [0, 0, 1, 0]]))
  with caplog.at_level(std_logging.INFO, logger='absl'):
    results = task.reduce_aggregated_logs({'': acc})  # {prefix: accumulator}
  assert 'per_class_ap/0' not in results  # return_per_class_ap is off.
  assert ('best:\n  0 (Game): AP 1.0000, 1 positives\n'
          'worst:\n  3 (Car, sports): AP 0.5000, 1 positives') in caplog.text
  # A vocabulary that does not load stops the task before any work.
  bad = _vocab(tmp_path, HEADER.replace('Name', 'Title'), name='bad.csv')
  with pytest.raises(ValueError, match=(
      r"task.evaluation.vocabulary_path='.*bad.csv': no column 'Name'")):
    task_factory.get_task(_params(tmp_path, vocabulary_path=bad).task)


def test_predict_writes_named_predictions_beside_the_submission(tmp_path):
  params = _params(tmp_path)
  _, validation = demo_data.ensure_demo_data(params.task)
  tf_keras.utils.set_random_seed(2)
  model = task_factory.get_task(params.task).build_model()
  # In a model_dir of its own: predict writes nothing inside one.
  checkpoint = tf.train.Checkpoint(model=model).write(
      str(tmp_path / 'model' / 'ckpt-1'))
  out = tmp_path / 'pred.csv'
  n = predict.run(params, validation, str(out), checkpoint_path=checkpoint,
                  top_k=3, vocabulary=_vocab(tmp_path))
  # The submission CSV keeps its format; the names go to pred_names.csv.
  submission = out.read_text().splitlines()
  assert submission[0] == 'VideoId,LabelConfidencePairs'
  with open(tmp_path / 'pred_names.csv', newline='') as f:
    rows = list(csv.reader(f))
  assert rows[0] == ['VideoId', 'Rank', 'LabelId', 'Name', 'Score']
  expected = []
  for line in submission[1:]:
    vid, pairs = line.split(',')
    values = pairs.split()
    expected += [[vid, str(rank), c, NAMES[int(c)], s] for rank, (c, s) in
                 enumerate(zip(values[::2], values[1::2]), 1)]
  assert rows[1:] == expected and len(expected) == 3 * n == 18
  with pytest.raises(ValueError, match='--vocabulary names the classes of '
                     'video-level predictions'):
    predict.run(params, validation, str(tmp_path / 'seg.csv'),
                checkpoint_path=checkpoint, segment_labels=True,
                vocabulary=_vocab(tmp_path))
