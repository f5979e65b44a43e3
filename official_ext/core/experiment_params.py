"""The one way an experiment's config is loaded, and its strategy built.

Every entry point loads its `ExperimentConfig` (or multitask
`MultiTaskExperimentConfig`) here: `official_ext.train` (`parse`, from its
flags), `official_ext.export_saved_model` and `official_ext.yt8m.predict`
(`load_params`). The steps are Model Garden's `train_utils.ExperimentParser`
(`parse_configuration`), with the trained model's params.yaml inserted and
type checks added:

1. the registered `--experiment` (its config class; `exp_factory`);
2. when a trained model is given (export, predict: `checkpoint_path`), its
   `params.yaml`, if the directory of the checkpoint or SavedModel has one
   (logged; strict: a key the experiment lacks is an error naming the file,
   e.g. a params.yaml of another family). `official_ext.train` writes the
   run's full config to `model_dir/params.yaml`, and
   `official_ext.export_saved_model` writes the config it exported with to
   `export_dir/params.yaml`;
3. `--config_file`s in order, `--tpu` (if given) and `--tf_data_service`
   (every task routine's data of a multitask config), then
   `--params_override`, strictly (an unknown key is Model Garden's KeyError
   naming the key);
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
that names every such key with both values (`model_affecting_key` defines
the set). Other keys (input paths, batch sizes, runtime, trainer, losses,
...) may change freely. Without a params.yaml the config is steps 1, 3 and 4,
with a warning.

The run's strategy is built, and every global batch checked against its
replicas, in one place: `distribution_strategy`.
"""
import os
import pprint
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.common import distribute_utils
from official.core import config_definitions
from official.core import exp_factory
from official.core import train_utils
from official.modeling import hyperparams
from official_ext.core import config_checks

PARAMS_YAML = 'params.yaml'

# Everything under these prefixes changes the model: its layers, activations,
# pooling, heads (`task.model` in every family).
MODEL_PREFIXES = ('task.model',)

# Task-level keys that define the model's heads (readout: the heads and their
# routing ids).
MODEL_TASK_KEYS = ('task.readouts', 'task.task_vocabulary')

# Data keys that change what the model sees or outputs at inference, checked
# in `task.train_data` and `task.validation_data` (export and predict parse
# with `validation_data`; a train_data value differing from training is an
# error too, as it contradicts how the weights were trained). Keys that only
# choose files, batching, shuffling, training-time sampling/augmentation or
# padding are not in the set.
MODEL_DATA_SPLITS = ('train_data', 'validation_data')
MODEL_DATA_KEYS = (
    # All families.
    'num_classes',
    # YouTube-8M: which features, how they are decoded and normalised, how
    # many frames, the segment length.
    'record_type', 'feature_names', 'feature_sizes', 'feature_dtypes',
    'feature_from_bytes', 'max_frames', 'segment_size',
    'input_per_feature_l2_norm',
    # AssembleNet: clip shape, frame stride, evaluation clips/crops, pixel
    # scaling, label type.
    'feature_shape', 'temporal_stride', 'num_test_clips', 'num_test_crops',
    'min_image_size', 'zero_centering_image', 'is_multilabel',
    # Readout: token width.
    'input_dim',
)

# `task.validation_data` keys among MODEL_DATA_KEYS that choose the
# evaluation protocol, not the model: AssembleNet++lite scores a video on
# num_test_clips x num_test_crops views of clips of
# validation_data.feature_shape, which may have another frame count than
# training clips (the task then builds the model with an unknown frame count;
# height, width and channels must equal train_data's, which stays checked).
# An evaluation or export of a trained model may choose them anew.
EVALUATION_PROTOCOL_KEYS = ('feature_shape', 'temporal_stride',
                            'num_test_clips', 'num_test_crops')


def model_affecting_key(key: str) -> bool:
  """Whether dotted config key `key` (e.g. 'task.model.head.moe') is one.

  Args:
    key: a dotted path into an `ExperimentConfig` as_dict(), leaf or not.

  Returns:
    True for anything under `MODEL_PREFIXES`, the `MODEL_TASK_KEYS` and
    `task.<split>.<k>` with split in `MODEL_DATA_SPLITS` and k in
    `MODEL_DATA_KEYS`, except the `EVALUATION_PROTOCOL_KEYS` of
    `task.validation_data`.
  """
  for prefix in MODEL_PREFIXES + MODEL_TASK_KEYS:
    if key == prefix or key.startswith(prefix + '.'):
      return True
  parts = key.split('.')
  if (len(parts) >= 3 and parts[:2] == ['task', 'validation_data'] and
      parts[2] in EVALUATION_PROTOCOL_KEYS):
    return False
  return (len(parts) >= 3 and parts[0] == 'task' and
          parts[1] in MODEL_DATA_SPLITS and parts[2] in MODEL_DATA_KEYS)


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


def config_leaves(config: Any, prefix: str = '') -> Dict[str, Any]:
  """{dotted key: value} of a config's leaves, one-ofs by their active branch.

  Args:
    config: a `hyperparams.Config` (or a plain value).
    prefix: the dotted key of `config`.

  Returns:
    The leaves; of a `OneOfConfig` only `type` and the branch it names (the
    inactive branches do not build anything); sequences of configs as lists
    of dicts.
  """
  out = {}
  if isinstance(config, hyperparams.OneOfConfig):
    out[f'{prefix}.type'] = config.type
    if config.type:
      out.update(config_leaves(getattr(config, config.type),
                               f'{prefix}.{config.type}'))
  elif isinstance(config, hyperparams.Config):
    for key in config.as_dict():
      out.update(config_leaves(getattr(config, key),
                               f'{prefix}.{key}' if prefix else key))
  else:
    out[prefix] = _normalized(config)
  return out


