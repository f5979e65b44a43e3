"""Tests of official_ext.yt8m.dataloader on tiny hand-made records."""
import os
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.core.input import bad_records
from official_ext.yt8m import configs
from official_ext.yt8m import dataloader
from official_ext.yt8m import demo_data

RGB, AUDIO = 8, 4
SCALE = np.float32(4.0 / 255.0)
BIAS = np.float32(4.0 / 512.0 - 2.0)


def _deq(x):
  return np.asarray(x, np.float32) * SCALE + BIAS


def _video(num_frames, offset=0, sizes=(RGB, AUDIO)):
  """uint8 rgb/audio whose first column is the frame index (+ offset)."""
  rgb = (np.arange(num_frames)[:, None] * 7 + np.arange(sizes[0])[None, :] +
         offset) % 256
  rgb[:, 0] = (np.arange(num_frames) + offset) % 256
  audio = (np.arange(num_frames)[:, None] * 3 + 100 +
           np.arange(sizes[1])[None, :] + offset) % 256
  return rgb.astype(np.uint8), audio.astype(np.uint8)


def _write(path, examples):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for example in examples:
      writer.write(example if isinstance(example, bytes) else
                   example.SerializeToString())
  return str(path)


def _config(input_path, **overrides):
  kwargs = dict(
      input_path=str(input_path),
      is_training=False,
      drop_remainder=False,
      global_batch_size=2,
      feature_sizes=(RGB, AUDIO),
      num_classes=5,
      max_frames=6,
      num_sample_frames=None,
      seed=7,
      shuffle_buffer_size=16,
  )
  kwargs.update(overrides)
  return configs.DataConfig(**kwargs)


def _batches(params, **kwargs):
  return list(dataloader.build_dataset(params, **kwargs).as_numpy_iterator())


def _concat(batches, key):
  return np.concatenate([b[key] for b in batches])


def _simple_file(tmp_path, name='data.tfrecord', lengths=(3, 9, 1, 6),
                 labels=((0, 2), (4,), (1,), (3, 0))):
  examples = []
  for i, (n, l) in enumerate(zip(lengths, labels)):
    rgb, audio = _video(n, offset=10 * i)
    examples.append(demo_data.make_sequence_example(f'v{i}', l, rgb, audio))
  return _write(tmp_path / name, examples)


def test_dequantize_values():
  x = tf.constant([0, 1, 128, 255], tf.uint8)
  y = dataloader.dequantize(x).numpy()
  assert y.dtype == np.float32
  assert y[0] == np.float32(-2.0 + 4.0 / 512.0)  # -1.9921875, exact.
  np.testing.assert_allclose(y[1], -2.0 + 4.0 / 512.0 + 4.0 / 255.0, atol=1e-6)
  np.testing.assert_allclose(y[3], 2.0 + 4.0 / 512.0, atol=1e-6)
  np.testing.assert_array_equal(y, _deq([0, 1, 128, 255]))


def test_decoder_raw_tensors():
  rgb, audio = _video(4)
  record = demo_data.make_sequence_example('abc', [1, 3], rgb, audio)
  decoder = dataloader.Decoder(_config('unused'))
  out = decoder.decode(tf.constant(record.SerializeToString()),
                       source=tf.constant('f.tfrecord'))
  assert out['video_id'].numpy() == b'abc'
  np.testing.assert_array_equal(out['labels'].numpy(), [1, 3])
  assert out['features']['rgb'].dtype == tf.uint8
  np.testing.assert_array_equal(out['features']['rgb'].numpy(), rgb)
  np.testing.assert_array_equal(out['features']['audio'].numpy(), audio)
  assert out['source'].numpy() == b'f.tfrecord'


def test_video_level_eval_values(tmp_path):
  path = _simple_file(tmp_path)
  batches = _batches(_config(path, include_video_id=True))
  assert [b['video_matrix'].shape for b in batches] == [(2, 6, 12), (2, 6, 12)]
  matrix = _concat(batches, 'video_matrix')
  np.testing.assert_array_equal(_concat(batches, 'num_frames'), [3, 6, 1, 6])
  assert _concat(batches, 'num_frames').dtype == np.int32
  np.testing.assert_array_equal(_concat(batches, 'video_ids'),
                                [b'v0', b'v1', b'v2', b'v3'])
  for i, n in enumerate((3, 9, 1, 6)):
    rgb, audio = _video(n, offset=10 * i)
    kept = min(n, 6)
    expected = np.concatenate([_deq(rgb), _deq(audio)], axis=1)[:kept]
    np.testing.assert_allclose(matrix[i, :kept], expected, atol=1e-6)
    np.testing.assert_array_equal(matrix[i, kept:], 0.0)  # Zero padding.
  labels = _concat(batches, 'labels')
  assert labels.dtype == np.float32
  np.testing.assert_array_equal(
      labels, [[1, 0, 1, 0, 0], [0, 0, 0, 0, 1], [0, 1, 0, 0, 0],
               [1, 0, 0, 1, 0]])


