r"""Benchmarks: `python -m official_ext.benchmark FAMILY [--json FILE] [--quick]`.

The command line of `official_ext.benchmarks` (see `benchmarks/harness.py`):
FAMILY is one of `harness.FAMILIES` (yt8m, assemblenet, readout); `--quick`
runs tiny sizes (a smoke test of the harness); `--json FILE` also writes the
figures as JSON.
"""
from absl import app
from absl import flags

from official_ext.benchmarks import harness

flags.DEFINE_string('json', None, 'Write the figures to this JSON file.')
flags.DEFINE_bool('quick', False, 'Tiny sizes: check the harness runs.')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) != 2 or argv[1] not in harness.FAMILIES:
    raise app.UsageError(
        f'usage: python -m official_ext.benchmark FAMILY [--json FILE] '
        f'[--quick], FAMILY one of {sorted(harness.FAMILIES)}')
  harness.main(argv[1], quick=FLAGS.quick, json_path=FLAGS.json)


if __name__ == '__main__':
  app.run(main)
