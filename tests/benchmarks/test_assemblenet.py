"""The AssembleNet++lite benchmark: a quick run, its children and cases."""
import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext.assemblenet import structures
from tests.assemblenet import complexity
from official_ext.benchmarks import assemblenet as benchmark
from official_ext.benchmarks import assemblenet_input
from official_ext.benchmarks import graph_flops
from official_ext.benchmarks import harness
from official_ext.benchmarks import memory as memory_lib
from tests.benchmarks import flop_formulas


def test_conv3d_peak_counts_its_convolution():
  # Quick Conv3D: 1 clip x 4 frames x 8 x 8, 16 -> 16 channels, 3x3x3 SAME:
  # 4 * 8 * 8 = 256 output positions x 16 output channels, each 27 taps x 16
  # input channels multiply-adds, 2 FLOPs per multiply-add.
  assert benchmark.QUICK_CONV3D == (1, 4, 8, 16)
  conv, x = benchmark._conv3d(quick=True)  # pylint: disable=protected-access
  assert graph_flops.function_flops(lambda: conv(x)) == (
      256 * 16 * 27 * 16 * 2) == 3_538_944


@pytest.mark.parametrize('key', [n.key for n in benchmark.NETWORKS])
def test_memory_child_program_calls_this_module(key, monkeypatch, capsys):
  # The child process runs this program; here it runs in this process with
  # `memory_child` replaced (the real child costs a minute or more).
  calls = []
  monkeypatch.setattr(benchmark, 'memory_child',
                      lambda *args: calls.append(args) or {'peak_rss_gb': 1.5})
  exec(benchmark.memory_child_code(2, 8, 64, True, False, key), {})  # pylint: disable=exec-used
  assert calls == [(2, 8, 64, True, False, key)]
  assert capsys.readouterr().out == 'RESULT {"peak_rss_gb": 1.5}\n'


@pytest.mark.parametrize('net', benchmark.NETWORKS, ids=lambda n: n.key)
def test_training_step_takes_the_optimizer_its_experiment_trains_with(
    net, monkeypatch):
  # The step timed is the one `official_ext.train` runs: Model Garden's
  # `train_utils.create_optimizer` on the experiment's trainer config.
  built = []
  create = benchmark.train_utils.create_optimizer

  def recording(task, params):
    built.append(create(task, params))
    return built[-1]

  monkeypatch.setattr(benchmark.train_utils, 'create_optimizer', recording)
  task = benchmark._task(1, 4, 32, True, net)  # pylint: disable=protected-access
  benchmark._train_fn(task, task.build_model(), net)  # pylint: disable=protected-access
  trainer = exp_factory.get_exp_config(net.experiment).trainer
  expected = trainer.optimizer_config.optimizer.get()
  assert len(built) == 1
  assert isinstance(built[0], tf_keras.optimizers.legacy.SGD)
  assert built[0].get_config()['momentum'] == expected.momentum
  assert built[0].get_config()['nesterov'] == expected.nesterov


