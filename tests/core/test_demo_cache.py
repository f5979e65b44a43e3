"""The demo-data cache (official_ext.core.input.demo_cache): verified before use.

The rules on a toy generator, then the readout family's cache (the YT8M
family's: tests/yt8m/test_demo_data.py).
"""
import glob
import json
import os

from official_ext.core.input import demo_cache
from official_ext.readout import demo_data as readout_demo_data
from tests.readout.test_train import _params as _readout_params

_PARAMS = {'seed': 3, 'size': 64}


def _write(directory):
  for name in ('a.bin', 'b.bin'):
    with open(os.path.join(directory, name), 'wb') as f:
      f.write(bytes(range(_PARAMS['size'])) + name.encode())


def _ensure(root, calls):
  def write(directory):
    calls.append(directory)
    _write(directory)
  return demo_cache.ensure(str(root), _PARAMS, write, 'toy')


def test_every_file_is_recorded_and_checked(tmp_path, caplog):
  caplog.set_level('INFO', logger='absl')
  calls = []
  directory = _ensure(tmp_path, calls)
  assert directory == os.path.join(str(tmp_path),
                                   demo_cache.cache_key(_PARAMS))
  with open(os.path.join(directory, demo_cache.MANIFEST)) as f:
    manifest = json.load(f)
  assert manifest['params'] == _PARAMS
  assert sorted(manifest['files']) == ['a.bin', 'b.bin']
  assert manifest['files']['a.bin']['bytes'] == 69
  assert len(calls) == 1
  assert _ensure(tmp_path, calls) == directory and len(calls) == 1  # Cached.
  damages = {
      'truncated': lambda p: open(p, 'r+b').truncate(10),
      'flipped': lambda p: open(p, 'r+b').write(b'\xff'),
      'deleted': os.remove,
  }
  expected = {'truncated': 'a.bin has 10 bytes, 69 were written',
              'flipped': 'a.bin has other bytes than were written',
              'deleted': 'a.bin is missing'}
  for kind, damage in damages.items():
    damage(os.path.join(directory, 'a.bin'))
    caplog.clear()
    assert _ensure(tmp_path, calls) == directory
    assert expected[kind] in caplog.text, kind
    assert demo_cache.verify(directory, _PARAMS) is None
  # A file the manifest does not list (a stray shard a glob would read).
  open(os.path.join(directory, 'c.bin'), 'wb').close()
  assert demo_cache.verify(directory, _PARAMS) == 'c.bin was not written there'
  _ensure(tmp_path, calls)
  assert sorted(os.listdir(directory)) == ['COMPLETE.json', 'a.bin', 'b.bin']
  # A COMPLETE.json without the file list cannot vouch for anything.
  with open(os.path.join(directory, demo_cache.MANIFEST), 'w') as f:
    json.dump(_PARAMS, f)
  assert 'records no file sizes' in demo_cache.verify(directory, _PARAMS)
  assert len(calls) == 5
  _ensure(tmp_path, calls)
  assert len(calls) == 6
  assert sorted(os.listdir(tmp_path)) == [demo_cache.cache_key(_PARAMS)]


def test_readout_demo_cache_regenerates_a_deleted_shard(tmp_path, caplog):
  caplog.set_level('INFO', logger='absl')
  task = _readout_params(tmp_path / 'cache').task
  pattern = readout_demo_data.demo_split_pattern(task, 'train')
  shard = sorted(glob.glob(pattern))[0]
  with open(shard, 'rb') as f:
    original = f.read()
  os.remove(shard)
  assert readout_demo_data.demo_split_pattern(task, 'train') == pattern
  with open(shard, 'rb') as f:
    assert f.read() == original
  assert f'{os.path.basename(shard)} is missing' in caplog.text
