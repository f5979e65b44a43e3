"""Several NWB files into one spike-token dataset with a shared unit and
session vocabulary (`official_ext.readout.nwb`, `--tokens=spikes`), and a
later recording appended to that vocabulary without renumbering; on tiny
files this test writes with pynwb."""
import datetime
import importlib.util
import json
import os

import numpy as np
import pynwb  # The `test` extra installs it (setup.py).
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import
import yaml

from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import nwb
from official_ext.readout import unit_vocabulary as vocabulary_lib
from tests import cli

_SCRIPT = os.path.join(os.path.dirname(__file__), '..', '..', 'scripts',
                       'nwb_to_readout.py')
_NUM_TRIALS = 4
_PRE, _POST = 0.1, 0.05
# identifier -> (units table ids, spikes per unit, stimulus values).
_FILES = {
    'rat1-day1': ((0, 1, 2), (30, 12, 20), ('left', 'right')),
    'rat2-day1': ((7, 9), (25, 18), ('left', 'centre')),
    'rat1-day2': ((0, 3, 4, 5), (15, 22, 9, 30), ('right', 'centre')),
}
_FLAGS = ['--tokens=spikes', '--trial_columns=choice,stimulus',
          f'--pre_time={_PRE}', f'--post_time={_POST}',
          '--validation_fraction=0.25', '--batch_size=2', '--train_epochs=1']


