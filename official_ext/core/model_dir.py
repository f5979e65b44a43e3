"""A model_dir belongs to one run: never taken over by another experiment.

Model Garden's restore is not strict: training experiment B into a model_dir
that holds experiment A's run "restores" A's checkpoint (only the step
counter matches), trains B from fresh weights for fewer steps than asked,
and the checkpoint manager's `max_to_keep` then deletes A's checkpoints;
`params.yaml` is replaced before anything is checked. `official_ext.train`
guards a model_dir instead (`train.run`):

1. `check_model_dir`, before anything is written: a model_dir with a
   `params.yaml` is compared with the new run. Another experiment (its name
   is on the first line of params.yaml, `write_params_yaml`), a config that
   does not fit the experiment's config class (another family), or a
   different value of a *model-affecting* key
   (`experiment_params.model_affecting_key`: the model, its heads, what it
   sees) is a `ModelDirInUseError` naming the directory and every differing
   key with both values. Other changes (steps, schedule, data paths,
   intervals, batch sizes, runtime) are allowed and logged.
2. The checkpoint the run restores is checked against the task's model
   (`checkpoints.unmatched_model_variables`, in the runner): every model
   variable present with its shape, or an error listing the unmatched ones.
3. `write_params_yaml`, only after the config validated and the restore
   succeeded; whole or not at all (`core.output_files.write_atomically`).
"""
import os
import re
import tempfile
from typing import Any, List, Optional, Tuple

from absl import logging
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.modeling.hyperparams import params_dict
from official_ext.core import experiment_params
from official_ext.core import output_files

_EXPERIMENT_LINE = '# official_ext experiment: '
_EXPERIMENT_RE = re.compile(r'^# official_ext experiment: (\S+)\s*$')


class ModelDirInUseError(ValueError):
  """The model_dir holds a run of another experiment or model config."""


def recorded_experiment(params_yaml: str) -> Optional[str]:
  """The experiment name `write_params_yaml` recorded in `params_yaml`.

  Args:
    params_yaml: path of a params.yaml.

  Returns:
    The name from its first line, or None (a params.yaml written by Model
    Garden or an older official_ext has none).
  """
  with tf.io.gfile.GFile(params_yaml, 'r') as f:
    match = _EXPERIMENT_RE.match(f.readline())
  return match.group(1) if match else None


def _trained_config(params, params_yaml: str):
  try:
    return experiment_params.load_trained_config(params, params_yaml)
  except ValueError as e:
    raise ModelDirInUseError(
        f'{os.path.dirname(params_yaml)} holds the run of another kind of '
        f'experiment: {e}. Use a new --model_dir; nothing was written.'
    ) from e


def _differences(old: Any, new: Any) -> List[Tuple[str, Any, Any]]:
  """(key, old, new) of every leaf that differs, one-ofs by active branch."""
  a = experiment_params.config_leaves(old)
  b = experiment_params.config_leaves(new)
  missing = object()
  out = []
  for key in sorted(set(a) | set(b)):
    va, vb = a.get(key, missing), b.get(key, missing)
    if va != vb:
      out.append((key, None if va is missing else va,
                  None if vb is missing else vb))
  return out


def check_model_dir(params, model_dir: str,
                    experiment: Optional[str] = None) -> None:
  """Refuses a model_dir that holds another experiment's or model's run.

  Reads only; call it before anything is written to `model_dir`.

  Args:
    params: the new run's validated config.
    model_dir: the run's model_dir.
    experiment: the new run's registered experiment name (`--experiment`);
      None skips the name comparison (the config is compared still).

  Raises:
    ModelDirInUseError: naming `model_dir` and either both experiment names,
      the keys of params.yaml the config class lacks, or every differing
      model-affecting key with the value in params.yaml and the new one.
  """
  params_yaml = os.path.join(model_dir, experiment_params.PARAMS_YAML)
  if not tf.io.gfile.exists(params_yaml):
    return
  previous = recorded_experiment(params_yaml)
  if experiment and previous and previous != experiment:
    raise ModelDirInUseError(
        f'model_dir {model_dir} holds a run of experiment {previous!r} '
        f'({params_yaml}); this run is experiment {experiment!r}. Use a new '
        '--model_dir (nothing was written), or --experiment='
        f'{previous} to continue that run.')
  differences = _differences(_trained_config(params, params_yaml), params)
  model = [d for d in differences
           if experiment_params.model_affecting_key(d[0])]
  if model:
    lines = '\n  '.join(f'{key}: {params_yaml} has {old!r}, this run has '
                        f'{new!r}' for key, old, new in model)
    raise ModelDirInUseError(
        f'model_dir {model_dir} holds a run of '
        f'{"experiment " + repr(previous) if previous else "another model"}'
        f' with a different model config in {len(model)} key(s):\n  {lines}\n'
        'Use a new --model_dir for a different model (nothing was written), '
        'or drop these overrides to continue that run.')
  if differences:
    logging.info(
        'model_dir %s: continuing its run with %d changed setting(s) that do '
        'not change the model:\n  %s', model_dir, len(differences),
        '\n  '.join(f'{key}: {old!r} -> {new!r}'
                    for key, old, new in differences))


def write_params_yaml(params, model_dir: str,
                      experiment: Optional[str] = None) -> str:
  """Writes `model_dir/params.yaml` whole (`output_files.write_atomically`).

  Model Garden's `train_utils.serialize_config` format, with the experiment
  name on a first comment line (`recorded_experiment`); YAML readers ignore
  it.

  Args:
    params: the run's config.
    model_dir: where to write (created if missing).
    experiment: the registered experiment name, or None.

  Returns:
    The path written.
  """
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, experiment_params.PARAMS_YAML)
  with tempfile.TemporaryDirectory() as tmp:
    body = os.path.join(tmp, 'params.yaml')
    params_dict.save_params_dict_to_yaml(params, body)
    with open(body) as f:
      text = f.read()
  if experiment:
    text = f'{_EXPERIMENT_LINE}{experiment}\n{text}'
  output_files.write_atomically(path, lambda out: out.write(text))
  logging.info('Saved the experiment configuration to %s', path)
  return path
