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
   (`config_comparison.model_affecting_key`: the model, its heads, what it
   sees) is a `ModelDirInUseError` naming the directory and every differing
   key with both values. Other changes (steps, schedule, data paths,
   intervals, batch sizes, runtime) are allowed and logged.
2. The checkpoint the run restores is checked against the task's model
   (`checkpoints.unmatched_model_variables`, in the runner): every model
   variable present with its shape, or an error listing the unmatched ones.
3. `write_params_yaml`, only after the config validated and the restore
   succeeded; whole or not at all (`core.output_files.write_atomically`).

And a run that has nothing to do says so instead of pretending:

* `check_checkpoint_to_evaluate`: `--mode=eval` on a model_dir without a
  checkpoint (a typo in the path) is an error naming it, before anything is
  created; Model Garden would score freshly initialized weights.
* `check_resume_step`: `trainer.train_steps` below the step of the
  checkpoint to resume from is an error (nothing would be trained); equal to
  it (the same command after the run ended) trains nothing, says so, and
  leaves params.yaml as it was.
* A model_dir with checkpoints but no params.yaml resumes with a warning
  naming the missing file (`check_model_dir`): only the variables' names and
  shapes can then be checked against the new run's model.
"""
import os
import re
import tempfile
from typing import Any, List, Optional, Tuple

from absl import logging
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.modeling.hyperparams import params_dict
from official_ext.core import config_comparison
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
  a = config_comparison.config_leaves(old)
  b = config_comparison.config_leaves(new)
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
    if tf.train.latest_checkpoint(model_dir):
      logging.warning(
          'model_dir %s holds checkpoints but no params.yaml (%s): the config '
          'they were trained with is unknown, so only the names and shapes of '
          "the model's variables are checked against this run's model (a "
          'setting that changes no variable cannot be checked). The run '
          'continues under its own config; a training run records it in %s.',
          model_dir, params_yaml, params_yaml)
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
           if config_comparison.model_affecting_key(d[0])]
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


def check_checkpoint_to_evaluate(params, model_dir: str, mode: str) -> None:
  """Refuses `--mode=eval` when there is nothing to evaluate.

  Reads only, and creates nothing (a misspelled model_dir stays absent).
  Model Garden's evaluation restores the latest checkpoint of model_dir or,
  when there is none, initializes the model (from `task.init_checkpoint` if
  set, else randomly) and scores that; only the random case is refused.
  `continuous_eval` waits for checkpoints instead (up to
  `trainer.continuous_eval_timeout`).

  Args:
    params: the run's config.
    model_dir: the run's model_dir.
    mode: the run's mode; only 'eval' is checked.

  Raises:
    ValueError: naming model_dir, when it holds no checkpoint and
      `task.init_checkpoint` is not set.
  """
  if mode != 'eval' or getattr(params.task, 'init_checkpoint', None):
    return
  if tf.train.latest_checkpoint(model_dir):
    return
  what = ('does not exist' if not tf.io.gfile.exists(model_dir) else
          'holds no checkpoint state file naming an existing checkpoint')
  raise ValueError(
      f'--mode=eval: model_dir {model_dir} has no checkpoint to evaluate (it '
      f'{what}); evaluating would score untrained weights. Check the path '
      '(nothing was created), train first, or set task.init_checkpoint to '
      'evaluate a checkpoint stored elsewhere.')


def check_resume_step(params, model_dir: str, checkpoint: Optional[str],
                      step: int) -> bool:
  """Whether a training run has steps left, after restoring `checkpoint`.

  Call before anything of the run is written (params.yaml included).

  Args:
    params: the run's config (`trainer.train_steps`).
    model_dir: the run's model_dir, for the messages.
    checkpoint: the checkpoint the run resumes from, or None.
    step: its global step (0 without one).

  Returns:
    True when `step < trainer.train_steps`; False when they are equal (the
    run ended already: logged, nothing is to be trained or written).

  Raises:
    ValueError: `trainer.train_steps` is below `step`, naming both and the
      checkpoint (nothing would be trained; model_dir is left as it was).
  """
  train_steps = params.trainer.train_steps
  if not checkpoint or step < train_steps:
    return True
  if step > train_steps:
    raise ValueError(
        f'trainer.train_steps={train_steps} is below the step of the '
        f'checkpoint to resume from, {checkpoint} (step {step}): nothing '
        'would be trained. Set trainer.train_steps above '
        f'{step} to train on, use --mode=eval to evaluate it, or a new '
        '--model_dir to start another run; nothing was written.')
  logging.warning(
      'model_dir %s: %s is already at step %d = trainer.train_steps: nothing '
      'to train; params.yaml is left as it was.', model_dir, checkpoint, step)
  return False


def eval_output_dir(params, model_dir: str) -> str:
  """Where an evaluation writes its summaries (and `official_ext.train` its
  operative gin config in an evaluation mode): Model Garden's
  `model_dir/trainer.validation_summary_subdir`, or that key itself when it
  is an absolute path (an evaluation of a model_dir it cannot write)."""
  return os.path.join(model_dir, params.trainer.validation_summary_subdir)


def check_eval_outputs_writable(params, model_dir: str, mode: str) -> None:
  """An evaluation mode can write its outputs, checked before any work.

  `eval` and `continuous_eval` only read model_dir's checkpoints; they
  write `eval_output_dir` and, when `trainer.best_checkpoint_export_subdir`
  and its metric are set, the best-checkpoint folder. Each is created if
  missing and a probe file is written and removed. Training modes write
  model_dir itself, and fail at its lock first.

  Raises:
    PermissionError: naming the folder, the key that places it and the
      error, when it cannot be written.
  """
  if mode not in ('eval', 'continuous_eval'):
    return
  folders = [(eval_output_dir(params, model_dir),
              'the evaluation summaries, trainer.validation_summary_subdir')]
  trainer = params.trainer
  if (trainer.best_checkpoint_export_subdir and
      trainer.best_checkpoint_eval_metric):
    folders.append((os.path.join(model_dir,
                                 trainer.best_checkpoint_export_subdir),
                    'the best checkpoint, '
                    'trainer.best_checkpoint_export_subdir'))
  for folder, what in folders:
    probe = os.path.join(folder, f'.write_probe-{os.getpid()}')
    try:
      tf.io.gfile.makedirs(folder)
      with tf.io.gfile.GFile(probe, 'w') as f:
        f.write('')
      tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as e:
      raise PermissionError(
          f'--mode={mode} cannot write {folder} ({what}): {e}. Nothing was '
          'evaluated. Make it writable, or set that key to an absolute '
          'folder that is (model_dir is only read).') from e
