"""Every command exits 0 exactly when it did what was asked.

`absl.app.run(main)` prints what `main` returns and exits 1 unless it is
None: every `main` a module hands to `app.run` returns nothing. The Beam
pipelines' exit status in a real process: tests/assemblenet/
test_beam_pipelines.py.
"""
import ast
import pathlib
from typing import Iterator, List, Tuple

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