def _normalized(value: Any) -> Any:
  if isinstance(value, hyperparams.Config):
    return _normalized(value.as_dict())
  if isinstance(value, (tuple, list)):
    return [_normalized(v) for v in value]
  if isinstance(value, dict):
    return {k: _normalized(v) for k, v in value.items()}
  return value


def contradictions(trained: Dict[str, Any], final: Dict[str, Any]
                   ) -> List[Tuple[str, Any, Any]]:
  """Model-affecting leaves whose value differs between two configs.

  Args:
    trained: `config_leaves` of the config as params.yaml gives it.
    final: `config_leaves` of the same after the flags.

  Returns:
    Sorted (dotted key, trained value, final value) triples; a one-of whose
    `type` differs appears as that key only.
  """
  missing = object()
  out = []
  # A one-of whose `type` changed is reported by its type alone.
  switched = [key[:-len('type')] for key in trained
              if key.endswith('.type') and key in final and
              trained[key] != final[key]]
  for key in sorted(set(trained) | set(final)):
    if not model_affecting_key(key) or any(
        key.startswith(p) and key != p + 'type' for p in switched):
      continue
    va, vb = trained.get(key, missing), final.get(key, missing)
    if va != vb:
      out.append((key, None if va is missing else va,
                  None if vb is missing else vb))
  return out


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
    return hyperparams.override_params_dict(trained, params_yaml,
                                            is_strict=True)
  except (KeyError, ValueError, TypeError, AttributeError) as e:
    raise ValueError(
        f'{params_yaml} does not fit the config of this experiment '
        f'({type(params).__name__}): {e!r}') from e


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
        params = hyperparams.override_params_dict(params, self.params_yaml,
                                                  is_strict=True)
      except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(
            f'{self.params_yaml} (the config the checkpoint was trained with) '
            f'does not fit experiment {experiment!r}: {e!r}. Pass the '
            '--experiment the model was trained with.') from e
      logging.info('Using the trained config %s (then --config_file / '
                   '--params_override on top).', self.params_yaml)
      self.trained = config_leaves(params)
    elif self._checkpoint_path:
      logging.warning(
          'No %s next to %s: the model is built from --experiment=%s and the '
          'flags only; pass the config it was trained with.', PARAMS_YAML,
          self._checkpoint_path, experiment)
    return params

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
    KeyError: a flag names an unknown key (Model Garden's strict override).
  """
  parser = ExperimentParser(flags_obj, checkpoint_path=checkpoint_path)
  params = parser.parse()
  if parser.trained is not None:
    differences = contradictions(parser.trained, config_leaves(params))
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


def _data_configs(params) -> List[Tuple[str, Any]]:
  """(config key, DataConfig) of every train/validation input of `params`."""
  out = []
  routines = getattr(params.task, 'task_routines', None)
  if routines is not None:
    tasks = [(f'task.task_routines[{i}].task_config', r.task_config)
             for i, r in enumerate(routines)]
  else:
    tasks = [('task', params.task)]
  for prefix, task in tasks:
    for name in ('train_data', 'validation_data'):
      data = getattr(task, name, None)
      if data is not None:
        out.append((f'{prefix}.{name}', data))
  return out


def check_batch_sizes(params, strategy: tf.distribute.Strategy) -> None:
  """Every global batch must split evenly over the strategy's replicas.

  Model Garden divides `global_batch_size` by the number of replicas; an
  uneven split fails later with a message that names neither the key nor
  the strategy. Checks `task.train_data` and `task.validation_data`, or of
  a multitask config every `task.task_routines[i].task_config`'s.

  Raises:
    ValueError: naming the key, the strategy and the nearest valid sizes.
  """
  replicas = strategy.num_replicas_in_sync
  for key, data in _data_configs(params):
    batch = getattr(data, 'global_batch_size', None)
    if batch is None or batch % replicas == 0:
      continue
    lower = max(batch // replicas * replicas, replicas)
    raise ValueError(
        f'{key}.global_batch_size={batch} does not divide evenly over '
        f'the {replicas} replicas of runtime.distribution_strategy='
        f'{params.runtime.distribution_strategy!r}: expected a multiple of '
        f'{replicas} (e.g. {lower} or {lower + replicas}).')


def distribution_strategy(params, strategy: Optional[tf.distribute.Strategy]
                          = None) -> tf.distribute.Strategy:
  """The run's strategy, its batch sizes checked (`check_batch_sizes`).

  Args:
    params: the experiment config.
    strategy: a strategy to use instead of the one `runtime` names (tests
      use a MirroredStrategy over logical CPU devices).

  Returns:
    `strategy`, or the one `runtime.distribution_strategy` names (built with
    `runtime.all_reduce_alg`, `num_gpus`, `tpu`).
  """
  if strategy is None:
    runtime = params.runtime
    strategy = distribute_utils.get_distribution_strategy(
        distribution_strategy=runtime.distribution_strategy,
        all_reduce_alg=runtime.all_reduce_alg,
        num_gpus=runtime.num_gpus,
        tpu_address=runtime.tpu)
  check_batch_sizes(params, strategy)
  return strategy