def test_quick_run_figures_are_consistent():
  # Without the memory child (see above; `python -m official_ext.benchmark
  # assemblenet --quick` runs it), with the original-width reference and
  # the exported SavedModel (the input pipeline case: below).
  f = benchmark.run(quick=True, memory=False, reference=True,
                    cases=['model'])
  json.dumps(f)  # The harness writes them as JSON.
  assert f['quick'] is True
  assert not any(k.startswith('peak_rss') for k in f)
  # The sizes asked for.
  assert benchmark.QUICK_SPEED == (1, 4, 32)
  assert f['bench_size'] == '1x4x32^2'
  # The smallest structure (both stems fused, one level-3 block): tracing
  # both variants' forward pass and training step is most of this test.
  assert benchmark.QUICK_STRUCTURE == [
      [-1, 1], [-2, 1], [3, [0, 1], [8, 8, 8], 1, 2]]
  structures.validate_structure(
      benchmark.QUICK_STRUCTURE,
      blocks_per_level=benchmark.QUICK_BLOCKS_PER_LEVEL)
  # FLOPs counted from the traced graph (tests/benchmarks/test_graph_flops.py
  # checks the count against the formulas).
  tiny = dict(structure=benchmark.QUICK_STRUCTURE,
              blocks_per_level=benchmark.QUICK_BLOCKS_PER_LEVEL,
              stem_filters=8, head_filters=(16, 24), flow_iterations=2)
  assert f['gflops_per_clip'] == flop_formulas.assemblenet_forward_flops(
      **tiny) / 1e9
  assert f['gflops_per_clip_bench'] == flop_formulas.assemblenet_forward_flops(
      num_frames=4, height=32, width=32, **tiny) / 1e9
  assert f['train_gflops_per_clip_bench'] == flop_formulas.assemblenet_flops(
      num_frames=4, height=32, width=32, **tiny)['train'] / 1e9
  assert f['gflops_per_clip_original_width'] != f['gflops_per_clip']
  # The original TF1 code is not timed without --tf1_reference; nothing
  # stands in for it.
  assert f['tf1_reference'] == {'measured': False, 'why': (
      'the original TF1 code was not given (--tf1_reference=PATH, the '
      'google-research folder holding assemblenet/)')}
  assert not any('tf1' in k for k in f if k != 'tf1_reference')
  # Figures agree with one another (batch 1 at quick sizes).
  approx = lambda x: pytest.approx(x, rel=1e-9)
  for key in ('forward_sec_per_batch', 'train_sec_per_step',
              'conv3d_peak_gflops'):
    assert isinstance(f[key], float) and math.isfinite(f[key]), key
  assert f['train_clips_per_sec'] == approx(1 / f['train_sec_per_step'])
  assert f['forward_clips_per_sec'] == approx(1 / f['forward_sec_per_batch'])
  assert f['forward_model_gflops'] == approx(
      f['gflops_per_clip_bench'] / f['forward_sec_per_batch'])
  assert f['train_model_gflops'] == approx(
      f['train_gflops_per_clip_bench'] / f['train_sec_per_step'])
  assert f['train_speedup_vs_original_width'] == approx(
      f['train_clips_per_sec'] /
      f['reference_original_width_train_clips_per_sec'])
  assert f['forward_speedup_vs_original_width'] == approx(
      f['forward_clips_per_sec'] /
      f['reference_original_width_forward_clips_per_sec'])
  # The exported SavedModel, served at 1 x 4 x 32^2 (uint8 -> probabilities).
  assert benchmark.QUICK_INFERENCE == (1, 4, 32)
  assert benchmark.FULL_INFERENCE == (2, 32, 224)
  assert f['inference_size'] == '1x4x32^2'
  assert f['inference_gflops_per_clip'] == f['gflops_per_clip_bench']
  assert f['inference_clips_per_sec'] == approx(
      1 / f['inference_sec_per_batch'])
  assert f['inference_stock_export_clips_per_sec'] > 0
  assert f['inference_model_gflops'] == approx(
      f['inference_gflops_per_clip'] / f['inference_sec_per_batch'])


# The reference-checkout timing: a real child runs a TF training step (tens of
# seconds to build), so the protocol is tested with a child that only counts,
# and the timing with fake children.
_COUNTING_CHILD = '''
import importlib.util
spec = importlib.util.spec_from_file_location('children', {path!r})
children = importlib.util.module_from_spec(spec)
spec.loader.exec_module(children)
calls = []
def build():
  print('noise before READY', flush=True)
  return (lambda: calls.append(1) or {{'calls': len(calls)}}), {{'x': 7}}
children.step_child_loop(build)
'''


def test_step_child_runs_a_step_per_command_and_reports_a_crash():
  code = _COUNTING_CHILD.format(path=memory_lib.__file__)
  with memory_lib.StepChild(code, 'counter', timeout=60) as child:
    assert child.wait_ready() == {'x': 7}
    assert [child.step(), child.step()] == [{'calls': 1}, {'calls': 2}]
  crash = 'import sys; sys.stderr.write("boom at build"); sys.exit(3)'
  with memory_lib.StepChild(crash, 'crasher', timeout=60) as child:
    with pytest.raises(RuntimeError, match=r'crasher exited \(code 3.*'
                       r'before its READY line:\nboom at build'):
      child.step()


