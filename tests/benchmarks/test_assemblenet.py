"""The AssembleNet++lite benchmark: a quick run, its children and cases."""
import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from official_ext.assemblenet import structures
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


def test_memory_child_program_calls_this_module(monkeypatch, capsys):
  # The child process runs this program; here it runs in this process with
  # `memory_child` replaced (the real child costs a minute or more).
  calls = []
  monkeypatch.setattr(benchmark, 'memory_child',
                      lambda *args: calls.append(args) or {'peak_rss_gb': 1.5})
  exec(benchmark.memory_child_code(2, 8, 64, True, False), {})  # pylint: disable=exec-used
  assert calls == [(2, 8, 64, True, False)]
  assert capsys.readouterr().out == 'RESULT {"peak_rss_gb": 1.5}\n'


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
  # No quoted TF1 figures at quick sizes (they are for 2 x 16 x 112^2).
  assert not any(k.startswith('tf1_') or k.endswith('_tf1_quoted') for k in f)
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


def test_reference_checkout_is_refused_for_families_without_it():
  with pytest.raises(ValueError, match='--reference_checkout: the readout '
                     r'benchmark does not take it \(assemblenet does\)'):
    harness.run('readout', quick=True, reference_checkout='/tmp')


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
  code = assemblenet_input.child_code('/x/*.tfrecord', 1, {'batch': 2}, 1, 0.0)
  assert code.startswith('import os; os.sched_setaffinity(0, ')
  exec(code, {})  # pylint: disable=exec-used
  assert calls == [('/x/*.tfrecord', 1, {'batch': 2}, 1, 0.0)]


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
