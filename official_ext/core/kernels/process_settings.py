"""Process settings: what a family's process sets before TensorFlow starts.

Some settings that matter for a training step on CPU are read once, when
TensorFlow's runtime (or the C library) starts, so no config field can change
them later: TensorFlow's CPU allocator (`TF_CPU_ALLOCATOR_USE_BFC`) and
glibc malloc's mmap threshold (`MALLOC_MMAP_THRESHOLD_`). Which ones a run
takes is the kernel policy's decision: they are fast paths declared in
`core.kernels.kernel_policy.FAST_PATHS` (`kernel_policy.process_env` gives an
experiment's), and both `python -m official_ext.train` and `python -m
official_ext.benchmark` apply them (`apply`) before TensorFlow's runtime
starts, so the benchmark figures are those a user's training run gets.

Rules of `apply`:

* Only before TensorFlow's runtime starts in this process (the allocator
  reads its variable then). Afterwards (e.g. inside a test process) nothing
  is set: a variable set now would change nothing here but leak into child
  processes.
* Never over the user's own setting: a variable already in the environment
  wins (for the mmap threshold also glibc's `GLIBC_TUNABLES`
  `glibc.malloc.mmap_threshold`).
* The variables are set in `os.environ`, so child processes inherit them;
  `MALLOC_MMAP_THRESHOLD_`, which glibc reads only at process start, is also
  applied to this process (`core.kernels.set_malloc_mmap_threshold`).
* What was applied, and what the user's setting kept, is returned and
  logged by the callers (`describe`).
"""
import ctypes
import ctypes.util
import dataclasses
import os
from typing import Dict, Mapping, MutableMapping, Optional

from official_ext.core import tf_internals

MALLOC_MMAP_THRESHOLD = 'MALLOC_MMAP_THRESHOLD_'
BFC_ALLOCATOR = 'TF_CPU_ALLOCATOR_USE_BFC'
# The variables `apply` knows how to apply (a typo in a declaration fails).
KNOWN_VARIABLES = (BFC_ALLOCATOR, MALLOC_MMAP_THRESHOLD)

# mallopt's parameter number of the mmap threshold (glibc malloc.h).
M_MMAP_THRESHOLD = -3
DEFAULT_THRESHOLD_BYTES = 1 << 20
MAX_THRESHOLD_BYTES = 32 << 20  # glibc's HEAP_MAX / 2 on 64-bit.


def set_malloc_mmap_threshold(
    threshold_bytes: int = DEFAULT_THRESHOLD_BYTES) -> bool:
  """Fixes glibc malloc's mmap threshold for this process (`mallopt`).

  Applies to allocations made afterwards. Returns True when set, False when
  the C library has no `mallopt` (not glibc: nothing is changed).

  Raises:
    ValueError: `threshold_bytes` is not in [0, 32 MiB] (glibc's range).
    RuntimeError: glibc refused the value.
  """
  if not 0 <= threshold_bytes <= MAX_THRESHOLD_BYTES:
    raise ValueError(f'malloc mmap threshold must be 0..'
                     f'{MAX_THRESHOLD_BYTES} bytes '
                     f'(glibc HEAP_MAX / 2); got {threshold_bytes}.')
  libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
  mallopt = getattr(libc, 'mallopt', None)
  if mallopt is None:
    return False
  if mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)) != 1:
    raise RuntimeError(f'mallopt(M_MMAP_THRESHOLD, {threshold_bytes}) '
                       'failed.')
  return True


def check(env: Mapping[str, str], source: str) -> None:
  """Checks process settings {variable: value} declared by `source`.

  Raises:
    ValueError: an unknown variable, a value that is not a string, or an mmap
      threshold outside glibc's range, naming `source` and the variable.
  """
  for variable, value in env.items():
    if variable not in KNOWN_VARIABLES:
      raise ValueError(f'{source}: unknown process setting {variable!r}; one '
                       f'of {list(KNOWN_VARIABLES)}.')
    if not isinstance(value, str):
      raise ValueError(f'{source}: process setting {variable} must be a '
                       f'string (an environment value); got {value!r}.')
    if variable == MALLOC_MMAP_THRESHOLD and not (
        value.isdigit() and int(value) <= MAX_THRESHOLD_BYTES):
      raise ValueError(f'{source}: {variable}={value!r} is not a byte count '
                       f'in 0..{MAX_THRESHOLD_BYTES}.')


def runtime_started() -> bool:
  """Whether TensorFlow's eager runtime has started in this process."""
  return tf_internals.eager_runtime_started()


@dataclasses.dataclass
class Applied:
  """What `apply` did: `applied` set by us, `kept` the user's own values of
  variables we would have set, `too_late` the settings not applied because
  TensorFlow's runtime had started."""
  applied: Dict[str, str]
  kept: Dict[str, str]
  too_late: Dict[str, str]


def _user_value(variable: str, environ: Mapping[str, str]) -> Optional[str]:
  if variable in environ:
    return environ[variable]
  if variable == MALLOC_MMAP_THRESHOLD:
    for tunable in environ.get('GLIBC_TUNABLES', '').split(':'):
      if tunable.startswith('glibc.malloc.mmap_threshold='):
        return 'GLIBC_TUNABLES=' + tunable
  return None


def apply(settings: Mapping[str, str],
          environ: Optional[MutableMapping[str, str]] = None,
          started: Optional[bool] = None) -> Applied:
  """Applies `settings` (module docstring: when, and never over the user's).

  Args:
    settings: {variable: value} (`kernel_policy.process_env`).
    environ: the environment to update (default `os.environ`; tests pass a
      dict, and then the mmap threshold is not applied to this process).
    started: whether TensorFlow's runtime has started (default:
      `runtime_started()`).

  Returns:
    An `Applied`.
  """
  this_process = environ is None
  environ = os.environ if environ is None else environ
  if started is None:
    started = runtime_started()
  if started:
    return Applied({}, {}, dict(settings))
  applied, kept = {}, {}
  for variable, value in settings.items():
    user = _user_value(variable, environ)
    if user is not None:
      kept[variable] = user
      continue
    environ[variable] = value
    if variable == MALLOC_MMAP_THRESHOLD and this_process:
      set_malloc_mmap_threshold(int(value))
    applied[variable] = value
  return Applied(applied, kept, {})


def describe(result: Applied) -> str:
  """One log line: what was applied, what the user's setting kept."""
  parts = []
  if result.applied:
    parts.append('set ' + ', '.join(f'{k}={v}' for k, v in
                                    sorted(result.applied.items())))
  if result.kept:
    parts.append('kept the environment\'s ' + ', '.join(
        f'{k}={v}' if not v.startswith('GLIBC_TUNABLES=') else v
        for k, v in sorted(result.kept.items())))
  if result.too_late:
    parts.append('not applied, TensorFlow\'s runtime had started: ' +
                 ', '.join(f'{k}={v}' for k, v in
                           sorted(result.too_late.items())))
  return 'Process settings: ' + ('; '.join(parts) if parts else 'none')
