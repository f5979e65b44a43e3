"""The harness: family lookup and the generic table."""
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


def test_benchmark_modules_declare_their_tasks_settings():
  # The harness applies what `python -m official_ext.train` applies.
  from official_ext.benchmarks import yt8m  # pylint: disable=g-import-not-at-top
  from official_ext.yt8m import task  # pylint: disable=g-import-not-at-top
  assert yt8m.PROCESS_SETTINGS is task.PROCESS_SETTINGS
  assert yt8m.PROCESS_SETTINGS == {'TF_CPU_ALLOCATOR_USE_BFC': 'true'}
