"""Child processes of the benchmarks: a step's peak host memory, each variant in
a fresh process (the high-water mark `ru_maxrss` only grows; the child prints
`RESULT {json}`), and `StepChild`, a child that runs one step per command so
that several code versions are timed interleaved."""
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

RESULT_PREFIX = 'RESULT '
READY_PREFIX = 'READY '
DONE_PREFIX = 'DONE '
STEP_COMMAND = 'step'


def peak_rss_gb() -> float:
  """This process's peak resident set size so far, GiB."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def _status_kib(field: str) -> int:
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1])
  raise RuntimeError(f'/proc/self/status has no {field} line.')


def step_peak_mb(step: Callable[[], Any]) -> float:
  """How far one call of `step` (which must wait for its results) raises this
  process's resident memory, MiB: the peak is reset first
  (`/proc/self/clear_refs`, Linux), so earlier work does not hide it.

  Raises:
    RuntimeError: /proc/self/clear_refs or /proc/self/status cannot be used
      (not Linux), naming the file."""
  try:
    with open('/proc/self/clear_refs', 'w') as f:
      f.write('5')
  except OSError as e:
    raise RuntimeError(f'Cannot reset the peak RSS through '
                       f'/proc/self/clear_refs: {e}') from e
  before = _status_kib('VmRSS')
  step()
  return (_status_kib('VmHWM') - before) / 1024


def result_line(figures: Dict[str, Any]) -> str:
  """The line a child prints: `RESULT {json}`."""
  return RESULT_PREFIX + json.dumps(figures)


def run_child(code: str, timeout: int = 3600) -> Dict[str, Any]:
  """Runs `python -c code` (which prints `result_line(figures)`) and returns
  the dict of its last `RESULT` line, plus `children_max_rss_gb` (the largest
  peak RSS of this process's children so far, GiB).

  Raises:
    RuntimeError: the child failed or printed no `RESULT` line; the message
      has its exit code and the end of its stderr."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  proc = subprocess.run([sys.executable, '-c', code], capture_output=True,
                        text=True, env=env, timeout=timeout, check=False)
  children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2 ** 20
  lines = [l for l in proc.stdout.splitlines()
           if l.startswith(RESULT_PREFIX)]
  if proc.returncode != 0 or not lines:
    raise RuntimeError(
        f'memory child failed (exit {proc.returncode}; a negative code is a '
        f'signal, -9 usually out of memory):\n{proc.stderr[-3000:]}')
  result = json.loads(lines[-1][len(RESULT_PREFIX):])
  result['children_max_rss_gb'] = children
  return result


class StepChild:
  """A long-lived `python -c code` child that runs one step per command.

  Protocol, one line each way: the child builds (and warms up) its step and
  prints `READY {json}`; for each `step` line on its stdin it runs one step to
  completion and prints `DONE {json}`; it exits when stdin closes; other
  output is ignored. `step()` blocks until `DONE`.

  Args:
    code: the child's program.
    name: what error messages call the child.
    env: extra environment variables (e.g. PYTHONPATH of another checkout);
      a None value removes the variable.
    cwd: the child's working directory.
    timeout: seconds to wait for READY."""

  def __init__(self, code: str, name: str,
               env: Optional[Dict[str, Optional[str]]] = None,
               cwd: Optional[str] = None, timeout: float = 3600):
    self.name = name
    full_env = {k: v for k, v in dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
                                      **(env or {})).items() if v is not None}
    self._stderr = tempfile.TemporaryFile(mode='w+')
    self._proc = subprocess.Popen(
        [sys.executable, '-c', code], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=full_env,
        cwd=cwd, bufsize=1)
    self._timeout = timeout
    self.ready: Optional[Dict[str, Any]] = None

  def wait_ready(self) -> Dict[str, Any]:
    """Waits for the child's READY line; returns its dict."""
    if self.ready is None:
      self.ready = self._read(READY_PREFIX, self._timeout)
    return self.ready

  def step(self) -> Dict[str, Any]:
    """Runs one step in the child; returns its DONE dict."""
    self.wait_ready()
    try:
      self._proc.stdin.write(STEP_COMMAND + '\n')
      self._proc.stdin.flush()
    except BrokenPipeError:
      pass  # _read reports the exit and the child's stderr.
    return self._read(DONE_PREFIX, None)

  def _read(self, prefix: str, timeout: Optional[float]) -> Dict[str, Any]:
    if timeout is not None:
      ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
      if not ready:
        self.close()
        raise RuntimeError(f'{self.name}: no {prefix.strip()} line within '
                           f'{timeout} s.\n{self._tail()}')
    while True:
      line = self._proc.stdout.readline()
      if not line:
        code = self._proc.wait()
        raise RuntimeError(
            f'{self.name} exited (code {code}; a negative code is a signal, '
            f'-9 usually out of memory) before its {prefix.strip()} line:\n'
            f'{self._tail()}')
      if line.startswith(prefix):
        return json.loads(line[len(prefix):])

  def _tail(self) -> str:
    self._stderr.seek(0)
    return self._stderr.read()[-3000:]

  def close(self) -> None:
    """Closes the child's stdin (it exits) and waits for it."""
    if self._proc.poll() is None:
      try:
        self._proc.stdin.close()
      except OSError:
        pass
      try:
        self._proc.wait(timeout=60)
      except subprocess.TimeoutExpired:
        self._proc.kill()
        self._proc.wait()
    self._stderr.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def step_child_loop(build: Callable[[], Tuple[Callable[[], Dict[str, Any]],
                                                Dict[str, Any]]],
                    lines: Optional[Iterable[str]] = None) -> None:
  """The child side of `StepChild` (this module imports only the standard
  library: another checkout's child loads it by path). `build()` returns
  (step, ready): `step()` runs one step and returns the DONE line's dict,
  `ready` is the READY line's; `lines`: the commands (default stdin).

  Raises:
    ValueError: a command other than `step`."""
  step, ready = build()
  print(READY_PREFIX + json.dumps(ready), flush=True)
  for line in (sys.stdin if lines is None else lines):
    command = line.strip()
    if command != STEP_COMMAND:
      raise ValueError(f'step child: unknown command {command!r}; expected '
                       f'{STEP_COMMAND!r}.')
    print(DONE_PREFIX + json.dumps(step()), flush=True)
