"""The YT8M model zoo (`benchmark yt8m --cases zoo,zoo_demos`) and its FLOP
counter."""
import json
import os

import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official_ext import benchmark as benchmark_cli
from official_ext.benchmarks import graph_flops
from official_ext.benchmarks import harness
from official_ext.benchmarks import report
from official_ext.benchmarks import yt8m as benchmark
from tests import cli
from tests.benchmarks import flop_formulas


def test_zoo_lists_each_registered_pair():
  models = {m.name: m for m in benchmark.zoo_models()}
  assert {'dbof', 'video_level', 'nextvlad'} <= set(models)
  assert models['dbof'] == benchmark.ZooModel('dbof', 'yt8m', 'yt8m_demo')
  assert models['nextvlad'].demo == 'yt8m_nextvlad_demo'
  # A pair registered later is found without a change to the benchmark.
  registry = exp_factory._REGISTERED_CONFIGS
  for name in ('yt8m_zoo_test', 'yt8m_zoo_test_demo'):
    exp_factory.register_config_factory(name)(
        lambda: exp_factory.get_exp_config('yt8m_video_level'))
  try:
    assert benchmark.zoo_models(['zoo_test']) == [benchmark.ZooModel(
        'zoo_test', 'yt8m_zoo_test', 'yt8m_zoo_test_demo')]
    registry['yt8m_zoo_test_demo'] = (
        lambda: exp_factory.get_exp_config('readout_demo'))
    with pytest.raises(ValueError, match="'yt8m_zoo_test_demo'.*not YT8MTask"):
      benchmark.zoo_models()
  finally:
    for name in ('yt8m_zoo_test', 'yt8m_zoo_test_demo'):
      registry.pop(name)
  with pytest.raises(ValueError, match=r"unknown model\(s\) \['nope'\]"):
    benchmark.zoo_models(['nope'])
  with pytest.raises(ValueError, match=r"unknown yt8m case\(s\) \['zo'\]"):
    benchmark.run(quick=True, cases=['zo'])


@pytest.fixture(scope='module')
def quick_zoo():
  """The zoo's quick figures of the video-level logistic model (quick
  size: 1152 x 20), measured: its step timed."""
  return benchmark.zoo(quick=True, models=['video_level'], peak_gflops=50.0)


@pytest.fixture(scope='module')
def quick_zoo_demos(tmp_path_factory):
  """The demos' quick figures of the video-level model: its demo trained
  2 steps on tiny generated data and evaluated."""
  return benchmark.zoo_demos(quick=True, models=['video_level'],
                             workdir=str(tmp_path_factory.mktemp('demos')))


def test_quick_zoo_figures_are_consistent(quick_zoo):
  approx = lambda x: pytest.approx(x, rel=1e-9)
  assert list(quick_zoo['models']) == ['video_level']
  assert quick_zoo['batch'] == benchmark.QUICK_BATCH
  f = quick_zoo['models']['video_level']
  classes = benchmark.QUICK_CLASSES
  assert f['parameters'] == 1152 * classes + classes
  # Forward and weight gradient; no gradient w.r.t. the features.
  assert f['gflops_per_example'] == approx(2 * 2 * 1152 * classes / 1e9)
  assert f['model_garden_examples_per_sec'] is None  # Model Garden has none.
  assert f['achieved_gflops'] == approx(f['examples_per_sec'] *
                                        f['gflops_per_example'])
  assert f['peak_fraction'] == approx(f['achieved_gflops'] / 50.0)
  assert f['interleaved_matmul_fraction'] == approx(
      f['achieved_gflops'] / f['interleaved_matmul_gflops'])
  # The speed case trains no demo: the ranking is `zoo_demos`'.
  assert not [k for k in f if k.startswith('demo_')]
  table = benchmark.zoo_table(quick_zoo)
  assert ('| video_level | `yt8m_video_level`, `yt8m_video_level_demo` | '
          'identity + logistic | 23,060     | 0.000 ') in table
  assert 'GAP' not in table


