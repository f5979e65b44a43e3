"""The object stream's data: per-frame object class maps in the clip records
(video_records, the converter from --object_maps_dir or a --segmenter), the
dataloader's features['objects'] (the frames' sampling, window, flip and
evaluation views), its refusals, the demo's exact masks, and the task handing
them to the model (a stand-in model: the backbone is not this test's)."""
import importlib.util
import os

from absl import flags as absl_flags
import numpy as np
from PIL import Image
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official.vision.configs import common
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.assemblenet import configs
from official_ext.assemblenet import dataloader
from official_ext.assemblenet import demo_data
from official_ext.assemblenet import video_records
from official_ext.assemblenet import videos as videos_lib
from tests import cli

_SCRIPT = os.path.join(os.path.dirname(__file__), '..', '..', 'scripts',
                       'assemblenet_videos_to_tfrecord.py')
KEY = dataloader.OBJECT_FIELD_KEY

# Class id -> colour: one-hot colours, so that a frame pixel mixing two
# classes (bilinear resize) equals no class colour.
COLOURS = np.array([[0, 0, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255]],
                   np.uint8)


def _script():
  spec = importlib.util.spec_from_file_location('videos_to_tfrecord', _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _blocky_maps(rng, num_frames, height, width, block=4):
  """uint8 [T, H, W] random class ids (0..3) in blocks of `block` pixels."""
  small = rng.integers(0, 4, [num_frames, height // block, width // block])
  return np.repeat(np.repeat(small, block, 1), block, 2).astype(np.uint8)


def _write_records(path, items, encoder=tf.io.encode_png):
  """items: (frames uint8 [T, H, W, 3], labels, maps uint8 [T, H, W] or
  None, or PNG strings)."""
  with tf.io.TFRecordWriter(str(path)) as w:
    for frames, labels, maps in items:
      encoded = [encoder(f).numpy() for f in frames]
      if maps is not None and not isinstance(maps, list):
        maps = dataloader.encode_object_maps(maps)
      w.write(dataloader.make_sequence_example(encoded, labels, maps)
              .SerializeToString())


def _params(path, **kwargs):
  base = dict(input_path=str(path), feature_shape=(4, 16, 16, 3),
              num_classes=demo_data.NUM_CLASSES, global_batch_size=1,
              is_training=False, drop_remainder=False, min_image_size=16,
              num_object_classes=4)
  base.update(kwargs)
  return configs.DataConfig(**base)


def _classes_of(images):
  """Class ids of pure class-colour pixels of float frames [..., 3] in
  [0, 1], -1 elsewhere (mixtures)."""
  values = np.rint(images * 255).astype(np.int64)
  out = np.full(values.shape[:-1], -1)
  for c, colour in enumerate(COLOURS):
    out[np.all(values == colour, axis=-1)] = c
  return out


def _check_maps_follow_frames(images, objects, min_pure=0.5):
  """Every pure-colour frame pixel's map holds its class, and most pixels
  are pure (so that the check is not empty)."""
  classes = _classes_of(images)
  pure = classes >= 0
  assert pure.mean() > min_pure, pure.mean()
  np.testing.assert_array_equal(objects[pure], classes[pure])


# -- records -----------------------------------------------------------------


def test_records_round_trip_the_maps(tmp_path):
  """make_example writes one 8-bit grey PNG a frame under the object key;
  evaluation without resize or crop returns the middle clip's maps as
  written, int32, batched [B, T, H, W]; without num_object_classes the
  batch has no 'objects'."""
  rng = np.random.default_rng(0)
  maps = _blocky_maps(rng, 6, 16, 16)
  frames = COLOURS[maps]
  example = video_records.make_example(frames, [3], 'a.mp4', objects=maps)
  stored = example.feature_lists.feature_list[KEY].feature
  assert len(stored) == 6
  png = stored[0].bytes_list.value[0]
  assert png[:8] == b'\x89PNG\r\n\x1a\n' and png[24:26] == b'\x08\x00'
  with tf.io.TFRecordWriter(str(tmp_path / 'r.tfrecord')) as w:
    w.write(example.SerializeToString())
  features, _ = next(iter(dataloader.build_dataset(
      _params(tmp_path / 'r.tfrecord'))))
  assert features['objects'].dtype == tf.int32
  assert features['objects'].shape == (1, 4, 16, 16)
  np.testing.assert_array_equal(features['objects'][0], maps[1:5])
  features, _ = next(iter(dataloader.build_dataset(
      _params(tmp_path / 'r.tfrecord', num_object_classes=0))))
  assert set(features) == {'image'}
  with pytest.raises(ValueError, match=r'a\.mp4: object maps must be uint8'):
    video_records.make_example(frames, [3], 'a.mp4', objects=maps[:2])


# -- the dataloader ------------------------------------------------------------


@pytest.mark.parametrize('encoder', ['png', 'jpeg'])
def test_training_window_resize_and_flip_apply_to_the_maps(tmp_path,
                                                           encoder):
  """Frames are a colour of their maps' classes: after random temporal
  offsets, random resized windows (bilinear for frames, nearest for maps)
  and random flips, every pure-colour pixel's map still holds its class
  (PNG frames: lossless). JPEG frames (only the window decoded): the class
  nearest each pixel's colour."""
  rng = np.random.default_rng(1)
  maps = _blocky_maps(rng, 8, 40, 48)
  frames = COLOURS[maps]
  encode = tf.io.encode_png if encoder == 'png' else (
      lambda f: tf.io.encode_jpeg(f, quality=100))
  _write_records(tmp_path / 't.tfrecord', [(frames, [1], maps)], encode)
  params = _params(tmp_path / 't.tfrecord', is_training=True,
                   drop_remainder=True, feature_shape=(3, 24, 24, 3),
                   global_batch_size=4, random_flip=True,
                   aug_min_area_ratio=0.3)
  batches = list(dataloader.build_dataset(params).take(4))
  images = np.concatenate([f['image'].numpy() for f, _ in batches])
  objects = np.concatenate([f['objects'].numpy() for f, _ in batches])
  assert objects.shape == (16, 3, 24, 24) and objects.dtype == np.int32
  if encoder == 'png':
    _check_maps_follow_frames(images, objects)
  else:
    distance = np.abs(images[..., np.newaxis, :] * 255 -
                      COLOURS.astype(np.float32)).sum(-1)
    nearest = np.argmin(distance, -1)
    assert (nearest == objects).mean() > 0.85
  # The draws vary: windows, offsets and flips differ between clips.
  assert len({o.tobytes() for o in objects}) > 8


def test_evaluation_views_carry_their_maps(tmp_path):
  """Several clips and 3 crops, the short side resized (frames bilinear,
  maps nearest): each view's maps follow its frames; views folded into the
  batch as the frames are."""
  rng = np.random.default_rng(2)
  maps = _blocky_maps(rng, 10, 24, 40)
  _write_records(tmp_path / 'e.tfrecord', [(COLOURS[maps], [1], maps)] * 2)
  params = _params(tmp_path / 'e.tfrecord', num_test_clips=2,
                   num_test_crops=3, min_image_size=20, global_batch_size=2,
                   feature_shape=(4, 16, 16, 3))
  features, labels = next(iter(dataloader.build_dataset(params)))
  assert features['image'].shape == (12, 4, 16, 16, 3)
  assert features['objects'].shape == (12, 4, 16, 16)
  assert labels.shape == (2, demo_data.NUM_CLASSES)
  _check_maps_follow_frames(features['image'].numpy(),
                            features['objects'].numpy())
  # Without a resize the views are exact crops of the written maps: the
  # first clip's first crop is frames 0-3, rows and columns 0-15, its last
  # (the third crop of the second clip) frames 6-9, columns 24-39.
  params = params.replace(min_image_size=24)
  features, _ = next(iter(dataloader.build_dataset(params)))
  np.testing.assert_array_equal(features['objects'][0], maps[0:4, 0:16, 0:16])
  np.testing.assert_array_equal(features['objects'][5],
                                maps[6:10, 0:16, 24:40])
  np.testing.assert_array_equal(_classes_of(features['image'][5].numpy()),
                                maps[6:10, 0:16, 24:40])


@pytest.mark.parametrize('key, value', [
    ('aug_type', common.Augmentation(type='randaug')),
    ('mixup_and_cutmix', common.MixupAndCutmix()),
])
def test_augmentations_that_miss_the_maps_are_refused(tmp_path, key, value):
  params = _params(tmp_path / 'x', is_training=True, **{key: value})
  with pytest.raises(ValueError, match=(
      f'DataConfig.{key} and DataConfig.num_object_classes')):
    dataloader.build_dataset(params)


def test_num_object_classes_beyond_the_maps_uint8_is_refused(tmp_path):
  with pytest.raises(ValueError, match=r'num_object_classes must be in '
                     r'\[0, 256\]'):
    dataloader.build_dataset(_params(tmp_path / 'x', num_object_classes=300))


def _rgb_png_maps(maps):
  return [tf.io.encode_png(np.repeat(m[..., None], 3, -1)).numpy()
          for m in maps]


@pytest.mark.parametrize('is_training', [False, True])
@pytest.mark.parametrize('maps, message', [
    (None, r'bad\.tfrecord` has no object maps \(image/segmentation/class/'
           r'encoded\) but DataConfig\.num_object_classes=4 needs them'),
    ('short', r'bad\.tfrecord` has 5 object maps \(image/segmentation/class/'
              r'encoded\) for 6 frames'),
    ('large_id', r'bad\.tfrecord` has object class id 7 >= '
                 r'DataConfig\.num_object_classes=4'),
    ('rgb', r'Object map in a record of file `[^`]*bad\.tfrecord`: sampled '
            r'frame 0 is not an 8-bit single-channel \(grey\) PNG'),
    ('size', r'Object maps of a record of file `[^`]*bad\.tfrecord` are '
             r'\[8, 8\] but its frames are \[16, 16\]'),
])
def test_bad_maps_are_errors_naming_the_file(tmp_path, maps, message,
                                             is_training):
  rng = np.random.default_rng(3)
  good = _blocky_maps(rng, 6, 16, 16)
  large_id = good.copy()
  large_id[:, 0, 0] = 7  # In every frame: any sampled clip holds it.
  bad = {None: None, 'short': good[:5], 'large_id': large_id,
         'rgb': _rgb_png_maps(good), 'size': good[:, ::2, ::2]}[maps]
  _write_records(tmp_path / 'good.tfrecord', [(COLOURS[good], [1], good)])
  _write_records(tmp_path / 'bad.tfrecord', [(COLOURS[good], [1], bad)])
  params = _params(tmp_path / 'bad.tfrecord', is_training=is_training,
                   drop_remainder=is_training)
  with pytest.raises(tf.errors.InvalidArgumentError, match=message):
    next(iter(dataloader.build_dataset(params)))
  # skip_bad_records skips it like any bad record (the good one stays).
  params = params.replace(input_path=str(tmp_path / '*.tfrecord'),
                          skip_bad_records=True, is_training=False,
                          drop_remainder=False)
  assert len(list(dataloader.build_dataset(params))) == 1


def test_tfds_without_object_maps_is_refused(tmp_path):
  data_dir = demo_data.ensure_prepared('moving_shapes/tiny', str(tmp_path))
  params = configs.DataConfig(
      tfds_name='moving_shapes/tiny', tfds_split='validation',
      tfds_data_dir=data_dir, feature_shape=(4, 32, 32, 3),
      num_classes=demo_data.NUM_CLASSES, global_batch_size=8,
      is_training=False, min_image_size=32, num_object_classes=3)
  with pytest.raises(ValueError, match=r"tfds:moving_shapes/tiny/validation "
                     r"has no 'objects' feature"):
    dataloader.build_dataset(params)


# -- the demo's masks ----------------------------------------------------------


def test_demo_masks_are_the_shapes(tmp_path):
  """The masks are the rendered shapes (class 1 square, 2 disk, 0 the
  background: the label's shape), drawn without changing the videos;
  `moving_shapes/tiny_objects` serves them beside the same videos, the
  existing configs have no objects feature."""
  for (_, video, label), (_, video2, maps, label2) in zip(
      demo_data.generate(8, 4, 32, seed=3),
      demo_data.generate_with_objects(8, 4, 32, seed=3)):
    assert label == label2 and np.array_equal(video, video2)
    shape = demo_data.SHAPES[label // len(demo_data.DIRECTIONS)]
    assert set(np.unique(maps)) == {0, demo_data.OBJECT_CLASS_NAMES.index(
        shape)}
    # Shape pixels are colour >= 140 (noise 12), background <= 90.
    brightness = video.max(-1).astype(np.float32)
    assert brightness[maps > 0].mean() > brightness[maps == 0].mean() + 60
    if shape == 'square':  # Each frame's mask is one filled rectangle.
      for m in maps:
        ys, xs = np.nonzero(m)
        assert m[ys.min():ys.max() + 1, xs.min():xs.max() + 1].all()
  assert 'objects' not in demo_data.MovingShapes(
      config='tiny', data_dir=str(tmp_path)).info.features
  data_dir = demo_data.ensure_prepared('moving_shapes/tiny_objects',
                                       str(tmp_path))
  params = configs.DataConfig(
      tfds_name='moving_shapes/tiny_objects', tfds_split='validation',
      tfds_data_dir=data_dir, feature_shape=(4, 32, 32, 3),
      num_classes=demo_data.NUM_CLASSES, global_batch_size=24,
      is_training=False, min_image_size=32,
      num_object_classes=demo_data.NUM_OBJECT_CLASSES)
  (features, labels), = list(dataloader.build_dataset(params))
  expected = {v.tobytes(): m for _, v, m, _ in
              demo_data.generate_with_objects(24, 4, 32, seed=2)}
  for image, objects in zip(features['image'].numpy(),
                            features['objects'].numpy()):
    video = np.rint(image * 255).astype(np.uint8)
    np.testing.assert_array_equal(objects, expected[video.tobytes()])
  assert labels.shape == (24, demo_data.NUM_CLASSES)


# -- the converter ---------------------------------------------------------------


def _demo_videos(folder, maps_dir=None, num_frames=6, size=32):
  """Two demo videos (square, disk) as AVI files in class folders; with
  `maps_dir` their masks as DIR/<class>/<stem>/<i>.png. Returns {relative
  path: masks}."""
  out = {}
  for i, video, maps, label in demo_data.generate_with_objects(
      5, num_frames, size, seed=4):
    if label not in (0, 4):
      continue
    rel = os.path.join(demo_data.CLASS_NAMES[label], f'v{i}.avi')
    os.makedirs(folder / os.path.dirname(rel), exist_ok=True)
    videos_lib.write_video(str(folder / rel), video, 10)
    out[rel] = maps
    if maps_dir is not None:
      sub = maps_dir / os.path.splitext(rel)[0]
      sub.mkdir(parents=True)
      for t, m in enumerate(maps):
        Image.fromarray(m, mode='L').save(sub / f'{t:05d}.png')
  return out


def _stored_maps(files):
  out = {}
  for record in tf.data.TFRecordDataset(files):
    ex = tf.train.SequenceExample.FromString(record.numpy())
    clip = ex.context.feature['clip/id'].bytes_list.value[0].decode()
    out[clip] = np.stack([
        tf.io.decode_png(f.bytes_list.value[0])[..., 0].numpy()
        for f in ex.feature_lists.feature_list[KEY].feature])
  return out


def test_the_converter_reads_object_maps_dir(tmp_path):
  """--object_maps_dir: each frame's map stored beside it (resampled with
  the frames by --fps, resized by nearest neighbour with --short_side);
  read back by the dataloader."""
  masks = _demo_videos(tmp_path / 'videos', tmp_path / 'maps')
  cli.run_main(_script(), f'--video_dir={tmp_path / "videos"}',
               f'--output={tmp_path / "out" / "a"}',
               f'--object_maps_dir={tmp_path / "maps"}')
  files = video_records.shard_paths(str(tmp_path / 'out' / 'a'), 1)
  stored = _stored_maps(files)
  assert set(stored) == set(masks)
  for video, maps in masks.items():
    np.testing.assert_array_equal(stored[video], maps)
  # Half the rate (frames 0, 2, 4 of 6) and half the size.
  video_records.convert(str(tmp_path / 'videos'), str(tmp_path / 'out' / 'b'),
                        fps=5, short_side=16,
                        object_maps_dir=str(tmp_path / 'maps'))
  stored = _stored_maps(video_records.shard_paths(str(tmp_path / 'out' / 'b'),
                                                  1))
  for video, maps in masks.items():
    expected = tf.image.resize(maps[::2, ..., None], (16, 16),
                               method='nearest')[..., 0].numpy()
    np.testing.assert_array_equal(stored[video], expected)
  params = _params(files[0], num_object_classes=3, global_batch_size=2,
                   feature_shape=(6, 32, 32, 3), min_image_size=32)
  features, _ = next(iter(dataloader.build_dataset(params)))
  assert features['objects'].shape == (2, 6, 32, 32)


def test_the_converter_names_the_video_and_file_of_bad_maps(tmp_path):
  masks = _demo_videos(tmp_path / 'videos', tmp_path / 'maps')
  video = sorted(masks)[0]
  sub = tmp_path / 'maps' / os.path.splitext(video)[0]
  out = str(tmp_path / 'out' / 'a')

  def convert():
    video_records.convert(str(tmp_path / 'videos'), out,
                          object_maps_dir=str(tmp_path / 'maps'))

  os.remove(sub / '00003.png')
  with pytest.raises(ValueError, match=(
      rf'video {video} decodes 6 frames but {sub} holds 5 object maps; '
      r'missing frame\(s\) \[3\]')):
    convert()
  Image.fromarray(np.zeros([32, 32, 3], np.uint8)).save(sub / '00003.png')
  with pytest.raises(ValueError, match=(
      rf'object map {sub / "00003.png"} is a PNG image of mode RGB')):
    convert()
  os.remove(sub / '00003.png')
  Image.fromarray(masks[video][3], mode='L').save(sub / '3.png')
  Image.fromarray(masks[video][3], mode='L').save(sub / '03.png')
  with pytest.raises(ValueError, match='are both the map of frame 3'):
    convert()
  os.remove(sub / '03.png')
  Image.fromarray(np.zeros([8, 16], np.uint8), mode='L').save(
      sub / '00000.png')
  with pytest.raises(ValueError, match=(
      rf'video {video}: object map {sub / "00000.png"} is 8 x 16, not the '
      'aspect ratio')):
    convert()
  for name in os.listdir(sub):
    os.remove(sub / name)
  os.rmdir(sub)
  with pytest.raises(ValueError, match=rf'video {video}: no object maps: '
                     rf'{sub} is not a folder'):
    convert()
  assert os.listdir(tmp_path / 'out') == []  # Nothing written.


class _Segmenter(tf.Module):
  """Shape pixels (bright) -> class 1, else 0: scores [N, H, W, 2]; or ids at
  half size."""

  def __init__(self, ids=False):
    super().__init__()
    self._ids = ids

  @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3],
                                              tf.uint8)])
  def serve(self, frames):
    bright = tf.reduce_max(tf.cast(frames, tf.float32), -1) - 115.0
    if self._ids:
      return {'ids': tf.cast(bright[:, ::2, ::2] > 0, tf.int32)}
    return {'scores': tf.stack([-bright, bright], -1)}


