"""The YT8M model zoo (`benchmark yt8m --cases zoo`) and its FLOP counter."""
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


def test_graph_count_equals_the_nextvlad_hand_formula():
  # DBoF's: test_model_garden_runs_beside_the_models_it_has.
  size = benchmark.NEXTVLAD_TINY
  task = benchmark.build_nextvlad_task(size)
  flops = graph_flops.train_step_flops(task, task.build_model(),
                                       benchmark.make_batch(size))
  assert flops == benchmark.nextvlad_train_flops_per_example(size) == 92_032
  assert task.task_config.jit_compile  # Restored after the trace.


def test_graph_flops_counts_each_contraction():
  a = tf.ones([3, 4])
  b = tf.ones([4, 5])
  x = tf.ones([2, 3, 4])
  y = tf.ones([2, 5, 4])

  def fn():
    return (tf.matmul(a, b), tf.matmul(b, a, transpose_a=True,
                                       transpose_b=True),
            tf.matmul(x, y, adjoint_b=True), tf.einsum('bij,bkj->bik', x, y))

  graph = tf.function(fn).get_concrete_function().graph
  counts = graph_flops.graph_flops(graph)
  # 2 x (3*4*5) twice; 2 x (2*3*4*5) as a batch matmul and as an einsum.
  assert counts == {'MatMul': 240, 'BatchMatMulV2': 240, 'Einsum': 240}


def test_graph_flops_refuses_what_it_cannot_count():
  unknown = tf.function(lambda m: tf.matmul(m, tf.ones([4, 2]))
                        ).get_concrete_function(
                            tf.TensorSpec([None, 4], tf.float32))
  with pytest.raises(ValueError, match=r"MatMul op 'MatMul'.*unknown shape"):
    graph_flops.graph_flops(unknown.graph)
  with pytest.raises(ValueError, match='Conv2D op .*not counted'):
    graph_flops.function_flops(lambda: tf.nn.conv2d(
        tf.ones([1, 4, 4, 1]), tf.ones([2, 2, 1, 1]), 1, 'SAME'))
  inner = tf.function(lambda: tf.matmul(tf.ones([2, 2]), tf.ones([2, 2])))
  with pytest.raises(ValueError, match=r"function '.*' called by "
                     r"(Stateful)?PartitionedCall op .* holds \['MatMul'\]"):
    graph_flops.function_flops(inner)
  x = tf.ones([2, 2])
  with pytest.raises(ValueError, match='branches hold different'):
    graph_flops.function_flops(lambda: tf.cond(
        tf.reduce_sum(x) > 0, lambda: tf.matmul(x, x), lambda: x))
  with pytest.raises(ValueError, match='number of iterations is not static'):
    graph_flops.function_flops(lambda: tf.while_loop(
        lambda m: tf.reduce_sum(m) < 100.0, lambda m: tf.matmul(m, x), [x]))


def test_graph_flops_follows_loops_and_conditionals():
  x = tf.ones([2, 3])
  w = tf.ones([3, 3])
  # 7 iterations of a [2, 3] x [3, 3] matmul (36 FLOPs each); a conditional
  # with one in each branch counts it once.
  assert graph_flops.function_flops(lambda: tf.while_loop(
      lambda m: tf.reduce_sum(m) > -1.0, lambda m: tf.matmul(m, w), [x],
      maximum_iterations=7)) == 7 * 36
  assert graph_flops.function_flops(lambda: tf.cond(
      tf.reduce_sum(x) > 0, lambda: tf.matmul(x, w),
      lambda: 2.0 * tf.matmul(x, w))) == 36
  # A Keras LSTM (the starter's) loops once per frame: per frame and video
  # x [3] @ W [3, 16] and h [4] @ U [4, 16], each 2 FLOPs a multiply-add.
  lstm = tf_keras.layers.RNN(tf_keras.layers.LSTMCell(4))
  frames = tf.ones([2, 5, 3])
  lstm(frames)
  forward = 5 * 2 * 2 * (3 * 16 + 4 * 16)
  assert graph_flops.function_flops(lambda: lstm(frames)) == forward

  def train():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(lstm(frames))
    return tape.gradient(loss, lstm.trainable_variables)

  # Its gradient loop runs 5 times too: the weight gradients of W and U and
  # the gradient into h (none into the frames, which nothing trains).
  assert graph_flops.function_flops(train) == (
      forward + 5 * 2 * 2 * (3 * 16 + 4 * 16 + 4 * 16))


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
def quick_zoo(tmp_path_factory):
  """The zoo's quick figures of the video-level logistic model (quick
  size: 1152 x 20), measured: its step timed, its demo trained 2 steps."""
  return benchmark.zoo(quick=True, models=['video_level'], peak_gflops=50.0,
                       workdir=str(tmp_path_factory.mktemp('zoo')))


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
  assert f['demo_train_steps'] == 2
  assert f['demo_train_examples'] == quick_zoo['demo_train_examples_budget']
  assert 0.0 <= f['demo_gap'] <= 1.0
  table = benchmark.zoo_table(quick_zoo)
  assert ('| video_level | `yt8m_video_level`, `yt8m_video_level_demo` | '
          'identity + logistic | 23,060     | 0.000 ') in table
  assert f"| {f['demo_gap']:.4f} " in table