def test_quick_zoo_demos_figures_are_consistent(quick_zoo_demos):
  assert quick_zoo_demos['budget'] == {
      'train_examples': 2 * benchmark.QUICK_BATCH, 'train_steps': 2,
      'batch': benchmark.QUICK_BATCH}
  assert quick_zoo_demos['budget_experiment'] == 'yt8m_demo'
  f = quick_zoo_demos['models']['video_level']
  assert (f['demo'], f['backbone'], f['head'], f['batch']) == (
      'yt8m_video_level_demo', 'identity', 'logistic', benchmark.QUICK_BATCH)
  assert (f['train_steps'], f['train_examples']) == (2, 2 * f['batch'])
  assert 0.0 <= f['gap'] <= 1.0 and 0.0 <= f['map'] <= 1.0
  assert f['wall_seconds'] > 0.0
  table = benchmark.zoo_demos_table(quick_zoo_demos)
  assert 'training videos (budget 8)' in table.splitlines()[0]
  assert (f"| video_level | `yt8m_video_level_demo` | identity + logistic | "
          f"8 ") in table
  assert f"| 2 × 4 " in table and f"| {f['gap']:.4f} " in table
  # No published figure of the video-level model: a dash, not a number.
  cells = [c.strip() for c in table.splitlines()[-1].split('|')[1:-1]]
  assert cells[-2:] == ['–', '–']


def test_every_demo_trains_yt8m_demos_schedule(monkeypatch, tmp_path):
  """The budget is `yt8m_demo`'s own (992 steps of 64), and every
  registered demo trains on exactly that many videos, in a child process
  each (replaced here)."""
  assert benchmark.zoo_demo_budget() == {
      'train_examples': 992 * 64, 'train_steps': 992, 'batch': 64}
  programs = []

  def run_child(code, timeout):
    programs.append(code)
    return {'gap': 0.5, 'children_max_rss_gb': 1.0}

  monkeypatch.setattr(benchmark.memory_lib, 'run_child', run_child)
  figures = benchmark.zoo_demos(workdir=str(tmp_path))
  names = [m.name for m in benchmark.zoo_models()]
  assert list(figures['models']) == names
  assert figures['models']['dbof'] == {'gap': 0.5}
  assert programs == [benchmark.zoo_demo_child_code(n, 992 * 64,
                                                    str(tmp_path))
                      for n in names]
  # The child's program calls `zoo_demo` of this module with that budget.
  calls = []
  monkeypatch.setattr(benchmark, 'zoo_demo',
                      lambda *args: calls.append(args) or {'gap': 0.5})
  exec(programs[0], {})  # pylint: disable=exec-used
  assert calls == [(benchmark.zoo_models([names[0]])[0], 992 * 64,
                    str(tmp_path))]


def test_a_demo_whose_batch_does_not_divide_the_budget_is_named(tmp_path):
  with pytest.raises(ValueError, match=r'yt8m_demo trains batches of 64, '
                     r'which do not divide the budget of 100 training videos: '
                     r'it would train on 64'):
    benchmark.demo_gap('yt8m_demo', 100, str(tmp_path))
  with pytest.raises(ValueError, match=r'less than one batch of yt8m_demo'):
    benchmark.demo_gap('yt8m_demo', 10, str(tmp_path))


def test_published_figures_name_their_source(quick_zoo_demos):
  models = {m.name for m in benchmark.zoo_models()}
  assert set(benchmark.PUBLISHED_GAP) <= models
  assert {n: p.gap for n, p in benchmark.PUBLISHED_GAP.items()} == {
      'netvlad': 0.8507, 'nextvlad': 0.8723, 'mix_nextvlad': 0.88722}
  for p in benchmark.PUBLISHED_GAP.values():
    assert '3,862 classes' in p.dataset and 'Table' in p.source
  # A row with a published figure shows it beside ours, its source named.
  figures = dict(quick_zoo_demos, models={
      'nextvlad': dict(quick_zoo_demos['models']['video_level'],
                       demo='yt8m_nextvlad_demo')})
  row = benchmark.zoo_demos_table(figures).splitlines()[-1]
  assert [c.strip() for c in row.split('|')[1:-1]][-2] == '0.8723'
  assert ('NeXtVLAD (8G, 0.5 drop, 128K, 2048H; 89M parameters); local '
          'validation partition; YouTube-8M 2018, 3,862 classes; Lin, Xiao, '
          'Fan') in row


