"""The AssembleNet++lite task: experiments, losses, mAP, 2-replica training.

The shipped YAMLs are checked against their experiments and started in
tests/test_shipped_configs.py.
"""
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras
from sklearn import metrics as metrics_lib

from official.core import exp_factory
from official.core import task_factory
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.assemblenet import dataloader
from official_ext.assemblenet import demo_data
from official_ext.assemblenet import metrics as anet_metrics
from official_ext.assemblenet import structures
from tests.assemblenet import minimal


@pytest.mark.parametrize('name, multilabel, classes', [
    ('assemblenet_plus_lite_charades', True, 157),
    ('assemblenet_plus_lite_kinetics', False, 400),
    ('assemblenet_plus_lite_demo', False, demo_data.NUM_CLASSES)])
def test_experiments_are_registered(name, multilabel, classes):
  params = exp_factory.get_exp_config(name)
  params.validate()
  assert params.task.train_data.is_multilabel == multilabel
  assert params.task.train_data.num_classes == classes
  if name == 'assemblenet_plus_lite_charades':
    backbone = params.task.model.backbone.assemblenet_plus_lite
    assert backbone.attention_mode == 'peer'
    assert eval(backbone.model_edge_weights) == (  # pylint: disable=eval-used
        structures.ASSEMBLENET_PLUS_LITE_EDGE_WEIGHTS)
    assert tuple(params.task.train_data.feature_shape) == (32, 224, 224, 3)
  # Charades: a class scores what a video's best view scores.
  assert params.task.eval_aggregation == (
      'max' if name == 'assemblenet_plus_lite_charades' else 'mean')


def test_mean_average_precision():
  scores = np.array([[0.9, 0.1, 0.3], [0.8, 0.7, 0.2], [0.1, 0.2, 0.1]])
  labels = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 0]])
  per_class = []
  # Class 0: positives ranked 1 and 3 -> (1/1 + 2/3) / 2; class 1: rank 1;
  # class 2: no positive, excluded.
  value = anet_metrics.mean_average_precision(scores, labels, per_class)
  assert per_class[0] == pytest.approx((1 + 2 / 3) / 2)
  assert per_class[1] == pytest.approx(1.0)
  assert np.isnan(per_class[2])
  assert value == pytest.approx(((1 + 2 / 3) / 2 + 1) / 2)


def _multilabel_task(tmp_path):
  videos = [v for _, v, _ in demo_data.generate(4, 4, 32, seed=0)]
  path = tmp_path / 'ml.tfrecord'
  with tf.io.TFRecordWriter(str(path)) as w:
    for v, labels in zip(videos, [[0, 3], [1], [2, 3], [0]]):
      w.write(dataloader.make_sequence_example(
          dataloader.encode_jpeg_frames(v), labels).SerializeToString())
  params = exp_factory.get_exp_config('assemblenet_plus_lite_charades')
  data = {'input_path': str(path), 'feature_shape': [4, 32, 32, 3],
          'num_classes': 4, 'global_batch_size': 2, 'min_image_size': 32}
  params.override({'task': {
      'model': {'backbone': minimal.backbone(), 'head_filters': [16, 24]},
      'train_data': data, 'validation_data': data}}, is_strict=True)
  return task_factory.get_task(params.task)


def test_multilabel_losses_and_map(tmp_path):
  task = _multilabel_task(tmp_path)
  model = task.build_model()
  labels = tf.constant([[1.0, 0.0, 1.0, 0.0]])
  logits = tf.constant([[2.0, -1.0, 0.5, 0.0]])
  losses = task.build_losses(labels, logits)
  expected = np.mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
  assert float(losses['model_loss']) == pytest.approx(expected, rel=1e-5)
  metrics = task.build_metrics(training=False)
  state = None
  scores, targets = [], []
  for batch in task.build_inputs(task.task_config.validation_data):
    logs = task.validation_step(batch, model, metrics)
    state = task.aggregate_logs(state, logs)
    scores.append(tf.sigmoid(model(batch[0], training=False)).numpy())
    targets.append(batch[1].numpy())
  result = task.reduce_aggregated_logs(state)
  # mAP over the classes with a positive, from the model's own outputs.
  scores, targets = np.concatenate(scores), np.concatenate(targets)
  np.testing.assert_array_equal(
      targets, [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0, 0]])
  expected = np.mean([metrics_lib.average_precision_score(targets[:, c],
                                                          scores[:, c])
                      for c in range(4)])
  assert result['map'] == pytest.approx(expected, rel=1e-5)