def _save_segmenter(path, module, signature=None):
  tf.saved_model.save(module, str(path), signatures={
      'serving_default': signature or module.serve})
  return str(path)


def test_the_converter_runs_a_segmenter(tmp_path):
  """--segmenter: the SavedModel's argmax over the stored frames (ids of
  half size resized by nearest neighbour); a signature against the contract
  and both sources are errors naming the flags."""
  masks = _demo_videos(tmp_path / 'videos')
  scores = _save_segmenter(tmp_path / 'scores', _Segmenter())
  ids = _save_segmenter(tmp_path / 'ids', _Segmenter(ids=True))
  for name, model in (('s', scores), ('i', ids)):
    cli.run_main(_script(), f'--video_dir={tmp_path / "videos"}',
                 f'--output={tmp_path / "out" / name}',
                 f'--segmenter={model}')
    stored = _stored_maps(video_records.shard_paths(
        str(tmp_path / 'out' / name), 1))
    for video, maps in masks.items():
      frames = videos_lib.read_video(str(tmp_path / 'videos' / video)).frames
      bright = frames.max(-1).astype(np.float32) > 115
      if name == 'i':
        bright = np.repeat(np.repeat(bright[:, ::2, ::2], 2, 1), 2, 2)
      np.testing.assert_array_equal(stored[video], bright)
      # The toy segmenter finds the shapes (MPEG-4 blurs their edges).
      assert (stored[video] == (maps > 0)).mean() > 0.95

  class TwoInputs(tf.Module):

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 3], tf.uint8),
                                  tf.TensorSpec([], tf.float32)])
    def serve(self, frames, scale):
      return {'scores': tf.cast(frames, tf.float32) * scale}

  class FloatInput(tf.Module):

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 3],
                                                tf.float32)])
    def serve(self, frames):
      return {'a': frames, 'b': frames}

  for module, message in (
      (TwoInputs(), r"serving_default takes \['frames', 'scale'\]; expected "
                    r'serving_default\(one uint8 \[N, H, W, 3\] input\)'),
      (FloatInput(), r"serving_default input 'frames' is float32")):
    path = _save_segmenter(tmp_path / type(module).__name__, module)
    with pytest.raises(ValueError, match=rf'--segmenter={path}: ' + message):
      video_records.convert(str(tmp_path / 'videos'),
                            str(tmp_path / 'out' / 'x'), segmenter=path)
  with pytest.raises(ValueError, match='does not load as a SavedModel'):
    video_records.convert(str(tmp_path / 'videos'),
                          str(tmp_path / 'out' / 'x'),
                          segmenter=str(tmp_path / 'videos'))
  with pytest.raises(ValueError, match='--object_maps_dir and --segmenter '
                     'are both given'):
    video_records.convert(str(tmp_path / 'videos'),
                          str(tmp_path / 'out' / 'x'), segmenter=scores,
                          object_maps_dir=str(tmp_path))
  with pytest.raises(absl_flags.IllegalFlagValueError,
                     match='object_maps_dir.*segmenter'):
    cli.parse_flags(_script(), '--video_dir=v', '--output=o',
                    '--object_maps_dir=m', f'--segmenter={scores}')


