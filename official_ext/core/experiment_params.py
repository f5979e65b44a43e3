"""The one way an experiment's config is loaded, by every CLI
(docs/architecture.md, "Loading an experiment")."""
import os
import pprint
from typing import Any, Dict, Optional, Sequence

from absl import flags
from absl import logging
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import config_definitions
from official.core import exp_factory
from official.core import train_utils
from official.modeling import hyperparams
from official.modeling.hyperparams import params_dict
from official_ext.core import config_checks
from official_ext.core import config_comparison
from official_ext.core import tf_internals

PARAMS_YAML = 'params.yaml'


def find_params_yaml(path: Optional[str]) -> Optional[str]:
  """The params.yaml beside a model_dir, checkpoint or SavedModel, or None."""
  if not path:
    return None
  directory = path if tf.io.gfile.isdir(path) else os.path.dirname(path)
  candidate = os.path.join(directory, PARAMS_YAML)
  return candidate if tf.io.gfile.exists(candidate) else None


def _fill_fields_added_later(config: Any, written: Dict[str, Any],
                             typed: Any) -> None:
  """Sets the fields `written` lacks to `PARAMS_YAML_DEFAULTS`."""
  for key, value in (getattr(type(typed), 'PARAMS_YAML_DEFAULTS', None)
                     or {}).items():
    if key not in written:
      config.override({key: value}, is_strict=True)
  for key, section in written.items():
    child, typed_child = getattr(config, key, None), getattr(typed, key, None)
    if isinstance(child, hyperparams.Config) and isinstance(section, dict):
      _fill_fields_added_later(child, section, typed_child)
    elif isinstance(child, (list, tuple)) and isinstance(section, list):
      for item, item_section, typed_item in zip(child, section,
                                                typed_child or ()):
        if (isinstance(item, hyperparams.Config) and
            isinstance(item_section, dict)):
          _fill_fields_added_later(item, item_section, typed_item)


def override_with_params_yaml(params, params_yaml: str, typed=None):
  """`params` overridden strictly by a trained model's params.yaml.

  Fields the file lacks take `PARAMS_YAML_DEFAULTS`, read from `typed`'s classes
  (default `params`).
  """
  params = hyperparams.override_params_dict(params, params_yaml,
                                            is_strict=True)
  written = params_dict.read_yaml_to_params_dict(params_yaml).as_dict()
  _fill_fields_added_later(params, written,
                           params if typed is None else typed)
  return params


def load_trained_config(params, params_yaml: str):
  """`params_yaml` over a fresh copy of `params`' class; ValueError if unfit."""
  trained = type(params)(params.as_dict())
  try:
    return override_with_params_yaml(trained, params_yaml, typed=params)
  except (KeyError, ValueError, TypeError, AttributeError) as e:
    raise ValueError(
        f'{params_yaml} does not fit the config of this experiment '
        f'({type(params).__name__}): {e!r}') from e


def _unknown_key(params, config_file: str) -> Optional[str]:
  """'key.path: ' of the first key of `config_file` that `params` lacks."""
  try:
    overrides = params_dict.read_yaml_to_params_dict(config_file).as_dict()
  except Exception:  # pylint: disable=broad-except
    return None

  def walk(new, old, path):
    if isinstance(new, dict) and isinstance(old, dict):
      for key, value in new.items():
        if key not in old:
          return path + [str(key)]
        found = walk(value, old[key], path + [str(key)])
        if found:
          return found
    elif isinstance(new, list) and isinstance(old, list):
      for i, (a, b) in enumerate(zip(new, old)):
        found = walk(a, b, path[:-1] + [f'{path[-1]}[{i}]'] if path else path)
        if found:
          return found
    return None

  found = walk(overrides, params.as_dict(), [])
  return f"{'.'.join(found)}: " if found else None


class ExperimentParser(train_utils.ExperimentParser):
  """Model Garden's `ExperimentParser` with the trained model's params.yaml.

  `flags_obj`: absl FLAGS or a `ParseConfigOptions`; `checkpoint_path`: the
  trained model, or None.
  """

  def __init__(self, flags_obj, checkpoint_path: Optional[str] = None):
    super().__init__(flags_obj)
    self.params_yaml = find_params_yaml(checkpoint_path)
    self._checkpoint_path = checkpoint_path
    self.trained: Optional[Dict[str, Any]] = None

  def base_experiment(self):
    params = super().base_experiment()
    experiment = self._flags_obj.experiment
    if self.params_yaml:
      try:
        params = override_with_params_yaml(params, self.params_yaml)
      except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(
            f'{self.params_yaml} (the config the checkpoint was trained with) '
            f'does not fit experiment {experiment!r}: {e!r}. Pass the '
            '--experiment the model was trained with.') from e
      logging.info('Using the trained config %s (then --config_file / '
                   '--params_override on top).', self.params_yaml)
      self.trained = config_comparison.config_leaves(params)
    elif self._checkpoint_path:
      logging.warning(
          'No %s next to %s: the model is built from --experiment=%s and the '
          'flags only; pass the config it was trained with.', PARAMS_YAML,
          self._checkpoint_path, experiment)
    return params

  def parse_config_file(self, params):
    """Model Garden's step; an unknown key names the key and the file."""
    for config_file in self._flags_obj.config_file or []:
      try:
        params = hyperparams.override_params_dict(params, config_file,
                                                  is_strict=True)
      except KeyError as e:
        raise KeyError(
            f'--config_file {config_file}: '
            f'{_unknown_key(params, config_file) or ""}{e.args[0]}') from e
    return params

  def parse_params_override(self, params):
    """Model Garden's step; an unknown key names --params_override."""
    try:
      return super().parse_params_override(params)
    except KeyError as e:
      raise KeyError(f'--params_override: {e.args[0]}') from e

  def parse_runtime(self, params):
    """`--tpu` only when given (params.yaml's `runtime.tpu` otherwise stays)."""
    if getattr(self._flags_obj, 'tpu', None):
      return super().parse_runtime(params)
    return params

  def parse_data_service(self, params):
    """`--tf_data_service` for every task's data, multitask included."""
    address = getattr(self._flags_obj, 'tf_data_service', None)
    routines = getattr(params.task, 'task_routines', None)
    if not address or routines is None:
      return super().parse_data_service(params)
    data = {'train_data': {'tf_data_service_address': address},
            'validation_data': {'tf_data_service_address': address}}
    params.override({'task': {'task_routines': [
        {'task_config': data} for _ in routines]}}, is_strict=True)
    return params


def parse_flags(flags_obj, checkpoint_path: Optional[str] = None,
                lock: bool = True) -> config_definitions.ExperimentConfig:
  """The checked, validated config from the CLI's flags (or their options).

  `checkpoint_path`: a trained model whose params.yaml to start from.

  Raises:
    ValueError: a flag contradicts params.yaml in a model-affecting key,
      params.yaml does not fit, a value has the wrong type, or a restriction
      fails (each naming the key and values).
    KeyError: a flag names an unknown key (naming it and its file).
  """
  # The package's functions traced as written (docs/architecture.md#autograph).
  tf_internals.exclude_from_autograph()
  parser = ExperimentParser(flags_obj, checkpoint_path=checkpoint_path)
  params = parser.parse()
  if parser.trained is not None:
    differences = config_comparison.contradictions(
        parser.trained, config_comparison.config_leaves(params))
    if differences:
      lines = config_comparison.describe(differences, parser.params_yaml,
                                         'the flags')
      raise ValueError(
          f'--config_file/--params_override contradict the config the '
          f'checkpoint was trained with in {len(differences)} model-affecting '
          f'key(s):\n  {lines}\nDrop these flags (params.yaml is read '
          'automatically), or export a checkpoint trained with them.')
  config_checks.check_types(
      params, baseline=exp_factory.get_exp_config(flags_obj.experiment))
  config_checks.check_runtime(params)
  params.validate()
  if lock:
    params.lock()
  # The whole config is in model_dir/params.yaml (training writes it); the
  # dump is for --verbosity=1.
  logging.vlog(1, 'Final experiment parameters:\n%s',
               pprint.PrettyPrinter().pformat(params.as_dict()))
  return params


def load_params(experiment: str,
                config_files: Sequence[str] = (),
                params_override: str = '',
                checkpoint_path: Optional[str] = None,
                lock: bool = True,
                tpu: str = '',
                tf_data_service: str = ''
                ) -> config_definitions.ExperimentConfig:
  """`parse_flags` from values (`checkpoint_path` None: the defaults)."""
  options = train_utils.ParseConfigOptions(
      experiment=experiment, config_file=list(config_files or ()),
      tpu=tpu, tf_data_service=tf_data_service,
      params_override=params_override or '')
  return parse_flags(options, checkpoint_path=checkpoint_path, lock=lock)


# -- The config of a trained model a command reads (predict, extractors) ----


def model_path(saved_model: Optional[str],
               checkpoint_path: Optional[str]) -> str:
  """The one of `--saved_model` / `--checkpoint_path`; ValueError otherwise."""
  if bool(saved_model) == bool(checkpoint_path):
    raise ValueError('Pass exactly one of --saved_model and --checkpoint_path.')
  return saved_model or checkpoint_path


def load_model_params(default_experiment: str,
                      experiment: Optional[str] = None,
                      config_files: Sequence[str] = (),
                      params_override: str = '',
                      saved_model: Optional[str] = None,
                      checkpoint_path: Optional[str] = None
                      ) -> config_definitions.ExperimentConfig:
  """The config of a trained model a command runs (predict, extraction).

  `load_params` over the model's params.yaml (`saved_model` or
  `checkpoint_path`), read into `default_experiment` when `experiment` is None.

  Raises:
    ValueError: no params.yaml and no `experiment` (naming the file), or what
      `load_params` raises.
  """
  path = model_path(saved_model, checkpoint_path)
  if experiment is None:
    if not find_params_yaml(path):
      directory = path if tf.io.gfile.isdir(path) else os.path.dirname(path)
      flag = '--saved_model' if saved_model else '--checkpoint_path'
      raise ValueError(
          f'No {os.path.join(directory, PARAMS_YAML)} ({flag}={path}): the '
          'input pipeline the model was trained with (features, frames, '
          'image size, normalisation, ...) is unknown, and a default one '
          'would score differently without an error. Export with '
          'official_ext.export_saved_model, which writes params.yaml, or pass '
          'the --experiment (and --config_file / --params_override) the model '
          'was trained with.')
    experiment = default_experiment
  return load_params(experiment, config_files, params_override,
                     checkpoint_path=path)


def check_model_params(params: config_definitions.ExperimentConfig,
                       model: str, command: str = 'predict') -> None:
  """ValueError when `params` contradicts `model`'s params.yaml."""
  path = find_params_yaml(model)
  if not path:
    return
  trained = load_trained_config(params, path)
  differences = config_comparison.contradictions(
      config_comparison.config_leaves(trained),
      config_comparison.config_leaves(params))
  if differences:
    lines = config_comparison.describe(differences, path, 'the config given')
    raise ValueError(
        f'The config given to {command} contradicts the one the model at '
        f'{model} was trained/exported with in {len(differences)} '
        f'model-affecting key(s):\n  {lines}\nIt would score every video '
        'differently; load it with experiment_params.load_model_params '
        f'(which reads {path}).')


# -- The flags naming a model, for every CLI --------------------------------

# Each flag that can name the trained model: (default, help).
MODEL_FLAGS = {
    'saved_model': (None, 'SavedModel directory.'),
    'checkpoint_path': (None, 'A training checkpoint: a ckpt-N prefix or a '
                        'model_dir (its newest checkpoint).'),
    'model_dir': ('', 'A model_dir (its newest checkpoint).'),
    'checkpoint': ('', 'Or a checkpoint prefix.'),
}


def define_model_flags(flag_values: flags.FlagValues = flags.FLAGS,
                       models: Sequence[str] = ('checkpoint_path',),
                       default_experiment: Optional[str] = None,
                       experiment: Optional[str] = None) -> None:
  """Defines --experiment, --config_file, --params_override and `models`.

  Args:
    flag_values: the CLI's flags.
    models: the flags naming the trained model, of `MODEL_FLAGS`.
    default_experiment: the family's experiment that reads the model's
      params.yaml when --experiment is not given; None: --experiment names it.
    experiment: --experiment's default.
  """
  unknown = [m for m in models if m not in MODEL_FLAGS]
  if unknown:
    raise ValueError(f'Unknown model flags {unknown}; known: '
                     f'{sorted(MODEL_FLAGS)}.')
  define = dict(flag_values=flag_values)
  if default_experiment:
    experiment_help = (
        'Experiment giving the config class and the values no params.yaml '
        'sets; needed only when the model has no params.yaml (default: the '
        f'params.yaml beside the model is read into {default_experiment!r}).')
  else:
    experiment_help = ('Registered experiment name (the params.yaml beside '
                       'the model, if any, applies on top).')
  flags.DEFINE_string('experiment', experiment, experiment_help, **define)
  flags.DEFINE_multi_string('config_file', None, 'YAML config overrides, '
                            "applied after the model's params.yaml.", **define)
  flags.DEFINE_string('params_override', '',
                      'Comma-separated overrides, applied last.', **define)
  for name in models:
    default, help_text = MODEL_FLAGS[name]
    flags.DEFINE_string(name, default, help_text, **define)


def params_from_flags(flag_values: flags.FlagValues,
                      default_experiment: Optional[str] = None,
                      model: Optional[str] = None
                      ) -> config_definitions.ExperimentConfig:
  """The config of the model the parsed `define_model_flags` name.

  `load_model_params` with `default_experiment`, else `load_params`; `model`: a
  path the CLI resolved itself (default --checkpoint_path).
  """
  fv = flag_values
  config_files = fv.config_file or ()
  if default_experiment:
    saved_model = fv['saved_model'].value if 'saved_model' in fv else None
    return load_model_params(default_experiment, fv.experiment, config_files,
                             fv.params_override, saved_model=saved_model,
                             checkpoint_path=model or fv.checkpoint_path)
  return load_params(fv.experiment, config_files, fv.params_override,
                     checkpoint_path=model or fv.checkpoint_path)
