"""Video-level YouTube-8M records (`record_type='video'`): demo data, reader
(bad records included), the starter's video-level models, training,
evaluation and serving (`yt8m_video_level_demo`, tiny)."""
import csv
import glob

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official.modeling import optimization
from official_ext.core import checkpoints
from official_ext.core import experiment_params
from official_ext.core.input import bad_records
from official_ext import export_saved_model
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.yt8m import configs
from official_ext.yt8m import dataloader
from official_ext.yt8m import demo_data
from official_ext.yt8m.modeling import model as yt8m_model
from official_ext.yt8m import predict

SIZES = (16, 8)
NUM_CLASSES = 10
SMALL = dict(num_classes=NUM_CLASSES, max_frames=8, num_train_videos=24,
             num_validation_videos=14, num_shards=2, seed=5,
             segment_fraction=0.5, feature_sizes=SIZES)


def _data(input_path, **kwargs):
  fields = dict(configs.VIDEO_LEVEL_FEATURES, input_path=input_path,
                num_classes=NUM_CLASSES, is_training=False,
                global_batch_size=4, drop_remainder=False,
                include_video_id=True, feature_sizes=SIZES)
  return configs.DataConfig(**dict(fields, **kwargs))


def _write(path, examples):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for example in examples:
      writer.write(example.SerializeToString())
  return str(path)


def _example(video_id, labels, rgb=None, audio=None):
  rgb = np.full(SIZES[0], 0.5, np.float32) if rgb is None else rgb
  audio = np.full(SIZES[1], -0.5, np.float32) if audio is None else audio
  return demo_data.make_video_level_example(video_id, labels, rgb, audio)


@pytest.fixture(scope='module')
def both_levels(tmp_path_factory):
  """The same generated videos as frame- and as video-level records."""
  root = tmp_path_factory.mktemp('levels')
  return {level: demo_data.write_demo_dataset(
      str(root / level), record_type=level, **SMALL)
          for level in ('frame', 'video')}


def test_demo_video_records_are_the_frame_records_means(both_levels):
  """Each video-level record is its frame-level twin's dequantized mean,
  and the reader gives [features] vectors, multi-hot labels, one 'frame',
  and (drop_remainder) a padded, masked last batch."""
  frames = {}
  for raw in tf.data.TFRecordDataset(
      sorted(glob.glob(both_levels['frame']['validation']))):
    example = tf.train.SequenceExample.FromString(raw.numpy())
    lists = example.feature_lists.feature_list
    mean = [np.mean(dataloader.dequantize(np.stack([
        np.frombuffer(f.bytes_list.value[0], np.uint8)
        for f in lists[name].feature])), axis=0) for name in ('rgb', 'audio')]
    context = example.context.feature
    frames[context['id'].bytes_list.value[0]] = (
        np.concatenate(mean), list(context['labels'].int64_list.value))
  data = _data(both_levels['video']['validation'], drop_remainder=True)
  seen = {}
  for batch in dataloader.build_dataset(data):
    assert batch['video_matrix'].shape == (4, sum(SIZES))
    np.testing.assert_array_equal(batch['num_frames'], 1)
    for vid, row, labels, real in zip(
        batch['video_ids'].numpy(), batch['video_matrix'].numpy(),
        batch['labels'].numpy(), batch['eval_mask'].numpy()):
      if real:
        seen[vid] = (row, list(np.flatnonzero(labels)))
  assert sorted(seen) == sorted(frames) and len(seen) == 14
  for vid, (mean, labels) in frames.items():
    np.testing.assert_allclose(seen[vid][0], mean, atol=1e-5)
    assert seen[vid][1] == labels


def _read_one(example, source='f.tfrecord'):
  """Decodes and parses one record as the reader does (eagerly)."""
  data = _data('unused')
  decoded = dataloader.make_decoder(data).decode(
      tf.constant(example.SerializeToString()), source=tf.constant(source))
  return dataloader.Parser(data).parse_fn(is_training=False)(decoded)


