"""The harness: family lookup and the generic table."""
import os
import subprocess
import sys

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
  f = startup.run(quick=True, commands={'probe': probe}, experiments=())
  assert seen == ['0', None]
  assert f['commands'] == {'probe': 'python ' + ' '.join(probe)}
  probe_figures = f['probe']
  assert probe_figures['keras3_sec'] > 0 and probe_figures['tf_keras_sec'] > 0
  assert probe_figures['saved_sec'] == pytest.approx(
      probe_figures['keras3_sec'] - probe_figures['tf_keras_sec'])
  assert '| `python -c import os' in startup.table(f)
  with pytest.raises(RuntimeError, match='printed no help'):
    startup.command_candidate(['-c', 'pass'], None)()


def test_startup_times_each_demos_first_step_in_both_autograph_variants(
    monkeypatch):
  """The one-step runs' rounds and figures, on stand-in starts (the
  programs' AutoGraph: the next test)."""
  from official_ext.benchmarks import startup  # pylint: disable=g-import-not-at-top
  seen = []

  def candidate(experiment, variant, root):
    seen.append((experiment, variant, os.path.isdir(root)))
    return lambda: None

  monkeypatch.setattr(startup, 'first_step_candidate', candidate)
  f = startup.run(quick=True, commands={}, experiments=('a_demo', 'b_demo'))
  assert seen == [(e, v, True) for e in ('a_demo', 'b_demo')
                  for v in ('converted', 'as_written')]
  for e in ('a_demo', 'b_demo'):
    figures = f['first_step'][e]
    assert figures['saved_sec'] == pytest.approx(
        figures['converted_sec'] - figures['as_written_sec'])
  assert startup.FIRST_STEP_OVERRIDE in f['first_step_cli']
  assert '| `b_demo`' in startup.table(f)


def test_the_converted_program_has_autograph_convert_the_package():
  """`module_program(..., 'converted')` runs a module as `python -m` would
  and AutoGraph converts the package although the config is loaded (which
  leaves it as written otherwise: tests/core/test_tf_internals.py)."""
  from official_ext.benchmarks import startup  # pylint: disable=g-import-not-at-top
  repo = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  run = subprocess.run(
      [sys.executable, '-c', startup.module_program(
          'tests.benchmarks.autograph_probe', 'converted')],
      env=dict(os.environ, PYTHONPATH=repo, TF_CPP_MIN_LOG_LEVEL='2'),
      capture_output=True, text=True, check=False, cwd=repo)
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.split()[-1] == 'converted'


def test_a_first_step_run_without_its_checkpoint_is_an_error(monkeypatch,
                                                            tmp_path):
  from official_ext.benchmarks import startup  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(startup.subprocess, 'run', lambda *a, **k: (
      subprocess.CompletedProcess(a, 0, 'trained?', '')))
  with pytest.raises(RuntimeError, match=r'--experiment=yt8m_demo '
                     r'\(as_written\) did not train one step \(exit 0\)'
                     r':\ntrained\?'):
    startup.first_step_candidate('yt8m_demo', 'as_written', str(tmp_path))()
  with pytest.raises(ValueError, match='AutoGraph variant'):
    startup.module_program('official_ext.train', 'off')


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
