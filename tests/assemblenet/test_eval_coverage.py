"""AssembleNet++lite evaluation: every video, its own views, longer clips.

A validation set smaller than one static batch (`drop_remainder: true`, as on
TPU) used to give no batch: no loss, no accuracy, no mAP. The last batch is
now padded and the padding masked (`official_ext.core.input.eval_padding`); an
evaluation of zero videos is an error naming the dataset.

The evaluation protocols: a video's clips x crops views are combined with
that video's label, by their mean or maximum (`task.eval_aggregation`), and
evaluation clips may be longer than training clips.
"""
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext.assemblenet import dataloader
from official_ext.assemblenet import demo_data
from official_ext.core.input import eval_padding
from official_ext import registry_imports  # pylint: disable=unused-import
from tests.assemblenet import minimal

_LABELS = [[0, 3], [1], [2, 3]]  # Three videos, four classes.


def _task(path, multilabel, task=None, **validation):
  name = ('assemblenet_plus_lite_charades' if multilabel else
          'assemblenet_plus_lite_kinetics')
  params = exp_factory.get_exp_config(name)
  data = {'input_path': str(path), 'feature_shape': [4, 32, 32, 3],
          'num_classes': 4, 'global_batch_size': 2, 'min_image_size': 32}
  params.override({'task': dict({
      'model': {'backbone': minimal.backbone(), 'head_filters': [16, 24]},
      'train_data': data, 'validation_data': dict(data, **validation)},
                                **(task or {}))}, is_strict=True)
  return task_factory.get_task(params.task)


def _write(path, multilabel):
  videos = [v for _, v, _ in demo_data.generate(len(_LABELS), 4, 32, seed=0)]
  with tf.io.TFRecordWriter(str(path)) as w:
    for v, labels in zip(videos, _LABELS):
      w.write(dataloader.make_sequence_example(
          dataloader.encode_jpeg_frames(v),
          labels if multilabel else labels[:1]).SerializeToString())


def _evaluate(task, model, batches=None):
  """The trainer's evaluation: steps, metric results, aggregate, reduce (over
  `batches`, default the task's validation data)."""
  metrics = task.build_metrics(training=False)
  state = None
  if batches is None:
    batches = task.build_inputs(task.task_config.validation_data)
  for batch in batches:
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


