"""AssembleNet++lite evaluation covers every video, never an empty set.

A validation set smaller than one static batch (`drop_remainder: true`, as on
TPU) used to give no batch: no loss, no accuracy, no mAP. The last batch is
now padded and the padding masked (`official_ext.core.eval_padding`); an
evaluation of zero videos is an error naming the dataset.
"""
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.assemblenet import demo_data
from official_ext.core import eval_padding
from tests.assemblenet import minimal

_LABELS = [[0, 3], [1], [2, 3]]  # Three videos, four classes.


def _task(path, multilabel, **validation):
  name = ('assemblenet_plus_lite_charades' if multilabel else
          'assemblenet_plus_lite_kinetics')
  params = exp_factory.get_exp_config(name)
  data = {'input_path': str(path), 'feature_shape': [4, 32, 32, 3],
          'num_classes': 4, 'global_batch_size': 2, 'min_image_size': 32}
  params.override({'task': {
      'model': {'backbone': minimal.backbone(), 'head_filters': [16, 24]},
      'train_data': data, 'validation_data': dict(data, **validation)}},
                  is_strict=True)
  return task_factory.get_task(params.task)


def _write(path, multilabel):
  videos = [v for _, v, _ in demo_data.generate(len(_LABELS), 4, 32, seed=0)]
  with tf.io.TFRecordWriter(str(path)) as w:
    for v, labels in zip(videos, _LABELS):
      w.write(demo_data.make_sequence_example(
          demo_data.encode_jpeg_frames(v),
          labels if multilabel else labels[:1]).SerializeToString())


def _evaluate(task, model):
  """The trainer's evaluation: steps, metric results, aggregate, reduce."""
  metrics = task.build_metrics(training=False)
  state = None
  for batch in task.build_inputs(task.task_config.validation_data):
    logs = task.validation_step(batch, model, metrics)
    state = task.aggregate_logs(state, logs)
  out = {m.name: float(m.result()) for m in metrics}
  if state is not None:
    out.update(task.reduce_aggregated_logs(state))
  return out


@pytest.fixture(scope='module')
def model(tmp_path_factory):
  """The model both parametrizations evaluate: the task builds the same
  network for single- and multi-label data (4 classes; only the losses and
  metrics differ), so it is built, and its flow compiled, once."""
  path = tmp_path_factory.mktemp('eval_coverage') / 'unread.tfrecord'
  tf_keras.utils.set_random_seed(1)
  return _task(path, True, global_batch_size=4,
               drop_remainder=True).build_model()


@pytest.mark.parametrize('multilabel', [True, False])
def test_static_batch_larger_than_the_validation_set(tmp_path, multilabel,
                                                     model):
  path = tmp_path / 'valid.tfrecord'
  _write(path, multilabel)
  padded = _task(path, multilabel, global_batch_size=4, drop_remainder=True)
  small = _task(path, multilabel, global_batch_size=2, drop_remainder=False)
  out_padded, out_small = _evaluate(padded, model), _evaluate(small, model)
  keys = ['map'] if multilabel else ['accuracy', 'top_5_accuracy']
  assert set(keys + ['total_loss', 'model_loss']) <= set(out_padded)
  assert out_padded['num_examples'] == out_small['num_examples'] == 3
  for key in keys + ['total_loss', 'model_loss']:
    assert np.isfinite(out_padded[key]), key
    assert out_padded[key] == pytest.approx(out_small[key], rel=1e-5), key


@pytest.mark.parametrize('multilabel', [True, False])
def test_empty_validation_set_is_an_error_naming_it(tmp_path, multilabel):
  path = str(tmp_path / 'empty.tfrecord')
  with tf.io.TFRecordWriter(path):
    pass  # Zero records.
  task = _task(path, multilabel, global_batch_size=4, drop_remainder=True)
  with pytest.raises(eval_padding.EmptyEvaluationError,
                     match=re.escape(path) + r'.*global_batch_size=4.*'
                     r'drop_remainder=True'):
    _evaluate(task, model=None)  # No batch: the model is never called.
  if multilabel:
    with pytest.raises(eval_padding.EmptyEvaluationError,
                       match=re.escape(path)):
      task.reduce_aggregated_logs({'labels': [], 'probabilities': []})
