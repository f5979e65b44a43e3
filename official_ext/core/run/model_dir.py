"""A model_dir belongs to one run, and a run with nothing to do says so
(docs/bad_input.md, "What you own ...")."""
import os
import re
import tempfile
from typing import Optional

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
  """The experiment name on the first line of `params_yaml`, or None."""
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


def check_model_dir(params, model_dir: str,
                    experiment: Optional[str] = None) -> None:
  """Refuses a model_dir holding another experiment's or model's run.

  Reads only. Raises `ModelDirInUseError` naming the directory and the names, or
  every differing model-affecting key with both values.
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
  trained = config_comparison.config_leaves(
      _trained_config(params, params_yaml))
  final = config_comparison.config_leaves(params)
  model = config_comparison.contradictions(trained, final)
  if model:
    lines = config_comparison.describe(model, params_yaml, 'this run')
    raise ModelDirInUseError(
        f'model_dir {model_dir} holds a run of '
        f'{"experiment " + repr(previous) if previous else "another model"}'
        f' with a different model config in {len(model)} key(s):\n  {lines}\n'
        'Use a new --model_dir for a different model (nothing was written), '
        'or drop these overrides to continue that run.')
  differences = config_comparison.differences(trained, final)
  if differences:
    logging.info(
        'model_dir %s: continuing its run with %d changed setting(s) that do '
        'not change the model:\n  %s', model_dir, len(differences),
        config_comparison.describe(differences, params_yaml, 'this run'))


def write_params_yaml(params, model_dir: str,
                      experiment: Optional[str] = None) -> str:
  """Writes `model_dir/params.yaml` whole, the experiment on line 1."""
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
  """ValueError when `--mode=eval` has no checkpoint to evaluate."""
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
  """Whether training has steps left after `checkpoint` at `step`.

  ValueError when `trainer.train_steps` is below `step`.
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
  """Where an evaluation writes its summaries."""
  return os.path.join(model_dir, params.trainer.validation_summary_subdir)


def check_eval_outputs_writable(params, model_dir: str, mode: str) -> None:
  """PermissionError naming an evaluation output folder it cannot write."""
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
