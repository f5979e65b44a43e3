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
(tests/test_multiworker.py) and `saved_model_cli`. `ForkedCLI` starts such
processes from one that imported the CLI's module once.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

from absl import flags
import pytest


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


def run_main(module, *args: str, entry: str = 'main'):
  """`module.main` (or the function `entry`) run on `args` (flags and
  positional arguments) as from the command line; returns what it returns
  (exceptions propagate: the CLI exits non-zero with them). `main` must
  return None: `absl.app.run` prints any other value and exits 1."""
  flag_values, argv = _parse(module, args)
  result = getattr(module, entry)(argv, flag_values)
  if entry == 'main':
    assert result is None, (
        f'{module.__name__}.main returned {type(result).__name__}: '
        'app.run would print it and exit 1 after the command succeeded.')
  return result


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
  stdout. A command that fails is an AssertionError with its stderr.

  The console script `saved_model_cli` must be installed (with TensorFlow,
  on PATH): the test fails naming it otherwise. Its entry point,
  `saved_model_cli.main`, runs the commands, so that several cost one
  process."""
  return start_saved_model_cli(*commands)()


def start_saved_model_cli(*commands: Sequence[str]) -> Callable[[], str]:
  """`saved_model_cli` started in the background: the process imports
  TensorFlow (seconds) while the test goes on; call the result to wait for
  it and get its stdout (as `saved_model_cli`)."""
  if shutil.which('saved_model_cli') is None:
    pytest.fail('saved_model_cli, the console script installed with '
                'TensorFlow, is not on PATH; install tensorflow into this '
                'environment (or put its bin/ folder on PATH).')
  process = subprocess.Popen(
      [sys.executable, '-c', _SAVED_MODEL_CLI,
       json.dumps([[str(a) for a in c] for c in commands])],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))

  def result() -> str:
    try:
      stdout, stderr = process.communicate(timeout=300)
    finally:
      if process.poll() is None:
        process.kill()
        process.communicate()
    assert process.returncode == 0, stderr[-3000:]
    return stdout

  return result


# {name: (dtype, shape)} of a signature's inputs or outputs, as
# `saved_model_cli show` prints them: ('DT_FLOAT', '(-1, 8)').
TensorInfos = Dict[str, Tuple[str, str]]


def shown_signatures(text: str) -> Dict[str, Tuple[TensorInfos, TensorInfos]]:
  """{signature: (inputs, outputs)} of `saved_model_cli show --all`'s
  output (one tag set; `__saved_model_init_op` left out)."""
  signatures, current, side, name = {}, None, None, None
  for line in text.splitlines():
    line = line.strip()
    match = re.match(r"signature_def\['(.+)'\]:", line)
    if match:
      current, side = match.group(1), None
      if current.startswith('__'):
        current = None
      else:
        signatures[current] = ({}, {})
      continue
    if current is None:
      continue
    match = re.match(r'The given SavedModel SignatureDef contains the '
                     r'following (input|output)', line)
    if match:
      side = 0 if match.group(1) == 'input' else 1
    match = re.match(r"(?:inputs|outputs)\['(.+)'\] tensor_info:", line)
    if match:
      name = match.group(1)
    match = re.match(r'(dtype|shape): (.+)', line)
    if match and side is not None and name is not None:
      entry = signatures[current][side].setdefault(name, ['', ''])
      entry[0 if match.group(1) == 'dtype' else 1] = match.group(2)
  return {key: tuple({n: tuple(v) for n, v in infos.items()}
                     for infos in sides)
          for key, sides in signatures.items()}


# Imports the module named by its argument, then serves JSON requests, one a
# line on stdin: {"start": [[log] or [out, err], args]} creates the logs and
# forks a child that runs `python -m <module> *args` (the module run as
# __main__, as `-m` does) with stdout and stderr to them and exits as that
# command would (its status, a traceback, a signal); it replies
# {"pid": ...}. {"poll": pid}
# replies {"code": the exit status, or null while it runs}.
_FORK_SERVER = """
import json, os, runpy, sys
module = sys.argv[1]
__import__(module)
for line in sys.stdin:
  request = json.loads(line)
  if 'start' in request:
    logs, args = request['start']
    fds = [os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
           for log in logs]
    pid = os.fork()
    if pid == 0:
      os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
      os.dup2(fds[0], 1)
      os.dup2(fds[-1], 2)
      sys.argv = [module, *args]
      runpy.run_module(module, run_name='__main__', alter_sys=True)
      sys.exit(0)
    for fd in fds:
      os.close(fd)
    reply = {'pid': pid}
  else:
    pid, status = os.waitpid(request['poll'], os.WNOHANG)
    reply = {'code': os.waitstatus_to_exitcode(status) if pid else None}
  print(json.dumps(reply), flush=True)