# -- the task --------------------------------------------------------------------


class _StandIn(tf_keras.Model):
  """Logits from the one-hot object maps' class frequencies and the mean
  image: records the input keys it was called with."""

  def __init__(self, num_object_classes, num_classes):
    super().__init__()
    self._k = num_object_classes
    self.dense = tf_keras.layers.Dense(num_classes)
    self.seen = []

  def call(self, inputs, training=None):
    self.seen.append(tuple(sorted(inputs)))
    hot = tf.one_hot(inputs['objects'], self._k)
    x = tf.concat([tf.reduce_mean(hot, [1, 2, 3]),
                   tf.reduce_mean(inputs['image'], [1, 2, 3])], -1)
    return self.dense(x)


def test_the_task_passes_the_maps_to_the_model(tmp_path):
  # The AssembleNet++ demo's config (its object classes the data's), with a
  # stand-in model.
  params = exp_factory.get_exp_config('assemblenet_plus_demo')
  data = {'tfds_name': 'moving_shapes/tiny_objects',
          'feature_shape': [4, 32, 32, 3], 'global_batch_size': 4,
          'num_object_classes': demo_data.NUM_OBJECT_CLASSES}
  params.override({'task': {
      'train_data': data,
      'validation_data': dict(data, global_batch_size=8, drop_remainder=True),
      'demo_data': {'data_dir': str(tmp_path / 'tfds')}}}, is_strict=True)
  params.validate()
  task = task_factory.get_task(params.task)
  model = _StandIn(demo_data.NUM_OBJECT_CLASSES, demo_data.NUM_CLASSES)
  optimizer = tf_keras.optimizers.SGD(0.1)
  train = next(iter(task.build_inputs(params.task.train_data)))
  assert train[0]['objects'].shape == (4, 4, 32, 32)
  logs = task.train_step(train, model, optimizer, task.build_metrics())
  assert np.isfinite(float(logs['loss']))
  # The objects' weights got a gradient: the model used the maps.
  assert not np.allclose(model.dense.kernel.numpy()[:3], 0.0)
  val = next(iter(task.build_inputs(params.task.validation_data)))
  assert 'eval_mask' in val[0]
  task.validation_step(val, model, task.build_metrics(training=False))
  assert set(model.seen) == {('image', 'objects')}
  with pytest.raises(ValueError, match=r"num_object_classes=3: the model "
                     r"takes each frame's object class map"):
    task.inference_step({'image': val[0]['image']}, model)
  # Without object maps the model gets the clips alone, as before.
  plain = task_factory.get_task(exp_factory.get_exp_config(
      'assemblenet_plus_lite_demo').task)
  assert set(plain.model_inputs({'image': 1, 'objects': 2,
                                 'eval_mask': 3})) == {'image'}
  params.task.validation_data.num_object_classes = 0
  with pytest.raises(ValueError, match=r'task\.train_data\.num_object_classes'
                     r' \(3\) and task\.validation_data\.num_object_classes '
                     r'\(0\) differ'):
    task_factory.get_task(params.task)
