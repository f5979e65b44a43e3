"""Type and runtime checks of experiment configs after files and overrides."""
import dataclasses
import typing
from typing import Any, List, Optional, Tuple

from official.modeling import hyperparams
from official_ext.core.kernels import kernel_policy

_SCALARS = (bool, int, float, str, type(None))


def _expected(annotation) -> Optional[Tuple[Tuple[type, ...], Any]]:
  """(allowed scalar types, element type), or None: not checked."""
  if annotation in _SCALARS:
    return (annotation,), None
  origin = typing.get_origin(annotation)
  args = typing.get_args(annotation)
  if origin is typing.Union:
    scalars, element = [], None
    for arg in args:
      sub = _expected(arg)
      if sub is None:
        return None
      scalars.extend(sub[0])
      element = element or sub[1]
    return tuple(scalars), element
  if origin in (tuple, list) or (origin is not None and getattr(
      origin, '__name__', '') == 'Sequence'):
    elements = [a for a in args if a is not Ellipsis]
    if len(set(elements)) != 1 or elements[0] not in _SCALARS:
      return None
    return (tuple, list), elements[0]
  return None


def _type_names(types) -> str:
  names = []
  for t in types:
    name = 'None' if t is type(None) else t.__name__
    if name not in names:
      names.append(name)
  return ' or '.join(names)


def _ok(value, allowed: Tuple[type, ...]) -> bool:
  if isinstance(value, bool):
    return bool in allowed  # bool is an int subclass: True is not an int.
  if isinstance(value, int) and float in allowed:
    return True  # An int where a float is expected (YAML `1`).
  return isinstance(value, allowed)


_NO_BASELINE = object()


def _errors(config: hyperparams.Config, path: str, baseline: Any
            ) -> List[str]:
  errors = []
  try:
    hints = typing.get_type_hints(type(config))
  except Exception:  # pylint: disable=broad-except
    hints = {}
  for field in dataclasses.fields(config):
    key = f'{path}.{field.name}' if path else field.name
    value = getattr(config, field.name, None)
    base = getattr(baseline, field.name, _NO_BASELINE)
    if isinstance(value, hyperparams.Config):
      errors.extend(_errors(value, key, base))
      continue
    if _configs(value):
      # A sequence of configs (e.g. a multitask experiment's
      # `task.task_routines`): each element, against the baseline's element
      # at the same position when there is one.
      for i, element in enumerate(value):
        element_base = (base[i] if _configs(base) and i < len(base)
                        else _NO_BASELINE)
        errors.extend(_errors(element, f'{key}[{i}]', element_base))
      continue
    if base is not _NO_BASELINE and _same(value, base):
      continue  # As registered: not from a config file or override.
    expected = _expected(hints.get(field.name, field.type))
    if expected is None:
      continue
    allowed, element = expected
    if not _ok(value, allowed):
      what = _type_names(allowed)
      if element is not None:
        what = what.replace('tuple or list', f'a list of {element.__name__}')
      errors.append(f'{key}: expected {what}, got {value!r} '
                    f'({type(value).__name__}).')
    elif element is not None and isinstance(value, (tuple, list)):
      for i, item in enumerate(value):
        if not _ok(item, (element,)):
          errors.append(f'{key}[{i}]: expected {element.__name__}, got '
                        f'{item!r} ({type(item).__name__}).')
  return errors


def _configs(value) -> bool:
  return (isinstance(value, (tuple, list)) and bool(value) and
          all(isinstance(v, hyperparams.Config) for v in value))


def _same(a, b) -> bool:
  if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
    return list(a) == list(b)
  return type(a) is type(b) and a == b


def check_types(config: hyperparams.Config,
                baseline: Optional[hyperparams.Config] = None) -> None:
  """ValueError listing every field of the wrong type (key, type, value).

  A field equal to `baseline`'s (the registered experiment) is not checked.
  """
  errors = _errors(config, '',
                   _NO_BASELINE if baseline is None else baseline)
  if errors:
    raise ValueError('Config value(s) of the wrong type (from --config_file / '
                     '--params_override?):\n  ' + '\n  '.join(errors))


# `runtime.mixed_precision_dtype`: the values Model Garden's
# `performance.set_mixed_precision_policy` takes ('' or None: float32), and
# Keras' policy names, taken as aliases of Model Garden's.
MIXED_PRECISION_DTYPES = ('float32', 'float16', 'bfloat16')
MIXED_PRECISION_ALIASES = {'mixed_float16': 'float16',
                           'mixed_bfloat16': 'bfloat16'}


def mixed_precision_dtype(runtime) -> Optional[str]:
  """`runtime.mixed_precision_dtype` if Model Garden takes it, else ValueError.
  """
  value = runtime.mixed_precision_dtype
  if value in (None, '') or value in MIXED_PRECISION_DTYPES:
    return value or None
  hint = ''
  if value in MIXED_PRECISION_ALIASES:
    hint = (f' (the Keras name of {MIXED_PRECISION_ALIASES[value]!r}: a '
            'config parsed by `official_ext.train` takes it as that)')
  raise ValueError(
      f'runtime.mixed_precision_dtype={value!r} is not a precision Model '
      f'Garden takes{hint}; expected one of {list(MIXED_PRECISION_DTYPES)}, '
      f'or the Keras names {list(MIXED_PRECISION_ALIASES)}.')


def check_runtime(params) -> None:
  """Checks the precision (Keras aliases replaced) and the kernel policy."""
  runtime = params.runtime
  value = runtime.mixed_precision_dtype
  if value in MIXED_PRECISION_ALIASES:
    runtime.mixed_precision_dtype = MIXED_PRECISION_ALIASES[value]
  mixed_precision_dtype(runtime)
  kernel_policy.setting_of(params)
