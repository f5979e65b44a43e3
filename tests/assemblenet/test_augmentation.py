"""Training augmentation from Model Garden: RandAugment / AutoAugment on a
whole clip (`DataConfig.aug_type`) and mixup / cutmix per batch
(`DataConfig.mixup_and_cutmix`), both off by default, training data only."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import exp_factory
from official.modeling.hyperparams import params_dict
from official.vision.configs import common
from official_ext.assemblenet import configs
from official_ext.assemblenet import dataloader
from official_ext.assemblenet import task as task_lib

T, SIZE, K, COPIES = 4, 16, 5, 6


@pytest.fixture(scope='module')
def still_clip(tmp_path_factory):
  """A record file holding one video `COPIES` times: 4 identical 16x16
  frames (class 2); and its decoded frames, float32 [T, 16, 16, 3] in
  [0, 1]: what the training pipeline gives with no augmentation, for the
  crop below covers the whole frame and the clip is the whole video."""
  frame = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), np.uint8)
  jpegs = dataloader.encode_jpeg_frames(np.stack([frame] * T))
  path = tmp_path_factory.mktemp('aug') / 'still.tfrecord'
  with tf.io.TFRecordWriter(str(path)) as w:
    for _ in range(COPIES):
      w.write(dataloader.make_sequence_example(jpegs, [2]).SerializeToString())
  decoded = np.stack([tf.io.decode_jpeg(j).numpy() for j in jpegs]) / 255.0
  return str(path), decoded.astype(np.float32), jpegs


def _train_params(path, **kwargs):
  return configs.DataConfig(
      input_path=path, feature_shape=(T, SIZE, SIZE, 3), num_classes=K,
      global_batch_size=COPIES, is_training=True, drop_remainder=True,
      random_flip=False, aug_min_area_ratio=1.0, aug_max_area_ratio=1.0,
      aug_min_aspect_ratio=1.0, aug_max_aspect_ratio=1.0, **kwargs)


def _first_batch(params):
  features, labels = next(iter(dataloader.build_dataset(params)))
  return features['image'], labels


def test_off_by_default_and_unchanged(still_clip):
  """Off (the default), the training pipeline's output is exactly the
  decoded frames and the one-hot labels: nothing else touches them."""
  path, decoded, _ = still_clip
  params = _train_params(path)
  assert params.aug_type is None and params.mixup_and_cutmix is None
  images, labels = _first_batch(params)
  np.testing.assert_array_equal(images.numpy(), np.stack([decoded] * COPIES))
  np.testing.assert_array_equal(labels.numpy(),
                                np.stack([np.eye(K)[2]] * COPIES))


@pytest.mark.parametrize('aug', [
    # Cutout is the exception (a box through a few frames; see DataConfig).
    {'type': 'randaug', 'randaug': {'exclude_ops': ['Cutout']}},
    {'type': 'autoaug', 'autoaug': {'augmentation_name': 'v0'}}],
                         ids=['randaug', 'autoaug'])
def test_one_transform_per_clip(still_clip, aug):
  """The same video six times, its four frames identical: each output clip
  keeps its frames identical (one transform for the whole clip), while the
  six copies are transformed differently (one sampled policy per clip)."""
  path, decoded, jpegs = still_clip
  # The training parser, eagerly (a tf.data graph of every AutoAugment
  # policy takes seconds to build): it is what the pipeline maps.
  parse = dataloader.Parser(_train_params(
      path, aug_type=common.Augmentation(**aug))).parse_fn(is_training=True)
  record = {dataloader.FRAMES: tf.constant(jpegs),
            dataloader.LABELS: tf.constant([2], tf.int64),
            dataloader.SOURCE: tf.constant(path)}
  parsed = [parse(record) for _ in range(COPIES)]
  images = tf.stack([features['image'] for features, _ in parsed])
  labels = tf.stack([label for _, label in parsed])
  assert images.shape == (COPIES, T, SIZE, SIZE, 3)
  assert images.dtype == tf.float32
  clips = images.numpy()
  assert 0.0 <= clips.min() and clips.max() <= 1.0
  # uint8 values, augmented before the normalization to [0, 1].
  np.testing.assert_allclose(clips * 255.0, np.round(clips * 255.0),
                             atol=1e-3)
  for clip in clips:
    for frame in clip[1:]:
      np.testing.assert_array_equal(frame, clip[0])
  distinct = {clip.tobytes() for clip in clips} | {decoded.tobytes()}
  assert len(distinct) >= 3, 'copies not transformed independently'
  np.testing.assert_array_equal(labels.numpy(),
                                np.stack([np.eye(K)[2]] * COPIES))


def _weight(mixed, own, partner):
  """lam with mixed = lam * own + (1 - lam) * partner (least squares)."""
  d = own - partner
  return float(np.dot(mixed - partner, d) / np.dot(d, d)) if d.any() else 1.0


def _constant_clips(values):
  """float32 [B, T, 16, 16, 3], clip i filled with values[i]."""
  return tf.constant(np.stack([np.full((T, SIZE, SIZE, 3), v, np.float32)
                               for v in values]))


def test_mixup_mixes_clips_and_labels_with_the_partner():
  """Mixup: clip i = lam_i x_i + (1 - lam_i) x_{B-1-i}; label i the same
  mixture of the smoothed one-hot labels (rows sum to 1)."""
  values = [0.0, 0.2, 0.6, 1.0]
  y = tf.one_hot([0, 1, 3, 4], K)
  mix = common.MixupAndCutmix(mixup_alpha=0.8, cutmix_alpha=0.0, prob=1.0,
                              label_smoothing=0.1)
  images, labels = dataloader.mix_clips(mix, K, 8, _constant_clips(values), y)
  assert images.shape == (4, T, SIZE, SIZE, 3) and images.dtype == tf.float32
  assert labels.shape == (4, K) and labels.dtype == tf.float32
  smoothed = y.numpy() * 0.9 + 0.1 / K
  labels = labels.numpy()
  np.testing.assert_allclose(labels.sum(-1), 1.0, atol=1e-6)
  mixed = 0
  for i in range(4):
    j = 3 - i
    lam = _weight(labels[i], smoothed[i], smoothed[j])
    np.testing.assert_allclose(labels[i], lam * smoothed[i]
                               + (1 - lam) * smoothed[j], atol=1e-5)
    np.testing.assert_allclose(images[i].numpy(), lam * values[i]
                               + (1 - lam) * values[j], atol=1e-5)
    mixed += 0.01 < lam < 0.99
  assert mixed, 'no clip was mixed'


def test_cutmix_pastes_one_box_through_all_frames_and_mixes_multihot():
  """Cutmix: each clip is its own pixels outside one box, the partner's
  inside, the same box on every frame; multi-hot labels are mixed by
  Model Garden's lam (1 - the box's area fraction: a box clipped at the
  border keeps more of the clip than lam says)."""
  values = [0.1, 0.3, 0.5, 0.7, 0.9]
  y = tf.constant([[1, 0, 1, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 1, 1],
                   [1, 1, 0, 0, 0], [0, 0, 0, 0, 1]], tf.float32)
  mix = common.MixupAndCutmix(mixup_alpha=0.0, cutmix_alpha=1.0, prob=1.0,
                              label_smoothing=0.0)
  images, labels = dataloader.mix_clips(mix, K, 8, _constant_clips(values), y)
  images, labels = images.numpy(), labels.numpy()
  for i in range(5):
    j = 4 - i
    inside = images[i] == values[j]
    assert np.all(inside | (images[i] == values[i]))
    for frame in inside[1:]:
      np.testing.assert_array_equal(frame, inside[0])
    lam = _weight(labels[i], y[i].numpy(), y[j].numpy())
    np.testing.assert_allclose(labels[i], lam * y[i] + (1 - lam) * y[j],
                               atol=1e-5)
    if i != j:
      assert inside.mean() <= 1 - lam + 1e-6
  assert not np.allclose(labels, y.numpy()), 'no clip was mixed'


def test_mixup_in_the_training_pipeline(still_clip):
  """`mixup_and_cutmix` on: the batch's labels are smoothed mixtures."""
  path, _, _ = still_clip
  ds = dataloader.build_dataset(_train_params(
      path, mixup_and_cutmix=common.MixupAndCutmix(label_smoothing=0.1)))
  # Static shapes (drop_remainder), as TPUs need.
  assert ds.element_spec[0]['image'].shape == (COPIES, T, SIZE, SIZE, 3)
  assert ds.element_spec[1].shape == (COPIES, K)
  features, labels = next(iter(ds))
  images = features['image']
  assert images.shape == (COPIES, T, SIZE, SIZE, 3)
  assert images.dtype == tf.float32
  # Every copy has class 2: smoothing, then mixing, keeps 0.9 + 0.1 / K.
  np.testing.assert_allclose(labels.numpy(), np.full(
      (COPIES, K), 0.1 / K) + 0.9 * np.eye(K)[2], atol=1e-6)


