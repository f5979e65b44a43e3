r"""Benchmarks: `python -m official_ext.benchmark FAMILY [--json FILE]`.

Speed figures are measured in this process side by side with a reference
(interleaved rounds, medians) because shared machines are noisy: trust the
ratios; absolute numbers are printed too. The exception is AssembleNet++lite,
whose reference (the TF1 original) does not run in this process: its
`*_vs_tf1_quoted` ratios compare with quoted timings, not a measurement. FAMILY is one of the registered
sections below; `--quick` runs tiny sizes (a smoke test of the harness).
"""
import importlib
import json
import platform

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from official_ext.core import bench_utils

FAMILIES = {
    'yt8m': 'official_ext.yt8m.benchmark',
    'assemblenet': 'official_ext.assemblenet.benchmark',
    'readout': 'official_ext.readout.benchmark',
}


def _generic_table(figures) -> str:
  rows = [('figure', 'value')]
  for key in sorted(figures):
    value = figures[key]
    if isinstance(value, float):
      value = f'{value:.4g}'
    elif isinstance(value, (dict, list)):
      continue
    rows.append((key, str(value)))
  return bench_utils.format_table(rows)

flags.DEFINE_string('json', None, 'Write the figures to this JSON file.')
flags.DEFINE_bool('quick', False, 'Tiny sizes: check the harness runs.')
FLAGS = flags.FLAGS


def machine() -> str:
  cpus = len(tf.config.list_physical_devices('CPU'))
  gpus = tf.config.list_physical_devices('GPU')
  import os  # pylint: disable=g-import-not-at-top
  return (f'{platform.processor() or platform.machine()}, '
          f'{os.cpu_count()} cores, {cpus} CPU device(s), '
          f'{len(gpus)} GPU(s), TF {tf.__version__}')


def main(argv):
  if len(argv) != 2 or argv[1] not in FAMILIES:
    raise app.UsageError(
        f'usage: python -m official_ext.benchmark FAMILY [--json FILE] '
        f'[--quick], FAMILY one of {sorted(FAMILIES)}')
  family = argv[1]
  module = importlib.import_module(FAMILIES[family])
  logging.info('Benchmarking %s on %s', family, machine())
  figures = module.run(quick=FLAGS.quick)
  figures['machine'] = machine()
  print(f'{family} benchmark on {figures["machine"]}'
        f'{" (quick sizes)" if FLAGS.quick else ""}:')
  print(getattr(module, 'table', _generic_table)(figures))
  if FLAGS.json:
    with open(FLAGS.json, 'w') as f:
      json.dump(figures, f, indent=2, sort_keys=True, default=float)
    print(f'wrote {FLAGS.json}')


if __name__ == '__main__':
  app.run(main)