def test_reader_errors_name_file_feature_and_label():
  with pytest.raises(tf.errors.InvalidArgumentError) as error:
    _read_one(_example('v1', [2], rgb=np.zeros(SIZES[0] + 3, np.float32)),
              source='wide.tfrecord')
  for text in ('Feature `mean_rgb` of video `v1` in file `wide.tfrecord`',
               f'has {SIZES[0] + 3} values, expected {SIZES[0]}'):
    assert text in str(error.value), str(error.value)[-600:]
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='Label id 12 .*`labels` of video `v2` in file '
                     '`label.tfrecord`'):
    _read_one(_example('v2', [3, 12]), source='label.tfrecord')
  nan = np.zeros(SIZES[1], np.float32)
  nan[3] = np.nan
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='`mean_audio` of video `v4`.*value 3 is NaN'):
    _read_one(_example('v4', [1], audio=nan))
  # A frame-level record read as video level: its features are missing.
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='`mean_rgb` of video `f0`.*has 0 values, '
                     'expected 16 .*record_type'):
    _read_one(demo_data.make_sequence_example(
        'f0', [1], np.zeros([2, SIZES[0]], np.uint8),
        np.zeros([2, SIZES[1]], np.uint8)))
  good = _read_one(_example('v3', [4, 1]))
  np.testing.assert_allclose(good['video_matrix'],
                             [0.5] * SIZES[0] + [-0.5] * SIZES[1])
  np.testing.assert_array_equal(np.flatnonzero(good['labels']), [1, 4])


def test_skip_mode_skips_and_counts_the_bad_records(tmp_path):
  """skip_bad_records: invalid records and a truncated file's damaged bytes
  are skipped and counted, every other record read."""
  nan = np.zeros(SIZES[1], np.float32)
  nan[3] = np.nan
  path = _write(tmp_path / 'mixed.tfrecord', [
      _example('ok0', [1]), _example('bad_label', [10]),
      _example('bad_width', [1], audio=np.zeros(2, np.float32)),
      _example('bad_nan', [1], audio=nan), _example('ok1', [0, 4])])
  # A truncated file: its last record is cut.
  whole = _write(tmp_path / 'whole.tfrecord', [_example('ok2', [2]),
                                                _example('cut', [2])])
  cut = tmp_path / 'z_truncated.tfrecord'
  cut.write_bytes(open(whole, 'rb').read()[:-9])
  pattern = str(tmp_path / '[mz]*.tfrecord')
  log = bad_records.BadRecordLog()
  batches = list(dataloader.build_dataset(
      _data(pattern, global_batch_size=8, skip_bad_records=True),
      bad_records=log))
  ids = [v for b in batches for v in b['video_ids'].numpy()]
  assert ids == [b'ok0', b'ok1', b'ok2']
  assert len(log.record_events) == 3 and len(log.events) == 1


def test_config_keys_video_records_cannot_honour_are_errors():
  with pytest.raises(ValueError, match='DataConfig.num_sample_frames'):
    dataloader.Parser(_data('x', num_sample_frames=4))
  with pytest.raises(ValueError, match='DataConfig.feature_from_bytes'):
    dataloader.make_decoder(_data('x', feature_from_bytes=(True, False)))
  with pytest.raises(ValueError, match="record_type is 'video'"):
    dataloader.Decoder(_data('x'))  # The frame-level decoder.
  with pytest.raises(ValueError, match='every_segment'):
    dataloader.build_dataset(_data('x'), every_segment=True)
  frame_backbone = exp_factory.get_exp_config('yt8m_video_level_demo').task
  frame_backbone.model.backbone.type = 'dbof'
  with pytest.raises(ValueError, match=r"task.train_data.record_type='video'"
                     r" but task.model.backbone.type='dbof'"):
    task_factory.get_task(frame_backbone).build_model()


