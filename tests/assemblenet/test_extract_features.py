"""The feature bridge: encoded videos -> AssembleNet++lite -> YT8M records.

One chain, shared by the tests (module fixture): the demo's moving shapes
written as .mp4 files (OpenCV), converted to clip records, a minimal
AssembleNet++lite trained on them by `official_ext.train`, its features
extracted from the .mp4 files (PCA fitted on the training split, quantized
as YouTube-8M does), and a YT8M DBoF model trained on those records, whose
validation hit@1 must beat chance (1/8) by a stated margin.
"""
import os
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.assemblenet import dataloader as anet_dataloader
from official_ext.assemblenet import extract_features as ef
from official_ext.assemblenet import video_records
from official_ext.assemblenet import videos as videos_lib
from official_ext.core import frame_features
from official_ext.yt8m import configs as yt8m_configs
from official_ext.yt8m import dataloader as yt8m_dataloader
from tests import cli
from tests.assemblenet import damaged_videos
from tests.assemblenet import minimal

NUM_CLASSES = 8
FRAMES, FPS = 16, 4.0  # 4 s videos: 4 features each at YouTube-8M's rate.
PCA_DIM = 16
# The bridge's validation hit@1 must beat chance (1/8) by this much.
MARGIN = 0.25


def _anet_params(records, model_dir_steps=300):
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  shape = [4, 32, 32, 3]
  data = dict(feature_shape=shape, tfds_name='', input_path=records)
  params.override({
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': {
          'model': {'backbone': minimal.backbone(), 'head_filters': [16, 24],
                    'dropout_rate': 0.0},
          'train_data': dict(data, global_batch_size=8,
                             shuffle_buffer_size=64, num_examples=64),
          'validation_data': dict(data, global_batch_size=8,
                                  num_examples=32),
          'demo_data': {'enabled': False}},
      'trainer': {
          'train_steps': model_dir_steps, 'steps_per_loop': model_dir_steps,
          'checkpoint_interval': model_dir_steps,
          'summary_interval': model_dir_steps,
          'optimizer_config': {
              'learning_rate': {'cosine': {'initial_learning_rate': 0.01,
                                           'decay_steps': model_dir_steps}},
              'warmup': {'linear': {'warmup_steps': 10}}}},
  }, is_strict=True)
  params.validate()
  return params


def _yt8m_params(train_files, validation_files, steps=200):
  params = exp_factory.get_exp_config('yt8m_demo')
  data = dict(feature_names=['rgb'], feature_sizes=[PCA_DIM],
              feature_dtypes=['uint8'], feature_from_bytes=[True],
              num_classes=NUM_CLASSES, max_frames=4, global_batch_size=8)
  params.override({
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': {
          'model': {'backbone': {'dbof': {'cluster_size': 16,
                                          'hidden_size': 16}}},
          'train_data': dict(data, input_path=train_files,
                             num_sample_frames=None, num_examples=64),
          'validation_data': dict(data, input_path=validation_files,
                                  num_examples=32),
          'demo_data': {'enabled': False}, 'jit_compile': False},
      'trainer': {'train_steps': steps, 'steps_per_loop': steps,
                  'checkpoint_interval': steps, 'summary_interval': steps,
                  'validation_interval': steps, 'validation_steps': -1,
                  'optimizer_config': {
                      'learning_rate': {'exponential': {
                          'initial_learning_rate': 0.01}},
                      'warmup': {'linear': {'warmup_steps': 10}}}},
  }, is_strict=True)
  params.validate()
  return params


