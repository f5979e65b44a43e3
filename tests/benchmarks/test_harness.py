"""The harness: family lookup and the generic table."""
import pytest

from official_ext.benchmarks import harness


def test_families_are_the_benchmark_modules():
  assert harness.FAMILIES == {
      'yt8m': 'official_ext.benchmarks.yt8m',
      'assemblenet': 'official_ext.benchmarks.assemblenet',
      'readout': 'official_ext.benchmarks.readout',
      'readout_adaptation': 'official_ext.benchmarks.readout_adaptation',
      'startup': 'official_ext.benchmarks.startup',
      'accelerator': 'official_ext.benchmarks.accelerator',
      'xla_steps': 'official_ext.benchmarks.xla_steps',
  }


def test_unknown_family_names_the_known_ones():
  with pytest.raises(ValueError, match=r"'nope'.*\['accelerator', "
                     r"'assemblenet', 'readout', 'readout_adaptation', "
                     r"'startup', 'xla_steps', 'yt8m'\]"):
    harness.family_module('nope')


def test_generic_table_lists_flat_figures_sorted():
  table = harness.generic_table({'b': 0.123456, 'a': 3, 'nested': {'x': 1},
                                 'listed': [1]})
  assert table.splitlines() == ['| figure | value  |', '|--------|--------|',
                                '| a      | 3      |', '| b      | 0.1235 |']


def test_benchmark_modules_take_a_cpu_runs_settings():
  # The harness applies what `python -m official_ext.train` applies to a
  # run of the family's demo (on CPU).
  from official.core import exp_factory  # pylint: disable=g-import-not-at-top
  from official_ext.core.kernels import kernel_policy  # pylint: disable=g-import-not-at-top
  for family, experiment in (('yt8m', 'yt8m_demo'),
                             ('assemblenet', 'assemblenet_plus_lite_demo'),
                             ('readout', 'readout_demo')):
    module = harness.family_module(family)
    assert module.PROCESS_SETTINGS == kernel_policy.process_env(
        exp_factory.get_exp_config(experiment)), family
  assert harness.family_module('yt8m').PROCESS_SETTINGS == {
      'TF_CPU_ALLOCATOR_USE_BFC': 'true'}


def test_startup_times_each_command_with_and_without_keras_3(monkeypatch):
  """The start-up benchmark's rounds and figures, on a stand-in command that
  prints the variable it was started with (the real commands' Keras import:
  tests/test_commands.py)."""
  from official_ext.benchmarks import startup  # pylint: disable=g-import-not-at-top
  seen = []
  real = startup.command_candidate

  def candidate(args, value):
    seen.append(value)
    return real(args, value)

  monkeypatch.setattr(startup, 'command_candidate', candidate)
  probe = ['-c', 'import os; print("flags", os.environ.get('
           '"TF_USE_LEGACY_KERAS"))']
  f = startup.run(quick=True, commands={'probe': probe})
  assert seen == ['0', None]
  assert f['commands'] == {'probe': 'python ' + ' '.join(probe)}
  probe_figures = f['probe']
  assert probe_figures['keras3_sec'] > 0 and probe_figures['tf_keras_sec'] > 0
  assert probe_figures['saved_sec'] == pytest.approx(
      probe_figures['keras3_sec'] - probe_figures['tf_keras_sec'])
  assert '| `python -c import os' in startup.table(f)
  with pytest.raises(RuntimeError, match='printed no help'):
    startup.command_candidate(['-c', 'pass'], None)()


def test_a_run_without_cases_keeps_the_cases_it_did_not_measure(
    monkeypatch, tmp_path, capsys):
  """`benchmark yt8m --json FILE` replaces the model's figures and keeps the
  zoo's, which only `--cases zoo` measures."""
  import json  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'yt8m.json'
  path.write_text(json.dumps({
      'speedup': 1.0, 'stale_model_figure': 2.0, 'zoo': {'dbof': 1},
      'zoo_command': 'c', 'zoo_demos': {'x': 1}, 'command': 'old'}))
  monkeypatch.setattr(harness, 'run', lambda family, **kw: {
      'speedup': 1.5, 'command': 'new', 'machine': 'm'})
  monkeypatch.setattr(harness, 'report', lambda *a, **k: 'report')
  harness.main('yt8m', json_path=str(path))
  assert json.loads(path.read_text()) == {
      'speedup': 1.5, 'command': 'new', 'machine': 'm', 'zoo': {'dbof': 1},
      'zoo_command': 'c', 'zoo_demos': {'x': 1}}
  capsys.readouterr()
