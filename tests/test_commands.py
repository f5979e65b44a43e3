"""Every command exits 0 exactly when it did what was asked, and starts
without importing Keras 3 (its `tf.keras` is tf_keras).

`absl.app.run(main)` prints what `main` returns and exits 1 unless it is
None: every `main` a module hands to `app.run` returns nothing. The Beam
pipelines' exit status in a real process: tests/assemblenet/
test_beam_pipelines.py.
"""
import ast
import os
import pathlib
import re
import subprocess
import sys
from typing import Iterator, List, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _returns(function: ast.FunctionDef) -> Iterator[ast.Return]:
  """The return statements of `function` itself (not of nested ones)."""
  stack = list(function.body)
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                         ast.ClassDef)):
      continue
    if isinstance(node, ast.Return):
      yield node
    stack.extend(ast.iter_child_nodes(node))


def _commands() -> List[Tuple[str, str, ast.Module]]:
  """(file, function name, module) of every `app.run(f)` in the package and
  scripts/."""
  found = []
  for path in sorted([*(ROOT / 'official_ext').rglob('*.py'),
                      *(ROOT / 'scripts').glob('*.py')]):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
      if (isinstance(node, ast.Call) and ast.unparse(node.func) == 'app.run'
          and node.args and isinstance(node.args[0], ast.Name)):
        found.append((str(path.relative_to(ROOT)), node.args[0].id, tree))
  return found


def test_every_main_given_to_app_run_returns_none():
  commands = _commands()
  files = {f for f, _, _ in commands}
  assert {'official_ext/train.py',
          'official_ext/assemblenet/beam_pipelines.py',
          'scripts/assemblenet_videos_to_tfrecord.py',
          'scripts/nwb_to_readout.py'} <= files, files
  wrong = []
  for path, name, tree in commands:
    functions = [n for n in tree.body
                 if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(functions) == 1, f'{path}: app.run({name}) but no def {name}'
    for ret in _returns(functions[0]):
      if ret.value is not None and not (
          isinstance(ret.value, ast.Constant) and ret.value.value is None):
        wrong.append(f'{path}:{ret.lineno}: {name} returns '
                     f'{ast.unparse(ret.value)}')
  assert not wrong, ('app.run prints the value and exits 1:\n' +
                     '\n'.join(wrong))


_LEGACY = "os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')"


def test_every_script_chooses_tf_keras_before_its_imports():
  """A script under scripts/ is not started with `-m` (official_ext's
  __init__ chooses for those): it sets the variable before it imports
  anything but `os`."""
  for path, _, tree in _commands():
    if not path.startswith('scripts/'):
      continue
    first = [ast.unparse(node) for node in tree.body
             if not isinstance(node, ast.Expr) or
             not isinstance(node.value, ast.Constant)][:2]
    assert first == ['import os', _LEGACY], (path, first)


def _imported(args: List[str]) -> set:
  """The top-level packages a real process imports (`-X importtime`) when
  run with `args --help` (absl's help exits 1)."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', PYTHONPATH=os.pathsep.join(
      [str(ROOT)] + os.environ.get('PYTHONPATH', '').split(os.pathsep)))
  env.pop('TF_USE_LEGACY_KERAS', None)
  run = subprocess.run([sys.executable, '-X', 'importtime', *args, '--help'],
                       cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300, check=False)
  assert run.returncode in (0, 1) and 'flags' in run.stdout, (
      run.stderr[-3000:])
  return {name.split('.')[0] for name in
          re.findall(r'^import time:.*\|\s*([\w.]+)$', run.stderr, re.M)}


@pytest.mark.parametrize('args', [
    ['-m', 'official_ext.assemblenet.predict'],
    ['scripts/nwb_to_readout.py']], ids=lambda a: a[-1])
def test_commands_start_without_keras_3(args):
  imported = _imported(args)
  assert 'tensorflow' in imported
  assert not imported & {'keras', 'sklearn'}, imported & {'keras', 'sklearn'}


def test_importing_the_package_leaves_the_users_keras_alone():
  run = subprocess.run(
      [sys.executable, '-c', 'import os, official_ext; '
       "print(os.environ.get('TF_USE_LEGACY_KERAS'))"],
      cwd=ROOT, env={k: v for k, v in os.environ.items()
                     if k != 'TF_USE_LEGACY_KERAS'},
      capture_output=True, text=True, check=True)
  assert run.stdout.strip() == 'None'