def _script():
  spec = importlib.util.spec_from_file_location('nwb_to_readout', _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _write(path, identifier, seed):
  """A file of `_FILES[identifier]`; returns ({unit id: spikes}, starts,
  stops)."""
  unit_ids, counts, stimuli = _FILES[identifier]
  nwbfile = pynwb.NWBFile(
      session_description='test', identifier=identifier,
      session_start_time=datetime.datetime(2024, 5, 1,
                                           tzinfo=datetime.timezone.utc))
  rng = np.random.default_rng(seed)
  spikes = {}
  for unit, n in zip(unit_ids, counts):
    spikes[unit] = np.sort(rng.uniform(0, _NUM_TRIALS + 1, n))
    nwbfile.add_unit(id=unit, spike_times=spikes[unit])
  nwbfile.add_trial_column('choice', 'the choice')
  nwbfile.add_trial_column('stimulus', 'the stimulus')
  starts = np.arange(_NUM_TRIALS) * 1.0 + 0.3
  stops = starts + 0.6
  for i in range(_NUM_TRIALS):
    nwbfile.add_trial(start_time=starts[i], stop_time=stops[i],
                      choice=i % 2, stimulus=stimuli[i % 2])
  with pynwb.NWBHDF5IO(str(path), 'w') as io:
    io.write(nwbfile)
  return spikes, starts, stops


def _records(path):
  out = {}
  for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
    f = tf.train.Example.FromString(raw).features.feature
    get = lambda k, f=f: np.array(
        f[k].float_list.value or f[k].int64_list.value or
        f[k].bytes_list.value)
    out[f['example_id'].bytes_list.value[0].decode()] = (
        {k: get(k) for k in f}, raw)
  return out


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  """(tmp, {identifier: (path, spikes, starts, stops)}, the two-file
  summary, the appended summary)."""
  tmp = tmp_path_factory.mktemp('nwb_sessions')
  files = {}
  for seed, identifier in enumerate(_FILES):
    path = tmp / f'{identifier}.nwb'
    files[identifier] = (str(path),) + _write(path, identifier, seed)
  first = cli.run_main(
      _script(), f'--nwb={files["rat1-day1"][0]},{files["rat2-day1"][0]}',
      f'--output_dir={tmp / "ab"}', *_FLAGS, entry='convert')
  # A new recording, and one converted before, onto the first vocabulary.
  appended = nwb.convert(
      [files['rat1-day2'][0], files['rat1-day1'][0]], str(tmp / 'c'),
      tokens='spikes', vocabulary=first['files']['vocabulary'],
      trial_columns='choice,stimulus', pre_time=_PRE, post_time=_POST,
      validation_fraction=0.25, batch_size=2, train_epochs=1)
  return tmp, files, first, appended


def _check_records(summary, files, vocab):
  """Every record's spike tokens and targets against numpy; returns the
  records by example id."""
  records = {}
  for split in ('train', 'validation'):
    records.update(_records(summary['files'][split]))
  classes = {r['name']: r.get('classes') for r in summary['readouts']}
  for session in summary['sessions']:
    _, spikes, starts, stops = files[session['session_id']]
    stimuli = _FILES[session['session_id']][2]
    for i in range(_NUM_TRIALS):
      f, _ = records[f'{session["session_id"]}/trial{i}']
      assert f['session_id'][0].decode() == session['session_id']
      start, end = starts[i] - _PRE, stops[i] + _POST
      assert f['window_start'][0] == pytest.approx(start, abs=1e-6)
      expected = sorted(
          (t - start, vocab.unit_id(f'{session["session_id"]}/{unit}'))
          for unit, s in spikes.items() for t in s if start <= t < end)
      assert len(f['input_unit_ids']) == len(expected) > 0
      np.testing.assert_allclose(f['input_timestamps'],
                                 [e[0] for e in expected], atol=1e-6)
      np.testing.assert_array_equal(f['input_unit_ids'],
                                    [e[1] for e in expected])
      np.testing.assert_array_equal(f['input_values'], 1.0)
      # choice (binary) then stimulus (class id among every file's values).
      np.testing.assert_array_equal(f['output_task_ids'], [1, 2])
      np.testing.assert_allclose(
          f['output_targets'],
          [i % 2, classes['stimulus'].index(stimuli[i % 2])])
  return records


def test_two_files_make_one_dataset_with_one_vocabulary(converted):
  tmp, files, first, _ = converted
  vocab = vocabulary_lib.load(first['files']['vocabulary'])
  assert vocab.sessions == ('rat1-day1', 'rat2-day1')
  assert vocab.units == ('rat1-day1/0', 'rat1-day1/1', 'rat1-day1/2',
                         'rat2-day1/7', 'rat2-day1/9')
  readouts = {r['name']: r for r in first['readouts']}
  assert readouts['stimulus']['classes'] == ['centre', 'left', 'right']
  records = _check_records(first, files, vocab)
  assert len(records) == 2 * _NUM_TRIALS
  for session in first['sessions']:  # Every session in both splits.
    assert len(session['trial_ids']['validation']) == 1
    assert len(session['trial_ids']['train']) == _NUM_TRIALS - 1
  with open(first['files']['config']) as f:
    config = yaml.safe_load(f)
  assert config['task']['model'] == {'tokenization': 'unit_tokens'}
  assert config['task']['vocabulary_file'] == first['files']['vocabulary']
  assert config['task']['train_data']['input_dim'] == 1
  assert config['task']['train_data']['num_examples'] == 6
  assert '2 sessions, 8 trials, spike tokens' in nwb.format_summary(first)
  # The records are what the unit-token dataloader reads.
  specs = tuple(configs.ReadoutSpec(name=r['name'], type=r['type'],
                                    dim=r['dim']) for r in first['readouts'])
  parser = dataloader.Parser(configs.DataConfig(input_dim=1), specs,
                             [s.name for s in specs], units=vocab)
  f, raw = records['rat2-day1/trial2']
  parsed = parser.parse(tf.constant(raw))
  np.testing.assert_array_equal(parsed['input_unit_ids'],
                                f['input_unit_ids'])


def test_an_appended_recording_keeps_the_earlier_ids(converted):
  tmp, files, first, appended = converted
  old = vocabulary_lib.load(first['files']['vocabulary'])
  new = vocabulary_lib.load(appended['files']['vocabulary'])
  assert appended['files']['vocabulary'] == str(tmp / 'c' /
                                                'vocabulary.json')
  assert vocabulary_lib.is_prefix(old, new) is None
  assert new.sessions == old.sessions + ('rat1-day2',)
  assert new.units == old.units + tuple(
      f'rat1-day2/{u}' for u in (0, 3, 4, 5))
  # rat1-day1's records carry the same unit ids as in the first dataset.
  again = _check_records(appended, files, new)
  before = _check_records(first, files, old)
  for i in range(_NUM_TRIALS):
    np.testing.assert_array_equal(
        again[f'rat1-day1/trial{i}'][0]['input_unit_ids'],
        before[f'rat1-day1/trial{i}'][0]['input_unit_ids'])
  assert min(again['rat1-day2/trial0'][0]['input_unit_ids']) >= 6
  with open(appended['files']['summary']) as f:
    assert json.load(f)['extended_vocabulary'] == first['files'][
        'vocabulary']


def test_errors_name_the_flag_and_file(converted):
  tmp, files, first, _ = converted
  a, b = files['rat1-day1'][0], files['rat2-day1'][0]
  flags = dict(trial_columns='choice', batch_size=2,
               validation_fraction=0.25)
  with pytest.raises(ValueError, match='--nwb names 2 files; binned tokens'):
    nwb.convert(f'{a},{b}', str(tmp / 'e1'), **flags)
  with pytest.raises(ValueError, match='--vocabulary=.*applies to '
                     '--tokens=spikes'):
    nwb.convert(a, str(tmp / 'e2'), vocabulary=first['files']['vocabulary'],
                **flags)
  with pytest.raises(ValueError, match='is the file this conversion writes'):
    nwb.convert(a, str(tmp / 'ab'), tokens='spikes', overwrite=True,
                vocabulary=first['files']['vocabulary'], **flags)
  with pytest.raises(nwb.NWBConversionError,
                     match="same identifier 'rat1-day1'"):
    nwb.convert([a, a], str(tmp / 'e3'), tokens='spikes', **flags)
  assert not any(os.path.exists(tmp / d) for d in ('e1', 'e2', 'e3'))


def test_an_identifier_that_names_another_recording_is_refused(converted):
  """--vocabulary holds each recording's fingerprint (its start time and
  units table): a different recording under an identifier already in it is
  an error naming the identifier, the file and the vocabulary, before
  anything is written; the same recording converted again keeps its ids
  (`test_an_appended_recording_keeps_the_earlier_ids`)."""
  tmp, files, first, _ = converted
  other = tmp / 'other-rat1-day1.nwb'
  _write(other, 'rat1-day1', seed=99)  # Same identifier and units, other spikes.
  flags = dict(tokens='spikes', trial_columns='choice,stimulus',
               pre_time=_PRE, post_time=_POST, validation_fraction=0.25,
               batch_size=2)
  with pytest.raises(nwb.NWBConversionError, match=(
      f"{other}: identifier 'rat1-day1' already names another recording in "
      f"--vocabulary={first['files']['vocabulary']}")):
    nwb.convert(str(other), str(tmp / 'e5'),
                vocabulary=first['files']['vocabulary'], **flags)
  vocab = vocabulary_lib.load(first['files']['vocabulary'])
  assert set(vocab.fingerprints) == {'rat1-day1', 'rat2-day1'}
  assert vocab.fingerprints['rat1-day1'] != vocab.fingerprints['rat2-day1']
  # A vocabulary that does not record its recordings cannot tell.
  bare = tmp / 'bare_vocabulary.json'
  bare.write_text(json.dumps(vocab.as_dict()))
  with pytest.raises(nwb.NWBConversionError, match=(
      f"--vocabulary={bare} has no fingerprint of session 'rat1-day1'")):
    nwb.convert(files['rat1-day1'][0], str(tmp / 'e6'),
                vocabulary=str(bare), **flags)
  assert not any(os.path.exists(tmp / d) for d in ('e5', 'e6'))
