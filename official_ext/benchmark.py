r"""Benchmarks: `python -m official_ext.benchmark FAMILY [--json FILE] [--quick]
[--reference_checkout DIR] [--tpu ADDRESS]`.

The command line of `official_ext.benchmarks` (see `benchmarks/harness.py`):
FAMILY is one of `harness.FAMILIES` (yt8m, assemblenet, readout on this
machine's CPU; accelerator: the shipped GPU / TPU YAMLs' training steps on
this machine's GPUs or TPU, `--tpu` its address, an error without one); `--quick`
runs tiny sizes (a smoke test of the harness); `--json FILE` also writes the
figures as JSON; `--reference_checkout DIR` (assemblenet) also times the
training step of another checkout of this repository (e.g. one made with
`git worktree add /tmp/ref313792b 313792b`) interleaved with this one's, each
in a child process.
"""
from typing import Sequence

from absl import app
from absl import flags

from official_ext.benchmarks import accelerator
from official_ext.benchmarks import harness

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  flags.DEFINE_string('json', None, 'Write the figures to this JSON file.',
                      flag_values=flag_values)
  flags.DEFINE_bool('quick', False, 'Tiny sizes: check the harness runs.',
                    flag_values=flag_values)
  flags.DEFINE_string(
      'reference_checkout', None,
      'assemblenet: another checkout of this repository whose training step '
      'is timed interleaved with this one (each in a child process).',
      flag_values=flag_values)
  flags.DEFINE_string(
      'tpu', None, 'accelerator: the Cloud TPU address (local on a TPU VM).',
      flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Benchmarks the family `argv[1]` with the parsed `flag_values`."""
  if len(argv) != 2 or argv[1] not in harness.FAMILIES:
    raise app.UsageError(
        f'usage: python -m official_ext.benchmark FAMILY [--json FILE] '
        f'[--quick] [--reference_checkout DIR], FAMILY one of {sorted(harness.FAMILIES)}')
  try:
    harness.main(argv[1], quick=flag_values.quick, json_path=flag_values.json,
                 reference_checkout=flag_values.reference_checkout,
                 tpu=flag_values.tpu)
  except accelerator.NoAcceleratorError as e:
    raise SystemExit(f'official_ext.benchmark accelerator: {e}') from e


if __name__ == '__main__':
  define_flags()
  app.run(main)