def test_eval_one_pass_drop_remainder(tmp_path):
  path = _simple_file(tmp_path, lengths=(2, 2, 2), labels=((0,), (1,), (2,)))
  kept = _batches(_config(path, global_batch_size=2, drop_remainder=False))
  assert [b['labels'].shape[0] for b in kept] == [2, 1]
  # drop_remainder in evaluation: static batch shapes, the last batch padded
  # and masked, no video dropped (core.input.eval_padding).
  padded = _batches(_config(path, global_batch_size=2, drop_remainder=True))
  assert [b['labels'].shape[0] for b in padded] == [2, 2]
  assert [list(b['eval_mask']) for b in padded] == [[True, True],
                                                    [True, False]]
  np.testing.assert_array_equal(padded[1]['labels'][0], kept[1]['labels'][0])


@pytest.mark.parametrize('num_sample_frames', [None, 16, 32])
@pytest.mark.parametrize('random_frames', [True, False])
def test_training_sampling(tmp_path, num_sample_frames, random_frames):
  lengths = (1, 5, 20, 40)
  path = _simple_file(tmp_path, lengths=lengths,
                      labels=((0,), (1,), (2,), (3,)))
  params = _config(path, is_training=True, drop_remainder=True,
                   global_batch_size=4, max_frames=24, include_video_id=True,
                   num_sample_frames=num_sample_frames,
                   sample_random_frames=random_frames)
  batch = next(dataloader.build_dataset(params).as_numpy_iterator())
  frames = num_sample_frames or 24
  assert batch['video_matrix'].shape == (4, frames, RGB + AUDIO)
  if num_sample_frames is None:
    # Training repeats and shuffles across epochs: match by video id.
    np.testing.assert_array_equal(
        batch['num_frames'],
        [min(lengths[int(v[1:])], 24) for v in batch['video_ids']])
    return
  np.testing.assert_array_equal(batch['num_frames'], [frames] * 4)
  for row, vid in zip(batch['video_matrix'], batch['video_ids']):
    i = int(vid[1:])
    n = min(lengths[i], 24)  # Sampled from the first max_frames frames.
    # Column 0 holds frame index + 10 * i (dequantized): recover indices.
    idx = np.rint((row[:, 0] - BIAS) / SCALE).astype(int) - 10 * i
    assert idx.min() >= 0 and idx.max() < n
    rgb, audio = _video(lengths[i], offset=10 * i)
    expected = np.concatenate([_deq(rgb), _deq(audio)], axis=1)[idx]
    np.testing.assert_allclose(row, expected, atol=1e-6)
    if random_frames:
      assert np.all(np.diff(idx) >= 0)  # Sorted in time.
      if n >= frames:
        assert len(set(idx)) == frames  # No repeats when long enough.
    else:  # A window of consecutive frames, wrapping when short.
      np.testing.assert_array_equal(idx, (idx[0] + np.arange(frames)) % n)


def test_per_feature_l2_norm(tmp_path):
  path = _simple_file(tmp_path)
  batch = _batches(_config(path, input_per_feature_l2_norm=True))[0]
  m = batch['video_matrix']
  np.testing.assert_allclose(np.linalg.norm(m[0, :3, :RGB], axis=-1), 1.0,
                             rtol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(m[0, :3, RGB:], axis=-1), 1.0,
                             rtol=1e-5)
  np.testing.assert_array_equal(m[0, 3:], 0.0)
  rgb, _ = _video(3)
  block = _deq(rgb)
  np.testing.assert_allclose(
      m[0, :3, :RGB], block / np.linalg.norm(block, axis=-1, keepdims=True),
      rtol=1e-5)


