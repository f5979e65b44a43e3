"""Tests of official_ext.yt8m.demo_data (tiny sizes)."""
import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.yt8m import configs
from official_ext.yt8m import dataloader
from official_ext.yt8m import demo_data
from tests import cli

SMALL = dict(num_classes=10, max_frames=8, num_train_videos=60,
             num_validation_videos=20, num_shards=2, seed=3,
             segment_fraction=0.5, feature_sizes=(16, 8))


def _records(pattern):
  out = []
  for path in sorted(glob.glob(pattern)):
    for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
      out.append(tf.train.SequenceExample.FromString(raw))
  return out


def _info(example):
  ctx = example.context.feature
  frames = example.feature_lists.feature_list
  return dict(
      id=ctx['id'].bytes_list.value[0].decode(),
      labels=list(ctx['labels'].int64_list.value),
      rgb=np.stack([np.frombuffer(f.bytes_list.value[0], np.uint8)
                    for f in frames['rgb'].feature]),
      audio=np.stack([np.frombuffer(f.bytes_list.value[0], np.uint8)
                      for f in frames['audio'].feature]),
      seg_labels=list(ctx['segment_labels'].int64_list.value),
      seg_starts=list(ctx['segment_start_times'].int64_list.value),
      seg_scores=list(ctx['segment_scores'].float_list.value))


@pytest.fixture(scope='module')
def small_data(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('demo'))
  return out, demo_data.write_demo_dataset(out, **SMALL)


def test_make_sequence_example_round_trip():
  rgb = np.arange(6, dtype=np.uint8).reshape(2, 3)
  audio = np.arange(4, dtype=np.uint8).reshape(2, 2) + 50
  ex = demo_data.make_sequence_example('x', [2, 4], rgb, audio, [4], [0], [1.0])
  info = _info(ex)
  assert info['id'] == 'x' and info['labels'] == [2, 4]
  np.testing.assert_array_equal(info['rgb'], rgb)
  np.testing.assert_array_equal(info['audio'], audio)
  assert (info['seg_labels'], info['seg_starts'], info['seg_scores']) == (
      [4], [0], [1.0])
  with pytest.raises(ValueError, match='rgb'):
    demo_data.make_sequence_example('x', [0], rgb.astype(np.float32), audio)
  with pytest.raises(ValueError, match='segment'):
    demo_data.make_sequence_example('x', [0], rgb, audio, [1], [0], None)


def test_quantize_inverts_dequantize():
  q = np.arange(256, dtype=np.uint8)
  x = dataloader.dequantize(tf.constant(q)).numpy()
  np.testing.assert_array_equal(demo_data.quantize(x), q)
  np.testing.assert_array_equal(demo_data.quantize(np.array([-9.0, 9.0])),
                                [0, 255])


def test_deterministic_by_seed(small_data, tmp_path):
  out, patterns = small_data
  again = demo_data.write_demo_dataset(str(tmp_path / 'again'), **SMALL)
  other = demo_data.write_demo_dataset(str(tmp_path / 'other'),
                                       **dict(SMALL, seed=4))
  for split in ('train', 'validation'):
    a = sorted(glob.glob(patterns[split]))
    b = sorted(glob.glob(again[split]))
    c = sorted(glob.glob(other[split]))
    assert len(a) == len(b) == len(c) == SMALL['num_shards']
    for x, y, z in zip(a, b, c):
      assert os.path.basename(x) == os.path.basename(y)
      assert open(x, 'rb').read() == open(y, 'rb').read()
      assert open(x, 'rb').read() != open(z, 'rb').read()
  assert out in patterns['train']