def test_reference_checkout_timing_interleaves_the_two_children(
    monkeypatch, tmp_path):
  (tmp_path / 'official_ext').mkdir()
  seconds = {'checkout_train': iter([1.0, 1.0, 3.0]),
             'reference_checkout_train': iter([2.0, 5.0, 7.0])}
  log = []
  clock = [0.0]
  monkeypatch.setattr(benchmark.timing.time, 'perf_counter',
                      lambda: clock[0])

  class Fake:
    def __init__(self, root, batch, frames, size, quick, name):
      log.append(('build', name, batch, frames, size, quick))
      self.root, self.name = root, name

    def wait_ready(self):
      return {'official_ext': f'{self.root}/official_ext/__init__.py'}

    def step(self):
      log.append(('step', self.name))
      clock[0] += next(seconds[self.name])

    def close(self):
      log.append(('close', self.name))

  f = benchmark.reference_checkout_speed(str(tmp_path), quick=False,
                                         rounds=3, make_child=Fake)
  assert log[:2] == [('build', 'checkout_train', 2, 16, 112, False),
                     ('build', 'reference_checkout_train', 2, 16, 112, False)]
  assert log[2:8] == [('step', 'checkout_train'),
                      ('step', 'reference_checkout_train')] * 3
  assert log[8:] == [('close', 'checkout_train'),
                     ('close', 'reference_checkout_train')]
  assert f['checkout_train_sec_per_step'] == 1.0
  assert f['reference_checkout_train_sec_per_step'] == 5.0
  assert f['train_speedup_vs_reference_checkout'] == 5.0
  assert f['reference_checkout'] == str(tmp_path)
  json.dumps(f)
  # A directory that is no checkout, and a child that imported another
  # official_ext (PYTHONPATH did not take), are refused.
  with pytest.raises(ValueError, match='no official_ext directory'):
    benchmark.reference_checkout_speed(str(tmp_path / 'official_ext'), True,
                                       make_child=Fake)

  class Elsewhere(Fake):
    def wait_ready(self):
      return {'official_ext': '/work/main/official_ext/__init__.py'}

  log.clear()
  with pytest.raises(ValueError, match='imported official_ext from'):
    benchmark.reference_checkout_speed(str(tmp_path), True,
                                       make_child=Elsewhere)
  assert log[-2:] == [('close', 'checkout_train'),
                      ('close', 'reference_checkout_train')]


def test_reference_checkouts_are_refused_for_families_without_them():
  with pytest.raises(ValueError, match='--reference_checkout: the readout '
                     r'benchmark does not take it \(assemblenet does\)'):
    harness.run('readout', quick=True, reference_checkout='/tmp')
  with pytest.raises(ValueError, match='--tf1_reference: the yt8m '
                     r'benchmark does not take it \(assemblenet does\)'):
    harness.run('yt8m', quick=True, tf1_reference='/tmp')


# A stand-in of the original's interface (its modules, flags and model
# function; a tiny network of its own): the original cannot be shipped.
STANDIN = os.path.join(os.path.dirname(__file__), 'tf1_standin')