@pytest.fixture(scope='module')
def bridge(tmp_path_factory):
  root = tmp_path_factory.mktemp('bridge')
  tf_keras.utils.set_random_seed(3)
  split = {}
  for name, per_class, seed in (('train', 8, 1), ('validation', 4, 2)):
    video_dir = str(root / 'videos' / name)
    written = videos_lib.write_demo_videos(video_dir, per_class, FRAMES,
                                           fps=FPS, seed=seed)
    files, _ = video_records.convert(video_dir, str(root / 'clips' / name))
    split[name] = dict(video_dir=video_dir, videos=written, clips=files[0])
  model_dir = str(root / 'anet')
  params = _anet_params(split['train']['clips'])
  model, _ = train.run(params, 'train', model_dir)
  # The command (test_cli_...) loads it from model_dir and its params.yaml.
  extractor = ef.FeatureExtractor(params, model)
  (root / 'features').mkdir()
  train_out = str(root / 'features' / 'train')
  summary = ef.extract(extractor,
                       ef.videos_in_folder(split['train']['video_dir']),
                       train_out, encoding='quantized', pca_dim=PCA_DIM)
  return dict(root=root, split=split, model_dir=model_dir,
              extractor=extractor, train_out=train_out, summary=summary)


def _records(path):
  return [tf.train.SequenceExample.FromString(r.numpy())
          for r in tf.data.TFRecordDataset(path)]


def _features_of(bridge, split, index=0):
  path = sorted(bridge['split'][split]['videos'])[index]
  video = videos_lib.read_video(path)
  return path, ef.extract_video(bridge['extractor'], video.frames, video.fps)


def test_rate_gives_features_per_second(bridge):
  extractor = bridge['extractor']
  assert ef.clip_windows(FRAMES, FPS, 1.0, 4) == [(0, 4), (4, 8), (8, 12),
                                                  (12, 16)]
  assert ef.clip_windows(10, 4.0, 2.0, 8) == [(0, 8), (0, 8), (1, 9),
                                              (2, 10), (2, 10)]
  path = sorted(bridge['split']['train']['videos'])[0]
  video = videos_lib.read_video(path)
  assert video.fps == FPS and len(video.frames) == FRAMES
  for rate in (1.0, 2.0):
    features = ef.extract_video(extractor, video.frames, video.fps, rate)
    assert features.shape == (FRAMES / FPS * rate, extractor.dim)
  assert bridge['summary'].features_per_video == [4] * 64


def test_head_feature_is_what_the_classifier_reads(bridge):
  """--feature_layer=head is the input of the dense layer: dense(feature)
  gives the model's logits."""
  extractor = bridge['extractor']
  model = extractor.model
  clip = np.random.default_rng(0).uniform(size=[2, 4, 32, 32, 3]).astype(
      np.float32)
  embedding = model.head.embedding(
      model.backbone(clip, training=False)['output'], training=False)
  dense = model.head._dense  # pylint: disable=protected-access
  np.testing.assert_allclose(dense(embedding), model({'image': clip}),
                             rtol=1e-4, atol=1e-5)
  assert extractor.dim == embedding.shape[-1] == 24


def test_pca_fitted_on_train_is_reused_for_validation(bridge):
  pca_file = bridge['train_out'] + ef.PCA_SUFFIX
  pca = frame_features.load_pca(pca_file)
  assert (pca.dim, pca.input_dim) == (PCA_DIM, 24)
  val_out = str(bridge['root'] / 'features' / 'validation_float')
  sources = ef.videos_in_folder(bridge['split']['validation']['video_dir'])
  ef.extract(bridge['extractor'], sources[:3], val_out, encoding='quantized',
             pca_file=pca_file)
  assert not os.path.exists(val_out + ef.PCA_SUFFIX)  # Loaded, not fitted.
  path, features = _features_of(bridge, 'validation')
  record = _records(ef.shard_paths(val_out, 1)[0])[0]
  assert record.context.feature['id'].bytes_list.value[0].decode() == (
      os.path.relpath(path, bridge['split']['validation']['video_dir']))
  stored = np.stack([np.frombuffer(f.bytes_list.value[0], np.uint8) for f in
                     record.feature_lists.feature_list['rgb'].feature])
  np.testing.assert_array_equal(stored,
                                frame_features.quantize(pca.apply(features)))
  # A PCA fitted on the validation features would encode them otherwise.
  refit = frame_features.fit_pca(features, 2)
  assert not np.allclose(refit.mean, pca.mean)
  with pytest.raises(FileExistsError, match='validation_float'):
    ef.extract(bridge['extractor'], sources[:1], val_out,
               encoding='quantized', pca_file=pca_file)


