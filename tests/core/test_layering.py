"""The layout's one-way rules, and one implementation per shared concern.

docs/architecture.md: families import `core/`, never each other and never the
package's top level (`registry_imports`, the CLIs); the harness
(`benchmarks/`, the CLIs) imports families, never the reverse; within a family
data flows one way, config -> dataloader -> model -> task -> export (configs
import no dataloader or model, a dataloader no model, ...); no import cycle;
TensorFlow's private modules only through `core.tf_internals`; what two
families need lives once in `core/`. Checked on the import statements and
calls of the source.
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


def _module_name(path):
  rel = os.path.relpath(path, os.path.join(ROOT, '..'))[:-len('.py')]
  name = rel.replace(os.sep, '.')
  return name[:-len('.__init__')] if name.endswith('.__init__') else name


def _import_graph():
  """{module: the package's modules it imports (anywhere in the file)}."""
  paths = {_module_name(p): p for p in _modules('')}
  graph = {}
  for name, path in paths.items():
    graph[name] = {i for i in _imports(path) if i in paths and i != name}
  return graph


def _reachable(graph, name):
  seen, todo = set(), [name]
  while todo:
    for dep in graph[todo.pop()]:
      if dep not in seen:
        seen.add(dep)
        todo.append(dep)
  return seen


# A family's rooms in the order data flows through them.
STAGES = ('configs', 'dataloader', 'modeling', 'task', 'export')


def _stage(module):
  """(family, index in STAGES) of a stage module, else None."""
  parts = module.split('.')
  if (len(parts) >= 3 and parts[0] == 'official_ext' and
      parts[1] in FAMILIES + ('joint',) and parts[2] in STAGES):
    return parts[1], STAGES.index(parts[2])
  return None


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


@pytest.mark.parametrize('family', FAMILIES + ('joint',))
def test_data_flows_one_way(family):
  """No stage imports a later one, directly or through other modules:
  configs import no dataloader or model, a dataloader no model, a model no
  task, a task no export (of any family: joint/ joins the families')."""
  graph = _import_graph()
  bad = []
  for module in sorted(graph):
    stage = _stage(module)
    if not stage or stage[0] != family:
      continue
    later = sorted(d for d in _reachable(graph, module)
                   if _stage(d) and _stage(d)[1] > stage[1])
    if later:
      bad.append(f'{module} ({STAGES[stage[1]]}) imports {later}')
  assert any(_stage(m) == (family, 0) for m in graph), family
  assert not bad, '\n'.join(bad)


def test_no_import_cycle():
  """The package's modules import each other without a cycle (an import
  inside a function counts: it would only hide one)."""
  graph = _import_graph()
  for module in sorted(graph):
    reachable = _reachable(graph, module)
    assert module not in reachable, (
        f'{module} imports itself through '
        f'{sorted(d for d in reachable if module in _reachable(graph, d))}')


def test_the_library_imports_no_module_by_name():
  """Families, `core/` and `joint/` import with import statements, which the
  tests above see; `importlib` only in `core.tf_internals` (TensorFlow's
  private modules, after its version check)."""
  users = sorted(os.path.relpath(p, ROOT) for f in FAMILIES + ('core', 'joint')
                 for p in _modules(f)
                 if any(n == 'importlib' or n.startswith('importlib.')
                        for n in _imports(p)))
  assert users == [os.path.join('core', 'tf_internals.py')], users


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
  """The families' generated data is cached by core.input.demo_cache alone (its
  manifest is written and checked there)."""
  users = sorted(os.path.relpath(p, ROOT) for f in FAMILIES
                 for p in _modules(f) if 'COMPLETE.json' in open(p).read())
  assert not users, users


@pytest.mark.parametrize('family', FAMILIES)
def test_one_demo_data_hook_name(family):
  """Each task's `build_inputs` takes its demo data through one hook name,
  `_resolve_input_path`."""
  path = os.path.join(ROOT, family, 'task.py')
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  methods = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
  assert '_resolve_input_path' in methods and '_resolve' not in methods
  assert '_resolve_input_path' in set(_calls_in(methods['build_inputs']))


def _calls_in(function):
  for node in ast.walk(function):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      yield node.func.attr