def test_single_label_losses():
  params = exp_factory.get_exp_config('assemblenet_plus_lite_kinetics')
  params.override({'task': {'losses': {'label_smoothing': 0.1}}})
  task = task_factory.get_task(params.task)
  labels = tf.one_hot([1, 0], 3)
  logits = tf.constant([[0.1, 2.0, -1.0], [0.3, 0.2, 0.1]])
  smoothed = labels * 0.9 + 0.1 / 3
  expected = np.mean(tf.nn.softmax_cross_entropy_with_logits(smoothed, logits))
  assert float(task.build_losses(labels, logits)['model_loss']) == (
      pytest.approx(expected, rel=1e-5))


def test_train_and_eval_on_two_replicas(tmp_path, mirrored):
  """The demo experiment, shrunk, under a 2-replica MirroredStrategy.

  Shrunk to the minimal network (tests/assemblenet/minimal.py), with peer
  attention and gradient checkpointing: tracing the training step for two
  replicas is most of this test's time.

  `bn_decay` 1 keeps batch norm's moving statistics at their initial values,
  so that both replicas evaluate the same model. The moving statistics are
  sync-on-read variables: one copy per replica, which (at the demo's 0.9)
  follows that replica's half of every batch; after these 4 steps the
  copies differ by ~0.03. Each replica evaluates its videos with its own
  copy, while the checkpoint (and a read outside the replicas, as below)
  holds their mean: logits differ by ~1e-4 (float32 rounding alone: ~1e-9),
  enough to flip the argmax of a video whose two largest logits are closer,
  the likely cause of an accuracy of 0.0833 against 0.125 here once.
  (Synchronized batch norm keeps the copies equal too, at twice this test's
  time.)
  """
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  data = {'tfds_name': 'moving_shapes/tiny', 'feature_shape': [4, 32, 32, 3],
          'global_batch_size': 4}
  params.override({
      'runtime': {'distribution_strategy': 'mirrored'},
      'task': {
          'model': {'backbone': minimal.backbone(
              attention_mode='peer', recompute_grad=True, bn_decay=1.0),
                    'head_filters': [16, 24]},
          'train_data': data,
          'validation_data': dict(data, global_batch_size=8),
          'demo_data': {'data_dir': str(tmp_path / 'tfds')},
          'gradient_clip_norm': 1.0},
      'trainer': {'train_steps': 4, 'steps_per_loop': 2,
                  'summary_interval': 2, 'checkpoint_interval': 4,
                  'validation_interval': 4, 'validation_steps': -1}},
                  is_strict=True)
  params.validate()
  strategy = mirrored
  model, metrics = train.run(params, 'train_and_eval', str(tmp_path / 'm'),
                             strategy=strategy)
  assert set(['accuracy', 'top_5_accuracy', 'total_loss']) <= set(metrics)
  assert np.isfinite(float(metrics['total_loss']))
  assert tf.train.latest_checkpoint(str(tmp_path / 'm')).endswith('ckpt-4')
  # The 2-replica evaluation is the trained model's evaluation of the whole
  # validation split, computed here in one process: every video once.
  task = task_factory.get_task(params.task)
  losses, correct, margins = [], [], []
  for features, labels in task.build_inputs(params.task.validation_data):
    logits = model(features, training=False).numpy()
    labels = labels.numpy()
    losses.append(tf_keras.losses.categorical_crossentropy(
        labels, tf.nn.softmax(logits)).numpy())
    correct.append(np.argmax(logits, -1) == np.argmax(labels, -1))
    top2 = np.sort(logits, -1)[:, -2:]
    margins.append(top2[:, 1] - top2[:, 0])
  losses, correct, margins = map(np.concatenate, (losses, correct, margins))
  total = len(losses)
  assert total == int(metrics['num_examples'])
  # The mean loss is continuous in the logits, which float32 rounding (the
  # replicas' batches of 4, one batch of 8 here) moves by ~1e-9; summing it
  # in float32 adds < 1e-6 relative: the tolerance is 2e-6 relative. After
  # 4 steps the model is still close to uniform, yet the videos' losses
  # differ (spread ~7e-4 to 9e-4 over seeds): missing or doubling the video
  # farthest from the mean (>= spread / 2 away) moves the mean by more than
  # spread / (2 * total), which must exceed the tolerance for this check to
  # see it.
  tolerance = 2e-6 * losses.mean()
  assert np.ptp(losses) / (2 * total) > tolerance, losses
  assert float(metrics['model_loss']) == pytest.approx(losses.mean(),
                                                       rel=2e-6)
  # Accuracy (argmax): a video whose two largest logits are within rounding
  # of a tie could take either class on the replicas; at most those differ.
  # (Margins here: ~1e-4 to 1e-3.)
  ambiguous = int(np.sum(margins < 1e-6))
  assert ambiguous <= total // 4, margins
  assert abs(float(metrics['accuracy']) - correct.mean()) <= (
      ambiguous / total + 1e-6)
  # The demo learns its edge weights: they are trainable variables.
  assert any('agg_weights' in v.name for v in model.trainable_variables)
  assert not any('agg_weights' in v.name
                 for v in model.non_trainable_variables)


