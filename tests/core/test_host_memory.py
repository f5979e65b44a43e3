"""core.host_memory: the glibc malloc mmap threshold setting.

Setting it would change this (pytest) process's allocator for the rest of the
suite, so the tests check the refusal and that glibc's `mallopt` is found;
the benchmark's memory child sets it (benchmarks/assemblenet.py).
"""
import ctypes
import ctypes.util

import pytest

from official_ext.core import host_memory


@pytest.mark.parametrize('value', [-1, (32 << 20) + 1])
def test_threshold_outside_glibc_range_is_refused(value):
  with pytest.raises(ValueError, match=f'0..33554432 bytes .* got {value}'):
    host_memory.set_malloc_mmap_threshold(value)


def test_mallopt_is_found_on_glibc():
  libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
  assert hasattr(libc, 'mallopt')
  assert host_memory.M_MMAP_THRESHOLD == -3
  assert host_memory.DEFAULT_THRESHOLD_BYTES == 1 << 20
