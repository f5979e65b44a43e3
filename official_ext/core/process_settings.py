"""Process settings: what a family's process sets before TensorFlow starts.

Some settings that matter for a training step on CPU are read once, when
TensorFlow's runtime (or the C library) starts, so no config field can change
them later: TensorFlow's CPU allocator (`TF_CPU_ALLOCATOR_USE_BFC`) and
glibc malloc's mmap threshold (`MALLOC_MMAP_THRESHOLD_`). Each family
declares the settings its task runs best with, next to its task
(`declare(TaskConfigClass, {variable: value}, reason)`), and both
`python -m official_ext.train` and `python -m official_ext.benchmark` apply
the experiment's settings (`apply`) before TensorFlow's runtime starts, so
the benchmark figures are those a user's training run gets.

Rules of `apply`:

* Only before TensorFlow's runtime starts in this process (the allocator
  reads its variable then). Afterwards (e.g. inside a test process) nothing
  is set: a variable set now would change nothing here but leak into child
  processes.
* Never over the user's own setting: a variable already in the environment
  wins (for the mmap threshold also glibc's `GLIBC_TUNABLES`
  `glibc.malloc.mmap_threshold`).
* The variables are set in `os.environ`, so child processes inherit them;
  `MALLOC_MMAP_THRESHOLD_`, which glibc reads only at process start, is also
  applied to this process (`core.host_memory.set_malloc_mmap_threshold`).
* What was applied, and what the user's setting kept, is returned and
  logged by the callers (`describe`).

A multitask experiment gets the union of its tasks' settings; two tasks
asking for different values of one variable is an error naming both.
"""
import dataclasses
import os
from typing import Dict, Mapping, MutableMapping, Optional, Tuple

from official_ext.core import host_memory

MALLOC_MMAP_THRESHOLD = 'MALLOC_MMAP_THRESHOLD_'
BFC_ALLOCATOR = 'TF_CPU_ALLOCATOR_USE_BFC'
# The variables `apply` knows how to apply (a typo in a declaration fails).
KNOWN_VARIABLES = (BFC_ALLOCATOR, MALLOC_MMAP_THRESHOLD)


@dataclasses.dataclass(frozen=True)
class Declaration:
  """A task config class's process settings and the measurement behind them."""
  env: Tuple[Tuple[str, str], ...]
  reason: str


_DECLARED: Dict[type, Declaration] = {}


def declare(task_config_cls: type, env: Mapping[str, str],
            reason: str) -> Dict[str, str]:
  """Declares the process settings of tasks configured by `task_config_cls`.

  Args:
    task_config_cls: the family's task config class (e.g.
      `yt8m.configs.YT8MTask`).
    env: {variable: value}, variables of `KNOWN_VARIABLES`; {} declares that
      the family runs best with the defaults.
    reason: the measurement behind the choice (one line; logged).

  Returns:
    The settings, as a dict.

  Raises:
    ValueError: an unknown variable, a value that is not a string, or an mmap
      threshold outside glibc's range, naming the class and the variable.
  """
  name = task_config_cls.__name__
  for variable, value in env.items():
    if variable not in KNOWN_VARIABLES:
      raise ValueError(f'{name}: unknown process setting {variable!r}; one '
                       f'of {list(KNOWN_VARIABLES)}.')
    if not isinstance(value, str):
      raise ValueError(f'{name}: process setting {variable} must be a '
                       f'string (an environment value); got {value!r}.')
    if variable == MALLOC_MMAP_THRESHOLD and not (
        value.isdigit() and int(value) <= host_memory.MAX_THRESHOLD_BYTES):
      raise ValueError(f'{name}: {variable}={value!r} is not a byte count '
                       f'in 0..{host_memory.MAX_THRESHOLD_BYTES}.')
  _DECLARED[task_config_cls] = Declaration(tuple(sorted(env.items())), reason)
  return dict(env)


def declared(task_config_cls: type) -> Dict[str, str]:
  """The settings `task_config_cls` declared; {} where it declared none."""
  declaration = _DECLARED.get(task_config_cls)
  return dict(declaration.env) if declaration else {}


def _task_configs(params) -> Dict[str, object]:
  """{name: task config} of an experiment: `task`, or each task routine's."""
  routines = getattr(params.task, 'task_routines', None)
  if routines:
    return {f'task.task_routines[{i}] ({r.task_name})': r.task_config
            for i, r in enumerate(routines)}
  return {'task': params.task}


def for_experiment(params) -> Dict[str, str]:
  """The process settings of an experiment config (single or multitask).

  Raises:
    ValueError: two tasks of a multitask experiment declare different values
      of one variable (both named).
  """
  settings: Dict[str, str] = {}
  source: Dict[str, str] = {}
  for name, task_config in _task_configs(params).items():
    for variable, value in declared(type(task_config)).items():
      if variable in settings and settings[variable] != value:
        raise ValueError(
            f'process setting {variable}: {source[variable]} '
            f'({type(params.task).__name__}) declares {settings[variable]!r}'
            f', {name} ({type(task_config).__name__}) {value!r}; set '
            f'{variable} in the environment to choose.')
      settings[variable] = value
      source[variable] = name
  return settings


def runtime_started() -> bool:
  """Whether TensorFlow's eager runtime has started in this process."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  return context.context()._context_handle is not None  # pylint: disable=protected-access


@dataclasses.dataclass
class Applied:
  """What `apply` did: `applied` set by us, `kept` the user's own values of
  variables we would have set, `too_late` the settings not applied because
  TensorFlow's runtime had started."""
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
  """Applies `settings` (module docstring: when, and never over the user's).

  Args:
    settings: {variable: value} (`for_experiment`, `declared`).
    environ: the environment to update (default `os.environ`; tests pass a
      dict, and then the mmap threshold is not applied to this process).
    started: whether TensorFlow's runtime has started (default:
      `runtime_started()`).

  Returns:
    An `Applied`.
  """
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
      host_memory.set_malloc_mmap_threshold(int(value))
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