"""


class ForkedRun:
  """One run of a `ForkedCLI`: a process of its own (`pid`), with
  `subprocess.Popen`'s `poll`, `wait`, `send_signal`, `kill` and
  `returncode`."""

  def __init__(self, server: 'ForkedCLI', pid: int, log: str,
               stderr: Optional[str]):
    self._server, self.pid, self.log, self._stderr = server, pid, log, stderr
    self.returncode: Optional[int] = None

  def poll(self) -> Optional[int]:
    if self.returncode is None:
      self.returncode = self._server.ask(poll=self.pid)['code']
    return self.returncode

  def wait(self, timeout: float) -> int:
    deadline = time.time() + timeout
    while self.poll() is None:
      if time.time() > deadline:
        raise subprocess.TimeoutExpired(f'{self._server.module} run',
                                        timeout, output=self.output())
      time.sleep(0.05)
    return self.returncode

  def send_signal(self, signum: int) -> None:
    if self.poll() is None:
      os.kill(self.pid, signum)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)

  def output(self) -> str:
    """What the run wrote to its log so far (stdout, and stderr unless
    `start` was given a file for it)."""
    with open(self.log, errors='replace') as f:
      return f.read()

  def errors(self) -> str:
    """What the run wrote to stderr so far."""
    with open(self._stderr or self.log, errors='replace') as f:
      return f.read()


class ForkedCLI:
  """`python -m <module> ARGS` runs, each a process of its own forked from
  one that imported `module` once (most of a new interpreter's start, for
  TensorFlow's CLIs): its own pid, signals, exit status and TensorFlow
  runtime (the importing process never starts it). A context manager:
  leaving it kills the runs still going.

    with cli.ForkedCLI('official_ext.train', env=env) as train:
      run = train.start(['--experiment=...'], log=tmp_path / 'run.log')
      run.wait(timeout=120)
  """

  def __init__(self, module: str, env: Optional[Dict[str, str]] = None,
               cwd: Optional[str] = None):
    self.module = module
    self._server = subprocess.Popen(
        [sys.executable, '-c', _FORK_SERVER, module], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        cwd=cwd, start_new_session=True)

  def ask(self, **request) -> Dict[str, Optional[int]]:
    self._server.stdin.write(json.dumps(request) + '\n')
    self._server.stdin.flush()
    line = self._server.stdout.readline()
    if not line:  # The server exited: its import failed.
      error = self._server.stderr.read()
      self.close()
      raise AssertionError(f'importing {self.module} failed: {error[-3000:]}')
    return json.loads(line)

  def start(self, args: Sequence[str], log, stderr=None) -> ForkedRun:
    """Starts `python -m <module> *args`: stdout to `log`, stderr to
    `stderr` (default: `log` too)."""
    logs = [str(log)] + ([str(stderr)] if stderr else [])
    pid = self.ask(start=[logs, [str(a) for a in args]])['pid']
    return ForkedRun(self, pid, logs[0], stderr and logs[1])

  def close(self) -> None:
    """Kills the server and every run still going (one process group)."""
    try:
      os.killpg(self._server.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self._server.communicate()

  def __enter__(self) -> 'ForkedCLI':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
