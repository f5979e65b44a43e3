"""The readout benchmark runs (quick) and reports its figures."""
from official_ext.readout import benchmark


def test_quick_benchmark_reports_figures():
  figures = benchmark.run(quick=True)
  for key in ('padded_rows_per_sec', 'varlen_rows_per_sec'):
    assert figures[key] > 0
  assert figures['varlen_speedup'] == (figures['varlen_rows_per_sec'] /
                                       figures['padded_rows_per_sec'])
  assert figures['padded_rows'] > figures['num_queries'] > 0
  assert 0 < figures['padding_fraction'] < 1
