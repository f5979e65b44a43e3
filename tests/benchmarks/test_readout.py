"""The readout benchmark: a quick run reports the sizes asked for."""
import numpy as np
import pytest

from official_ext.benchmarks import readout as benchmark


def test_quick_run_reports_the_sizes_asked_for():
  f = benchmark.run(quick=True)
  assert set(f) == {'padded_rows_per_sec', 'varlen_rows_per_sec',
                    'varlen_speedup', 'num_samples', 'num_queries',
                    'padded_rows', 'padding_fraction', 'dim', 'max_queries'}
  for key in ('num_samples', 'num_queries', 'padded_rows', 'dim',
              'max_queries'):
    assert type(f[key]) is int, key  # pylint: disable=unidiomatic-typecheck
  for key in ('padded_rows_per_sec', 'varlen_rows_per_sec', 'varlen_speedup',
              'padding_fraction'):
    assert isinstance(f[key], float), key
  assert benchmark.QUICK == (8, 16, 16)
  assert (f['num_samples'], f['max_queries'], f['dim']) == (8, 16, 16)
  # The longest sample has all 16 queries, already a multiple of 8, so the
  # padded batch is 8 samples x 16 rows.
  assert f['padded_rows'] == 8 * 16
  # The query counts drawn with the benchmark's seed: 16 for the first
  # sample, clipped geometric(p = 4/16) for the others.
  counts = np.clip(np.random.default_rng(0).geometric(4 / 16, 8), 1, 16)
  counts[0] = 16
  assert f['num_queries'] == int(counts.sum())
  assert 16 + 7 <= f['num_queries'] < 8 * 16
  assert f['padding_fraction'] == pytest.approx(1 - f['num_queries'] / 128)
  assert f['varlen_speedup'] == pytest.approx(
      f['varlen_rows_per_sec'] / f['padded_rows_per_sec'], rel=1e-12)
