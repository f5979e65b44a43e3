"""Generated demo data: cached per parameter set (installed by rename), every
file's size and SHA-256 verified before each use."""
import hashlib
import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Optional

from absl import logging

MANIFEST = 'COMPLETE.json'
_ABSENT = 'not generated yet'


def cache_root(cache_dir: str = '') -> str:
  """`cache_dir`, else $OFFICIAL_EXT_CACHE, else ~/.cache/official_ext."""
  return (cache_dir or os.environ.get('OFFICIAL_EXT_CACHE') or
          os.path.join(os.path.expanduser('~'), '.cache', 'official_ext'))


def cache_key(params: Dict[str, Any]) -> str:
  """16 hex digits of the SHA-256 of `params` (as sorted JSON)."""
  return hashlib.sha256(
      json.dumps(params, sort_keys=True).encode('utf-8')).hexdigest()[:16]


def _digest(path: str) -> str:
  sha = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      sha.update(block)
  return sha.hexdigest()


def _write_manifest(directory: str, params: Dict[str, Any]) -> None:
  files = {}
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    files[name] = {'bytes': os.path.getsize(path), 'sha256': _digest(path)}
  with open(os.path.join(directory, MANIFEST), 'w') as f:
    json.dump({'params': params, 'files': files}, f, sort_keys=True,
              indent=1)


def verify(directory: str, params: Dict[str, Any]) -> Optional[str]:
  """What is wrong with the cached data in `directory` (`_ABSENT`), or None."""
  manifest = os.path.join(directory, MANIFEST)
  if not os.path.exists(manifest):
    return _ABSENT
  try:
    with open(manifest) as f:
      recorded = json.load(f)
  except ValueError as e:
    return f'{manifest} does not parse ({e})'
  if not isinstance(recorded, dict) or not isinstance(
      recorded.get('files'), dict):
    return f'{manifest} records no file sizes and checksums'
  if recorded.get('params') != params:
    return f'{manifest} records other parameters'
  problems = []
  for name, entry in sorted(recorded['files'].items()):
    path = os.path.join(directory, name)
    if not os.path.exists(path):
      problems.append(f'{name} is missing')
    elif os.path.getsize(path) != entry.get('bytes'):
      problems.append(f'{name} has {os.path.getsize(path)} bytes, '
                      f'{entry.get("bytes")} were written')
    elif _digest(path) != entry.get('sha256'):
      problems.append(f'{name} has other bytes than were written (SHA-256)')
  extra = sorted(set(os.listdir(directory)) - set(recorded['files']) -
                 {MANIFEST})
  problems += [f'{name} was not written there' for name in extra]
  return '; '.join(problems[:5]) or None


def _install(tmp_dir: str, final_dir: str, params: Dict[str, Any]) -> None:
  """Renames `tmp_dir` to `final_dir` unless a sound one is there."""
  try:
    os.rename(tmp_dir, final_dir)
    return
  except OSError:
    pass
  if verify(final_dir, params) is None:  # Another process was first.
    return
  aside = f'{final_dir}.damaged-{os.getpid()}-{os.path.basename(tmp_dir)}'
  try:
    os.rename(final_dir, aside)
  except FileNotFoundError:
    pass
  os.rename(tmp_dir, final_dir)
  shutil.rmtree(aside, ignore_errors=True)


def ensure(root: str, params: Dict[str, Any], write: Callable[[str], Any],
           what: str) -> str:
  """`<root>/<cache_key(params)>` holding `write`'s data, verified; `what` names
  it in the log."""
  final_dir = os.path.join(root, cache_key(params))
  problem = verify(final_dir, params)
  if problem is None:
    return final_dir
  if problem != _ABSENT:
    logging.warning('The cached %s demo data in %s is damaged (%s): '
                    'generating it again.', what, final_dir, problem)
  os.makedirs(root, exist_ok=True)
  tmp_dir = tempfile.mkdtemp(prefix=f'.{cache_key(params)}.tmp-', dir=root)
  try:
    logging.info('Generating %s demo data %s into %s', what, params,
                 final_dir)
    write(tmp_dir)
    _write_manifest(tmp_dir, params)
    _install(tmp_dir, final_dir, params)
  finally:
    if os.path.exists(tmp_dir):
      shutil.rmtree(tmp_dir, ignore_errors=True)
  return final_dir