def test_data_properties(small_data):
  _, patterns = small_data
  train = [_info(e) for e in _records(patterns['train'])]
  val = [_info(e) for e in _records(patterns['validation'])]
  assert len(train) == SMALL['num_train_videos']
  assert len(val) == SMALL['num_validation_videos']
  assert len({v['id'] for v in train + val}) == len(train) + len(val)
  lengths = [len(v['rgb']) for v in train]
  assert min(lengths) == 1
  assert max(lengths) > SMALL['max_frames']
  assert max(lengths) <= 1.5 * SMALL['max_frames']
  counts = [len(v['labels']) for v in train]
  assert min(counts) >= 1 and max(counts) <= 5 and max(counts) > 1
  assert np.mean(counts) < 3  # Skewed toward few labels.
  with_segments = 0
  for v in train + val:
    assert v['rgb'].shape[1] == 16 and v['audio'].shape == (len(v['rgb']), 8)
    assert len(set(v['labels'])) == len(v['labels'])
    assert all(0 <= l < SMALL['num_classes'] for l in v['labels'])
    if not v['seg_labels']:
      continue
    with_segments += 1
    n = len(v['rgb'])
    assert len(v['seg_labels']) == len(v['seg_starts']) == len(v['seg_scores'])
    for label, start, score in zip(v['seg_labels'], v['seg_starts'],
                                   v['seg_scores']):
      assert start % 5 == 0 and start + 5 <= n
      assert score in (0.0, 1.0)
      assert (label in v['labels']) == (score == 1.0)
    for start in set(v['seg_starts']):  # Every segment has a positive rating.
      assert any(s == start and sc == 1.0
                 for s, sc in zip(v['seg_starts'], v['seg_scores']))
  assert 0 < with_segments < len(train) + len(val)


def test_pipeline_reads_demo_data(small_data):
  _, patterns = small_data
  common = dict(is_training=False, drop_remainder=False, global_batch_size=16,
                num_classes=SMALL['num_classes'],
                max_frames=SMALL['max_frames'],
                feature_sizes=SMALL['feature_sizes'])
  video = configs.DataConfig(input_path=patterns['validation'], **common)
  batches = list(dataloader.build_dataset(video).as_numpy_iterator())
  num_videos = sum(len(b['labels']) for b in batches)
  assert num_videos == SMALL['num_validation_videos']
  segments = configs.DataConfig(input_path=patterns['validation'],
                                segment_labels=True, **common)
  expected = sum(len(set(_info(e)['seg_starts']))
                 for e in _records(patterns['validation']))
  batches = list(dataloader.build_dataset(segments).as_numpy_iterator())
  assert sum(len(b['labels']) for b in batches) == expected > 0
  for b in batches:  # Each segment has one positive rated class.
    assert np.all((b['labels'] * b['label_weights']).sum(axis=1) >= 1)


