"""NWB files into readout records (`official_ext.readout.nwb` and its command
scripts/nwb_to_readout.py), on files this test writes with pynwb's own API,
trained through `official_ext.train`."""
import datetime
import importlib.util
import inspect
import json
import math
import os
import shutil

from absl import flags as absl_flags
import numpy as np
import pynwb  # The `test` extra installs it (setup.py).
from pynwb import behavior
import pytest
import tensorflow as tf, tf_keras

from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.core import experiment_params
from official_ext.readout import nwb
from tests import cli

_SCRIPT = os.path.join(os.path.dirname(__file__), '..', '..', 'scripts',
                       'nwb_to_readout.py')
_SESSION = 'mouse7-session1'
_NUM_TRIALS, _NUM_UNITS = 10, 4
_PRE, _POST, _BIN, _INTERVAL = 0.1, 0.05, 0.1, 0.2
_WHEEL_START = 0.25  # After the first window's first query (0.2 s): left out.


def _script():
  spec = importlib.util.spec_from_file_location('nwb_to_readout', _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _convert(script, *args):
  """The script's conversion run on `args` as from the command line; its
  summary."""
  return cli.run_main(script, *args, entry='convert')


def _nwbfile():
  return pynwb.NWBFile(
      session_description='test session', identifier=_SESSION,
      session_start_time=datetime.datetime(2024, 5, 1,
                                           tzinfo=datetime.timezone.utc))


def _trials():
  """The trials' table columns (numpy)."""
  i = np.arange(_NUM_TRIALS)
  start = 1.0 * i + 0.2
  reaction = 0.2 + 0.03 * i
  reaction[3] = np.nan  # No response: no reaction_time query for trial 3.
  return {'start_time': start, 'stop_time': start + 0.55 + 0.1 * (i % 3),
          'choice': i % 2, 'reward': (i % 3) == 0,
          'stimulus': np.array([-1, 0, 2])[i % 3],
          'reaction_time': reaction}


def _wheel(t):
  return 2.0 * t + 1.0  # Linear: interpolation recovers it exactly.


def _paw(t):
  return np.stack([3.0 - t, 0.5 * t], 1)


def _write(path, units=True, trials=True):
  nwbfile = _nwbfile()
  rng = np.random.default_rng(0)
  spikes = [np.sort(rng.uniform(0, _NUM_TRIALS + 1, n))
            for n in (60, 25, 0, 40)]  # Unit 2 never fires.
  if units:
    for s in spikes:
      nwbfile.add_unit(spike_times=s)
  table = _trials()
  if trials:
    for column in ('choice', 'reward', 'stimulus', 'reaction_time'):
      nwbfile.add_trial_column(column, f'the {column}')
    for i in range(_NUM_TRIALS):
      nwbfile.add_trial(**{k: v[i] for k, v in table.items()})
  times = _WHEEL_START + np.arange(1200) / 100.0
  series = behavior.BehavioralTimeSeries(name='BehavioralTimeSeries')
  series.add_timeseries(pynwb.TimeSeries(
      name='wheel_speed', data=_wheel(times), unit='m/s', rate=100.0,
      starting_time=_WHEEL_START))
  nwbfile.create_processing_module('behavior', 'behaviour').add(series)
  # Two channels at stored (irregular) timestamps, in acquisition.
  paw_times = np.cumsum(np.full(800, 0.015) + 0.01 * (np.arange(800) % 2))
  nwbfile.add_acquisition(pynwb.TimeSeries(
      name='paw_speed', data=_paw(paw_times), unit='m/s',
      timestamps=paw_times))
  with pynwb.NWBHDF5IO(str(path), 'w') as io:
    io.write(nwbfile)
  return spikes, table


_FLAGS = ['--trial_columns=choice,reward,stimulus,reaction_time',
          '--timeseries=wheel_speed,paw_speed', f'--bin_size={_BIN}',
          f'--pre_time={_PRE}', f'--post_time={_POST}',
          f'--query_interval={_INTERVAL}', '--validation_fraction=0.3',
          '--batch_size=4', '--train_epochs=1']


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('nwb')
  spikes, table = _write(tmp / 'session.nwb')
  script = _script()
  summary = _convert(script, f'--nwb={tmp / "session.nwb"}',
                     f'--output_dir={tmp / "out"}', *_FLAGS)
  return tmp, script, summary, spikes, table


def _records(path):
  out = {}
  for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
    f = tf.train.Example.FromString(raw).features.feature
    get = lambda k, f=f: np.array(
        f[k].float_list.value or f[k].int64_list.value or
        f[k].bytes_list.value)
    out[f['example_id'].bytes_list.value[0].decode()] = {
        k: get(k) for k in f}
  return out


def test_every_trial_with_its_counts_and_targets(converted, capsys):
  tmp, _, summary, spikes, table = converted
  files = summary['files']
  train_records, val_records = (_records(files['train']),
                                _records(files['validation']))
  # Every trial once, 7 / 3 split as the summary says.
  ids = {f'{_SESSION}/trial{i}' for i in range(_NUM_TRIALS)}
  assert set(train_records) | set(val_records) == ids
  assert len(train_records) == 7 and len(val_records) == 3
  assert summary['trial_ids']['validation'] == sorted(
      int(k.rsplit('trial', 1)[1]) for k in val_records)
  readouts = {r['name']: r for r in summary['readouts']}
  assert [(n, r['type'], r['dim']) for n, r in readouts.items()] == [
      ('choice', 'binary', 1), ('reward', 'binary', 1),
      ('stimulus', 'multinomial', 3), ('reaction_time', 'continuous', 1),
      ('wheel_speed', 'continuous', 1), ('paw_speed', 'continuous', 2)]
  assert readouts['stimulus']['classes'] == [-1, 0, 2]
  assert readouts['wheel_speed']['source'] == (
      'processing/behavior/BehavioralTimeSeries/wheel_speed')
  assert readouts['paw_speed']['source'] == 'acquisition/paw_speed'
  task_of = {i + 1: n for i, n in enumerate(readouts)}
  left_out_wheel = 0
  for name, r in {**train_records, **val_records}.items():
    i = int(name.rsplit('trial', 1)[1])
    assert r['session_id'][0].decode() == _SESSION
    start = table['start_time'][i] - _PRE
    duration = table['stop_time'][i] + _POST - start
    assert r['window_start'][0] == pytest.approx(start, abs=1e-6)
    # Spike counts per 100 ms bin, against numpy on the spike times.
    n_bins = math.ceil(round(duration / _BIN, 6))
    counts = r['input_values'].reshape([-1, _NUM_UNITS])
    assert counts.shape[0] == n_bins
    for k in range(n_bins):
      lo, hi = start + k * _BIN, start + (k + 1) * _BIN
      np.testing.assert_array_equal(
          counts[k], [np.sum((s >= lo) & (s < hi)) for s in spikes])
    np.testing.assert_allclose(r['input_timestamps'],
                               (np.arange(n_bins) + 0.5) * _BIN, atol=1e-6)
    # Targets against the trials table and the wheel series.
    tasks = [task_of[t] for t in r['output_task_ids']]
    targets = np.split(r['output_targets'],
                       np.cumsum(r['output_target_sizes'])[:-1])
    by_task = {}
    for task, time, value in zip(tasks, r['output_timestamps'], targets):
      by_task.setdefault(task, []).append((time, value))
    stop = table['stop_time'][i] - start
    expected = {'choice': table['choice'][i], 'reward': table['reward'][i],
                'stimulus': [-1, 0, 2].index(table['stimulus'][i]),
                'reaction_time': table['reaction_time'][i]}
    for task, value in expected.items():
      if np.isnan(value):
        assert task not in by_task  # Trial 3 has no reaction time.
        continue
      (time, got), = by_task[task]
      assert time == pytest.approx(stop, abs=1e-6)
      assert got[0] == pytest.approx(float(value), abs=1e-6), (name, task)
    centres = (np.arange(20) + 0.5) * _INTERVAL
    centres = centres[centres <= duration + 1e-9]  # The converter's tolerance.
    kept = centres[start + centres >= _WHEEL_START]
    left_out_wheel += len(centres) - len(kept)
    times, values = zip(*by_task['wheel_speed'])
    np.testing.assert_allclose(times, kept, atol=1e-6)
    np.testing.assert_allclose(np.concatenate(values), _wheel(start + kept),
                               rtol=1e-5)
    times, values = zip(*by_task['paw_speed'])
    np.testing.assert_allclose(times, centres, atol=1e-6)
    np.testing.assert_allclose(values, _paw(start + centres), rtol=1e-5)
  assert left_out_wheel > 0
  assert readouts['wheel_speed']['left_out_queries'] == left_out_wheel
  assert readouts['reaction_time']['left_out_queries'] == 1
  # The same flags give the same bytes (a seeded split, sorted map keys).
  again = _convert(_script(), f'--nwb={tmp / "session.nwb"}',
                   f'--output_dir={tmp / "again"}', *_FLAGS)
  out = capsys.readouterr().out
  assert 'stimulus: multinomial dim 3' in out and again['files']['config'] in out
  for split in ('train', 'validation'):
    with open(files[split], 'rb') as a, open(again['files'][split],
                                             'rb') as b:
      assert a.read() == b.read()
  with open(files['summary']) as f:
    assert json.load(f)['readouts'][2]['classes'] == [-1, 0, 2]


def test_converted_records_train_through_official_ext_train(converted):
  tmp, _, summary, _, _ = converted
  # The continuous readouts are normalised by their training queries' mean
  # and std (conversion.json), the others not.
  specs = {s.name: s for s in experiment_params.load_params(
      'readout_demo', [summary['files']['config']]).task.readouts}
  for entry in summary['readouts']:
    spec = specs[entry['name']]
    if entry['type'] == 'continuous':
      assert list(spec.normalize_mean) == entry['train_mean']
      assert list(spec.normalize_std) == entry['train_std']
    else:
      assert not spec.normalize_mean and not spec.normalize_std
  params = experiment_params.load_params(
      'readout_demo', [summary['files']['config']], params_override={
          'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
          'task': {'model': {'encoder': {
              'hidden_size': 8, 'num_heads': 2, 'num_layers': 1,
              'intermediate_size': 8}}},
          # One step, eagerly: tracing the steps costs ~10x running them.
          'trainer': {'train_steps': 1, 'steps_per_loop': 1,
                      'validation_interval': 1, 'checkpoint_interval': 1,
                      'summary_interval': 1, 'train_tf_function': False,
                      'train_tf_while_loop': False,
                      'eval_tf_function': False, 'eval_tf_while_loop': False},
      })
  assert params.task.train_data.input_dim == _NUM_UNITS
  assert params.task.validation_data.num_examples == 3
  tf_keras.utils.set_random_seed(1)
  _, metrics = train.run(params, 'train_and_eval', str(tmp / 'model'),
                         experiment='readout_demo')
  assert int(metrics['num_examples']) == 3
  for key in ('choice_loss', 'stimulus/balanced_accuracy',
              'wheel_speed/r2', 'average/score'):
    assert np.isfinite(float(metrics[key])), key


def test_missing_tables_columns_and_series_are_named(converted):
  tmp, _, _, _, _ = converted
  convert = lambda path, **kw: nwb.convert(
      str(path), str(tmp / 'error'), **{'trial_columns': 'choice', **kw})
  _write(tmp / 'no_trials.nwb', trials=False)
  with pytest.raises(nwb.NWBConversionError,
                     match=r'no_trials.nwb has no trials table.*'
                     r"processing modules \['behavior'\]"):
    convert(tmp / 'no_trials.nwb')
  _write(tmp / 'no_units.nwb', units=False)
  with pytest.raises(nwb.NWBConversionError,
                     match=r'no_units.nwb has no units table.*units table no'):
    convert(tmp / 'no_units.nwb')
  good = tmp / 'session.nwb'
  with pytest.raises(nwb.NWBConversionError,
                     match=r"no column 'side'.*'reaction_time'"):
    convert(good, trial_columns='choice,side')
  with pytest.raises(nwb.NWBConversionError,
                     match=r"no TimeSeries 'pupil'.*'acquisition/paw_speed', "
                     r"'processing/behavior/BehavioralTimeSeries/wheel_speed'"):
    convert(good, timeseries='pupil')
  with pytest.raises(nwb.NWBConversionError,
                     match=r"no TimeSeries 'processing/behavior/paw_speed'"):
    convert(good, timeseries='processing/behavior/paw_speed')  # A path.
  with pytest.raises(nwb.NWBConversionError,
                     match=r"'stimulus': type binary needs values in"):
    convert(good, trial_columns='stimulus:binary')
  with pytest.raises(nwb.NWBConversionError,
                     match=r'trial 1: --trial_query_time reaction_time is '
                     r'0.23 s, outside its window \[1.2, 1.85\]'):
    convert(good, trial_query_time='reaction_time')  # Not session times.
  assert not os.path.exists(tmp / 'error')  # Nothing written.


def test_not_an_nwb_file_is_named(converted):
  tmp, _, _, _, _ = converted
  notes = tmp / 'notes.nwb'
  notes.write_text('these are my notes, not an NWB file\n')
  with pytest.raises(nwb.NWBConversionError,
                     match=r'notes\.nwb is not an NWB file') as e:
    nwb.convert(str(notes), str(tmp / 'notes_out'), trial_columns='choice')
  assert str(notes) in str(e.value)
  assert not os.path.exists(tmp / 'notes_out')


@pytest.mark.parametrize('bad', [np.nan, np.inf])
def test_non_finite_spike_times_are_named(converted, bad):
  tmp, _, _, _, _ = converted
  path = tmp / f'spikes_{bad}.nwb'
  nwbfile = _nwbfile()
  nwbfile.add_unit(spike_times=[0.5, 1.5])
  nwbfile.add_unit(spike_times=[0.2, bad, 2.0])
  nwbfile.add_trial(start_time=0.0, stop_time=1.0)
  nwbfile.add_trial(start_time=1.0, stop_time=2.0)
  with pynwb.NWBHDF5IO(str(path), 'w') as io:
    io.write(nwbfile)
  with pytest.raises(nwb.NWBConversionError,
                     match=rf'spikes_{bad}\.nwb: unit 1 .*spike time {bad} '
                     r'\(index 1\)'):
    nwb.read_session(str(path), [], [])


_INJECTED = 'evil\nruntime:\n  distribution_strategy: tpu\n  tpu: attacker\n# '


def test_metadata_cannot_inject_yaml(tmp_path):
  """The identifier and class values reach readout.yaml only through a YAML
  emitter, on comment lines: newlines and `runtime:` keys add nothing."""
  path = tmp_path / 'evil.nwb'
  nwbfile = pynwb.NWBFile(
      session_description='x', identifier=_INJECTED,
      session_start_time=datetime.datetime(2024, 5, 1,
                                           tzinfo=datetime.timezone.utc))
  for s in ([0.1, 0.5, 2.2], [1.1, 3.3]):
    nwbfile.add_unit(spike_times=s)
  nwbfile.add_trial_column('side', 'a string column')
  for i in range(6):
    nwbfile.add_trial(start_time=float(i), stop_time=i + 0.8,
                      side=['left', f'right\nruntime: {{tpu: x}}\n'][i % 2])
  with pynwb.NWBHDF5IO(str(path), 'w') as io:
    io.write(nwbfile)
  summary = nwb.convert(str(path), str(tmp_path / 'out'),
                        trial_columns='side', batch_size=2,
                        validation_fraction=0.3)
  config = summary['files']['config']
  import yaml  # pylint: disable=g-import-not-at-top
  with open(config) as f:
    text = f.read()
  assert set(yaml.safe_load(text)) == {'task', 'trainer'}
  header = text[:text.index('\ntask:')].splitlines()
  assert all(line.startswith('#') for line in header), header
  assert '"evil\\nruntime:' in text  # The identifier, escaped.
  # Model Garden's own loader (yaml.FullLoader) sees the same.
  params = experiment_params.load_params('readout_demo', [config])
  default = experiment_params.load_params('readout_demo', [])
  assert params.runtime.as_dict() == default.runtime.as_dict()


def test_output_dir_refused_unless_overwrite_and_written_whole(
    converted, monkeypatch):
  """An output folder with files is refused before the NWB file is read;
  with --overwrite a conversion that fails while writing leaves the previous
  one as it was."""
  tmp, script, summary, _, _ = converted
  out = str(tmp / 'again_out')
  shutil.copytree(os.path.dirname(summary['files']['config']), out)

  def contents():
    return {name: open(os.path.join(out, name), 'rb').read()
            for name in sorted(os.listdir(out))}

  before = contents()
  assert {'train.tfrecord', 'readout.yaml', 'conversion.json'} <= set(before)
  args = [f'--nwb={tmp / "session.nwb"}', f'--output_dir={out}',
          '--split_seed=5'] + _FLAGS
  read = nwb.read_session

  def no_read(*a, **k):
    raise AssertionError('the NWB file was read before the check')

  monkeypatch.setattr(nwb, 'read_session', no_read)
  with pytest.raises(ValueError, match=rf'{out} is not empty .*readout\.yaml'
                     r'.*--overwrite'):
    _convert(script, *args)
  assert contents() == before
  monkeypatch.setattr(nwb, 'read_session', read)
  dump = json.dump

  def failing_dump(obj, f, **kwargs):
    dump(obj, f, **kwargs)
    raise OSError('injected: disk full')

  monkeypatch.setattr(nwb.json, 'dump', failing_dump)
  with pytest.raises(OSError, match='injected'):
    _convert(script, *args, '--overwrite')
  assert contents() == before  # No file replaced, nothing staged left.
  monkeypatch.setattr(nwb.json, 'dump', dump)
  again = _convert(script, *args, '--overwrite')
  after = contents()
  assert set(after) == set(before)
  assert after['train.tfrecord'] != before['train.tfrecord']  # Another split.
  assert again['trial_ids'] != summary['trial_ids']


def test_the_command_takes_absl_flags_with_the_converters_defaults(tmp_path):
  """scripts/nwb_to_readout.py defines its flags with absl (`define_flags`,
  `main(argv, flag_values)`, as the package's CLIs): one flag per argument of
  `nwb.convert`, with its default; --nwb and --output_dir required; `main`
  exits with a conversion error's message alone."""
  script = _script()
  flag_values = absl_flags.FlagValues()
  script.define_flags(flag_values)
  defaults = {name: None if p.default is p.empty else p.default
              for name, p in inspect.signature(nwb.convert).parameters.items()}
  assert {name: flag_values[name].default for name in defaults} == defaults
  assert set(flag_values) == set(defaults)
  assert flag_values['tokens'].parser.enum_values == nwb.TOKENS
  for required in ('nwb', 'output_dir'):
    with pytest.raises(absl_flags.IllegalFlagValueError, match=required):
      cli.parse_flags(script, *[f'--{n}=x' for n in ('nwb', 'output_dir')
                                if n != required])
  with pytest.raises(absl_flags.IllegalFlagValueError, match='tokens'):
    cli.parse_flags(script, '--nwb=x', '--output_dir=y', '--tokens=words')
  out = tmp_path / 'out'
  out.mkdir()
  (out / 'kept.txt').write_text('x')
  with pytest.raises(SystemExit, match=rf'^nwb_to_readout: {out} is not '
                     'empty'):
    cli.run_main(script, f'--nwb={tmp_path / "absent.nwb"}',
                 f'--output_dir={out}')