def test_model_garden_runs_beside_the_models_it_has(monkeypatch, tmp_path):
  """DBoF + MoE (`yt8m`) is timed by `bench_train_step` (ours vs Model
  Garden's); NeXtVLAD and the video-level model have no Model Garden twin.
  The timing and the demo are replaced here (the quick run above measures
  them); the FLOPs are the graph count."""
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
  monkeypatch.setattr(benchmark, 'demo_gap', lambda *a: {
      'gap': 0.5, 'map': 0.4, 'hit_at_one': 0.6, 'train_steps': 2,
      'train_examples': 8})
  f = benchmark.zoo_model(benchmark.zoo_models(['dbof'])[0], 20.0,
                          quick=True, workdir=str(tmp_path))
  assert sizes == [size]
  flops = benchmark.train_flops_per_example(size)
  assert f['gflops_per_example'] == pytest.approx(flops / 1e9)
  assert (f['examples_per_sec'], f['model_garden_examples_per_sec'],
          f['speedup_vs_model_garden']) == (30.0, 10.0, 3.0)
  assert f['peak_fraction'] == pytest.approx(30.0 * flops / 1e9 / 20.0)
  assert (f['backbone'], f['head'], f['demo_gap']) == ('dbof', 'moe', 0.5)


def test_the_docs_block_is_generated_from_the_results(quick_zoo, tmp_path):
  results = tmp_path / 'results'
  results.mkdir()
  (results / 'yt8m.json').write_text(json.dumps({
      'zoo': quick_zoo, 'zoo_command': 'python -m official_ext.benchmark '
      'yt8m --quick --cases zoo', 'zoo_environment': {'quick': True}}))
  block = report.zoo_block(json.loads((results / 'yt8m.json').read_text()))
  assert '**Quick sizes**' in block
  assert f"{quick_zoo['models']['video_level']['demo_gap']:.4f}" in block
  assert '`python -m official_ext.benchmark yt8m --quick --cases zoo`' in block
  # `report` writes the block into docs/yt8m.md between its markers (the
  # repository's generated pages copied under `pages_root`), and `--check`
  # finds a block edited by hand.
  zoo = next(b for b in report.BLOCKS if b.name == 'yt8m-zoo')
  for page in {b.page for b in report.BLOCKS}:
    (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
    with open(os.path.join(harness.REPO_ROOT, page), encoding='utf-8') as f:
      (tmp_path / page).write_text(f.read())
  page = tmp_path / zoo.page
  output = str(tmp_path / 'docs' / 'benchmarks.md')
  assert report.main(str(results), output, pages_root=str(tmp_path)) == 0
  assert f'{report.block_marker(zoo)}\n{block}\n<!-- /yt8m-zoo -->' in (
      page.read_text())
  assert report.main(str(results), output, check=True,
                     pages_root=str(tmp_path)) == 0
  page.write_text(page.read_text().replace('video_level', 'video'))
  assert report.main(str(results), output, check=True,
                     pages_root=str(tmp_path)) == 1
  page.write_text('# YT8M\n')
  with pytest.raises(ValueError, match="yt8m.md: no generated block 'yt8m-zoo'"):
    report.main(str(results), output, pages_root=str(tmp_path))


def test_cli_merges_the_zoo_case_into_the_results(quick_zoo, monkeypatch,
                                                  tmp_path, capsys):
  """`benchmark yt8m --cases zoo --json FILE` keeps the file's other figures
  and adds the zoo's with its own run keys (the zoo itself: replaced here by
  the quick figures measured above)."""
  calls = []

  def zoo(quick, models, peak_gflops):
    calls.append((quick, models))
    return quick_zoo

  monkeypatch.setattr(benchmark, 'zoo', zoo)
  out = tmp_path / 'yt8m.json'
  out.write_text(json.dumps({'speedup': 1.5, 'command': 'recorded'}))
  cli.run_main(benchmark_cli, 'yt8m', '--quick', '--cases=zoo',
               f'--json={out}')
  assert calls == [(True, None)]
  f = json.loads(out.read_text())
  assert (f['speedup'], f['command']) == (1.5, 'recorded')
  assert f['zoo'] == json.loads(json.dumps(quick_zoo))
  assert f['zoo_command'] == ('python -m official_ext.benchmark yt8m --quick '
                              '--cases zoo')
  assert '| video_level |' in capsys.readouterr().out


def test_zoo_model_child_program_calls_this_module(monkeypatch, capsys):
  # At full size each zoo model is measured in a child process of its own.
  calls = []
  monkeypatch.setattr(benchmark, 'zoo_model_child',
                      lambda *args: calls.append(args) or {'gap': 0.5})
  exec(benchmark.zoo_model_child_code('lstm', 123.5, False, '/w'), {})  # pylint: disable=exec-used
  assert calls == [('lstm', 123.5, False, '/w')]
  assert capsys.readouterr().out == 'RESULT {"gap": 0.5}\n'


def test_quick_measures_every_zoo_model_at_tiny_sizes(monkeypatch, tmp_path):
  """`--quick` (documented as tiny sizes) builds every registered model of
  the zoo at the quick classes and frames and at most its demo's size, and
  trains its demo on the quick videos; the timing, the FLOP count and the
  demo run are replaced here, so nothing is measured."""
  monkeypatch.setattr(graph_flops, 'train_step_flops', lambda *a: 1000.0)
  monkeypatch.setattr(benchmark, 'bench_step', lambda *a, **k: {
      'examples_per_sec': 1.0, 'achieved_gflops': 1.0, 'peak_fraction': 0.1,
      'interleaved_matmul_gflops': 1.0, 'interleaved_matmul_fraction': 1.0})
  monkeypatch.setattr(benchmark, 'bench_train_step', lambda *a, **k: {
      'ours_examples_per_sec': 1.0, 'reference_examples_per_sec': 1.0,
      'speedup': 1.0, 'interleaved_matmul_gflops': 1.0})
  demos = []

  def demo_gap(experiment, examples, workdir, overrides=None):
    demos.append((experiment, examples, overrides))
    return {'gap': 0.5, 'map': 0.4, 'hit_at_one': 0.6, 'train_steps': 2,
            'train_examples': examples}

  monkeypatch.setattr(benchmark, 'demo_gap', demo_gap)
  figures = benchmark.zoo(quick=True, peak_gflops=10.0,
                          workdir=str(tmp_path))
  models = benchmark.zoo_models()
  assert list(figures['models']) == [m.name for m in models]
  for m in models:
    f = figures['models'][m.name]
    assert f['batch'] == benchmark.QUICK_BATCH, m.name
    assert f['classes'] == benchmark.QUICK_CLASSES, (m.name, f['classes'])
    assert f['frames'] <= benchmark.QUICK_FRAMES, (m.name, f['frames'])
    assert f['parameters'] <= benchmark.QUICK_MAX_PARAMETERS, (
        m.name, f['parameters'])
  assert [d[0] for d in demos] == [m.demo for m in models]
  for _, examples, overrides in demos:
    assert examples == 2 * benchmark.QUICK_BATCH
    assert overrides['task']['demo_data']['num_train_videos'] == (
        benchmark.QUICK_DEMO_VIDEOS)
