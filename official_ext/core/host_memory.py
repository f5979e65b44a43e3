"""Host-memory setting of the C allocator (glibc malloc), for big CPU steps.

TensorFlow's CPU allocator is the C library's malloc. glibc serves large
blocks with mmap (returned to the system on free) only above its mmap
threshold, which it raises on its own (up to 32 MiB on 64-bit) each time such
a block is freed; from then on tensors below the raised threshold come from
the heap arenas, which keep freed memory and fragment. A training step whose
tensors are mostly 1-64 MiB (AssembleNet++lite at 224^2) then holds far more
resident memory than it has live tensors. `set_malloc_mmap_threshold` fixes
the threshold (which also stops glibc from raising it): every block of at
least that size is mmapped and given back when freed.

An AssembleNet++lite step of 2 clips x 32 x 224^2 with recompute_grad (the
memory child of benchmarks/assemblenet.py) peaks at 5.83 GB RSS with
glibc's default, 4.75 GB with a fixed 1 MiB threshold (set through the
environment, MALLOC_MMAP_THRESHOLD_).
"""
import ctypes
import ctypes.util

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