def test_records_read_back_within_the_quantization_error(bridge):
  """The quantized records, dequantized as the YT8M input pipeline does,
  equal the whitened PCA features (clipped to [-2, 2]) within half a
  quantization step; float records read back exactly through the YT8M input
  pipeline (the quantized ones are read by it in the last test)."""
  pca = frame_features.load_pca(bridge['train_out'] + ef.PCA_SUFFIX)
  first = sorted(bridge['split']['train']['videos'])[0]
  video_id = os.path.relpath(first, bridge['split']['train']['video_dir'])
  record, = [r for r in _records(ef.shard_paths(bridge['train_out'], 1)[0])
             if r.context.feature['id'].bytes_list.value[0].decode() ==
             video_id]
  stored = np.stack([np.frombuffer(f.bytes_list.value[0], np.uint8) for f in
                     record.feature_lists.feature_list['rgb'].feature])
  _, features = _features_of(bridge, 'train')
  # Values outside [-2, 2] are stored as its ends.
  expected = np.clip(pca.apply(features), -2.0, 2.0)
  error = np.abs(yt8m_dataloader.dequantize(stored).numpy() - expected)
  assert error.max() <= frame_features.QUANTIZATION_SCALE / 2 + 1e-5
  assert np.ptp(expected) > 1.0  # Not a constant feature.
  np.testing.assert_allclose(frame_features.dequantize(stored),
                             yt8m_dataloader.dequantize(stored), atol=1e-6)
  example = ef.make_yt8m_example('v', [3], features, 'float')
  path = str(bridge['root'] / 'float.tfrecord')
  with tf.io.TFRecordWriter(path) as w:
    w.write(example.SerializeToString())
  data = yt8m_configs.DataConfig(
      input_path=path, feature_names=('rgb',),
      feature_sizes=(features.shape[1],), feature_dtypes=('float32',),
      feature_from_bytes=(False,), num_classes=NUM_CLASSES, max_frames=4,
      is_training=False, global_batch_size=1, drop_remainder=False)
  batch = next(iter(yt8m_dataloader.build_dataset(data)))
  np.testing.assert_array_equal(batch['video_matrix'].numpy()[0], features)
  assert batch['labels'].numpy()[0].argmax() == 3


def test_clip_records_give_the_videos_features(bridge):
  """--input_path: the converter's clip records of the validation videos
  (JPEG frames) give each video's id, labels and the features of its .mp4
  file's frames as the converter stores them (JPEGs of quality 90)."""
  split = bridge['split']['validation']
  with pytest.raises(ValueError, match='--fps'):
    list(ef.videos_in_records(split['clips'], None,
                              bridge['extractor'].params))
  sources = list(ef.videos_in_records(split['clips'], FPS,
                                      bridge['extractor'].params))
  assert len(sources) == len(split['videos'])
  path, features = _features_of(bridge, 'validation')
  video_id = os.path.relpath(path, split['video_dir'])
  source, = [s for s in sources if s.video_id == video_id]
  assert source.labels == [split['videos'][path]]
  frames, fps = source.load()
  from_records = ef.extract_video(bridge['extractor'], frames, fps)
  stored = anet_dataloader.encode_jpeg_frames(
      videos_lib.read_video(path).frames, 90)
  assert [bytes(f) for f in frames] == stored
  decoded = np.stack([tf.io.decode_jpeg(f).numpy() for f in stored])
  np.testing.assert_allclose(
      from_records, ef.extract_video(bridge['extractor'], decoded, fps),
      atol=1e-5)
  assert from_records.shape == features.shape


def test_unreadable_video_is_named(bridge, tmp_path):
  video_dir = tmp_path / 'videos'
  videos_lib.write_demo_videos(str(video_dir), 1, 8, fps=FPS)
  broken = video_dir / '0_square_right' / 'broken.mp4'
  broken.write_bytes(b'not a video')
  sources = ef.videos_in_folder(str(video_dir))
  with pytest.raises(ValueError, match='broken.mp4'):
    ef.extract(bridge['extractor'], sources, str(tmp_path / 'a'))
  assert not ef.previous_output(str(tmp_path / 'a'))  # Nothing written.
  summary = ef.extract(bridge['extractor'], sources, str(tmp_path / 'b'),
                       skip_unreadable=True)
  assert summary.skipped == [str(broken)] and summary.num_videos == 8


