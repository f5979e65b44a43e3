"""docs/benchmarks.md is generated from the benchmark JSON, byte for byte."""
import json
import os
import re

import pytest

from official_ext import benchmark
from official_ext.benchmarks import harness
from official_ext.benchmarks import report
from tests import cli

_ENVIRONMENT_KEYS = {'cpu_model', 'cpu_flags', 'cores', 'tensorflow', 'date',
                     'quick'}


def test_page_is_generated_from_the_results_folder():
  with open(report.PAGE, encoding='utf-8') as f:
    page = f.read()
  assert page == report.render(harness.RESULTS_DIR), (
      'docs/benchmarks.md is not the page generated from benchmarks/results/: '
      'run `python -m official_ext.benchmark report`')


def test_every_family_has_a_full_run_that_says_where_and_when():
  results = report.load(harness.RESULTS_DIR)
  for family in report.ORDER:
    assert family in results, f'benchmarks/results/{family}.json is missing'
    environment = results[family]['environment']
    assert _ENVIRONMENT_KEYS <= set(environment), (family, environment)
    assert environment['quick'] is False, family
    assert results[family]['command'].startswith(
        f'python -m official_ext.benchmark {family}')
    # Every run's section on the page names its date and CPU.
    page = report.render(harness.RESULTS_DIR)
    section = page.split(f'## {report.TITLES[family]}\n', 1)[1].split(
        '\n## ', 1)[0]
    assert environment['date'] in section
    assert environment['cpu_model'] in section


def test_environment_records_the_machine():
  environment = harness.environment()
  assert _ENVIRONMENT_KEYS <= set(environment)
  assert environment['cores'] == os.cpu_count()
  assert isinstance(environment['cpu_flags'], list)
  assert environment['date'].endswith('Z')


def test_a_family_without_a_run_says_how_to_record_one(tmp_path):
  page = report.render(str(tmp_path))
  for family in report.ORDER:
    assert (f'No run recorded: `python -m official_ext.benchmark {family} '
            f'--json benchmarks/results/{family}.json`') in page
  assert 'No accelerator figures were recorded' in page
  assert 'python -m official_ext.benchmark accelerator' in page


def test_accelerator_figures_render_as_a_table_per_family(tmp_path):
  accelerator = {
      'machine': {'device': 'NVIDIA H200', 'tensorflow': '2.20.0'},
      'date': '2030-01-02T03:04:05Z',
      'yt8m': {'examples_per_sec': 1234.6, 'kernel_policy': 'stock',
               'fast': {'examples_per_sec': 1300.0}},
      'readout': {'device_memory_peak_gb': 2.25, 'steps': 20},
  }
  (tmp_path / 'accelerator.json').write_text(json.dumps(accelerator))
  page = report.render(str(tmp_path))
  section = page.split('## GPUs and TPUs\n', 1)[1]
  assert 'No accelerator figures' not in section
  assert '- device: NVIDIA H200' in section
  assert '- date: 2030-01-02T03:04:05Z' in section
  yt8m = section.split('### YouTube-8M\n', 1)[1].split('###', 1)[0]
  assert '| examples_per_sec      | 1,235 |' in yt8m
  assert '| fast.examples_per_sec | 1,300 |' in yt8m
  assert '| kernel_policy         | stock |' in yt8m
  readout = section.split('### Multitask readout\n', 1)[1]
  assert '| device_memory_peak_gb | 2.25  |' in readout


def test_a_json_file_of_another_name_is_named(tmp_path):
  (tmp_path / 'yt8m_old.json').write_text('{}')
  with pytest.raises(ValueError, match=r'yt8m_old\.json: not a results file'):
    report.render(str(tmp_path))


def test_report_command_writes_and_checks_the_page(tmp_path):
  results = tmp_path / 'results'
  results.mkdir()
  (results / 'readout.json').write_text(json.dumps(
      {'machine': 'm', 'varlen_speedup': 2.5}))
  page = tmp_path / 'benchmarks.md'
  cli.run_main(benchmark, 'report', f'--results_dir={results}',
               f'--output={page}')
  assert page.read_text(encoding='utf-8') == report.render(str(results))
  assert '| readout layer: chained over padded | 2.50× |' in page.read_text(
      encoding='utf-8')
  cli.run_main(benchmark, 'report', f'--results_dir={results}',
               f'--output={page}', '--check')
  page.write_text('edited by hand\n')
  with pytest.raises(SystemExit) as exit_info:
    cli.run_main(benchmark, 'report', f'--results_dir={results}',
                 f'--output={page}', '--check')
  assert exit_info.value.code == 1


def test_every_table_row_keeps_its_columns():
  """A `|` inside a cell (e.g. a label `max |difference|`) is escaped."""
  page = report.render(harness.RESULTS_DIR)
  columns = None
  for line in page.splitlines():
    if not line.startswith('|'):
      columns = None
      continue
    count = len(re.findall(r'(?<!\\)\|', line))
    columns = columns or count
    assert count == columns, line
  assert report.markdown_safe('| a | b |\n|---|---|\n| x |y| | 1 |') == (
      '| a       | b |\n|---------|---|\n| x \\|y\\| | 1 |')