def test_reproducible_with_seed(tmp_path):
  paths = [
      _simple_file(tmp_path, f'f{k}.tfrecord', lengths=(5, 8, 13, 30))
      for k in range(3)
  ]
  pattern = str(tmp_path / 'f*.tfrecord')
  assert len(paths) == 3

  def first_batches(seed):
    params = _config(pattern, is_training=True, global_batch_size=4,
                     max_frames=24, num_sample_frames=8, seed=seed,
                     include_video_id=True)
    it = dataloader.build_dataset(params).as_numpy_iterator()
    return [next(it) for _ in range(4)]

  a, b, c = first_batches(3), first_batches(3), first_batches(4)
  for x, y in zip(a, b):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])
  assert any(not np.array_equal(x['video_matrix'], z['video_matrix'])
             for x, z in zip(a, c))
  # Each occurrence of a video gets its own sample (seeds per example, not
  # per video): the 3 copies of 'v3' (24 usable frames) differ.
  v3 = [x['video_matrix'][k].tobytes() for x in a
        for k in range(4) if x['video_ids'][k] == b'v3']
  assert len(v3) >= 3 and len(set(v3)) == len(v3)


def _sampled_rows(params):
  """{video id: (frame indices, row)} of an evaluation with sampling."""
  rows = {}
  for batch in _batches(params):
    np.testing.assert_array_equal(batch['num_frames'],
                                  params.num_sample_frames)
    for vid, row in zip(batch['video_ids'], batch['video_matrix']):
      i = int(vid[1:])
      idx = np.rint((row[:, 0] - BIAS) / SCALE).astype(int) - 10 * i
      rows[vid] = (idx, row)
  return rows


def test_evaluation_sampling_is_deterministic(tmp_path):
  """validation_data.num_sample_frames: every video sampled (as in
  training), the same frames run to run and whatever the batching; the
  sample follows the seed."""
  lengths = (30, 4, 12, 30)
  path = _simple_file(tmp_path, lengths=lengths,
                      labels=((0,), (1,), (2,), (3,)))
  params = _config(path, max_frames=24, num_sample_frames=6,
                   include_video_id=True, global_batch_size=3)
  # Off by default: evaluation pads to max_frames.
  assert configs.yt8m_data(is_training=False).num_sample_frames is None
  first = _sampled_rows(params)
  again = _sampled_rows(params.replace(global_batch_size=1))
  other_seed = _sampled_rows(params.replace(seed=8))
  assert sorted(first) == [b'v0', b'v1', b'v2', b'v3']
  for vid, (idx, row) in first.items():
    i = int(vid[1:])
    n = min(lengths[i], 24)
    assert idx.min() >= 0 and idx.max() < n and np.all(np.diff(idx) >= 0)
    rgb, audio = _video(lengths[i], offset=10 * i)
    np.testing.assert_allclose(
        row, np.concatenate([_deq(rgb), _deq(audio)], axis=1)[idx],
        atol=1e-6)
    np.testing.assert_array_equal(again[vid][1], row)
  # A sample, not the first frames; per video (v0 and v3 have the same
  # frame count), and another seed gives another one.
  assert list(first[b'v0'][0]) != list(range(6))
  assert list(first[b'v0'][0]) != list(first[b'v3'][0])
  assert any(list(first[v][0]) != list(other_seed[v][0]) for v in first)


def test_input_context_splits_batch(tmp_path):
  for k in range(2):
    _simple_file(tmp_path, f's{k}.tfrecord')
  params = _config(str(tmp_path / 's*.tfrecord'), global_batch_size=4,
                   include_video_id=True)
  ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0,
                                   num_replicas_in_sync=2)
  batches = _batches(params, input_context=ctx)
  assert all(b['labels'].shape[0] <= 2 for b in batches)
  assert sum(b['labels'].shape[0] for b in batches) == 4  # One file of two.


