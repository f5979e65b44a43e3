"""Video input: TFRecord SequenceExamples (JPEG frames), TFDS, bad input."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.vision.dataloaders import video_input
from official_ext.assemblenet import configs
from official_ext.assemblenet import dataloader
from official_ext.assemblenet import demo_data


def _write(path, videos, labels):
  with tf.io.TFRecordWriter(str(path)) as w:
    for video, label in zip(videos, labels):
      frames = (dataloader.encode_jpeg_frames(video)
                if not isinstance(video, list) else video)
      w.write(dataloader.make_sequence_example(frames, label)
              .SerializeToString())


def _videos(n, frames=6, size=40, seed=0):
  out = list(demo_data.generate(n, frames, size, seed))
  return [v for _, v, _ in out], [[l] for _, _, l in out]


def _params(path, **kwargs):
  base = dict(input_path=str(path), feature_shape=(4, 32, 32, 3),
              num_classes=demo_data.NUM_CLASSES, global_batch_size=2,
              is_training=False, drop_remainder=False, min_image_size=32)
  base.update(kwargs)
  return configs.DataConfig(**base)


def test_tfrecord_train_and_eval(tmp_path):
  videos, labels = _videos(4)
  _write(tmp_path / 'a.tfrecord', videos[:2], labels[:2])
  _write(tmp_path / 'b.tfrecord', videos[2:], labels[2:])
  pattern = str(tmp_path / '*.tfrecord')
  ds = dataloader.build_dataset(_params(pattern, is_training=True,
                                        drop_remainder=True))
  features, y = next(iter(ds))
  assert features['image'].shape == (2, 4, 32, 32, 3)
  assert features['image'].dtype == tf.float32
  assert 0.0 <= float(tf.reduce_min(features['image']))
  assert float(tf.reduce_max(features['image'])) <= 1.0
  assert y.shape == (2, demo_data.NUM_CLASSES)
  np.testing.assert_array_equal(tf.reduce_sum(y, -1), [1.0, 1.0])

  # Evaluation: one pass, file order, middle clip, center crop.
  ds = dataloader.build_dataset(_params(pattern, min_image_size=40))
  got = [np.argmax(y, -1) for _, y in ds]
  np.testing.assert_array_equal(np.concatenate(got), [l[0] for l in labels])
  x = next(iter(ds))[0]['image'].numpy()
  # Middle 4 frames (of 6: frames 1-4) of video 0, no resize (short side
  # already 40), center crop 40 -> 32 pixels.
  expected = tf.io.decode_jpeg(dataloader.encode_jpeg_frames(videos[0])[1])
  np.testing.assert_allclose(x[0, 0], expected.numpy()[4:36, 4:36] / 255.0,
                             atol=1e-6)


def test_multi_clip_multi_crop_eval_views(tmp_path):
  videos, labels = _videos(3, frames=12)
  _write(tmp_path / 'v.tfrecord', videos, labels)
  ds = dataloader.build_dataset(_params(tmp_path / 'v.tfrecord',
                                        num_test_clips=2, num_test_crops=3))
  batches = list(ds)
  features, y = batches[0]
  # 2 videos x 2 clips x 3 crops folded into the batch, video-major.
  assert features['image'].shape == (12, 4, 32, 32, 3)
  assert y.shape == (2, demo_data.NUM_CLASSES)
  # A video's 6 views stay together, next to its own label: each view is a
  # 4-frame window of that video (matched against every video's frames).
  sources = [tf.image.resize(v / 255.0, [32, 32]).numpy() for v in videos]
  views = np.concatenate([f['image'].numpy() for f, _ in batches])
  labels_out = np.concatenate([np.argmax(l, -1) for _, l in batches])
  assert views.shape[0] == 3 * 6
  np.testing.assert_array_equal(labels_out, [l[0] for l in labels])
  for j, view in enumerate(views):

    def distance(video):
      return min(np.abs(view - video[s:s + 4]).mean()
                 for s in range(len(video) - 3))

    assert int(np.argmin([distance(v) for v in sources])) == j // 6, j


def test_multilabel_records(tmp_path):
  videos, _ = _videos(2)
  _write(tmp_path / 'm.tfrecord', videos, [[0, 5, 7], [2]])
  ds = dataloader.build_dataset(_params(tmp_path / 'm.tfrecord',
                                        is_multilabel=True))
  _, y = next(iter(ds))
  np.testing.assert_array_equal(np.nonzero(y[0].numpy())[0], [0, 5, 7])
  np.testing.assert_array_equal(np.nonzero(y[1].numpy())[0], [2])


def test_corrupt_jpeg_names_the_file(tmp_path):
  videos, labels = _videos(2)
  frames = dataloader.encode_jpeg_frames(videos[1])
  frames[2] = frames[2][:40]  # truncated JPEG
  _write(tmp_path / 'good.tfrecord', videos[:1], labels[:1])
  _write(tmp_path / 'bad.tfrecord', [frames], labels[1:])
  ds = dataloader.build_dataset(_params(str(tmp_path / '*.tfrecord'),
                                        global_batch_size=1))
  with pytest.raises(tf.errors.OpError, match=r'bad\.tfrecord.*frame'):
    for _ in ds:
      pass


@pytest.mark.parametrize('labels, message', [
    ([[3], [99]], r'bad\.tfrecord.*label\(s\) \[99\] outside \[0, 8\)'),
    ([[3], []], r'bad\.tfrecord.*has no label'),
    ([[3], [1, 2]], r'bad\.tfrecord.*2 labels \[1,2\].*single-label'),
])
def test_wrong_label_names_the_file(tmp_path, labels, message):
  videos, _ = _videos(2)
  _write(tmp_path / 'bad.tfrecord', videos, labels)
  ds = dataloader.build_dataset(_params(tmp_path / 'bad.tfrecord'))
  with pytest.raises(tf.errors.InvalidArgumentError, match=message):
    for _ in ds:
      pass


def test_config_errors_name_the_key(tmp_path):
  with pytest.raises(ValueError, match='does not match any file'):
    dataloader.build_dataset(_params(tmp_path / 'none*.tfrecord'))
  with pytest.raises(ValueError, match='num_test_crops'):
    dataloader.build_dataset(_params(tmp_path / 'x', num_test_crops=2))
  with pytest.raises(ValueError, match='exactly one of'):
    dataloader.build_dataset(_params(tmp_path / 'x', tfds_name='mnist'))


def test_tfds_moving_shapes(tmp_path):
  data_dir = demo_data.ensure_prepared('moving_shapes/tiny', str(tmp_path))
  params = configs.DataConfig(
      tfds_name='moving_shapes/tiny', tfds_split='validation',
      tfds_data_dir=data_dir, feature_shape=(4, 32, 32, 3),
      num_classes=demo_data.NUM_CLASSES, global_batch_size=8,
      is_training=False, drop_remainder=False, min_image_size=32)
  batches = list(dataloader.build_dataset(params))
  labels = np.concatenate([np.argmax(y, -1) for _, y in batches])
  assert len(labels) == 24
  # The generator cycles through the classes; TFDS keeps them all.
  assert sorted(set(labels.tolist())) == list(range(demo_data.NUM_CLASSES))
  image = batches[0][0]['image']
  assert image.shape == (8, 4, 32, 32, 3)
  # Pixels match the generator (PNG is lossless, no resize at 32x32).
  first = int(labels[0])
  assert any(np.allclose(image[0].numpy(), v / 255.0, atol=1e-6)
             for _, v, l in demo_data.generate(24, 4, 32, seed=2)
             if l == first)
  train = params.replace(tfds_split='train', is_training=True,
                         drop_remainder=True, random_flip=False)
  features, y = next(iter(dataloader.build_dataset(train)))
  assert features['image'].shape == (8, 4, 32, 32, 3) and y.shape == (8, 8)


def test_generator_is_deterministic_and_moves():
  a = list(demo_data.generate(8, 4, 32, seed=5))
  b = list(demo_data.generate(8, 4, 32, seed=5))
  for (_, va, la), (_, vb, lb) in zip(a, b):
    assert la == lb and np.array_equal(va, vb)
  assert [l for _, _, l in a] == list(range(8))
  for _, video, label in a:
    bright = video.mean(-1) > 130
    ys, xs = [], []
    for frame in bright:
      yy, xx = np.nonzero(frame)
      ys.append(yy.mean())
      xs.append(xx.mean())
    direction = demo_data.DIRECTIONS[label % 4]
    dx, dy = xs[-1] - xs[0], ys[-1] - ys[0]
    moved = {'right': dx, 'left': -dx, 'down': dy, 'up': -dy}[direction]
    assert moved > 3, (label, dx, dy)


def _fixed_draws(monkeypatch, flip):
  """Fixes the random crop window ([3, 5] + [20, 30]) and the flip draw of
  both our pipeline and Model Garden's (`tf.random.uniform` returns its
  largest value (flip) or its smallest, for the flip draw; 0 for the
  temporal offset of a clip as long as the video)."""
  begin, size = tf.constant([3, 5, 0]), tf.constant([20, 30, -1])
  monkeypatch.setattr(tf.image, 'sample_distorted_bounding_box',
                      lambda *a, **k: (begin, size, tf.zeros([1, 1, 4])))

  def uniform(shape, minval=0, maxval=None, dtype=tf.float32, seed=None):
    del shape, seed
    return tf.constant(maxval - 1 if flip and maxval == 2 else minval, dtype)

  monkeypatch.setattr(tf.random, 'uniform', uniform)


@pytest.mark.parametrize('flip', [False, True])
@pytest.mark.parametrize('encode', ['jpeg', 'png'])
@pytest.mark.parametrize('name_file', [True, False])
def test_training_clip_equals_model_garden(monkeypatch, flip, encode,
                                           name_file):
  # The same window and flip: our training clip (JPEG: only the window
  # decoded, the fused floor/flip/normalize) holds exactly the values of
  # Model Garden's video_input.process_image.
  video = _videos(1, frames=4, size=40)[0][0]
  encoder = tf.io.encode_jpeg if encode == 'jpeg' else tf.io.encode_png
  frames = tf.constant([encoder(f).numpy() for f in video])
  _fixed_draws(monkeypatch, flip)
  params = _params('x', is_training=True, feature_shape=(4, 24, 24, 3),
                   name_file_in_decode_errors=name_file)
  ours = dataloader.Parser(params).train_clip(frames, tf.constant('f'))
  theirs = video_input.process_image(frames, is_training=True, num_frames=4,
                                     stride=1, crop_size=24)
  assert ours.shape == theirs.shape == (4, 24, 24, 3)
  assert ours.dtype == theirs.dtype == tf.float32
  np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
  # The window and the flip took effect (not the whole frame resized).
  whole = tf.image.resize(video.astype(np.float32), [24, 24]) / 255.0
  assert np.abs(ours.numpy() - whole.numpy()).mean() > 0.01


@pytest.mark.parametrize('name_file', [True, False])
def test_training_frames_of_other_sizes_name_the_file(tmp_path, name_file):
  frames = [tf.io.encode_jpeg(np.full([s, s, 3], 90, np.uint8)).numpy()
            for s in (40, 40, 36, 40)]
  _write(tmp_path / 'bad.tfrecord', [frames], [[1]])
  ds = dataloader.build_dataset(_params(
      tmp_path / 'bad.tfrecord', is_training=True, drop_remainder=True,
      global_batch_size=1, name_file_in_decode_errors=name_file))
  with pytest.raises(tf.errors.OpError,
                     match=r'bad\.tfrecord` differ in size: sampled frame 2 '
                           r'is \(36, 36, 3\), frame 0 is \(40, 40, 3\)'):
    next(iter(ds))


@pytest.mark.parametrize('damage, reason', [
    # Truncated: the header reads, the end marker is missing.
    (lambda f: f[:300], 'no JPEG end marker'),
    # The header's first segment overwritten: no frame size to read.
    (lambda f: f[:3] + b'\0' * 297, 'no frame header before byte 2'),
])
def test_training_corrupt_jpeg_names_the_file_and_frame(tmp_path, damage,
                                                        reason):
  videos, labels = _videos(1, frames=4)
  frames = dataloader.encode_jpeg_frames(videos[0])
  frames[1] = damage(frames[1])
  _write(tmp_path / 'bad.tfrecord', [frames], labels)
  ds = dataloader.build_dataset(_params(
      tmp_path / 'bad.tfrecord', is_training=True, drop_remainder=True,
      global_batch_size=1))
  with pytest.raises(tf.errors.OpError,
                     match=r'Corrupt frame in a record of file `[^`]*bad\.'
                           r'tfrecord`: sampled frame 1 \(300 bytes\) does '
                           r'not decode as JPEG/PNG: ' + reason):
    next(iter(ds))
