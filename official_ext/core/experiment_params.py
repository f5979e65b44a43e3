"""The experiment config of a trained model: its params.yaml, then the flags.

`official_ext.train` writes the run's full config to `model_dir/params.yaml`
(`train_utils.serialize_config`), and `official_ext.export_saved_model`
writes the config it exported with to `export_dir/params.yaml` (as Model
Garden's vision export does). A strict checkpoint restore checks variable
names and shapes only, so a model rebuilt from the experiment's defaults with
a shape-neutral difference (a pooling method, an activation, input
normalisation, ...) restores without error and predicts wrongly. The CLIs that
rebuild a trained model (`export_saved_model`, `yt8m.predict`) therefore
build their config with `load_params`:

1. the registered `--experiment` (its config class; `exp_factory`);
2. the trained model's `params.yaml`, when the directory of the checkpoint or
   SavedModel has one (logged; strict: a key the experiment lacks is an error
   naming the file, e.g. a params.yaml of another family);
3. `--config_file`s in order, then `--params_override`, strictly, as Model
   Garden's `train_utils.ExperimentParser` applies them.

A file or override that changes a *model-affecting* key away from its
params.yaml value is an error that names every such key with both values
(`model_affecting_key` defines the set). Other keys (input paths, batch sizes,
runtime, trainer, losses, ...) may change freely. Without a params.yaml the
config is steps 1 and 3 only, with a warning.
"""
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import config_definitions
from official.core import exp_factory
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
    'feature_names', 'feature_sizes', 'feature_dtypes', 'feature_from_bytes',
    'max_frames', 'segment_size', 'input_per_feature_l2_norm',
    # AssembleNet: clip shape, frame stride, evaluation clips/crops, pixel
    # scaling, label type.
    'feature_shape', 'temporal_stride', 'num_test_clips', 'num_test_crops',
    'min_image_size', 'zero_centering_image', 'is_multilabel',
    # Readout: token width.
    'input_dim',
)


def model_affecting_key(key: str) -> bool:
  """Whether dotted config key `key` (e.g. 'task.model.head.moe') is one.

  Args:
    key: a dotted path into an `ExperimentConfig` as_dict(), leaf or not.

  Returns:
    True for anything under `MODEL_PREFIXES`, the `MODEL_TASK_KEYS` and
    `task.<split>.<k>` with split in `MODEL_DATA_SPLITS` and k in
    `MODEL_DATA_KEYS`.
  """
  for prefix in MODEL_PREFIXES + MODEL_TASK_KEYS:
    if key == prefix or key.startswith(prefix + '.'):
      return True
  parts = key.split('.')
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


def load_params(experiment: str,
                config_files: Sequence[str] = (),
                params_override: str = '',
                checkpoint_path: Optional[str] = None,
                lock: bool = True) -> config_definitions.ExperimentConfig:
  """The config a trained model was trained with, plus compatible flags.

  Args:
    experiment: the registered experiment name (`--experiment`); gives the
      config class and the values params.yaml does not set.
    config_files: YAML files applied after params.yaml, in order.
    params_override: `--params_override` string (or YAML), applied last.
    checkpoint_path: where the trained model is (see `find_params_yaml`);
      None or a path without params.yaml: the experiment's defaults are used.
    lock: lock the returned config.

  Returns:
    The validated ExperimentConfig.

  Raises:
    ValueError: a flag contradicts params.yaml in a model-affecting key (the
      message lists each key with the params.yaml value and the flag's
      value), params.yaml does not fit the experiment (the message names the
      file), or a value has the wrong type (`config_checks`).
    KeyError: a flag names an unknown key (Model Garden's strict override).
  """
  params = exp_factory.get_exp_config(experiment)
  baseline = exp_factory.get_exp_config(experiment)
  params_yaml = find_params_yaml(checkpoint_path)
  trained = None
  if params_yaml:
    try:
      params = hyperparams.override_params_dict(params, params_yaml,
                                                is_strict=True)
    except (KeyError, ValueError, TypeError, AttributeError) as e:
      raise ValueError(
          f'{params_yaml} (the config the checkpoint was trained with) does '
          f'not fit experiment {experiment!r}: {e!r}. Pass the --experiment '
          'the model was trained with.') from e
    logging.info('Using the trained config %s (then --config_file / '
                 '--params_override on top).', params_yaml)
    trained = config_leaves(params)
  elif checkpoint_path:
    logging.warning(
        'No %s next to %s: the model is built from --experiment=%s and the '
        'flags only; pass the config it was trained with.', PARAMS_YAML,
        checkpoint_path, experiment)
  for path in config_files or ():
    params = hyperparams.override_params_dict(params, path, is_strict=True)
  if params_override:
    params = hyperparams.override_params_dict(params, params_override,
                                              is_strict=True)
  if trained is not None:
    differences = contradictions(trained, config_leaves(params))
    if differences:
      lines = '\n  '.join(f'{key}: {params_yaml} has {old!r}, the flags give '
                          f'{new!r}' for key, old, new in differences)
      raise ValueError(
          f'--config_file/--params_override contradict the config the '
          f'checkpoint was trained with in {len(differences)} model-affecting '
          f'key(s):\n  {lines}\nDrop these flags (params.yaml is read '
          'automatically), or export a checkpoint trained with them.')
  config_checks.check_types(params, baseline=baseline)
  params.validate()
  if lock:
    params.lock()
  return params