def test_segment_level_values(tmp_path):
  rgb, audio = _video(12)
  ex0 = demo_data.make_sequence_example(
      'seg', [1, 2], rgb, audio,
      segment_labels=[2, 4, 1, 2],
      segment_start_times=[10, 0, 0, 5],
      segment_scores=[1.0, 0.0, 1.0, 0.0])
  no_ratings = demo_data.make_sequence_example('none', [3], *_video(7))
  path = _write(tmp_path / 'seg.tfrecord', [ex0, no_ratings])
  params = _config(path, segment_labels=True, include_video_id=True,
                   global_batch_size=4, max_frames=6)
  batches = _batches(params)
  assert len(batches) == 1
  b = batches[0]
  assert b['video_matrix'].shape == (3, 5, RGB + AUDIO)
  np.testing.assert_array_equal(b['segment_start_times'], [0, 5, 10])
  assert b['segment_start_times'].dtype == np.int32
  np.testing.assert_array_equal(b['num_frames'], [5, 5, 2])
  np.testing.assert_array_equal(b['video_ids'], [b'seg'] * 3)
  np.testing.assert_array_equal(
      b['labels'], [[0, 1, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0]])
  np.testing.assert_array_equal(
      b['label_weights'], [[0, 1, 0, 0, 1], [0, 0, 1, 0, 0], [0, 0, 1, 0, 0]])
  full = np.concatenate([_deq(rgb), _deq(audio)], axis=1)
  np.testing.assert_allclose(b['video_matrix'][0], full[0:5], atol=1e-6)
  # Frames past max_frames are used; the end is zero-padded.
  np.testing.assert_allclose(b['video_matrix'][1], full[5:10], atol=1e-6)
  np.testing.assert_allclose(b['video_matrix'][2, :2], full[10:12], atol=1e-6)
  np.testing.assert_array_equal(b['video_matrix'][2, 2:], 0.0)


def test_real_feature_sizes(tmp_path):
  rng = np.random.default_rng(0)
  rgb = rng.integers(0, 256, (3, 1024), dtype=np.uint8)
  audio = rng.integers(0, 256, (3, 128), dtype=np.uint8)
  path = _write(tmp_path / 'real.tfrecord',
                [demo_data.make_sequence_example('r', [7], rgb, audio)])
  params = _config(path, feature_sizes=(1024, 128), num_classes=10,
                   max_frames=4, global_batch_size=1)
  b = _batches(params)[0]
  assert b['video_matrix'].shape == (1, 4, 1152)
  np.testing.assert_allclose(b['video_matrix'][0, :3, :1024], _deq(rgb),
                             atol=1e-6)
  np.testing.assert_allclose(b['video_matrix'][0, :3, 1024:], _deq(audio),
                             atol=1e-6)
  np.testing.assert_array_equal(b['video_matrix'][0, 3], 0.0)
  assert b['labels'][0].argmax() == 7 and b['labels'].sum() == 1


def test_float_list_features(tmp_path):
  ex = tf.train.SequenceExample()
  ex.context.feature['id'].bytes_list.value.append(b'f')
  ex.context.feature['labels'].int64_list.value.append(1)
  frames = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
  for row in frames:
    ex.feature_lists.feature_list['emb'].feature.add().float_list.value.extend(
        row)
  path = _write(tmp_path / 'float.tfrecord', [ex])
  params = _config(path, feature_names=('emb',), feature_sizes=(3,),
                   feature_dtypes=('float32',), feature_from_bytes=(False,),
                   max_frames=3, global_batch_size=1)
  b = _batches(params)[0]
  np.testing.assert_allclose(b['video_matrix'][0, :2], frames)
  np.testing.assert_array_equal(b['video_matrix'][0, 2], 0.0)


# Bad input -----------------------------------------------------------------


def test_missing_pattern_is_named(tmp_path):
  pattern = str(tmp_path / 'nothing-*.tfrecord')
  with pytest.raises(ValueError, match=re.escape(pattern)):
    dataloader.build_dataset(_config(pattern))
  missing = str(tmp_path / 'missing.tfrecord')
  with pytest.raises(ValueError, match=re.escape(missing)):
    dataloader.build_dataset(_config(missing))


