"""Per-worker input sharding: across the input pipelines of a multi-worker
job every example is read exactly once per epoch.

Each family's `build_dataset` runs on Model Garden's InputReader, which shards
the files per `tf.distribute.InputContext` when there are at least as many
files as pipelines, and the records otherwise. Two pipelines are simulated
here with `tf.distribute.InputContext(num_input_pipelines=2, ...)`.
"""
import collections
import functools

import numpy as np
import pytest
import tensorflow as tf

from official.core import exp_factory
from official_ext.core.input import input_files
from official_ext.readout import dataloader as readout_dataloader
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.yt8m import dataloader as yt8m_dataloader
from official_ext.yt8m import demo_data as yt8m_demo_data

_PIPELINES = 2


def _contexts():
  return [tf.distribute.InputContext(num_input_pipelines=_PIPELINES,
                                     input_pipeline_id=i,
                                     num_replicas_in_sync=_PIPELINES)
          for i in range(_PIPELINES)]


def _assert_each_once(per_pipeline, expected):
  counts = collections.Counter(i for ids in per_pipeline for i in ids)
  twice = sorted(i for i, n in counts.items() if n > 1)
  assert not twice, f'read by more than one pipeline (or twice): {twice[:10]}'
  assert sorted(counts) == sorted(expected)
  # Each pipeline reads its share (files of equal size here).
  assert [len(ids) for ids in per_pipeline] == (
      [len(expected) // _PIPELINES] * _PIPELINES)


# -- YouTube-8M ------------------------------------------------------------

_YT8M_VIDEOS = 48


@pytest.fixture(scope='module')
def yt8m_files(tmp_path_factory):
  """Train and validation splits: 8 files and 1 file of 48 videos each."""
  out = tmp_path_factory.mktemp('yt8m')
  write = dict(num_classes=10, max_frames=4, seed=3, segment_fraction=0.0,
               feature_sizes=(8, 4))
  many = yt8m_demo_data.write_demo_dataset(
      str(out / 'many'), num_train_videos=_YT8M_VIDEOS,
      num_validation_videos=8, num_shards=8, **write)
  one = yt8m_demo_data.write_demo_dataset(
      str(out / 'one'), num_train_videos=_YT8M_VIDEOS,
      num_validation_videos=8, num_shards=1, **write)
  return many['train'], one['train']


def _yt8m_params(input_path, is_training):
  params = exp_factory.get_exp_config('yt8m_demo').task.train_data
  params.override({
      'input_path': input_path, 'is_training': is_training,
      'include_video_id': True, 'global_batch_size': 4,
      'feature_sizes': [8, 4], 'num_classes': 10, 'max_frames': 4,
      'num_sample_frames': None, 'drop_remainder': False,
      'seed': None,  # Model Garden's default: no seed.
      # An epoch in order: no example shuffle, one file at a time.
      'shuffle_buffer_size': 1, 'cycle_length': 1, 'block_length': 1,
  }, is_strict=True)
  return params


def _yt8m_ids(params, context, num_examples=None):
  dataset = yt8m_dataloader.build_dataset(params, input_context=context)
  ids = []
  for batch in dataset:
    ids.extend(v.decode() for v in batch['video_ids'].numpy())
    if num_examples is not None and len(ids) >= num_examples:
      return ids[:num_examples]
  return ids


@functools.lru_cache(maxsize=None)
def _yt8m_all_ids(pattern):
  """The ids of one evaluation pass over `pattern` (read once per pattern:
  the files do not change within the module)."""
  return tuple(_yt8m_ids(_yt8m_params(pattern, is_training=False), None))


@pytest.mark.parametrize('is_training', [False, True])
@pytest.mark.parametrize('files', ['many', 'one'])
def test_yt8m_pipelines_read_every_video_once(yt8m_files, files, is_training):
  pattern = yt8m_files[0] if files == 'many' else yt8m_files[1]
  expected = _yt8m_all_ids(pattern)
  assert len(expected) == len(set(expected)) == _YT8M_VIDEOS
  params = _yt8m_params(pattern, is_training)
  # Training repeats forever: one epoch of a pipeline is its share.
  share = _YT8M_VIDEOS // _PIPELINES if is_training else None
  per_pipeline = [_yt8m_ids(params, c, share) for c in _contexts()]
  _assert_each_once(per_pipeline, expected)


# -- Readout ----------------------------------------------------------------

_READOUT_RECORDS = 48


def _readout_params(input_path, is_training):
  params = exp_factory.get_exp_config('readout_demo')
  data = params.task.train_data
  data.override({
      'input_path': input_path, 'is_training': is_training,
      'global_batch_size': 4, 'drop_remainder': False, 'seed': None,
      'shuffle_buffer_size': 1, 'cycle_length': 1, 'block_length': 1,
  }, is_strict=True)
  return params.task, data


@pytest.fixture(scope='module')
def readout_files(tmp_path_factory):
  """Records whose single input token holds the record's number: 8 files."""
  out = tmp_path_factory.mktemp('readout')
  task, data = _readout_params('', False)
  paths = []
  per_file = _READOUT_RECORDS // 8
  for f in range(8):
    path = str(out / f'readout-{f}.tfrecord')
    readout_dataloader.write_records(path, [
        readout_dataloader.make_example(
            f'record-{i}', np.full([1, data.input_dim], float(i), np.float32),
            [0.0], [], [], [])
        for i in range(f * per_file, (f + 1) * per_file)])
    paths.append(path)
  return paths


def _readout_ids(task, data, context, num_examples=None):
  dataset = readout_dataloader.build_dataset(
      data, task.readouts, task.task_vocabulary, input_context=context)
  ids = []
  for batch in dataset:
    values = batch['input_values'].numpy()[:, 0, 0]
    ids.extend(int(v) for v in values)
    if num_examples is not None and len(ids) >= num_examples:
      return ids[:num_examples]
  return ids


@pytest.mark.parametrize('is_training', [False, True])
@pytest.mark.parametrize('files', ['many', 'one'])
def test_readout_pipelines_read_every_record_once(readout_files, files,
                                                  is_training):
  paths = readout_files if files == 'many' else readout_files[:1]
  expected = list(range(_READOUT_RECORDS // 8 * len(paths)))
  task, data = _readout_params(','.join(paths), is_training)
  share = len(expected) // _PIPELINES if is_training else None
  per_pipeline = [_readout_ids(task, data, c, share) for c in _contexts()]
  _assert_each_once(per_pipeline, expected)


# -- A resumed run continues its data stream --------------------------------


def _yt8m_experiment(pattern, seed):
  params = exp_factory.get_exp_config('yt8m_demo')
  params.task.train_data = _yt8m_params(pattern, is_training=True)
  params.task.train_data.seed = seed
  return params


@pytest.mark.parametrize('seed', [None, 7])
def test_yt8m_resumed_run_does_not_replay_the_first_reads(yt8m_files, seed):
  """Two pipelines (several workers, seed unset or set): a run resumed at
  step 100 reads its files in another order than the run that started at
  step 0 (with a seed; without one the first run's order is random), and
  its pipelines still read every video once per epoch."""
  pattern = yt8m_files[0]
  share = _YT8M_VIDEOS // _PIPELINES
  first = input_files.reseed_for_start(_yt8m_experiment(pattern, seed), 0)
  resumed = input_files.reseed_for_start(_yt8m_experiment(pattern, seed), 100)
  assert first.task.train_data.seed == seed
  assert resumed.task.train_data.seed not in (None, seed)
  reads = {}
  for name, params in (('first', first), ('resumed', resumed)):
    reads[name] = [_yt8m_ids(params.task.train_data, c, share)
                   for c in _contexts()]
    _assert_each_once(reads[name], _yt8m_all_ids(pattern))
  if seed is None:
    # The first run's order is drawn at random (no seed), so it equals the
    # resumed run's by chance (the same first file in about one run of
    # four): the resumed run is seeded (above), and reads every video once.
    # The resumed run reads the same order each time it is built.
    again = [_yt8m_ids(resumed.task.train_data, c, share) for c in _contexts()]
    assert again == reads['resumed']
    return
  # Per pipeline, the resumed run's epoch is not the first run's again.
  for before, after in zip(reads['first'], reads['resumed']):
    assert before != after
  assert reads['first'][0][:6] != reads['resumed'][0][:6]  # The first file.


def test_yt8m_same_seed_no_restart_reads_identically(yt8m_files):
  params = input_files.reseed_for_start(
      _yt8m_experiment(yt8m_files[0], 7), 0).task.train_data
  runs = [[_yt8m_ids(params, c, _YT8M_VIDEOS) for c in _contexts()]
          for _ in range(2)]
  assert runs[0] == runs[1]


# -- Overlapping input patterns ---------------------------------------------


def test_file_matched_by_two_patterns_is_read_once(yt8m_files):
  """A file matched twice (`train*,train-00000*`) is read once, and strict
  mode does not take it for a truncated file."""
  pattern = yt8m_files[0]
  files = input_files.match_input_files(pattern)
  assert len(files) == 8
  overlapping = f'{pattern},{files[0]},{files[3]}*'
  assert input_files.match_input_files(overlapping) == files
  assert input_files.match_input_files([files[3], pattern]) == (
      [files[3]] + files[:3] + files[4:])
  ids = _yt8m_ids(_yt8m_params(overlapping, is_training=False), None)
  assert sorted(ids) == sorted(_yt8m_all_ids(pattern))
  assert len(ids) == _YT8M_VIDEOS