def test_model_garden_runs_beside_the_models_it_has(monkeypatch):
  """DBoF + MoE (`yt8m`) is timed by `bench_train_step` (ours vs Model
  Garden's); NeXtVLAD and the video-level model have no Model Garden twin.
  The timing is replaced here (the quick run above measures it); the FLOPs
  are the graph count."""
  quick = benchmark.QUICK_PUBLISHED
  size = benchmark.model_garden_size(
      benchmark.zoo_params('yt8m', 4, quick['yt8m']), 4, name='tiny')
  assert (size.cluster, size.hidden, size.mixtures, size.classes,
          size.frames) == (32, 32, 5, 20, 8)
  for experiment in ('yt8m_nextvlad', 'yt8m_video_level'):
    assert benchmark.model_garden_size(benchmark.zoo_params(
        experiment, 4, quick.get(experiment)), 4) is None
  sizes = []

  def bench_train_step(size, peak, rounds):
    sizes.append(size)
    return {'ours_examples_per_sec': 30.0, 'reference_examples_per_sec': 10.0,
            'speedup': 3.0, 'interleaved_matmul_gflops': 40.0}

  monkeypatch.setattr(benchmark, 'bench_train_step', bench_train_step)
  f = benchmark.zoo_model(benchmark.zoo_models(['dbof'])[0], 20.0,
                          quick=True)
  assert sizes == [size]
  flops = flop_formulas.dbof_train_flops_per_example(size)
  assert f['gflops_per_example'] == pytest.approx(flops / 1e9)
  assert (f['examples_per_sec'], f['model_garden_examples_per_sec'],
          f['speedup_vs_model_garden']) == (30.0, 10.0, 3.0)
  assert f['peak_fraction'] == pytest.approx(30.0 * flops / 1e9 / 20.0)
  assert (f['backbone'], f['head']) == ('dbof', 'moe')


