"""Process settings the kernel policy takes, applied before TensorFlow starts
and never over the user's own."""
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
  """Fixes glibc malloc's mmap threshold; False without glibc."""
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
  """Checks settings {variable: value}; ValueError naming `source` and the
  variable."""
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
  """What `apply` did: `applied` (set), `kept` (the user's own values),
  `too_late` (TensorFlow's runtime had started)."""
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
  """Applies `settings` to `environ` before TensorFlow has `started`, never over
  a variable already set."""
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