def test_yt8m_video_level_is_the_starter_training():
  """The starter's train.py defaults on mean_rgb,mean_audio; input_path
  required."""
  config = exp_factory.get_exp_config('yt8m_video_level')
  config.validate()
  task = config.task
  assert task.model.backbone.type == 'identity'
  assert task.model.head.type == 'logistic'
  assert task.losses.l2_weight_decay == 1e-8
  assert task.gradient_clip_norm == 1.0
  for data in (task.train_data, task.validation_data):
    assert data.record_type == 'video' and data.global_batch_size == 1024
    assert tuple(data.feature_names) == ('mean_rgb', 'mean_audio')
    assert tuple(data.feature_sizes) == (1024, 128)
  assert config.trainer.train_steps == 5 * (configs.YT8M_TRAIN_EXAMPLES //
                                            1024)
  optimizer = config.trainer.optimizer_config
  assert optimizer.optimizer.type == 'adam' and optimizer.warmup.type is None
  schedule = optimization.OptimizerFactory(optimizer).build_learning_rate()
  # x0.95 every 4,000,000 examples (3,906 steps of 1,024), staircase.
  np.testing.assert_allclose(
      [float(schedule(step)) for step in (0, 3905, 3906, 7812)],
      [0.01, 0.01, 0.0095, 0.009025], rtol=1e-6)
  with pytest.raises(ValueError, match=r'task.train_data.input_path is empty'
                     r'.*video-level.*youtube8m-ml/2/video/train'):
    task_factory.get_task(task).build_inputs(task.train_data)


@pytest.mark.parametrize('head', ['logistic', 'moe'])
def test_starter_video_level_models(head):
  """The starter's LogisticModel and MoeModel (2 mixtures + a dummy expert
  predicting 0) on the concatenated features: the head alone, no backbone."""
  tf_keras.utils.set_random_seed(1)
  model = yt8m_model.build_model(
      configs.video_level_model(head), num_classes=3, input_feature_size=5)
  assert model.backbone is None and list(model.checkpoint_items) == ['head']
  weights = {v.name.split('/', 2)[-1]: v.numpy()
             for v in model.trainable_variables}
  x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
  got = model(x, training=False)['predictions'].numpy()
  # The starter's train.py and eval.py: tf.nn.l2_normalize(input, -1) first.
  x = x / np.linalg.norm(x, axis=-1, keepdims=True)
  sigmoid = lambda z: 1 / (1 + np.exp(-z))
  if head == 'logistic':
    assert sorted(weights) == ['logits/bias:0', 'logits/kernel:0']
    expected = sigmoid(x @ weights['logits/kernel:0'] +
                       weights['logits/bias:0'])
  else:
    assert sorted(weights) == ['expert/bias:0', 'expert/kernel:0',
                               'gate/kernel:0']
    gates = (x @ weights['gate/kernel:0']).reshape(4, 3, 3)
    gates = np.exp(gates) / np.exp(gates).sum(-1, keepdims=True)
    experts = sigmoid(x @ weights['expert/kernel:0'] +
                      weights['expert/bias:0']).reshape(4, 3, 2)
    expected = (gates[..., :2] * experts).sum(-1)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"'identity' takes video-level"):
    model(np.zeros([4, 2, 5], np.float32))


@pytest.mark.parametrize('experiment',
                         ['yt8m_video_level', 'yt8m_video_level_demo'])
def test_starter_experiments_predict_the_same_for_a_scaled_input(experiment):
  """The starter L2-normalizes every input before any model: scaling a
  video's features (or one of its feature blocks with the other) by 3
  changes no prediction."""
  tf_keras.utils.set_random_seed(4)
  model = task_factory.get_task(
      exp_factory.get_exp_config(experiment).task).build_model()
  x = np.random.default_rng(1).standard_normal((3, 1152)).astype(np.float32)
  got = model(x, training=False)['predictions'].numpy()
  scaled = model(3 * x, training=False)['predictions'].numpy()
  np.testing.assert_allclose(scaled, got, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """yt8m_video_level_demo, tiny (MoE head), trained and evaluated in
  process, then exported."""
  root = tmp_path_factory.mktemp('video_level')
  params = exp_factory.get_exp_config('yt8m_video_level_demo')
  params.override({
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': {
          # XLA steps: the demo run of docs/yt8m.md; here they cost time only.
          'jit_compile': False,
          'model': {'head': {'type': 'moe', 'moe': {'num_mixtures': 2}}},
          'train_data': {'global_batch_size': 8, 'seed': 3},
          # 14 videos in batches of 4: the last one padded.
          'validation_data': {'global_batch_size': 4, 'drop_remainder': True},
          'demo_data': {'cache_dir': str(root / 'cache'),
                        'num_train_videos': 32, 'num_validation_videos': 14,
                        'num_shards': 1},
      },
      'trainer': {'train_steps': 2, 'steps_per_loop': 2,
                  'checkpoint_interval': 2, 'summary_interval': 2,
                  'validation_interval': 2, 'validation_steps': -1},
  }, is_strict=True)
  params.validate()
  model_dir = str(root / 'model')
  tf_keras.utils.set_random_seed(2)
  _, metrics = train.run(params, 'train_and_eval', model_dir,
                         strategy=tf.distribute.OneDeviceStrategy('/cpu:0'))
  export_dir = export_saved_model.export(params, model_dir,
                                         str(root / 'export'), top_k=5)
  _, validation = demo_data.ensure_demo_data(params.task)
  return dict(root=root, params=params, metrics=metrics, model_dir=model_dir,
              export_dir=export_dir, validation=validation)


