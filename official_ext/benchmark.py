"""The benchmark command line: `python -m official_ext.benchmark FAMILY` (one
of `harness.FAMILIES`) or `report` (docs/benchmarks.md from the results JSON);
the flags say the rest."""
import sys
from typing import Sequence

from absl import app
from absl import flags

from official_ext.benchmarks import accelerator
from official_ext.benchmarks import harness
from official_ext.benchmarks import report
from official_ext.benchmarks import timing
from official_ext.benchmarks import xla_export

REPORT = 'report'

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
      'tf1_reference', None,
      'assemblenet: the folder holding google-research\'s original '
      'assemblenet/ (TF1); its AssembleNet++lite training step is timed '
      'interleaved with ours, each in a child process.',
      flag_values=flag_values)
  flags.DEFINE_float(
      'max_other_cores', None,
      'A timed round counts only while other processes use at most this '
      f'many cores (default {timing.QuietGate.max_other_cores}); busier '
      'rounds are retaken, a machine busy for '
      f'{timing.QuietGate.max_wait_s / 60:.0f} minutes ends the run (quick '
      'runs only record the load).',
      flag_values=flag_values)
  flags.DEFINE_list(
      'cases', None,
      'assemblenet: only these cases (model, input_pipeline, networks, '
      'tf1_reference); '
      'readout: (model, spike_tokens); yt8m: model (the default), zoo (every '
      'registered model\'s published-size step) and zoo_demos (every '
      'model\'s demo trained to the same budget); with --json, merged into '
      'the existing file.', flag_values=flag_values)
  flags.DEFINE_string(
      'tpu', None, 'accelerator: the Cloud TPU address (local on a TPU VM).',
      flag_values=flag_values)
  flags.DEFINE_string(
      'export_xla', None,
      'accelerator: write each case\'s training and validation steps as '
      'XLA modules into this folder, for scripts/run_xla_steps.py (no '
      'accelerator needed; --cases picks cases).', flag_values=flag_values)
  flags.DEFINE_string('results_dir', harness.RESULTS_DIR,
                      'report: the folder of benchmark JSON files.',
                      flag_values=flag_values)
  flags.DEFINE_string('output', report.PAGE,
                      'report: the page to write.', flag_values=flag_values)
  flags.DEFINE_string('pages_root', harness.REPO_ROOT,
                      'report: the folder of README.md and docs/ whose '
                      'generated blocks are rewritten.',
                      flag_values=flag_values)
  flags.DEFINE_bool('check', False,
                    'report: only check that the page is the generated one '
                    '(exit 1 if not).', flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Benchmarks the family `argv[1]` with the parsed `flag_values`, or
  writes the report page (`argv[1] == 'report'`)."""
  if len(argv) != 2 or argv[1] not in set(harness.FAMILIES) | {REPORT}:
    raise app.UsageError(
        f'usage: python -m official_ext.benchmark FAMILY [--json FILE] '
        f'[--quick] [--reference_checkout DIR] [--tpu ADDRESS], FAMILY one of '
        f'{sorted(harness.FAMILIES)}; or python -m official_ext.benchmark '
        f'report [--results_dir DIR] [--output FILE] [--check]')
  if argv[1] == REPORT:
    rc = report.main(flag_values.results_dir, flag_values.output,
                     check=flag_values.check,
                     pages_root=flag_values.pages_root)
    if rc:
      sys.exit(rc)
    return
  if flag_values.export_xla:
    if argv[1] != 'accelerator':
      raise app.UsageError('--export_xla is a flag of `benchmark accelerator`.')
    xla_export.main(flag_values.export_xla, quick=flag_values.quick,
                    cases=flag_values.cases)
    return
  try:
    harness.main(argv[1], quick=flag_values.quick, json_path=flag_values.json,
                 reference_checkout=flag_values.reference_checkout,
                 tpu=flag_values.tpu, cases=flag_values.cases,
                 tf1_reference=flag_values.tf1_reference,
                 max_other_cores=flag_values.max_other_cores)
  except accelerator.NoAcceleratorError as e:
    raise SystemExit(f'official_ext.benchmark accelerator: {e}') from e


if __name__ == '__main__':
  define_flags()
  app.run(main)
