"""The YT8M benchmark: its task and batch, a quick CLI run."""
import dataclasses
import json

import numpy as np
import pytest

from official_ext import benchmark as benchmark_cli
from official_ext.benchmarks import yt8m as benchmark
from tests import cli


def test_task_and_batch_have_the_size_asked_for():
  size = benchmark.TINY
  config = benchmark.build_task(size, jit_compile=False).task_config
  assert config.model.backbone.dbof.cluster_size == size.cluster == 32
  assert config.model.backbone.dbof.hidden_size == size.hidden == 32
  assert config.model.head.moe.num_mixtures == size.mixtures == 2
  assert config.train_data.num_classes == size.classes == 20
  assert config.train_data.max_frames == size.frames == 8
  assert config.train_data.global_batch_size == size.batch == 8
  assert config.jit_compile is False
  batch = benchmark.make_batch(size, seed=1)
  assert batch['video_matrix'].shape == (8, 8, 1152)
  np.testing.assert_array_equal(batch['num_frames'], np.full([8], 8))
  labels = batch['labels'].numpy()
  assert labels.shape == (8, 20)
  np.testing.assert_array_equal(labels.sum(axis=1), np.full([8], 3.0))


_PER_SIZE_KEYS = {
    'ours_examples_per_sec', 'reference_examples_per_sec',
    'reference_xla_examples_per_sec', 'speedup', 'gflops_per_example',
    'achieved_gflops', 'peak_fraction', 'interleaved_matmul_gflops',
    'interleaved_matmul_fraction'}


def test_quick_run_figures_are_consistent(tmp_path, capsys):
  # `python -m official_ext.benchmark yt8m --quick --json=...`, in-process.
  out = tmp_path / 'yt8m.json'
  cli.run_main(benchmark_cli, 'yt8m', '--quick', f'--json={out}')
  stdout = capsys.readouterr().out
  assert 'yt8m benchmark on ' in stdout
  assert '(quick sizes):' in stdout
  assert ('tiny: batch 8 x 8 frames, cluster 32, hidden 32, MoE 2, '
          '20 classes') in stdout
  assert 'metrics on 2,000 x 100 (s)' in stdout
  f = json.loads(out.read_text())

  assert set(f) == _PER_SIZE_KEYS | {
      'matmul_peak_gflops', 'pipeline_examples_per_sec',
      'pipeline_vs_train_step', 'metrics_seconds',
      'reference_metrics_seconds_scaled',
      'metrics_max_abs_diff_vs_reference', 'metrics_num_videos',
      'metrics_num_classes', 'metrics_reference_videos', 'sizes',
      'per_size', 'machine', 'nextvlad', 'cpu_allocator', 'environment',
      'command', 'timed_rounds'}
  # Every timed round's load is recorded; a quick run does not wait for a
  # quiet machine (`timing.QuietGate`, enforced in full runs).
  rounds = f['timed_rounds']
  assert rounds['gate']['enforce'] is False
  assert rounds['rounds'] == len(rounds['each']) > 0
  for r in rounds['each']:
    assert r['other_cores'] >= 0 and r['loadavg_before'] >= 0
    assert r['loadavg_after'] >= 0 and r['retaken'] == 0
  # Only the tiny size ran, with the sizes asked for.
  assert f['sizes'] == {'tiny': dataclasses.asdict(benchmark.TINY)}
  assert set(f['per_size']) == {'tiny'}
  tiny = f['per_size']['tiny']
  assert set(tiny) == _PER_SIZE_KEYS
  for key in _PER_SIZE_KEYS:
    assert isinstance(tiny[key], float), key
    assert f[key] == tiny[key], key  # the headline figures are tiny's
  assert (f['metrics_num_videos'], f['metrics_num_classes'],
          f['metrics_reference_videos']) == (2000, 100, 200)
  assert isinstance(f['machine'], str) and 'TF ' in f['machine']
  # In this test process TensorFlow had started before the CLI ran, so the
  # harness set no environment (nothing leaks to later child processes).
  assert f['cpu_allocator'] in ('bfc', 'default')

  # The figures agree with one another.
  approx = lambda x: pytest.approx(x, rel=1e-9)
  assert f['gflops_per_example'] == approx(1_204_992 / 1e9)
  assert f['speedup'] == approx(f['ours_examples_per_sec'] /
                                f['reference_examples_per_sec'])
  assert f['achieved_gflops'] == approx(f['ours_examples_per_sec'] *
                                        f['gflops_per_example'])
  assert f['peak_fraction'] == approx(f['achieved_gflops'] /
                                      f['matmul_peak_gflops'])
  # The matmul timed in the step's rounds: its rate and the step's share.
  assert 'fraction of the matmul timed in the same rounds' in stdout
  assert f['interleaved_matmul_gflops'] > 0
  assert f['interleaved_matmul_fraction'] == approx(
      f['achieved_gflops'] / f['interleaved_matmul_gflops'])
  assert f['pipeline_vs_train_step'] == approx(
      f['pipeline_examples_per_sec'] / f['ours_examples_per_sec'])
  # The NeXtVLAD step ran at its tiny size.
  nv = f['nextvlad']
  assert nv['size'] == json.loads(json.dumps(
      dataclasses.asdict(benchmark.NEXTVLAD_TINY)))  # tuples as lists
  assert 'NeXtVLAD train step, tiny: batch 8 x 8 frames' in stdout
  assert nv['gflops_per_example'] == approx(92_032 / 1e9)
  assert nv['examples_per_sec'] > 0
  assert nv['achieved_gflops'] == approx(nv['examples_per_sec'] *
                                         nv['gflops_per_example'])
  assert nv['peak_fraction'] == approx(nv['achieved_gflops'] /
                                       f['matmul_peak_gflops'])
  assert nv['interleaved_matmul_fraction'] == approx(
      nv['achieved_gflops'] / nv['interleaved_matmul_gflops'])
  # The vectorized metrics equal the straightforward reference.
  assert 0 <= f['metrics_max_abs_diff_vs_reference'] < 1e-9
