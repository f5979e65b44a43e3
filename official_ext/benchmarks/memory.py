"""Peak host memory of a step, measured in a child process of its own.

A process's resident-set high-water mark (`ru_maxrss`) only grows, so a
figure for one variant needs a fresh process: the family module writes a
`python -c` program that prints one line `RESULT {json}` (its figures, e.g.
`peak_rss_gb()`, or `step_peak_mb(step)`), and `run_child` runs it and
returns that dict. Linux reports `ru_maxrss` in KiB.

`step_peak_mb` measures one call alone: it resets the kernel's high-water
mark first (`/proc/self/clear_refs`, Linux >= 4.0), so what tracing, data
generation or earlier steps touched does not hide the call's own peak.
"""
import json
import os
import resource
import subprocess
import sys
from typing import Any, Callable, Dict

RESULT_PREFIX = 'RESULT '


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