def _damaged(tmp_path, how, num_good=4):
  path = _simple_file(tmp_path, 'bad.tfrecord', lengths=(2,) * num_good,
                      labels=((0,),) * num_good)
  data = open(path, 'rb').read()
  if how == 'truncated':
    data = data[:-5]
  elif how == 'short_tail':  # Shorter than a header: TF alone says nothing.
    data = data + b'garbage'
  elif how == 'appended':
    data = data + b'garbage appended after the good records'
  elif how == 'middle':
    data = bytearray(data)
    data[len(data) // 2] ^= 0xFF
    data = bytes(data)
  with open(path, 'wb') as f:
    f.write(data)
  return path


@pytest.mark.parametrize('how', ['truncated', 'short_tail', 'appended',
                                 'middle'])
def test_damaged_file_is_named(tmp_path, how):
  path = _damaged(tmp_path, how)
  ds = dataloader.build_dataset(_config(path))
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    list(ds.as_numpy_iterator())
  text = str(info.value)
  assert 'Corrupted or truncated TFRecord file' in text
  assert f'`{path}`' in text
  size = os.path.getsize(path)
  assert f' of {size} ' in text


def test_truncated_error_text(tmp_path):
  path = _damaged(tmp_path, 'truncated', num_good=3)
  size = os.path.getsize(path)
  record = (size + 5) // 3  # Equal-size records.
  ds = dataloader.build_dataset(_config(path))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=re.escape(
                         f'Corrupted or truncated TFRecord file `{path}`: its '
                         f'records are readable only up to byte {2 * record} '
                         f'of {size} (2 good records before it).')):
    list(ds.as_numpy_iterator())


@pytest.mark.parametrize('how', ['truncated', 'short_tail', 'appended',
                                 'middle'])
def test_skip_bad_records_counts(tmp_path, how):
  num_good = 6
  bad = _damaged(tmp_path, how, num_good=num_good)
  good = _simple_file(tmp_path, 'good.tfrecord', lengths=(2, 2, 2),
                      labels=((1,),) * 3)
  log = bad_records.BadRecordLog()
  params = _config(f'{bad},{good}', skip_bad_records=True,
                   include_video_id=True)
  batches = _batches(params, bad_records=log)
  seen = sum(b['labels'].shape[0] for b in batches)
  assert log.num_bad_records == 1
  assert log.bad_files == [bad]
  event = log.events[0]
  assert event.file_size == os.path.getsize(bad)
  assert log.skipped_bytes == (event.file_size - event.valid_bytes -
                               event.recovered_bytes) > 0
  if how == 'middle':  # Only the damaged record is lost: reading goes on.
    assert 0 < event.good_records < num_good
    assert event.good_records + event.recovered_records == num_good - 1
    assert log.skipped_bytes == event.file_size // num_good
  elif how == 'truncated':  # The cut record is lost, nothing before it.
    assert event.good_records == num_good - 1
  else:  # Nothing good is lost.
    assert event.good_records == num_good
  assert event.recovered_records == (how == 'middle') * (
      num_good - 1 - event.good_records)
  assert seen == event.good_records + event.recovered_records + 3


def test_wrong_frame_width_is_named(tmp_path):
  rgb, audio = _video(3, sizes=(RGB, AUDIO + 1))
  path = _write(tmp_path / 'w.tfrecord',
                [demo_data.make_sequence_example('wide', [0], rgb, audio)])
  ds = dataloader.build_dataset(_config(path))
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    list(ds.as_numpy_iterator())
  text = str(info.value)
  assert 'Feature `audio` of video `wide`' in text
  assert 'has 5 bytes, expected 4' in text
  assert path in text


@pytest.mark.parametrize('label', [5, 9, -1])
def test_label_out_of_range_is_named(tmp_path, label):
  ok = demo_data.make_sequence_example('ok', [1], *_video(2))
  bad = demo_data.make_sequence_example('badlabel', [0, label], *_video(2))
  path = _write(tmp_path / 'l.tfrecord', [ok, bad])
  ds = dataloader.build_dataset(_config(path, global_batch_size=1))
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    list(ds.as_numpy_iterator())
  text = str(info.value)
  assert (f'Label id {label} in context feature `labels` of video '
          '`badlabel`') in text
  assert 'num_classes = 5' in text
  assert path in text


def test_segment_label_out_of_range_is_named(tmp_path):
  ex = demo_data.make_sequence_example(
      's', [0], *_video(10), segment_labels=[7], segment_start_times=[0],
      segment_scores=[1.0])
  path = _write(tmp_path / 's.tfrecord', [ex])
  ds = dataloader.build_dataset(_config(path, segment_labels=True))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='Label id 7 in context feature `segment_labels`'):
    list(ds.as_numpy_iterator())


def test_inconsistent_config_is_named():
  with pytest.raises(ValueError, match='feature_sizes'):
    dataloader.Parser(_config('x', feature_sizes=(8,)))
  with pytest.raises(ValueError, match='feature_dtypes'):
    dataloader.Decoder(_config('x', feature_dtypes=('uint8', 'int3')))
