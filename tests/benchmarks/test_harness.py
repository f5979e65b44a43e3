"""The harness: family lookup and the generic table."""
import os

import pytest

from official_ext.benchmarks import harness


def test_families_are_the_benchmark_modules():
  assert harness.FAMILIES == {
      'yt8m': 'official_ext.benchmarks.yt8m',
      'assemblenet': 'official_ext.benchmarks.assemblenet',
      'readout': 'official_ext.benchmarks.readout',
  }


def test_unknown_family_names_the_known_ones():
  with pytest.raises(ValueError, match=r"'nope'.*\['assemblenet', 'readout', "
                     r"'yt8m'\]"):
    harness.family_module('nope')


def test_generic_table_lists_flat_figures_sorted():
  table = harness.generic_table({'b': 0.123456, 'a': 3, 'nested': {'x': 1},
                                 'listed': [1]})
  assert table.splitlines() == ['| figure | value  |', '|--------|--------|',
                                '| a      | 3      |', '| b      | 0.1235 |']


def test_process_env_is_not_set_once_tensorflow_runs(monkeypatch):
  # Here TensorFlow's runtime already runs: setting TF_CPU_ALLOCATOR_USE_BFC
  # now would change nothing in this process but leak into child processes.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.constant(1.0).numpy()
  monkeypatch.delenv('OFFICIAL_EXT_TEST_UNSET', raising=False)
  assert harness.apply_process_env({'OFFICIAL_EXT_TEST_UNSET': '1'}) == {}
  assert 'OFFICIAL_EXT_TEST_UNSET' not in os.environ