# AssembleNet and AssembleNet++ -------------------------------------------

def _asn_params(name, **backbone):
  params = exp_factory.get_exp_config(name)
  if backbone:
    params.override({'task': {'model': {'backbone': {
        params.task.model.backbone.type: backbone}}}}, is_strict=True)
  return params


@pytest.mark.parametrize('name, key', [
    ('assemblenet50_demo', 'task.model.backbone.assemblenet.'),
    ('assemblenet_plus_demo', 'task.model.backbone.assemblenet_plus.'),
    ('assemblenet_plus_lite_demo',
     'task.model.backbone.assemblenet_plus_lite.')])
def test_structure_errors_name_the_backbone_type(name, key, tmp_path):
  """The task reads every backbone type's structure (`structures.
  from_backbone`), its errors naming that type's keys."""
  path = tmp_path / 's.json'
  path.write_text('[]')
  params = _asn_params(name, model_structure_path=str(path))
  task = task_factory.get_task(params.task)
  with pytest.raises(ValueError, match=re.escape(
      f'{key}model_structure and {key}model_structure_path are both set')):
    task.model_input_shape()
  params = _asn_params(name)
  params.override({'task': {'train_data': {'feature_shape': [1, 32, 32, 3]}}})
  network = structures.NETWORK_NAMES[params.task.model.backbone.type]
  with pytest.raises(ValueError, match=re.escape(
      f'1 frames; {network} takes any frame count >= 2')):
    task_factory.get_task(params.task).model_input_shape()


def test_object_classes_of_model_and_data_must_agree():
  params = _asn_params('assemblenet_plus_demo', num_object_classes=5)
  with pytest.raises(ValueError, match=re.escape(
      'task.model.backbone.assemblenet_plus.num_object_classes (5) and '
      'task.train_data.num_object_classes (3) differ')):
    task_factory.get_task(params.task)
  params = _asn_params('assemblenet_plus_demo', use_object_input=False)
  with pytest.raises(ValueError, match=re.escape(
      'task.train_data.num_object_classes (3) asks for object maps, but '
      'task.model.backbone.assemblenet_plus.use_object_input is false')):
    task_factory.get_task(params.task)
  params = _asn_params('assemblenet50_demo')
  for key in ('train_data', 'validation_data'):
    params.override({'task': {key: {'num_object_classes': 3}}})
  with pytest.raises(ValueError, match=re.escape(
      'the AssembleNet backbone has no object stem '
      '(task.model.backbone.assemblenet.use_object_input)')):
    task_factory.get_task(params.task)
  # The published experiments agree.
  for name in ('assemblenet_plus_charades', 'assemblenet_plus_ucf101',
               'assemblenet50_charades'):
    task_factory.get_task(exp_factory.get_exp_config(name).task)


@pytest.mark.parametrize('name, tiny', [
    ('assemblenet50_demo', 'moving_shapes/tiny'),
    ('assemblenet_plus_demo', 'moving_shapes/tiny_objects')])
def test_asn_demos_train_and_evaluate(name, tiny, demo_cache, tmp_path):
  """The AssembleNet and AssembleNet++ (object stem) demos, with their own
  structures (2 flow iterations), on the tiny moving shapes' 2-frame clips:
  2 training steps, 1 evaluation."""
  params = exp_factory.get_exp_config(name)
  data = {'tfds_name': tiny, 'feature_shape': [2, 32, 32, 3],
          'global_batch_size': 8}
  backbone = params.task.model.backbone.type
  params.override({
      'task': {'train_data': data, 'validation_data': dict(data),
               'model': {'backbone': {backbone: {'rep_flow': {
                   'num_iter': 2}}}},
               'demo_data': {'data_dir': str(demo_cache / 'tfds')}},
      'trainer': {'train_steps': 2, 'steps_per_loop': 1,
                  'summary_interval': 1, 'checkpoint_interval': 2,
                  'validation_interval': 2, 'validation_steps': 1}},
                  is_strict=True)
  model, metrics = train.run(params, 'train_and_eval', str(tmp_path / 'm'))
  assert np.isfinite(float(metrics['total_loss']))
  assert int(metrics['num_examples']) == 8
  assert tf.train.latest_checkpoint(str(tmp_path / 'm')).endswith('ckpt-2')
  # The AssembleNet++ demo's model took the object maps.
  task = task_factory.get_task(params.task)
  features, _ = next(iter(task.build_inputs(params.task.validation_data)))
  inputs = task.model_inputs(features)
  assert ('objects' in inputs) == (name == 'assemblenet_plus_demo')
  assert model(inputs, training=False).shape == (8, demo_data.NUM_CLASSES)
