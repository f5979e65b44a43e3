"""The AssembleNet++lite benchmark: analytic FLOPs and a quick run."""
import json
import math

import pytest

from official_ext.assemblenet import structures
from official_ext.assemblenet.modeling import complexity
from official_ext.benchmarks import assemblenet as benchmark


def test_conv3d_flops_by_hand():
  # Quick Conv3D: 1 clip x 4 frames x 8 x 8, 16 -> 16 channels, 3x3x3 SAME:
  # 4 * 8 * 8 = 256 output positions x 16 output channels, each 27 taps x 16
  # input channels multiply-adds, 2 FLOPs per multiply-add.
  assert benchmark.QUICK_CONV3D == (1, 4, 8, 16)
  assert benchmark.conv3d_flops(1, 4, 8, 16) == 256 * 16 * 27 * 16 * 2
  assert 256 * 16 * 27 * 16 * 2 == 3_538_944
  # The full one: 2 x 16 x 28^2, 152 channels.
  assert benchmark.conv3d_flops(2, 16, 28, 152) == (
      2 * 16 * 28 * 28 * 152 * 27 * 152 * 2)


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
  # the exported SavedModel.
  f = benchmark.run(quick=True, memory=False, reference=True)
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
  tiny = dict(structure=benchmark.QUICK_STRUCTURE,
              blocks_per_level=benchmark.QUICK_BLOCKS_PER_LEVEL,
              edge_weights_given=False, stem_filters=8, head_filters=(16, 24),
              num_classes=157)
  assert f['gflops_per_clip'] == complexity.analyze(**tiny).flops / 1e9
  assert f['gflops_per_clip_bench'] == complexity.analyze(
      num_frames=4, height=32, width=32, **tiny).flops / 1e9
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
      3 * f['gflops_per_clip_bench'] / f['train_sec_per_step'])
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
