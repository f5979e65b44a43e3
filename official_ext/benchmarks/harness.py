"""The benchmark harness behind `python -m official_ext.benchmark FAMILY`.

Speed figures are measured in this process side by side with a reference
(interleaved rounds, medians: `timing.interleaved_seconds`) because shared
machines are noisy: trust the ratios; absolute numbers are printed too. The
exception is AssembleNet++lite's TF1 original, which does not run in this
process: its `*_vs_tf1_quoted` ratios compare with quoted timings, not a
measurement. Each family module has `run(quick=False) -> figures` (a
JSON-serializable dict) and may have `table(figures) -> str`, and
`PROCESS_SETTINGS` ({variable: value}): the process settings a CPU training
run of its family takes (`core.kernel_policy`, the ones `python -m official_ext.train`
applies too), applied by `run` only where the process has not yet started
TensorFlow's runtime (they take effect when it starts), and only where the
user has not set the variable; the log says what was applied.
"""
import importlib
import inspect
import json
import os
import platform
from typing import Any, Dict, Optional

from absl import logging
import tensorflow as tf

from official_ext.benchmarks import timing
from official_ext.core import process_settings

FAMILIES = {
    'yt8m': 'official_ext.benchmarks.yt8m',
    'assemblenet': 'official_ext.benchmarks.assemblenet',
    'readout': 'official_ext.benchmarks.readout',
    # The training steps of the shipped GPU / TPU YAMLs on this machine's
    # accelerators (exits non-zero without one).
    'accelerator': 'official_ext.benchmarks.accelerator',
}


def machine() -> str:
  """One line describing this machine: CPU, cores, devices, TF version."""
  cpus = len(tf.config.list_physical_devices('CPU'))
  gpus = tf.config.list_physical_devices('GPU')
  return (f'{platform.processor() or platform.machine()}, '
          f'{os.cpu_count()} cores, {cpus} CPU device(s), '
          f'{len(gpus)} GPU(s), TF {tf.__version__}')


def generic_table(figures: Dict[str, Any]) -> str:
  """A two-column table of the flat (non-dict, non-list) figures."""
  rows = [('figure', 'value')]
  for key in sorted(figures):
    value = figures[key]
    if isinstance(value, float):
      value = f'{value:.4g}'
    elif isinstance(value, (dict, list)):
      continue
    rows.append((key, str(value)))
  return timing.format_table(rows)


def family_module(family: str):
  """The benchmark module of `family` (a key of FAMILIES)."""
  if family not in FAMILIES:
    raise ValueError(f'unknown benchmark family {family!r}; one of '
                     f'{sorted(FAMILIES)}')
  return importlib.import_module(FAMILIES[family])


def run(family: str, quick: bool = False,
        reference_checkout: Optional[str] = None,
        tpu: Optional[str] = None) -> Dict[str, Any]:
  """Runs `family`'s benchmark; its figures plus 'machine'.

  `reference_checkout` (another checkout of this repository, timed beside
  this one) is passed to families whose `run` takes it (assemblenet);
  `tpu` (the TPU address) to the accelerator benchmark.
  """
  module = family_module(family)
  options = {}
  for name, value, who in (('reference_checkout', reference_checkout,
                            'assemblenet'), ('tpu', tpu, 'accelerator')):
    if not value:
      continue
    if name not in inspect.signature(module.run).parameters:
      raise ValueError(f'--{name}: the {family} benchmark does not take it '
                       f'({who} does).')
    options[name] = value
  settings = getattr(module, 'PROCESS_SETTINGS', {})
  applied = process_settings.apply(settings)
  logging.info(process_settings.describe(applied))
  logging.info('Benchmarking %s on %s', family, machine())
  figures = module.run(quick=quick, **options)
  figures['machine'] = machine()
  return figures


def report(family: str, figures: Dict[str, Any], quick: bool = False) -> str:
  """The printed report: a header line and the family's table."""
  table = getattr(family_module(family), 'table', generic_table)
  return (f'{family} benchmark on {figures["machine"]}'
          f'{" (quick sizes)" if quick else ""}:\n{table(figures)}')


def main(family: str, quick: bool = False,
         json_path: Optional[str] = None,
         reference_checkout: Optional[str] = None,
         tpu: Optional[str] = None) -> Dict[str, Any]:
  """Runs, prints the report, writes the figures to `json_path` if given."""
  figures = run(family, quick=quick, reference_checkout=reference_checkout,
                tpu=tpu)
  print(report(family, figures, quick=quick))
  if json_path:
    with open(json_path, 'w') as f:
      json.dump(figures, f, indent=2, sort_keys=True, default=float)
    print(f'wrote {json_path}')
  return figures