def test_tf1_reference_times_the_original_as_tf1_code_beside_ours(
    monkeypatch):
  """The original's child runs for real on the stand-in (a TF1 graph, a
  Session, momentum SGD after the batch-norm updates); ours is a fake that
  only counts (its program is the reference checkout's, above)."""
  monkeypatch.setenv(benchmark.process_settings.MALLOC_MMAP_THRESHOLD,
                     benchmark.PROCESS_SETTINGS[
                         benchmark.process_settings.MALLOC_MMAP_THRESHOLD])
  made, steps = [], []

  class Ours:
    def wait_ready(self):
      return {}

    def step(self):
      steps.append('ours')
      return {'loss': 1.0}

    def close(self):
      steps.append('closed')

  def make_ours(root, batch, frames, size, quick, name):
    made.append((root, batch, frames, size, quick, name))
    return Ours()

  original = []

  def make_original(root, batch, frames, size, blocks):
    child = memory_lib.StepChild(
        benchmark.tf1_lib.child_code(root, batch, frames, size, 5, blocks,
                                     1e-4),
        'tf1_train', env=benchmark.tf1_lib.child_env(
            benchmark.PROCESS_SETTINGS))
    original.append(child)
    real_step = child.step
    child.step = lambda: steps.append('tf1') or real_step()
    return child

  f = benchmark.tf1_reference_speed(
      os.path.join(STANDIN, 'assemblenet'), quick=True, rounds=2,
      make_ours=make_ours, make_original=make_original)
  json.dumps(f)
  assert made == [(benchmark.checkout_root(), 1, 4, 32, True, 'train')]
  assert steps == ['ours', 'tf1', 'ours', 'tf1', 'closed']
  assert f['tf1_root'] == STANDIN and f['measured'] is True
  assert f['bench_size'] == '1x4x32^2' and f['tf1_blocks_per_level'] == [
      1, 1, 1, 1]
  # The stand-in at one block per level: 4 Conv3D kernels, 3x3x3, 3 -> 4 ->
  # 8 -> 12 -> 16 channels, batch-norm scales and offsets, dense 16 -> 5.
  assert f['tf1_trainable_parameters'] == (
      27 * (3 * 4 + 4 * 8 + 8 * 12 + 12 * 16) + 2 * (4 + 8 + 12 + 16) +
      16 * 5 + 5)
  assert math.isfinite(f['tf1_first_loss'])
  assert len(f['tf1_train_samples']) == len(f['train_samples']) == 2
  assert f['train_speedup_vs_tf1'] == pytest.approx(
      f['tf1_train_sec_per_step'] / f['train_sec_per_step'])
  # The original trains without the process settings set for ours.
  assert benchmark.tf1_lib.child_env(benchmark.PROCESS_SETTINGS) == {
      benchmark.process_settings.MALLOC_MMAP_THRESHOLD: None}


def test_tf1_reference_refuses_a_folder_without_the_original(tmp_path):
  with pytest.raises(ValueError, match=r'--tf1_reference=.*: no original '
                     r'assemblenet/ there \(looked for run_asn.py'):
    benchmark.tf1_reference_speed(str(tmp_path), quick=True)
  assert benchmark.tf1_lib.original_root(STANDIN) == STANDIN
  assert benchmark.tf1_lib.original_root(
      os.path.join(STANDIN, 'assemblenet')) == STANDIN


def test_input_pipelines_are_timed_one_at_a_time(monkeypatch):
  # Prefetching pipelines, each logging the elements it makes: while one is
  # timed, no other may be making elements (its threads would take the
  # timed one's cores and give itself a head start).
  made = []

  def stand_in(name):
    def make(i):
      made.append(name)
      return i
    ds = tf.data.Dataset.range(10 ** 6).map(
        lambda i: tf.py_function(make, [i], tf.int64))
    return ds.map(lambda i: ({'image': tf.fill([4], i)}, tf.fill([1], i))
                  ).batch(2).prefetch(4)

  names = ('ours', 'model_garden', 'decode_bound')
  monkeypatch.setattr(assemblenet_input, 'pipelines',
                      lambda *a, **k: {n: stand_in(n) for n in names})
  f = assemblenet_input.measure('x', 1, rounds=2, min_seconds=0.05,
                                warmup=1, batch=2)
  assert f['batch_shapes'] == {'ours': [[2, 4], [2, 1]],
                               'model_garden': [[2, 4], [2, 1]]}
  runs = [n for i, n in enumerate(made) if i == 0 or made[i - 1] != n]
  # The first batches, the warm-up round and 2 timed rounds, each pipeline
  # alone in turn.
  assert runs == list(names) * 4