def test_a_truncated_video_is_named_not_shortened(bridge, tmp_path):
  """A video that decodes fewer frames than its container states gives no
  features (fewer would pass for a shorter video): an error naming it and
  both counts, nothing written; with skip_unreadable, listed."""
  video_dir = tmp_path / 'videos'
  videos_lib.write_demo_videos(str(video_dir), 1, 8, fps=FPS)
  cut = video_dir / '0_square_right' / 'cut.mp4'
  stated, decoded = damaged_videos.truncated_mp4(str(cut), fps=FPS)
  sources = ef.videos_in_folder(str(video_dir))
  with pytest.raises(ValueError, match=re.escape(
      f'{cut} is incomplete: {decoded} of the {stated} frames')):
    ef.extract(bridge['extractor'], sources, str(tmp_path / 'a'))
  assert not ef.previous_output(str(tmp_path / 'a'))
  summary = ef.extract(bridge['extractor'], sources, str(tmp_path / 'b'),
                       skip_unreadable=True)
  assert summary.skipped == [str(cut)] and summary.num_videos == 8


def test_cli_and_the_bridge_beats_chance(bridge):
  """The command on the validation videos (PCA loaded from the training
  split), then a YT8M DBoF trained on the training features: validation
  hit@1 beats chance by MARGIN."""
  val_out = str(bridge['root'] / 'features' / 'validation')
  cli.run_main(ef, f'--checkpoint_path={bridge["model_dir"]}',
               f'--video_dir={bridge["split"]["validation"]["video_dir"]}',
               f'--output={val_out}', '--encoding=quantized',
               f'--pca_file={bridge["train_out"]}{ef.PCA_SUFFIX}')
  params = _yt8m_params(ef.shard_paths(bridge['train_out'], 1)[0],
                        ef.shard_paths(val_out, 1)[0])
  tf_keras.utils.set_random_seed(5)
  _, metrics = train.run(params, 'train_and_eval',
                         str(bridge['root'] / 'yt8m'))
  hit_at_one = float(metrics['hit_at_one'])
  print(f'bridge validation hit@1 {hit_at_one:.3f}, GAP '
        f'{float(metrics["gap"]):.3f}')
  assert hit_at_one >= 1 / NUM_CLASSES + MARGIN, metrics


def test_a_pca_file_that_cannot_be_right_is_refused_before_any_video(
    tmp_path):
  """A --pca_file with a NaN mean or a negative eigenvalue (which gave
  all-zero quantized features) is an error naming the file and what is
  wrong, before any video is read."""
  class Extractor:
    dim, feature_layer = 4, 'head'

  def load():
    raise AssertionError('a video was read before --pca_file was checked')

  sources = [ef.VideoSource('v.mp4', [0], 'v.mp4', load)]
  good = frame_features.fit_pca(np.random.default_rng(0).normal(size=[9, 4]),
                                2)
  for name, arrays, message in (
      ('nan', dict(mean=np.full([4], np.nan, np.float32)), 'mean holds 4 NaN'),
      ('negative', dict(eigenvalues=np.array([1., -1.], np.float32)),
       'eigenvalues hold 1 negative value')):
    path = str(tmp_path / f'{name}.pca.npz')
    np.savez(path, **dict(dict(mean=good.mean, components=good.components,
                               eigenvalues=good.eigenvalues), **arrays))
    with pytest.raises(ValueError, match=f'--pca_file={path}: {message}'):
      ef.extract(Extractor(), sources, str(tmp_path / 'out'),
                 encoding='quantized', pca_file=path)
  assert sorted(os.listdir(tmp_path)) == ['nan.pca.npz', 'negative.pca.npz']