def _write_numbered_videos(path, num_videos, num_frames, width):
  """Videos whose pixels tell which video, frame and column they are:
  video i, frame t, column x has grey level 60 i + 4 t + x // 4 (bands of
  60 per video); labelled i (single-label, one class per video)."""
  grey = (60 * np.arange(num_videos)[:, None, None] +
          4 * np.arange(num_frames)[None, :, None] +
          np.arange(width)[None, None, :] // 4)  # [videos, T, width]
  assert grey.max() < 256
  videos = np.broadcast_to(grey[:, :, None, :, None].astype(np.uint8),
                           [num_videos, num_frames, 32, width, 3])
  with tf.io.TFRecordWriter(str(path)) as w:
    for i, video in enumerate(videos):
      w.write(dataloader.make_sequence_example(
          dataloader.encode_jpeg_frames(video), [i]).SerializeToString())


def test_views_are_aggregated_with_their_videos_label(tmp_path, model):
  """Through the real dataloader: 3 videos of 8 frames in one batch, 2 clips
  (frames 0-3 and 4-7) x 3 crops (left, center, right) each. A video's 6
  views are the rows the task aggregates into its label's row (each view's
  pixels name its video, and the 6 are 6 different views), and 'mean' /
  'max' give the numpy mean / max of the model's per-view probabilities."""
  path = tmp_path / 'numbered.tfrecord'
  _write_numbered_videos(path, num_videos=3, num_frames=8, width=48)
  views = dict(num_test_clips=2, num_test_crops=3, temporal_stride=1,
               global_batch_size=3)
  mean_task = _task(path, False, **views)
  max_task = _task(path, False, task={'eval_aggregation': 'max'}, **views)
  [(features, labels)] = list(mean_task.build_inputs(
      mean_task.task_config.validation_data))
  images, labels = features['image'].numpy(), labels.numpy()
  assert images.shape == (3 * 6, 4, 32, 32, 3) and labels.shape == (3, 4)
  grey = images.reshape(3, 6, -1).mean(-1) * 255  # [videos, views]
  videos = np.argmax(labels, -1)
  assert sorted(videos) == [0, 1, 2]
  for b, video in enumerate(videos):
    np.testing.assert_array_equal(grey[b] // 60, video)  # Its own video.
    assert np.min(np.diff(np.sort(grey[b]))) > 1.5, grey[b]  # 6 views.
  per_view = tf.nn.softmax(model(features, training=False)).numpy()
  per_view = per_view.reshape(3, 6, 4)
  mean = mean_task.inference_step(features, model).numpy()
  top = max_task.inference_step(features, model).numpy()
  np.testing.assert_allclose(mean, per_view.mean(1), rtol=1e-6)
  np.testing.assert_allclose(top, per_view.max(1), rtol=1e-6)
  assert np.abs(top - mean).min() > 1e-7  # The views' scores differ.
  with pytest.raises(ValueError, match=r"task.eval_aggregation must be one "
                     r"of \('mean', 'max'\); got 'median'"):
    _task(path, False, task={'eval_aggregation': 'median'})


def test_train_on_short_clips_evaluate_on_longer_clips(tmp_path, model):
  """Trains (one step) on 4-frame clips, evaluates on 8-frame clips: the
  task builds the network with an unknown frame count, which on 4-frame
  clips computes what the network built for 4 frames (as every model was
  before: the `model` fixture) computes on the same weights. (The training
  clips are the evaluation clips' first 4 frames: one input pipeline.)"""
  path = tmp_path / 'long.tfrecord'
  _write_numbered_videos(path, num_videos=3, num_frames=8, width=32)
  task = _task(path, False, feature_shape=[8, 32, 32, 3], global_batch_size=3)
  assert task.model_input_shape() == [None, 32, 32, 3]
  long_model = task.build_model()
  batches = list(task.build_inputs(task.task_config.validation_data))
  assert [f['image'].shape[1] for f, _ in batches] == [8]
  features, labels = batches[0]
  short = {'image': features['image'][:, :4]}
  long_model.set_weights(model.get_weights())
  np.testing.assert_allclose(long_model(short, training=False),
                             model(short, training=False),
                             rtol=1e-5, atol=1e-6)
  before = [w.numpy() for w in long_model.trainable_weights]
  task.train_step((short, labels), long_model, tf_keras.optimizers.SGD(0.1))
  assert any(np.abs(b - w.numpy()).max() > 0
             for b, w in zip(before, long_model.trainable_weights))
  logs = _evaluate(task, long_model, batches)
  assert logs['num_examples'] == 3 and np.isfinite(logs['total_loss'])
  with pytest.raises(ValueError, match=r'a clip of 1 frames; the flow stem'):
    long_model({'image': features['image'][:, :1]})
  for validation, match in (
      ({'feature_shape': [1, 32, 32, 3]},
       r'task.validation_data.feature_shape \[1, 32, 32, 3\]: 1 frames; '
       r'AssembleNet\+\+lite takes any frame count >= 2'),
      ({'feature_shape': [8, 48, 32, 3]},
       r'task.train_data.feature_shape \[4, 32, 32, 3\] and '
       r'task.validation_data.feature_shape \[8, 48, 32, 3\] differ in '
       r'height, width or channels')):
    with pytest.raises(ValueError, match=match):
      _task(path, False, **validation).build_model()


def test_a_trained_model_dir_may_be_evaluated_with_another_protocol(tmp_path):
  """The evaluation protocol (views per video, evaluation clip length) is not
  part of the model: an evaluation or export of a trained model_dir may
  choose it anew; the training clip shape may not change."""
  from official.core import train_utils  # pylint: disable=g-import-not-at-top
  from official_ext.core.run import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  train_utils.serialize_config(params, str(tmp_path))
  protocol = params.replace(task=params.task.replace(
      validation_data=params.task.validation_data.replace(
          feature_shape=(16, 32, 32, 3), num_test_clips=2,
          num_test_crops=3, temporal_stride=2)))
  model_dir_lib.check_model_dir(protocol, str(tmp_path),
                                'assemblenet_plus_lite_demo')
  retrained = params.replace(task=params.task.replace(
      train_data=params.task.train_data.replace(
          feature_shape=(16, 32, 32, 3))))
  with pytest.raises(model_dir_lib.ModelDirInUseError,
                     match=r'task.train_data.feature_shape'):
    model_dir_lib.check_model_dir(retrained, str(tmp_path),
                                  'assemblenet_plus_lite_demo')