def test_input_pipeline_case_agrees_with_model_garden(monkeypatch):
  # The quick case in this process (the CLI measures in pinned children:
  # their program is checked below without running it).
  step = {'train_clips_per_sec': 0.5, 'gflops_per_clip_bench': 40.0,
          'gflops_per_clip': 400.0}
  batches = {}
  f = assemblenet_input.run(quick=True, core_counts=[1], step_figures=step,
                            in_process=True, first_batches=batches)
  json.dumps(f)
  assert f['input_pipeline_1core_batch_shapes'] == {
      'ours': [[2, 4, 32, 32, 3], [2, 400]],
      'model_garden': [[2, 4, 32, 32, 3], [2, 400]]}
  ours = f['input_pipeline_ours_clips_per_sec_per_core']
  mg = f['input_pipeline_model_garden_clips_per_sec_per_core']
  assert ours > 0 and mg > 0
  assert f['input_pipeline_speedup_vs_model_garden'] == pytest.approx(ours / mg)
  bound = f['input_pipeline_decode_bound_clips_per_sec_per_core']
  assert bound > 0
  assert f['input_pipeline_share_of_decode_bound'] == pytest.approx(
      ours / bound)
  assert f['input_pipeline_cpu_step_clips_per_sec'] == pytest.approx(0.05)
  assert f['input_pipeline_cores_to_feed_cpu_step'] == pytest.approx(
      0.05 / ours)
  # The same records and settings: batches of the same dtypes, values in
  # [0, 1] on the 1/255 grid (uint8 pixels), one-hot labels of the records'
  # classes (i % 400 of 4 records).
  for name, (features, y) in batches.items():
    x = features['image'].numpy()
    assert x.dtype == np.float32 and y.dtype == tf.float32, name
    assert 0.0 <= x.min() and x.max() <= 1.0 and x.std() > 0.05, name
    np.testing.assert_allclose(x * 255, np.round(x * 255), atol=1e-3)
    np.testing.assert_array_equal(tf.reduce_sum(y, -1), [1.0, 1.0])
    assert set(np.argmax(y, -1)) <= {0, 1, 2, 3}, name
  # Settings Model Garden's parser cannot take are named.
  params = assemblenet_input.training_params('x', **assemblenet_input.QUICK)
  params.random_flip = False
  with pytest.raises(ValueError, match='random_flip'):
    assemblenet_input.model_garden_params(params)
  too_many = len(os.sched_getaffinity(0)) + 1
  with pytest.raises(ValueError, match=f'{too_many} cores asked'):
    assemblenet_input.run(quick=True, core_counts=[too_many])
  # The pinned child's program: its CPUs fixed before TensorFlow starts.
  calls = []
  monkeypatch.setattr(assemblenet_input, 'child',
                      lambda *a: calls.append(a) or {'cores': 1})
  code = assemblenet_input.child_code('/x/*.tfrecord', 1, {'batch': 2}, 1, 0.0,
                                      {'max_other_cores': 0.2})
  assert code.startswith('import os; os.sched_setaffinity(0, ')
  exec(code, {})  # pylint: disable=exec-used
  assert calls == [('/x/*.tfrecord', 1, {'batch': 2}, 1, 0.0,
                    {'max_other_cores': 0.2})]


def test_cases_choose_and_merge(monkeypatch):
  with pytest.raises(ValueError, match=r"unknown assemblenet case\(s\) "
                                       r"\['pipeline'\]"):
    benchmark.run(quick=True, cases=['pipeline'])
  got = []
  monkeypatch.setattr(benchmark.assemblenet_input, 'run',
                      lambda quick, step_figures: got.append(step_figures) or
                      {'input_pipeline_x': 1.0})
  recorded = {'train_model_gflops': 80.0, 'gflops_per_clip': 376.0,
              'input_pipeline_x': 0.5, 'environment': {'date': 'old'},
              'command': 'python -m official_ext.benchmark assemblenet'}
  f = benchmark.run(quick=True, cases=['input_pipeline'],
                    step_figures=recorded)
  assert got == [recorded] and f == {'quick': True, 'input_pipeline_x': 1.0}
  merged = harness.merge_cases(
      recorded, dict(f, environment={'date': 'new'}, command='c',
                     machine='m'), ['input_pipeline'])
  assert merged['input_pipeline_x'] == 1.0
  assert merged['environment'] == {'date': 'old'}
  assert merged['input_pipeline_environment'] == {'date': 'new'}
  assert merged['input_pipeline_command'] == 'c'
  assert merged['train_model_gflops'] == 80.0 and 'quick' not in merged
  # The model case's run is the file's own.
  merged = harness.merge_cases(recorded, {'environment': {'date': 'new'},
                                          'train_model_gflops': 81.0},
                               ['model'])
  assert merged['environment'] == {'date': 'new'}
  assert merged['train_model_gflops'] == 81.0
  assert merged['input_pipeline_x'] == 0.5
  # The networks case: its figures under 'networks', its run beside.
  merged = harness.merge_cases(
      recorded, {'networks': {'models': {}}, 'environment': {'date': 'n'},
                 'command': 'c --cases networks', 'quick': False},
      ['networks'])
  assert merged['networks'] == {'models': {}}
  assert merged['networks_environment'] == {'date': 'n'}
  assert merged['environment'] == {'date': 'old'}
  assert merged['input_pipeline_x'] == 0.5