@pytest.mark.parametrize('key, aug, mix', [
    ('aug_type.type', {'type': 'ssd_random_crop'}, None),
    ('aug_type.randaug.magnitude',
     {'type': 'randaug', 'randaug': {'magnitude': 11}}, None),
    ('aug_type.randaug.exclude_ops',
     {'type': 'randaug', 'randaug': {'exclude_ops': ['Cutuot']}}, None),
    ('aug_type.autoaug.augmentation_name',
     {'type': 'autoaug', 'autoaug': {'augmentation_name': 'detection_v0'}},
     None),
    ('mixup_and_cutmix.prob', None, {'prob': 1.5}),
    ('mixup_and_cutmix: mixup_alpha and cutmix_alpha', None,
     {'mixup_alpha': 0.0, 'cutmix_alpha': 0.0}),
])
def test_invalid_values_name_the_key(key, aug, mix):
  params = _train_params(
      'x.tfrecord',
      aug_type=None if aug is None else common.Augmentation(**aug),
      mixup_and_cutmix=None if mix is None else common.MixupAndCutmix(**mix))
  with pytest.raises(ValueError, match=f'DataConfig.{key}'):
    dataloader.check_params(params)


@pytest.mark.parametrize('key', ['aug_type', 'mixup_and_cutmix'])
def test_evaluation_data_is_never_augmented(key):
  value = (common.Augmentation(type='randaug') if key == 'aug_type' else
           common.MixupAndCutmix())
  params = configs.DataConfig(input_path='x.tfrecord', num_classes=K,
                              is_training=False, **{key: value})
  with pytest.raises(ValueError, match=f'DataConfig.{key} is set on '
                     r'evaluation data \(is_training=False\)'):
    dataloader.check_params(params)


def test_params_override_and_double_label_smoothing():
  """The override of docs/assemblenet.md turns both on in the demo; with
  `losses.label_smoothing` too, the task refuses (smoothed twice)."""
  config = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  config = params_dict.override_params_dict(
      config, 'task.train_data.aug_type.type=randaug,'
      'task.train_data.aug_type.randaug.magnitude=5,'
      'task.train_data.mixup_and_cutmix.mixup_alpha=0.2,'
      'task.train_data.mixup_and_cutmix.cutmix_alpha=0.0', is_strict=True)
  data = config.task.train_data
  assert data.aug_type.randaug.magnitude == 5
  assert data.mixup_and_cutmix.label_smoothing == 0.1  # Model Garden's.
  dataloader.check_params(data)
  assert config.task.validation_data.aug_type is None
  config.task.losses.label_smoothing = 0.1
  with pytest.raises(ValueError, match='task.losses.label_smoothing'):
    task_lib.AssembleNetTask(config.task)