def test_learnable_structure(tmp_path):
  """Nearest class centroid of mean frames beats chance by far."""
  params = dict(SMALL, num_train_videos=300, num_validation_videos=100,
                feature_sizes=(64, 16), segment_fraction=0.0)
  patterns = demo_data.write_demo_dataset(str(tmp_path), **params)

  def mean_features(pattern):
    xs, ys = [], []
    for e in _records(pattern):
      v = _info(e)
      frames = np.concatenate([v['rgb'], v['audio']], axis=1).astype(float)
      xs.append(frames.mean(axis=0))
      ys.append(v['labels'])
    return np.array(xs), ys

  x_train, y_train = mean_features(patterns['train'])
  x_val, y_val = mean_features(patterns['validation'])
  centroids = np.stack([
      x_train[[c in y for y in y_train]].mean(axis=0)
      for c in range(params['num_classes'])
  ])
  predicted = np.argmin(
      ((x_val[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
  hit = np.mean([p in y for p, y in zip(predicted, y_val)])
  assert hit > 0.6  # Chance is about 0.2.


def test_cli_writes_files(tmp_path, capsys):
  out = tmp_path / 'cli'
  cli.run_main(demo_data, f'--output_dir={out}', '--num_classes=7',
               '--max_frames=6', '--num_train_videos=5',
               '--num_validation_videos=3', '--num_shards=2', '--seed=1',
               '--segment_fraction=0.5')
  assert f'train: {out}/train-*-of-00002.tfrecord' in capsys.readouterr().out
  assert len(glob.glob(str(out / 'train-*.tfrecord'))) == 2
  assert len(_records(str(out / 'validation-*.tfrecord'))) == 3
  videos = [_info(e) for e in _records(str(out / 'train-*.tfrecord'))]
  assert len(videos) == 5 and all(v['rgb'].shape[1] == 1024 for v in videos)


def _task(cache_dir, **demo):
  task = configs.yt8m_demo().task
  task.demo_data.cache_dir = cache_dir
  task.demo_data.num_train_videos = 6
  task.demo_data.num_validation_videos = 4
  task.demo_data.num_shards = 1
  for data in (task.train_data, task.validation_data):
    data.max_frames = 6
    data.feature_sizes = (16, 8)
  task.demo_data.override(demo)
  return task


def test_ensure_demo_data_caches(tmp_path, monkeypatch):
  task = _task(str(tmp_path))
  train, val = demo_data.ensure_demo_data(task)
  assert train.startswith(str(tmp_path))
  files = glob.glob(train) + glob.glob(val)
  assert len(files) == 2
  mtimes = {f: os.path.getmtime(f) for f in files}

  def fail(*args, **kwargs):
    raise AssertionError('regenerated cached data')

  monkeypatch.setattr(demo_data, 'write_demo_dataset', fail)
  assert demo_data.ensure_demo_data(_task(str(tmp_path))) == (train, val)
  assert {f: os.path.getmtime(f) for f in files} == mtimes
  # Any data parameter changes the cache entry.
  with pytest.raises(AssertionError, match='regenerated'):
    demo_data.ensure_demo_data(_task(str(tmp_path), seed=5))
  leftovers = [d for d in os.listdir(tmp_path / 'yt8m_demo') if '.tmp-' in d]
  assert not leftovers


def test_ensure_demo_data_env_cache(tmp_path, monkeypatch):
  monkeypatch.setenv('OFFICIAL_EXT_CACHE', str(tmp_path / 'env'))
  train, _ = demo_data.ensure_demo_data(_task(''))
  assert train.startswith(str(tmp_path / 'env'))
  assert len(_records(train)) == 6


def test_ensure_demo_data_disabled():
  task = _task('', enabled=False)
  with pytest.raises(ValueError, match=r'task\.demo_data\.enabled'):
    demo_data.ensure_demo_data(task)


def test_damaged_cache_is_regenerated_and_logged(tmp_path, caplog):
  """COMPLETE.json records every file's size and checksum, checked before
  each use: a zeroed shard and a deleted shard are generated again (a
  warning names them), never read as they are."""
  caplog.set_level('INFO', logger='absl')
  train, val = demo_data.ensure_demo_data(_task(str(tmp_path)))
  shard, val_shard = glob.glob(train)[0], glob.glob(val)[0]
  with open(os.path.join(os.path.dirname(shard), 'COMPLETE.json')) as f:
    recorded = json.load(f)['files']
  with open(shard, 'rb') as f:
    original = f.read()
  assert recorded[os.path.basename(shard)]['bytes'] == len(original)
  with open(shard, 'wb') as f:  # Zeroed, same size.
    f.write(bytes(len(original)))
  assert demo_data.ensure_demo_data(_task(str(tmp_path))) == (train, val)
  with open(shard, 'rb') as f:
    assert f.read() == original
  assert (f'{os.path.basename(shard)} has other bytes than were written'
          in caplog.text)
  with open(val_shard, 'rb') as f:
    original = f.read()
  os.remove(val_shard)
  demo_data.ensure_demo_data(_task(str(tmp_path)))
  with open(val_shard, 'rb') as f:
    assert f.read() == original
  assert f'{os.path.basename(val_shard)} is missing' in caplog.text
  assert sorted(os.listdir(tmp_path / 'yt8m_demo')) == [
      os.path.basename(os.path.dirname(shard))]  # Nothing left beside it.


def test_cli_refuses_a_non_empty_output_dir_and_writes_whole(
    tmp_path, monkeypatch):
  out = tmp_path / 'cli'
  args = [f'--output_dir={out}', '--num_classes=5', '--max_frames=4',
          '--num_train_videos=4', '--num_validation_videos=2',
          '--num_shards=1']

  def contents():
    return {n: (out / n).read_bytes() for n in sorted(os.listdir(out))}

  cli.run_main(demo_data, *args, '--seed=1')
  before = contents()
  assert len(before) == 2
  with pytest.raises(ValueError, match=rf'{out} is not empty '
                     r'\(train-00000-of-00001.tfrecord, .*--overwrite'):
    cli.run_main(demo_data, *args, '--seed=2')
  assert contents() == before
  # A write that fails half-way replaces nothing, even with --overwrite.
  split_examples = demo_data._split_examples

  def failing(rng, split, *a, **k):
    if split == 'validation':
      raise OSError('injected: disk full')
    return split_examples(rng, split, *a, **k)

  monkeypatch.setattr(demo_data, '_split_examples', failing)
  with pytest.raises(OSError, match='injected'):
    cli.run_main(demo_data, *args, '--seed=2', '--overwrite')
  assert contents() == before
  monkeypatch.undo()
  cli.run_main(demo_data, *args, '--seed=2', '--overwrite')
  after = contents()
  assert set(after) == set(before) and after != before