@pytest.mark.parametrize('key,structure,plus', [
    ('assemblenet50', benchmark.QUICK_ASN_STRUCTURE, False),
    ('assemblenet_plus50', benchmark.QUICK_ASNP_STRUCTURE, True)],
                         ids=['assemblenet50', 'assemblenet_plus50'])
def test_networks_case_measures_each_full_network(key, structure, plus):
  """The 'networks' case at quick sizes, one network: its parameters are
  the built model's and the architecture's, its per-clip FLOPs those traced
  from a model built here at 32 x 224^2, its rates its timings'."""
  f = benchmark.run(quick=True, memory=False, cases=['networks'],
                    networks=[key])
  json.dumps(f)
  assert set(f) == {'quick', 'networks'}
  n = f['networks']
  assert (n['bench_size'], n['flops_size'], n['peak_rss_size']) == (
      '1x4x32^2', '32x224^2', '2x8x64^2')
  assert list(n['models']) == [key]
  row = n['models'][key]
  experiment = {'assemblenet50': 'assemblenet50_charades',
                'assemblenet_plus50': 'assemblenet_plus_charades'}[key]
  assert row['experiment'] == experiment
  assert row['backbone'] == ('assemblenet_plus' if plus else 'assemblenet')
  assert not any(k.startswith('peak_rss') for k in row)  # memory=False
  # The quick network: the stems (objects with AssembleNet++) fused into
  # one level-3 block, as the experiment's config builds it here.
  assert (structures.STEM_OBJECT in [s[0] for s in structure]) == plus
  params = exp_factory.get_exp_config(experiment)
  params.override({'task': {'model': {'backbone': {row['backbone']: {
      'model_structure': json.dumps(structure), 'model_edge_weights': '',
      'blocks_per_level': [1, 1, 1, 1], 'rep_flow': {'num_iter': 2}}}}}},
                  is_strict=True)
  task = task_factory.get_task(params.task)
  model = task.build_model(input_shape=[1, 32, 224, 224, 3])
  assert row['parameters'] == model.count_params()
  assert row['trainable_parameters'] == complexity.analyze_assemblenet(
      structure, [1, 1, 1, 1], plus=plus,
      attention_mode='peer' if plus else None, edge_weights_given=False,
      num_object_classes=151, num_classes=157).params
  features = {'image': tf.zeros([1, 32, 224, 224, 3])}
  if plus:
    features['objects'] = tf.zeros([1, 32, 224, 224], tf.int32)
  assert row['gflops_per_clip'] == graph_flops.forward_flops(
      model, features) / 1e9
  assert 0 < row['gflops_per_clip_bench'] < row['gflops_per_clip']
  assert row['train_gflops_per_clip_bench'] > row['gflops_per_clip_bench']
  approx = lambda x: pytest.approx(x, rel=1e-9)
  assert row['forward_clips_per_sec'] == approx(
      1 / row['forward_sec_per_batch'])
  assert row['train_clips_per_sec'] == approx(1 / row['train_sec_per_step'])
  assert row['forward_model_gflops'] == approx(
      row['gflops_per_clip_bench'] / row['forward_sec_per_batch'])
  assert row['train_model_gflops'] == approx(
      row['train_gflops_per_clip_bench'] / row['train_sec_per_step'])
  table = benchmark.networks_table(n)
  assert table.splitlines()[2].startswith(f"| {row['network']} ")
  assert f"{row['parameters']:,} ({row['trainable_parameters']:,})" in table


def test_object_maps_are_regions_of_class_ids():
  rng = np.random.default_rng(0)
  maps = benchmark.object_maps(rng, (2, 3, 20, 18), 151, block=8)
  assert maps.shape == (2, 3, 20, 18) and maps.dtype == np.int32
  assert 0 <= maps.min() and maps.max() < 151 and len(np.unique(maps)) > 10
  # Constant over each 8 x 8 region, the edge regions cut to the map.
  np.testing.assert_array_equal(maps[..., :8, :8],
                                np.broadcast_to(maps[..., :1, :1],
                                                (2, 3, 8, 8)))
  np.testing.assert_array_equal(maps[..., 16:, 16:],
                                np.broadcast_to(maps[..., 16:17, 16:17],
                                                (2, 3, 4, 2)))


