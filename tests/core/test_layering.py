"""The layout's one-way rules, and one implementation per shared concern.

DESIGN.md: families import `core/`, never each other and never the package's
top level (`registry_imports`, the CLIs); the harness (`benchmarks/`, the
CLIs) imports families, never the reverse; what two families need lives once
in `core/`. Checked on the import statements and calls of the source.
"""
import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', 'official_ext')
FAMILIES = ('yt8m', 'assemblenet', 'readout')
TOP_LEVEL = ('official_ext.registry_imports', 'official_ext.train',
             'official_ext.export_saved_model', 'official_ext.export_tflite',
             'official_ext.benchmark',
             'official_ext.benchmarks')


def _modules(folder):
  for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
    for name in names:
      if name.endswith('.py'):
        yield os.path.join(dirpath, name)


def _imports(path):
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield alias.name
    elif isinstance(node, ast.ImportFrom) and node.module:
      yield node.module
      for alias in node.names:
        yield f'{node.module}.{alias.name}'


def _calls(path):
  """Names of the functions and methods called, but `gradients.<name>`."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      func = node.func
      if isinstance(func, ast.Attribute):
        if not (isinstance(func.value, ast.Name) and
                func.value.id == 'gradients'):
          yield func.attr
      elif isinstance(func, ast.Name):
        yield func.id


@pytest.mark.parametrize('family', FAMILIES)
def test_a_family_imports_core_only(family):
  bad = []
  for path in _modules(family):
    for name in _imports(path):
      others = [f for f in FAMILIES if f != family]
      if (any(name == f'official_ext.{o}' or
              name.startswith(f'official_ext.{o}.') for o in others) or
          any(name == t or name.startswith(t + '.') for t in TOP_LEVEL) or
          name in ('official_ext.joint',) or
          name.startswith('official_ext.joint.')):
        bad.append(f'{os.path.relpath(path, ROOT)} imports {name}')
  assert not bad, '\n'.join(bad)


def test_only_tf_internals_imports_tensorflows_private_modules():
  """TensorFlow's private modules (anything imported from inside
  `tensorflow`, e.g. `tensorflow.python.eager.record`) are used through
  `core.tf_internals` alone, which checks the TensorFlow version first."""
  scripts = os.path.join(ROOT, '..', 'scripts')
  paths = [p for f in FAMILIES + ('core', 'joint', 'benchmarks')
           for p in _modules(f)]
  paths += [os.path.join(ROOT, n) for n in os.listdir(ROOT) if n.endswith('.py')]
  paths += [os.path.join(scripts, n) for n in os.listdir(scripts)
            if n.endswith('.py')]
  bad = [f'{os.path.relpath(p, ROOT)} imports {n}' for p in paths
         for n in _imports(p) if n.startswith('tensorflow.')
         and not p.endswith(os.path.join('core', 'tf_internals.py'))]
  assert len(paths) > 20
  assert not bad, '\n'.join(bad)


def test_core_imports_no_family():
  bad = [f'{os.path.relpath(p, ROOT)} imports {n}'
         for p in _modules('core') for n in _imports(p)
         if any(n == f'official_ext.{f}' or n.startswith(f'official_ext.{f}.')
                for f in FAMILIES + ('joint', 'benchmarks'))]
  assert not bad, '\n'.join(bad)


@pytest.mark.parametrize('call', [
    'get_scaled_loss', 'get_unscaled_gradients', 'clip_by_global_norm',
    'apply_gradients'])
def test_one_gradient_path(call):
  """Loss scaling, unscaling, clipping and applying happen in core.gradients
  only (every task's train step calls it)."""
  users = sorted(os.path.relpath(p, ROOT) for folder in FAMILIES + ('joint',)
                 for p in _modules(folder) if call in set(_calls(p)))
  users = [u for u in users if not u.startswith('benchmarks')]
  assert not users, f'{call} called outside core.gradients: {users}'


def test_yaml_is_parsed_with_a_safe_loader():
  """Where the project parses YAML itself (the package, scripts/) it uses
  yaml.safe_load or a SafeLoader; Model Garden loads config files with its
  own loader (yaml.FullLoader)."""
  unsafe = ('load', 'load_all', 'full_load', 'full_load_all', 'unsafe_load',
            'unsafe_load_all')
  scripts = os.path.join(ROOT, '..', 'scripts')
  paths = [p for f in FAMILIES + ('core', 'joint', 'benchmarks')
           for p in _modules(f)]
  paths += [os.path.join(ROOT, n) for n in os.listdir(ROOT) if n.endswith('.py')]
  paths += [os.path.join(scripts, n) for n in os.listdir(scripts)
            if n.endswith('.py')]
  bad = []
  for path in paths:
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and isinstance(node.func.value, ast.Name) and
          node.func.value.id == 'yaml' and node.func.attr in unsafe):
        loader = [ast.unparse(k.value) for k in node.keywords
                  if k.arg == 'Loader']
        if not loader or 'SafeLoader' not in loader[0]:
          bad.append(f'{os.path.relpath(path, ROOT)}:{node.lineno} '
                     f'yaml.{node.func.attr} with Loader={loader}')
  assert len(paths) > 20
  assert not bad, '\n'.join(bad)


def test_one_demo_data_cache():
  """The families' generated data is cached by core.demo_cache alone (its
  manifest is written and checked there)."""
  users = sorted(os.path.relpath(p, ROOT) for f in FAMILIES
                 for p in _modules(f) if 'COMPLETE.json' in open(p).read())
  assert not users, users
