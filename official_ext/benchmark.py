r"""Benchmarks: `python -m official_ext.benchmark FAMILY [--json FILE] [--quick]`.

The command line of `official_ext.benchmarks` (see `benchmarks/harness.py`):
FAMILY is one of `harness.FAMILIES` (yt8m, assemblenet, readout); `--quick`
runs tiny sizes (a smoke test of the harness); `--json FILE` also writes the
figures as JSON.
"""
from typing import Sequence

from absl import app
from absl import flags

from official_ext.benchmarks import harness

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  flags.DEFINE_string('json', None, 'Write the figures to this JSON file.',
                      flag_values=flag_values)
  flags.DEFINE_bool('quick', False, 'Tiny sizes: check the harness runs.',
                    flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Benchmarks the family `argv[1]` with the parsed `flag_values`."""
  if len(argv) != 2 or argv[1] not in harness.FAMILIES:
    raise app.UsageError(
        f'usage: python -m official_ext.benchmark FAMILY [--json FILE] '
        f'[--quick], FAMILY one of {sorted(harness.FAMILIES)}')
  harness.main(argv[1], quick=flag_values.quick, json_path=flag_values.json)


if __name__ == '__main__':
  define_flags()
  app.run(main)