def test_the_docs_blocks_are_generated_from_the_results(
    quick_zoo, quick_zoo_demos, tmp_path):
  results = tmp_path / 'results'
  results.mkdir()
  command = 'python -m official_ext.benchmark yt8m --quick --cases '
  (results / 'yt8m.json').write_text(json.dumps({
      'zoo': quick_zoo, 'zoo_command': command + 'zoo',
      'zoo_environment': {'quick': True}}))
  figures = json.loads((results / 'yt8m.json').read_text())
  block = report.zoo_block(figures)
  assert '**Quick sizes**' in block
  assert '| video_level |' in block
  assert f'`{command}zoo`' in block
  assert report.zoo_demos_block(figures).startswith(
      'No zoo_demos run recorded: `python -m official_ext.benchmark yt8m '
      '--cases zoo_demos --json benchmarks/results/yt8m.json`')
  figures.update(zoo_demos=quick_zoo_demos,
                 zoo_demos_command=command + 'zoo_demos',
                 zoo_demos_environment={'quick': True})
  (results / 'yt8m.json').write_text(json.dumps(figures))
  demos_block = report.zoo_demos_block(figures)
  assert f"{quick_zoo_demos['models']['video_level']['gap']:.4f}" in (
      demos_block)
  assert f'`{command}zoo_demos`' in demos_block
  # `report` writes the blocks into docs/yt8m.md between their markers (the
  # repository's generated pages copied under `pages_root`), and `--check`
  # finds a block edited by hand.
  blocks = {b.name: b for b in report.BLOCKS}
  for page in {b.page for b in report.BLOCKS}:
    (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
    with open(os.path.join(harness.REPO_ROOT, page), encoding='utf-8') as f:
      (tmp_path / page).write_text(f.read())
  page = tmp_path / blocks['yt8m-zoo'].page
  output = str(tmp_path / 'docs' / 'benchmarks.md')
  assert report.main(str(results), output, pages_root=str(tmp_path)) == 0
  for name, text in (('yt8m-zoo', block), ('yt8m-zoo-demos', demos_block)):
    assert f'{report.block_marker(blocks[name])}\n{text}\n<!-- /{name} -->' in (
        page.read_text())
  # docs/benchmarks.md has both tables, each under its own run.
  generated = (tmp_path / 'docs' / 'benchmarks.md').read_text()
  assert f'### {benchmark.ZOO_TITLE}' in generated
  assert f'### {benchmark.ZOO_DEMOS_TITLE}' in generated
  assert report.main(str(results), output, check=True,
                     pages_root=str(tmp_path)) == 0
  page.write_text(page.read_text().replace('video_level', 'video'))
  assert report.main(str(results), output, check=True,
                     pages_root=str(tmp_path)) == 1
  page.write_text('# YT8M\n')
  with pytest.raises(ValueError, match="yt8m.md: no generated block 'yt8m-zoo'"):
    report.main(str(results), output, pages_root=str(tmp_path))


def test_cli_merges_the_zoo_cases_into_the_results(
    quick_zoo, quick_zoo_demos, monkeypatch, tmp_path, capsys):
  """`benchmark yt8m --cases zoo,zoo_demos --json FILE` keeps the file's
  other figures and adds the zoo's with each case's own run keys (the
  cases themselves: replaced here by the quick figures measured above)."""
  calls = []

  def zoo(quick, models, peak_gflops):
    calls.append(('zoo', quick, models))
    return quick_zoo

  def zoo_demos(quick, models):
    calls.append(('zoo_demos', quick, models))
    return quick_zoo_demos

  monkeypatch.setattr(benchmark, 'zoo', zoo)
  monkeypatch.setattr(benchmark, 'zoo_demos', zoo_demos)
  out = tmp_path / 'yt8m.json'
  out.write_text(json.dumps({'speedup': 1.5, 'command': 'recorded'}))
  cli.run_main(benchmark_cli, 'yt8m', '--quick', '--cases=zoo,zoo_demos',
               f'--json={out}')
  assert calls == [('zoo_demos', True, None), ('zoo', True, None)]
  f = json.loads(out.read_text())
  assert (f['speedup'], f['command']) == (1.5, 'recorded')
  assert f['zoo'] == json.loads(json.dumps(quick_zoo))
  assert f['zoo_demos'] == json.loads(json.dumps(quick_zoo_demos))
  for case in ('zoo', 'zoo_demos'):
    assert f[f'{case}_command'] == ('python -m official_ext.benchmark yt8m '
                                    '--quick --cases zoo,zoo_demos')
    assert f[f'{case}_environment']['quick']
  printed = capsys.readouterr().out
  assert '| video_level |' in printed and 'training videos' in printed


def test_zoo_model_child_program_calls_this_module(monkeypatch, capsys):
  # At full size each zoo model is measured in a child process of its own.
  calls = []
  monkeypatch.setattr(benchmark, 'zoo_model_child',
                      lambda *args: calls.append(args) or {'gap': 0.5})
  exec(benchmark.zoo_model_child_code('lstm', 123.5, False), {})  # pylint: disable=exec-used
  assert calls == [('lstm', 123.5, False)]
  assert capsys.readouterr().out == 'RESULT {"gap": 0.5}\n'


def test_quick_measures_every_zoo_model_at_tiny_sizes(monkeypatch):
  """`--quick` (documented as tiny sizes) builds every registered model of
  the zoo at the quick classes and frames and at most its demo's size; the
  timing and the FLOP count are replaced here, so nothing is measured."""
  # The zoo found once: `zoo_models` builds every zoo experiment's config,
  # and `zoo` asks for it again for each model.
  models = benchmark.zoo_models()
  by_name = {m.name: m for m in models}
  monkeypatch.setattr(benchmark, 'zoo_models', lambda names=None: (
      list(models) if names is None else [by_name[n] for n in names]))
  monkeypatch.setattr(graph_flops, 'train_step_flops', lambda *a: 1000.0)
  monkeypatch.setattr(benchmark, 'bench_step', lambda *a, **k: {
      'examples_per_sec': 1.0, 'achieved_gflops': 1.0, 'peak_fraction': 0.1,
      'interleaved_matmul_gflops': 1.0, 'interleaved_matmul_fraction': 1.0})
  monkeypatch.setattr(benchmark, 'bench_train_step', lambda *a, **k: {
      'ours_examples_per_sec': 1.0, 'reference_examples_per_sec': 1.0,
      'speedup': 1.0, 'interleaved_matmul_gflops': 1.0})
  figures = benchmark.zoo(quick=True, peak_gflops=10.0)
  assert list(figures['models']) == [m.name for m in models]
  for m in models:
    f = figures['models'][m.name]
    assert f['batch'] == benchmark.QUICK_BATCH, m.name
    assert f['classes'] == benchmark.QUICK_CLASSES, (m.name, f['classes'])
    assert f['frames'] <= benchmark.QUICK_FRAMES, (m.name, f['frames'])
    assert f['parameters'] <= benchmark.QUICK_MAX_PARAMETERS, (
        m.name, f['parameters'])
