"""core.kernels.process_settings: the glibc malloc mmap threshold setting.

Setting it changes a process's allocator for the rest of its life, so the
threshold is set in child processes, where glibc's own statistics
(`mallinfo2`: the number of mmapped blocks) show whether it took effect.
"""
import ctypes
import ctypes.util
import json
import os
import subprocess
import sys

import pytest

from official_ext.core.kernels import process_settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# Frees an 8 MiB mmapped block (glibc then raises its dynamic threshold to
# 8 MiB) and allocates 2 MiB: mmapped only below a fixed, lower threshold.
_CHILD = r'''
import ctypes, ctypes.util, json, sys
from official_ext.core.kernels import process_settings

class Mallinfo2(ctypes.Structure):
  _fields_ = [(n, ctypes.c_size_t) for n in (
      'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks',
      'uordblks', 'fordblks', 'keepcost')]

libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
result = {}
threshold = json.loads(sys.argv[1])
if threshold is not None:
  result['set'] = process_settings.set_malloc_mmap_threshold(threshold)
libc.free(libc.malloc(8 << 20))
before = libc.mallinfo2().hblks
block = libc.malloc(2 << 20)
result['mmapped'] = libc.mallinfo2().hblks - before
libc.free(block)
print('RESULT ' + json.dumps(result))
'''


def _child(threshold=None):
  libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
  if not hasattr(libc, 'mallinfo2'):
    pytest.skip('the C library has no mallinfo2 (glibc >= 2.33)')
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep +
             os.environ.get('PYTHONPATH', ''))
  env.pop('MALLOC_MMAP_THRESHOLD_', None)
  env.pop('GLIBC_TUNABLES', None)
  proc = subprocess.run(
      [sys.executable, '-c', _CHILD, json.dumps(threshold)],
      env=env, capture_output=True, text=True, check=False, timeout=120)
  lines = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')]
  assert proc.returncode == 0 and lines, proc.stderr[-3000:]
  return json.loads(lines[-1][len('RESULT '):])


def test_the_fixed_threshold_mmaps_every_block_above_it():
  # glibc's default: the threshold follows the freed 8 MiB block up, and the
  # 2 MiB block comes from the heap arenas (kept when freed).
  assert _child() == {'mmapped': 0}
  # Fixed at 1 MiB: the 2 MiB block is mmapped (given back when freed).
  assert _child(1 << 20) == {'set': True, 'mmapped': 1}
  # Fixed at 4 MiB: a threshold, the 2 MiB block comes from the heap.
  assert _child(4 << 20) == {'set': True, 'mmapped': 0}


class _FakeLibc:
  """A C library whose `mallopt` (if any) answers `answer`."""

  def __init__(self, answer=None):
    if answer is not None:
      self.mallopt = lambda param, value: answer


def test_a_value_the_c_library_refuses_is_an_error(monkeypatch):
  monkeypatch.setattr(process_settings.ctypes, 'CDLL', lambda name: _FakeLibc(0))
  with pytest.raises(RuntimeError,
                     match=r'mallopt\(M_MMAP_THRESHOLD, 1048576\) failed'):
    process_settings.set_malloc_mmap_threshold(1 << 20)


def test_without_mallopt_nothing_is_set(monkeypatch):
  monkeypatch.setattr(process_settings.ctypes, 'CDLL', lambda name: _FakeLibc())
  assert process_settings.set_malloc_mmap_threshold(1 << 20) is False


@pytest.mark.parametrize('value', [-1, (32 << 20) + 1])
def test_threshold_outside_glibc_range_is_refused(value):
  with pytest.raises(ValueError, match=f'0..33554432 bytes .* got {value}'):
    process_settings.set_malloc_mmap_threshold(value)
