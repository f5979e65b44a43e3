"""`python -m official_ext.benchmark startup`: seconds from starting a command
to its exit after printing its help, with the Keras 3 import it made before the
commands set `TF_USE_LEGACY_KERAS=1` and without it, timed interleaved
(docs/benchmarks.md#command-start-up)."""
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

from official_ext.benchmarks import timing

# The commands timed: name -> arguments of the Python interpreter.
COMMANDS: Dict[str, List[str]] = {
    'train': ['-m', 'official_ext.train', '--helpshort'],
    'predict': ['-m', 'official_ext.assemblenet.predict', '--helpshort'],
}
# How each variant sets the variable: '0' imports Keras 3 as `tf.keras`
# (what every command did before it set the variable); None leaves it unset,
# and the command sets it to 1.
VARIANTS = {'keras3': '0', 'tf_keras': None}


def _env(value) -> Dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k != 'TF_USE_LEGACY_KERAS'}
  if value is not None:
    env['TF_USE_LEGACY_KERAS'] = value
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  return env


def command_candidate(args: Sequence[str], value) -> Any:
  """One start of `python args` with TF_USE_LEGACY_KERAS `value` (None:
  unset), as a timing candidate.

  Raises:
    RuntimeError: the command printed no usage (its output's end named)."""
  env = _env(value)

  def start():
    run = subprocess.run([sys.executable, *args], env=env,
                         capture_output=True, text=True, check=False)
    if 'flags' not in (run.stdout + run.stderr).lower():
      raise RuntimeError(f'python {" ".join(args)} printed no help (exit '
                         f'{run.returncode}):\n{(run.stdout + run.stderr)[-2000:]}')
  return start


def run(quick: bool = False,
        commands: Optional[Dict[str, List[str]]] = None) -> Dict[str, Any]:
  """Per command, seconds to start and print the help with Keras 3
  ('<name>_keras3_sec') and without ('<name>_tf_keras_sec'), medians of
  interleaved rounds after one untimed start of each, and 'saved_sec'."""
  commands = COMMANDS if commands is None else commands
  candidates = {f'{name}_{variant}': command_candidate(args, value)
                for name, args in commands.items()
                for variant, value in VARIANTS.items()}
  seconds = timing.interleaved_seconds(candidates, rounds=2 if quick else 5,
                                       warmup=1)
  out: Dict[str, Any] = {'quick': quick, 'commands': {
      name: ' '.join(['python', *args]) for name, args in commands.items()}}
  for name in commands:
    keras3, legacy = (seconds[f'{name}_keras3'], seconds[f'{name}_tf_keras'])
    out[name] = {'keras3_sec': keras3, 'tf_keras_sec': legacy,
                 'saved_sec': keras3 - legacy}
  return out


def table(figures: Dict[str, Any]) -> str:
  """One row a command: its start-up with and without Keras 3."""
  rows = [('command', 'with Keras 3 imported, s', 'tf_keras only (default), s',
           'saved, s')]
  for name, command in figures['commands'].items():
    f = figures[name]
    rows.append((f'`{command}`', f"{f['keras3_sec']:.2f}",
                 f"{f['tf_keras_sec']:.2f}", f"{f['saved_sec']:.2f}"))
  return timing.format_table(rows)