def test_train_and_eval_report_gap_over_every_video(trained):
  metrics = trained['metrics']
  assert int(metrics['num_videos']) == 14  # The padding is not counted.
  for key in ('gap', 'map', 'hit_at_one', 'perr'):
    assert 0.0 <= float(metrics[key]) <= 1.0, key
  assert np.isfinite(float(metrics['model_loss']))


def test_export_serves_tf_examples_as_the_model_predicts(trained, tmp_path):
  params = trained['params']
  model = task_factory.get_task(params.task).build_model()
  checkpoints.restore_model(model, trained['model_dir'])
  data = params.task.validation_data.replace(
      input_path=trained['validation'], include_video_id=True,
      drop_remainder=False, global_batch_size=14)
  batch = next(iter(dataloader.build_dataset(data)))
  expected = model(batch['video_matrix'], training=False)[
      'predictions'].numpy()
  records = list(tf.data.TFRecordDataset(
      glob.glob(trained['validation'])).as_numpy_iterator())
  loaded = tf.saved_model.load(trained['export_dir'])
  served = loaded.signatures['serving_default'](examples=tf.constant(records))
  assert list(served['video_id'].numpy()) == list(batch['video_ids'].numpy())
  np.testing.assert_allclose(served['probabilities'], expected, atol=1e-6)
  features = loaded.signatures['serve_features'](
      features=batch['video_matrix'])
  np.testing.assert_allclose(features['probabilities'], expected, atol=1e-6)
  scaled = loaded.signatures['serve_features'](
      features=3 * batch['video_matrix'])  # The export normalizes too.
  np.testing.assert_allclose(scaled['probabilities'], expected, atol=1e-6)
  np.testing.assert_allclose(
      served['top_k_scores'],
      np.take_along_axis(expected, served['top_k_classes'].numpy(), 1),
      atol=1e-6)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'row 1 of input `features` has a NaN.*column 2'):
    bad = batch['video_matrix'].numpy()[:2]
    bad[1, 2] = np.inf
    loaded.signatures['serve_features'](features=tf.constant(bad))
  narrow = demo_data.make_video_level_example(
      'x', [1], np.zeros(1024, np.float32), np.zeros(3, np.float32))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'`mean_audio` of video `x` in file `input '
                     r'`examples`\[0\]`: has 3 values, expected 128'):
    loaded.signatures['serving_default'](
        examples=tf.constant([narrow.SerializeToString()]))
  # predict reads the video-level records through the SavedModel.
  out = tmp_path / 'predictions.csv'
  params = experiment_params.load_model_params(
      predict.DEFAULT_EXPERIMENT, saved_model=trained['export_dir'])
  count = predict.run(params, trained['validation'], str(out),
                      saved_model=trained['export_dir'], top_k=3)
  rows = list(csv.reader(out.open()))
  assert count == 14 and rows[0] == ['VideoId', 'LabelConfidencePairs']
  first = rows[1][1].split()
  assert rows[1][0] == batch['video_ids'].numpy()[0].decode()
  assert int(first[0]) == int(np.argmax(expected[0]))
  np.testing.assert_allclose(float(first[1]), expected[0].max(), atol=1e-5)
