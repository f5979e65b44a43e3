"""Child processes of the benchmarks: peak host memory, and steps on command.

Peak host memory of a step is measured in a child process of its own.

A process's resident-set high-water mark (`ru_maxrss`) only grows, so a
figure for one variant needs a fresh process: the family module writes a
`python -c` program that prints one line `RESULT {json}` (its figures, e.g.
`peak_rss_gb()`, or `step_peak_mb(step)`), and `run_child` runs it and
returns that dict. Linux reports `ru_maxrss` in KiB.

`step_peak_mb` measures one call alone: it resets the kernel's high-water
mark first (`/proc/self/clear_refs`, Linux >= 4.0), so what tracing, data
generation or earlier steps touched does not hide the call's own peak.

`StepChild` is a long-lived child that builds a step once (e.g. from another
checkout of this repository, whose code cannot share this process) and then
runs one step per `step()` call, so that the parent can time several code
versions interleaved (`timing.interleaved_samples` over their `step`s).
"""
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
  """How far one call of `step` raises this process's resident memory, MiB.

  Resets the peak RSS (writes 5 to `/proc/self/clear_refs`), reads the
  current RSS, calls `step` (which must wait for its results) and returns
  the new peak (`VmHWM`) minus that RSS.

  Raises:
    RuntimeError: /proc/self/clear_refs or /proc/self/status cannot be used
      (not Linux), naming the file.
  """
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
  """Runs `python -c code` and returns the dict of its last `RESULT` line.

  Args:
    code: a program that prints `result_line(figures)`.
    timeout: seconds before the child is killed.

  Returns:
    The child's figures plus `children_max_rss_gb` (the largest peak RSS of
    this process's children so far, GiB: the child's own figure, as the
    kernel saw it).

  Raises:
    RuntimeError: the child failed or printed no `RESULT` line; the message
      has its exit code and the end of its stderr.
  """
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

  The protocol, one line each way: the child builds its step (and warms it
  up), then prints `READY {json}`; for every `step` line it reads on stdin it
  runs one step to completion and prints `DONE {json}` (e.g. the step's
  loss); it exits when stdin closes. Anything else it prints is ignored.

  `step()` blocks until the child's `DONE` line, so a parent timing
  `child.step` with `timing.interleaved_samples` times the child's step plus
  two pipe lines (well under a millisecond): children of different code
  versions are then timed interleaved, in one run.

  Args:
    code: the child's program (see the protocol).
    name: what error messages call the child.
    env: extra environment variables (e.g. PYTHONPATH of another checkout).
    cwd: the child's working directory.
    timeout: seconds to wait for READY (building, warm-up).
  """

  def __init__(self, code: str, name: str,
               env: Optional[Dict[str, str]] = None,
               cwd: Optional[str] = None, timeout: float = 3600):
    self.name = name
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', **(env or {}))
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
  """The child side of `StepChild`: builds, prints READY, steps on command.

  This module imports only the standard library, so a child running another
  checkout's code can load this file by its path and call this function.

  Args:
    build: builds the step; returns (step, ready): `step()` runs one step to
      completion and returns a JSON-serializable dict (the DONE line),
      `ready` is the READY line's dict.
    lines: the commands (default: stdin, until it closes).

  Raises:
    ValueError: a command other than `step`.
  """
  step, ready = build()
  print(READY_PREFIX + json.dumps(ready), flush=True)
  for line in (sys.stdin if lines is None else lines):
    command = line.strip()
    if command != STEP_COMMAND:
      raise ValueError(f'step child: unknown command {command!r}; expected '
                       f'{STEP_COMMAND!r}.')
    print(DONE_PREFIX + json.dumps(step()), flush=True)
