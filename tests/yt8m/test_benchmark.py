"""The YT8M benchmark harness: analytic FLOPs and a quick-size smoke run."""
import json
import subprocess
import sys

from official_ext.yt8m import benchmark


def test_analytic_flops_published_size():
  # Per example: cluster forward 2*300*1152*3000 and its weight gradient,
  # hidden 2*3000*2000 x3 (forward, weight grad, input grad), MoE gate+expert
  # 2*2000*3862*11 x3. No gradient w.r.t. the frame features.
  expected = (2 * 2 * 300 * 1152 * 3000 + 3 * 2 * 3000 * 2000 +
              3 * 2 * 2000 * 3862 * 11)
  assert benchmark.train_flops_per_example(benchmark.PUBLISHED) == expected
  assert abs(expected / 1e9 - 4.693) < 1e-3


def test_quick_run_writes_fixed_keys(tmp_path):
  out = tmp_path / 'yt8m.json'
  result = subprocess.run(
      [sys.executable, '-m', 'official_ext.benchmark', 'yt8m', '--quick',
       f'--json={out}'], capture_output=True, text=True, timeout=600,
      check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert '| figure' in result.stdout
  figures = json.loads(out.read_text())
  for key in ('ours_examples_per_sec', 'reference_examples_per_sec',
              'speedup', 'matmul_peak_gflops', 'achieved_gflops',
              'peak_fraction', 'pipeline_examples_per_sec',
              'metrics_seconds'):
    assert figures[key] > 0, key
  # The vectorized metrics equal the straightforward reference.
  assert figures['metrics_max_abs_diff_vs_reference'] < 1e-9