def test_a_failed_or_killed_memory_child_is_recorded_without_a_figure(
    monkeypatch):
  """Each network's child: a result is kept; a child killed (as by the
  kernel out of memory) or past its timeout gives None and its reason."""
  programs = {
      'assemblenet_plus_lite': "print('RESULT {\"peak_rss_gb\": 2.5, "
                               "\"step_sec\": 4.0}')",
      'assemblenet50': 'import time; time.sleep(60)',
      'assemblenet_plus50': 'import os, signal; '
                            'os.kill(os.getpid(), signal.SIGKILL)'}
  monkeypatch.setattr(benchmark, 'memory_child_code',
                      lambda *args: programs[args[-1]])
  f = benchmark.networks_peak_rss(True, benchmark.NETWORKS, timeout=2)
  assert f['assemblenet_plus_lite'] == {
      'peak_rss_gb': 2.5, 'peak_rss_step_sec': 4.0, 'peak_rss_error': None}
  assert f['assemblenet50'] == {
      'peak_rss_gb': None, 'peak_rss_step_sec': None,
      'peak_rss_error': 'memory child killed after its timeout of 2 s'}
  killed = f['assemblenet_plus50']
  assert killed['peak_rss_gb'] is None and killed['peak_rss_step_sec'] is None
  assert killed['peak_rss_error'].startswith('memory child failed (exit -9')
  # The table: the figure, or no figure with the reason's first line below.
  row = {'experiment': 'x', 'parameters': 1, 'trainable_parameters': 1,
         'gflops_per_clip': 1.0, 'forward_clips_per_sec': 1.0,
         'train_clips_per_sec': 1.0, 'forward_model_gflops': 1.0,
         'train_model_gflops': 1.0}
  # The rows in `NETWORKS` order, whatever the order of the keys (a JSON
  # file holds them sorted).
  table = benchmark.networks_table({
      'bench_size': 'b', 'flops_size': 'f', 'peak_rss_size': 'p',
      'models': {n.key: dict(row, network=n.title, **f[n.key])
                 for n in sorted(benchmark.NETWORKS, key=lambda n: n.key)}})
  lines = table.splitlines()
  assert lines[2].startswith('| AssembleNet++lite ') and ' 2.50 ' in lines[2]
  assert 'no figure (below)' in lines[3] and 'no figure (below)' in lines[4]
  assert lines[-2:] == [
      '- AssembleNet-50: memory child killed after its timeout of 2 s',
      '- AssembleNet++-50 with objects: memory child failed (exit -9; a '
      'negative code is a signal, -9 usually out of memory)']


def test_networks_case_takes_the_lite_memory_of_the_model_case(monkeypatch):
  """With the 'model' case in the run, the lite's peak RSS is its child's
  (one child, not two); the networks' children run before any model."""
  log = []
  monkeypatch.setattr(
      benchmark, 'peak_rss_gb', lambda *a, **k: log.append(k['net']) or {
          'peak_rss_gb': 2.0, 'step_sec': 3.0})
  monkeypatch.setattr(benchmark, '_model_figures', lambda *a: log.append(
      'model') or {'peak_rss_gb_8x32x224': 1.5, 'peak_rss_step_sec': 9.0})
  got = {}
  monkeypatch.setattr(benchmark, 'network_figures',
                      lambda quick, nets, peak: got.update(peak) or {})
  benchmark.run(quick=True, cases=['model', 'networks'])
  assert log == ['assemblenet50', 'assemblenet_plus50', 'model']
  assert got['assemblenet_plus_lite'] == {
      'peak_rss_gb': 1.5, 'peak_rss_step_sec': 9.0, 'peak_rss_error': None}
  assert got['assemblenet50']['peak_rss_gb'] == 2.0
  log.clear()
  benchmark.run(quick=True, cases=['networks'])
  assert log == ['assemblenet_plus_lite', 'assemblenet50',
                 'assemblenet_plus50']
  with pytest.raises(ValueError, match="unknown assemblenet benchmark "
                     "network 'asn'"):
    benchmark.run(quick=True, cases=['networks'], networks=['asn'])
