"""Runs a command-line tool's `main` in this process.

The package's CLIs define their flags with `define_flags(flag_values)` and
run as `main(argv, flag_values)` (`official_ext.export_saved_model`,
`export_tflite`, `benchmark`, `yt8m.predict`, `yt8m.demo_data`,
`yt8m.segment_eval`, `assemblenet.derive_structure`); `run_main` gives one a
fresh `FlagValues` parsed from `args`, as `app.run` would from the command
line, without the ~10 s of a new Python process importing TensorFlow.
Subprocesses remain where the process boundary is the subject: the training
CLI's output (tests/yt8m/test_train.py), SIGKILL and resume
(tests/test_resilience.py), several workers (tests/test_multiworker.py) and
`saved_model_cli`.
"""
from typing import Sequence

from absl import flags


def _parse(module, args: Sequence[str]):
  """(`module`'s flags defined in a fresh FlagValues and parsed from `args`,
  the positional arguments as `main` gets them); a missing required flag
  raises as on the command line."""
  flag_values = flags.FlagValues()
  module.define_flags(flag_values)
  return flag_values, flag_values([module.__name__, *args])


def parse_flags(module, *args: str) -> flags.FlagValues:
  """`module`'s flags parsed from `args` (`--name=value` strings)."""
  return _parse(module, args)[0]


def run_main(module, *args: str):
  """`module.main` run on `args` (flags and positional arguments) as from
  the command line; returns what it returns (exceptions propagate: the CLI
  exits non-zero with them)."""
  flag_values, argv = _parse(module, args)
  return module.main(argv, flag_values)
