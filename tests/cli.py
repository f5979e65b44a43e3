"""Runs a command-line tool's `main` in this process.

The package's CLIs define their flags with `define_flags(flag_values)` and
run as `main(argv, flag_values)` (`official_ext.export_saved_model`,
`export_tflite`, `benchmark`, `yt8m.predict`, `yt8m.demo_data`,
`yt8m.segment_eval`, `assemblenet.derive_structure`, `assemblenet.predict`);
`run_main` gives one a fresh `FlagValues` parsed from `args`, as `app.run`
would from the command line, without the ~10 s of a new Python process
importing TensorFlow. Subprocesses remain where the process boundary is the
subject: the training CLI's output (tests/yt8m/test_train.py), SIGKILL and
resume (tests/test_resilience.py), several workers
(tests/test_multiworker.py) and `saved_model_cli`.
"""
import json
import os
import subprocess
import sys
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


# Runs `saved_model_cli` commands (a JSON list of argument lists) through the
# entry point of the `saved_model_cli` console script, one after the other;
# a command that fails exits non-zero.
_SAVED_MODEL_CLI = """
import json, sys
from tensorflow.python.tools import saved_model_cli
for args in json.loads(sys.argv[1]):
  sys.argv = ['saved_model_cli'] + args
  try:
    saved_model_cli.main()
  except SystemExit as e:
    if e.code:
      raise
"""


def saved_model_cli(*commands: Sequence[str]) -> str:
  """Runs `saved_model_cli <command>` for each command (an argument list), in
  ONE fresh Python process (the SavedModel must stand alone); returns its
  stdout. A command that fails is an AssertionError with its stderr."""
  result = subprocess.run(
      [sys.executable, '-c', _SAVED_MODEL_CLI,
       json.dumps([[str(a) for a in c] for c in commands])],
      capture_output=True, text=True, timeout=300, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout
