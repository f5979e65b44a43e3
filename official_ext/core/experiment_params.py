"""The one way an experiment's config is loaded.

Every entry point loads its `ExperimentConfig` (or multitask
`MultiTaskExperimentConfig`) here: `official_ext.train` (`parse`, from its
flags), `official_ext.export_saved_model` (`load_params`) and the predict
commands of the families (`load_model_params`: a trained model's config,
`check_model_params`). The steps are Model Garden's
`train_utils.ExperimentParser` (`parse_configuration`), with the trained
model's params.yaml inserted and type checks added:

1. the registered `--experiment` (its config class; `exp_factory`);
2. when a trained model is given (export, predict: `checkpoint_path`), its
   `params.yaml`, if the directory of the checkpoint or SavedModel has one
   (logged; strict: a key the experiment lacks is an error naming the file,
   e.g. a params.yaml of another family; a field the file lacks that its
   config class lists in `PARAMS_YAML_DEFAULTS` takes the value listed
   there, the one the file was trained with). `official_ext.train` writes the
   run's full config to `model_dir/params.yaml`, and
   `official_ext.export_saved_model` writes the config it exported with to
   `export_dir/params.yaml`;
3. `--config_file`s in order, `--tpu` (if given) and `--tf_data_service`
   (every task routine's data of a multitask config), then
   `--params_override`, strictly (an unknown key is a KeyError naming the
   key and the file, or `--params_override`);
4. type checks (`core.config_checks`: a value of the wrong type is a
   ValueError naming the key, the expected type and the value), the runtime
   checks (`config_checks.check_runtime`: `runtime.mixed_precision_dtype`
   one of Model Garden's values, Keras' `mixed_float16` / `mixed_bfloat16`
   taken as `float16` / `bfloat16`; `runtime.kernel_policy`), then the
   config's `validate()` (restrictions), then it is locked.

A strict checkpoint restore checks variable names and shapes only, so a model
rebuilt from the experiment's defaults with a shape-neutral difference (a
pooling method, an activation, input normalisation, ...) restores without
error and predicts wrongly. A file or override that changes a
*model-affecting* key away from its params.yaml value is therefore an error
that names every such key with both values
(`core.config_comparison.model_affecting_key` defines the set). Other keys
(input paths, batch sizes, runtime, trainer, losses, ...) may change
freely. Without a params.yaml the config is steps 1, 3 and 4,
with a warning.

The run's strategy is built in `core.run.distribution`; configs are compared key
by key in `core.config_comparison`.
"""
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

PARAMS_YAML = 'params.yaml'


def find_params_yaml(path: Optional[str]) -> Optional[str]:
  """The params.yaml of a trained model, or None.

  Args:
    path: a model_dir, a checkpoint prefix inside one (`model_dir/ckpt-N`), or
      a SavedModel directory written by `export_saved_model`.

  Returns:
    `path/params.yaml` when `path` is a directory, else
    `dirname(path)/params.yaml`, if that file exists; otherwise None.
  """
  if not path:
    return None
  directory = path if tf.io.gfile.isdir(path) else os.path.dirname(path)
  candidate = os.path.join(directory, PARAMS_YAML)
  return candidate if tf.io.gfile.exists(candidate) else None


def _fill_fields_added_later(config: Any, written: Dict[str, Any],
                             typed: Any) -> None:
  """Sets, in `config` and the configs nested in it, each field the file's
  section `written` lacks and the config class of the matching node of
  `typed` lists in its `PARAMS_YAML_DEFAULTS` ({field: the value a file
  without it was trained with}) to that value."""
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
  """`params` overridden by a params.yaml of a trained model, strictly; a
  field added to a config class after the file was written takes the value
  the file was trained with (the class's `PARAMS_YAML_DEFAULTS`), not the
  experiment's. `typed`: the experiment's config whose classes to read,
  when `params` holds its values in plain `Config`s (default: `params`).
  Raises what Model Garden's strict override raises."""
  params = hyperparams.override_params_dict(params, params_yaml,
                                            is_strict=True)
  written = params_dict.read_yaml_to_params_dict(params_yaml).as_dict()
  _fill_fields_added_later(params, written,
                           params if typed is None else typed)
  return params


def load_trained_config(params, params_yaml: str):
  """`params_yaml` loaded over a fresh copy of `params`' config class.

  Args:
    params: a config of the experiment (its class and, for keys the file
      lacks, its values).
    params_yaml: a params.yaml written by training or export.

  Returns:
    A new, unlocked config holding the file's values.

  Raises:
    ValueError: the file does not fit the config class (a key it lacks,
      a value of the wrong kind): e.g. another family's params.yaml; the
      message names the file and the config class.
  """
  trained = type(params)(params.as_dict())
  try:
    return override_with_params_yaml(trained, params_yaml, typed=params)
  except (KeyError, ValueError, TypeError, AttributeError) as e:
    raise ValueError(
        f'{params_yaml} does not fit the config of this experiment '
        f'({type(params).__name__}): {e!r}') from e


def _unknown_key(params, config_file: str) -> Optional[str]:
  """'key.path: ' of the first key of the YAML `config_file` that `params`
  lacks, or None (not found, or the file does not read as a mapping)."""
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

  Applies the steps of the module docstring; `parse()` returns the unlocked,
  unchecked config, `parse_flags` finishes it.

  Args:
    flags_obj: the absl FLAGS of the CLI, or a
      `train_utils.ParseConfigOptions` (experiment, config_file, tpu,
      tf_data_service, params_override).
    checkpoint_path: where the trained model is (see `find_params_yaml`);
      None: the config starts from the experiment's defaults.
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
    """`--tpu`, when given (Model Garden's parser writes an empty flag over
    a `runtime.tpu` from params.yaml or a config file)."""
    if getattr(self._flags_obj, 'tpu', None):
      return super().parse_runtime(params)
    return params

  def parse_data_service(self, params):
    """`--tf_data_service` for every task's data (Model Garden's parser
    applies it to single-task configs only)."""
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
  """The experiment config from the CLI's flags (module docstring's steps).

  Args:
    flags_obj: absl FLAGS or `train_utils.ParseConfigOptions` with
      `experiment`, `config_file`, `params_override` (and `tpu`,
      `tf_data_service`).
    checkpoint_path: a trained model whose params.yaml to start from (export,
      predict); None for training.
    lock: lock the returned config.

  Returns:
    The checked, validated config.

  Raises:
    ValueError: a flag contradicts params.yaml in a model-affecting key (the
      message lists each key with the params.yaml value and the flag's
      value), params.yaml does not fit the experiment (the message names the
      file), a value has the wrong type (`config_checks`: the key, the
      expected type and the value), or a restriction fails.
    KeyError: a flag names an unknown key (naming it and its file, or
      `--params_override`).
  """
  parser = ExperimentParser(flags_obj, checkpoint_path=checkpoint_path)
  params = parser.parse()
  if parser.trained is not None:
    differences = config_comparison.contradictions(
        parser.trained, config_comparison.config_leaves(params))
    if differences:
      lines = '\n  '.join(
          f'{key}: {parser.params_yaml} has {old!r}, the flags give {new!r}'
          for key, old, new in differences)
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
  # 150-line dump is for --verbosity=1.
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
  """`parse_flags` from values instead of flags (export, predict, tests).

  Args:
    experiment: the registered experiment name (`--experiment`); gives the
      config class and the values params.yaml does not set.
    config_files: YAML files applied after params.yaml, in order.
    params_override: `--params_override` string (or YAML), applied last.
    checkpoint_path: where the trained model is (see `find_params_yaml`);
      None or a path without params.yaml: the experiment's defaults are used.
    lock: lock the returned config.
    tpu: `--tpu` (`runtime.tpu`).
    tf_data_service: `--tf_data_service`.

  Returns:
    The checked, validated config (see `parse_flags` for the errors).
  """
  options = train_utils.ParseConfigOptions(
      experiment=experiment, config_file=list(config_files or ()),
      tpu=tpu, tf_data_service=tf_data_service,
      params_override=params_override or '')
  return parse_flags(options, checkpoint_path=checkpoint_path, lock=lock)


# -- The config of a trained model a command reads (predict, extractors) ----


def model_path(saved_model: Optional[str],
               checkpoint_path: Optional[str]) -> str:
  """The one model path of `--saved_model` / `--checkpoint_path`.

  Raises:
    ValueError: both or neither are given.
  """
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

  The model's params.yaml (`official_ext.train` writes one into the
  model_dir, `official_ext.export_saved_model` into the SavedModel
  directory) gives the config; `load_params`'s steps apply on top of it
  (a `config_files` / `params_override` value that contradicts it in a
  model-affecting key is an error naming the key and both values).

  Args:
    default_experiment: the family's experiment whose config class holds
      the params.yaml when `experiment` is None.
    experiment: `--experiment`; None: the model's params.yaml must exist.
    config_files: YAML files applied after params.yaml.
    params_override: applied last.
    saved_model: a SavedModel directory of `export_saved_model`, or
    checkpoint_path: a model_dir or a `ckpt-N` prefix in one (exactly one).

  Returns:
    The checked, locked config.

  Raises:
    ValueError: no params.yaml beside the model and no `experiment` (a
      default input pipeline would score differently without an error; the
      message names the missing file and the flag), or what `load_params`
      raises.
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
  """Checks `params` against the params.yaml beside a model, if any.

  Args:
    params: the config a command was given (not loaded by
      `load_model_params`, e.g. built by a test or a library caller).
    model: the SavedModel directory or checkpoint.
    command: the command, for the message.

  Raises:
    ValueError: a model-affecting key (`config_comparison.
      model_affecting_key`) differs; the message lists each with both
      values and names the file.
  """
  path = find_params_yaml(model)
  if not path:
    return
  trained = load_trained_config(params, path)
  differences = config_comparison.contradictions(
      config_comparison.config_leaves(trained),
      config_comparison.config_leaves(params))
  if differences:
    lines = '\n  '.join(f'{key}: {path} has {old!r}, the config given has '
                         f'{new!r}' for key, old, new in differences)
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
    flag_values: the CLI's flags (tests: a fresh FlagValues).
    models: the flags naming the trained model, of `MODEL_FLAGS`.
    default_experiment: the family's experiment that reads the model's
      params.yaml when --experiment is not given (`load_model_params`);
      None: --experiment names the experiment.
    experiment: --experiment's default.

  Raises:
    ValueError: a name of `models` is not in `MODEL_FLAGS`.
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
  """The config of the model that the parsed `define_model_flags` name.

  Args:
    flag_values: the parsed flags.
    default_experiment: as given to `define_model_flags`; set:
      `load_model_params` of --saved_model / --checkpoint_path, else
      `load_params`.
    model: the model's path when the CLI resolves it from its own flags
      (default: --checkpoint_path).

  Returns:
    The checked, locked config (see `load_params` for the errors).
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
