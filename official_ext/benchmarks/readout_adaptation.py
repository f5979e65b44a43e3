"""`python -m official_ext.benchmark readout_adaptation`: a unit-token model
pretrained over many generated recordings, adapted to a held-out one with few
trials (unit identification, then fine-tuning) against training from scratch;
the protocol and the arms: docs/readout.md (adapting to a new recording)."""
import os
import tempfile
from typing import Any, Callable, Dict, IO, List, NamedTuple, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf, tf_keras

from official.core import config_definitions
from official_ext import train
from official_ext.core import experiment_params as experiment_params_lib
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import demo_data
from official_ext.readout import readout_types
from official_ext.readout import unit_vocabulary as vocabulary_lib

PRETRAIN_EXPERIMENT = 'readout_units_demo'
FINETUNE_EXPERIMENT = 'readout_units_finetune_demo'
# The unit-token variants measured (`model.unit_token_variant`), the
# default first; the arms of the others carry the variant in their name.
VARIANTS = ('poyo', 'session_per_token')
_ARM_KINDS = ('pretrained', 'identification', 'scratch')
ARMS = _ARM_KINDS + tuple(f'{arm}_{v}' for v in VARIANTS[1:]
                          for arm in _ARM_KINDS)
ARM_LABELS = {
    'pretrained': '(a) pretrained, unit identification then fine-tuning',
    'identification': "(a') pretrained, unit identification alone",
    'scratch': '(b) the same model from scratch',
    'pretrained_session_per_token': (
        '(c) as (a), session embedding on every input token'),
    'identification_session_per_token': (
        "(c') as (a'), session embedding on every input token"),
    'scratch_session_per_token': (
        '(d) as (b), session embedding on every input token'),
}
# The arms' short names (table columns, the plot's legend).
ARM_SHORT = {arm: ARM_LABELS[arm].split(' ', 1)[0] for arm in ARMS}
SCORE = 'average/score'
# Every run (pretraining, each arm) starts from this random seed.
SEED = 0


def arm_variant(arm: str) -> str:
  """The `model.unit_token_variant` of an arm."""
  for variant in VARIANTS[1:]:
    if arm.endswith('_' + variant):
      return variant
  return VARIANTS[0]


def arm_kind(arm: str) -> str:
  """'pretrained', 'identification' or 'scratch'."""
  return next(k for k in _ARM_KINDS if arm.startswith(k))


def _arms(figures: Dict[str, Any]) -> List[str]:
  """The arms the figures hold, in `ARMS` order."""
  return [arm for arm in ARMS if arm in figures]


class Size(NamedTuple):
  """The sizes of a run."""
  # Training trials of the held-out session: one adaptation per count and arm.
  trial_counts: Tuple[int, ...]
  pretrain_steps: int
  # Arm (a)'s steps of unit identification (`task.unfreeze_step`).
  identification_steps: int
  adaptation_steps: int  # Every arm's training steps on the held-out session.
  # Trials per training batch of the adaptation runs (pretraining keeps its
  # experiment's).
  batch_size: int
  # Further overrides of both experiments (model and data sizes).
  overrides: Tuple[Tuple[str, Any], ...] = ()


# Unit identification for 7/8 of the budget, then fine-tuning at the cosine
# schedule's tail: fine-tuning every module for longer overfits a few
# trials (docs/readout.md).
FULL = Size(trial_counts=(16, 64, 256), pretrain_steps=512,
            identification_steps=224, adaptation_steps=256, batch_size=32)
QUICK = Size(trial_counts=(4, 8), pretrain_steps=2, identification_steps=1,
             adaptation_steps=2, batch_size=4, overrides=(
                 ('task.model.encoder.hidden_size', 8),
                 ('task.model.encoder.num_heads', 2),
                 ('task.model.encoder.num_layers', 1),
                 ('task.model.encoder.intermediate_size', 8),
                 ('task.model.encoder.num_latents', 4),
                 ('task.demo_data.num_train_trials', 16),
                 ('task.demo_data.num_validation_trials', 4),
                 ('task.demo_data.num_held_out_session_trials', 4),
                 ('task.demo_data.num_sessions', 2),
                 ('task.demo_data.max_units', 8),
                 ('task.validation_data.global_batch_size', 4),
                 ('trainer.train_tf_function', False),
                 ('trainer.train_tf_while_loop', False),
                 ('trainer.eval_tf_function', False),
             ))


def _key(count: int) -> str:
  return str(int(count))


def _tasks(figures: Dict[str, Any]) -> List[Tuple[str, str]]:
  """[(task, its primary metric)] in the figures' order."""
  return [(t, m) for t, m in figures['tasks']]


def _score(figures: Dict[str, Any], arm: str, count: int,
           name: str) -> Optional[float]:
  return figures[arm][_key(count)].get(name)


def _cell(value: Optional[float]) -> str:
  return '' if value is None else f'{value:.3f}'


def table(figures: Dict[str, Any]) -> str:
  """Per-task primary metric and `average/score` of every arm at every
  count of training trials, a row each (markdown)."""
  tasks = _tasks(figures)
  header = (['trials', 'arm'] +
            [f'{t} ({m.replace("_", " ")})' for t, m in tasks] +
            ['**average/score**'])
  rows = [header, ['---'] * len(header)]
  for n in figures['trial_counts']:
    for arm in _arms(figures):
      rows.append([str(n), ARM_SHORT[arm]] +
                  [_cell(_score(figures, arm, n, f'{t}/{m}'))
                   for t, m in tasks] +
                  [f'**{_cell(_score(figures, arm, n, SCORE))}**'])
  lines = ['| ' + ' | '.join(r) + ' |' for r in rows]
  return '\n'.join(lines) + '\n\n' + legend(figures)


def legend(figures: Dict[str, Any]) -> str:
  """What the arms and counts of `table` are (one paragraph)."""
  steps = figures['steps']
  text = (
      f'(a) {ARM_LABELS["pretrained"][4:]}: the model pretrained '
      f'{steps["pretrain"]} steps on {figures["pretrain_sessions"]} '
      f'sessions, every module frozen for '
      f'{steps["identification"]} of {steps["adaptation"]} steps but the '
      f'held-out session\'s unit and session rows and the latents; '
      f'(a\') the same, frozen for all {steps["adaptation"]} steps; '
      f'(b) {ARM_LABELS["scratch"][4:]}, {steps["adaptation"]} steps')
  if any(arm_variant(a) != VARIANTS[0] for a in _arms(figures)):
    text += ('; (c), (c\'), (d): the same with the session embedding added '
             'to every input token instead of the decoder queries '
             '(`session_per_token`, pretrained on its own), whose unit '
             'identification freezes the latents too')
  text += (f'; each on n training trials of held-out session '
           f'`{figures["held_out_session"]}` ({figures["held_out_units"]} '
           f'units), scored on its {figures["test_trials"]} test trials, ')
  text += (f'every run from random seed {figures["seed"]}.'
           if figures.get('seed') is not None else 'runs not seeded.')
  unmeasured = [ARM_SHORT[a] for a in ARMS if a not in figures]
  if unmeasured:
    text += (f' Not measured in this results file: {", ".join(unmeasured)} '
             '(`python -m official_ext.benchmark readout_adaptation`).')
  return text


def summary_table(figures: Dict[str, Any]) -> str:
  """`average/score` of every arm against training trials (markdown)."""
  counts = figures['trial_counts']
  rows = [['held-out session: `average/score`'] +
          [f'{n} trials' for n in counts], ['---'] * (len(counts) + 1)]
  for arm in _arms(figures):
    rows.append([ARM_LABELS[arm]] + [_cell(_score(figures, arm, n, SCORE))
                                     for n in counts])
  return '\n'.join('| ' + ' | '.join(r) + ' |' for r in rows)


def readme_block(figures: Dict[str, Any]) -> str:
  """README.md's block: `summary_table` and the plot (`PLOTS`)."""
  unmeasured = [ARM_LABELS[a] for a in ARMS if a not in figures]
  note = ('' if not unmeasured else
          f'\n\nNot measured in this results file: {"; ".join(unmeasured)}.')
  return (summary_table(figures) + note + '\n\n![Scores against training '
          'trials of the held-out session, every arm]'
          '(docs/readout_adaptation.png)')


def docs_block(figures: Dict[str, Any]) -> str:
  """docs/readout.md's block: `table` and the plot (`PLOTS`)."""
  return (table(figures) + '\n\n![Scores against training trials of the '
          'held-out session, every arm](readout_adaptation.png)')


def plot(figures: Dict[str, Any], stream: IO[bytes]) -> None:
  """The curves: one panel per task and one of `average/score`, score
  against training trials (log scale), every arm; a PNG into `stream`."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  counts = figures['trial_counts']
  panels = [(f'{t}/{m}', f'{t}\n{m.replace("_", " ")}')
            for t, m in _tasks(figures)] + [(SCORE, 'average/score')]
  columns = min(len(panels), 5)
  rows = -(-len(panels) // columns)
  fig, axes = plt.subplots(rows, columns, figsize=(2.6 * columns,
                                                   2.4 * rows), dpi=80,
                           squeeze=False)
  for ax in axes.flat[len(panels):]:
    ax.axis('off')
  for ax, (name, title) in zip(axes.flat, panels):
    for arm in _arms(figures):
      style = ({'pretrained': 'o', 'identification': '^',
                'scratch': 's'}[arm_kind(arm)] +
               ('-' if arm_variant(arm) == VARIANTS[0] else ':'))
      points = [(n, _score(figures, arm, n, name)) for n in counts]
      points = [(n, v) for n, v in points if v is not None]
      ax.plot([n for n, _ in points], [v for _, v in points], style,
              label=ARM_SHORT[arm])
    ax.set_xscale('log', base=2)
    ax.set_xticks(counts)
    ax.set_xticklabels([str(n) for n in counts])
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=8)
  axes.flat[0].legend(fontsize=8)
  fig.supxlabel('training trials of the held-out session', fontsize=9)
  fig.tight_layout()
  fig.savefig(stream, format='png')
  plt.close(fig)


# The plots `python -m official_ext.benchmark report` draws from the
# results file (`report.write_plots`).
PLOTS: Dict[str, Callable[[Dict[str, Any], IO[bytes]], None]] = {
    os.path.join('docs', 'readout_adaptation.png'): plot,
}


def _nested(overrides: Dict[str, Any]) -> Dict[str, Any]:
  """{'a.b': 1} -> {'a': {'b': 1}}."""
  out: Dict[str, Any] = {}
  for key, value in overrides.items():
    node = out
    *parents, leaf = key.split('.')
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return out


def _schedule(steps: int) -> Dict[str, Any]:
  """A run of `steps` steps, evaluated and checkpointed once at its end,
  its learning rate's warmup and decay fitted to it."""
  return {
      'trainer.train_steps': steps,
      'trainer.steps_per_loop': steps,
      'trainer.summary_interval': steps,
      'trainer.checkpoint_interval': steps,
      'trainer.validation_interval': steps,
      'trainer.optimizer_config.learning_rate.cosine.decay_steps': steps,
      'trainer.optimizer_config.warmup.linear.warmup_steps': max(
          1, steps // 10),
  }


def experiment_params(experiment: str, size: Size,
                      overrides: Dict[str, Any]
                      ) -> config_definitions.ExperimentConfig:
  """`experiment`'s config with `size.overrides`, then `overrides` (dotted
  keys), applied strictly and validated."""
  params = experiment_params_lib.load_params(experiment, lock=False)
  params.override(_nested(dict(size.overrides)), is_strict=True)
  params.override(_nested(overrides), is_strict=True)
  params.validate()
  params.lock()
  return params


def primary_metrics(params: config_definitions.ExperimentConfig
                    ) -> List[Tuple[str, str]]:
  """[(task, its primary metric)] of the experiment's readouts."""
  return [(s.name, readout_types.get_readout_type(s).metrics[0])
          for s in params.task.readouts]


def _scores(metrics: Dict[str, Any], tasks: Sequence[Tuple[str, str]],
            where: str) -> Dict[str, float]:
  """{`<task>/<metric>` of each task's primary metric, `average/score`}
  from a run's final metrics.

  Raises:
    ValueError: a score the run did not report (naming the run and the
      key): nothing is filled in.
  """
  names = [f'{t}/{m}' for t, m in tasks] + [SCORE]
  missing = [n for n in names if n not in metrics]
  if missing:
    raise ValueError(f'{where}: the evaluation reported no {missing}; '
                     f'it reported {sorted(metrics)}.')
  return {n: float(metrics[n]) for n in names}


def _subset(pattern: str, count: int, path: str) -> None:
  """Writes the first `count` records of the files `pattern` matches (in
  file order) to `path`.

  Raises:
    ValueError: the files hold fewer records, naming the pattern.
  """
  files = sorted(tf.io.gfile.glob(pattern))
  records = []
  for record in tf.data.TFRecordDataset(files).take(count):
    records.append(record.numpy())
  if len(records) < count:
    raise ValueError(f'{pattern}: {len(records)} records; the adaptation '
                     f'with {count} training trials needs {count}.')
  dataloader.write_records(path, iter(records))


def run(quick: bool = False, work_dir: Optional[str] = None,
        size: Optional[Size] = None) -> Dict[str, Any]:
  """Pretrains, adapts with every arm at every trial count, evaluates.

  Args:
    quick: `QUICK` sizes (a smoke test) instead of `FULL`.
    work_dir: the folder of the runs (`pretrain/`, `<arm>_<n>/` model_dirs
      and the training subsets); None: a temporary folder, removed after.
    size: sizes other than `QUICK` / `FULL`.

  Returns:
    The run's description ('trial_counts', 'tasks', sessions, 'steps',
    'batch_size', 'seed', 'freeze') and per arm of `ARMS` {str(n): {score
    name: value}}, score names `<task>/<metric>` (each task's primary
    metric) and `average/score`."""
  size = size or (QUICK if quick else FULL)
  if work_dir is not None:
    return _run(size, work_dir)
  with tempfile.TemporaryDirectory() as folder:
    return _run(size, folder)


def _run(size: Size, root: str) -> Dict[str, Any]:
  """`run` in the folder `root`."""
  data = {'task.demo_data.num_held_out_train_trials': max(size.trial_counts)}
  figures: Dict[str, Any] = {arm: {} for arm in ARMS}
  for variant in VARIANTS:
    model = {'task.model.unit_token_variant': variant}
    pretrain = experiment_params(PRETRAIN_EXPERIMENT, size, {
        **data, **model, **_schedule(size.pretrain_steps)})
    pretrain_dir = os.path.join(
        root, 'pretrain' if variant == VARIANTS[0] else f'pretrain_{variant}')
    logging.info('readout_adaptation: pretraining %s %d steps in %s',
                 variant, size.pretrain_steps, pretrain_dir)
    tf_keras.utils.set_random_seed(SEED)
    train.run(pretrain, 'train', pretrain_dir, experiment=PRETRAIN_EXPERIMENT)
    checkpoint = tf.train.latest_checkpoint(pretrain_dir)
    finetune = experiment_params(FINETUNE_EXPERIMENT, size, data)
    held_out_train = demo_data.demo_split_pattern(finetune.task,
                                                  'held_out_train')
    vocabulary_file = demo_data.demo_vocabulary_file(finetune.task)
    tasks = primary_metrics(finetune)
    for count in size.trial_counts:
      subset = os.path.join(root, f'held_out_train_{count}.tfrecord')
      if not tf.io.gfile.exists(subset):
        _subset(held_out_train, count, subset)
      for arm in (a for a in ARMS if arm_variant(a) == variant):
        overrides = {**data, **model, **_schedule(size.adaptation_steps),
                     'task.train_data.global_batch_size': size.batch_size,
                     'task.train_data.input_path': subset,
                     'task.train_data.num_examples': count,
                     'task.vocabulary_file': vocabulary_file}
        if arm_kind(arm) != 'scratch':
          # unfreeze_step 0: frozen for the whole run.
          overrides.update({
              'task.init_checkpoint': checkpoint,
              'task.freeze': list(configs.UNIT_IDENTIFICATION_FREEZE[variant]),
              'task.unfreeze_step': (size.identification_steps
                                     if arm_kind(arm) == 'pretrained'
                                     else 0)})
        else:
          overrides.update({'task.init_checkpoint': '', 'task.freeze': [],
                            'task.unfreeze_step': 0})
        params = experiment_params(FINETUNE_EXPERIMENT, size, overrides)
        model_dir = os.path.join(root, f'{arm}_{count}')
        logging.info('readout_adaptation: %s, %d trials, in %s', arm, count,
                     model_dir)
        tf_keras.utils.set_random_seed(SEED)
        _, metrics = train.run(params, 'train_and_eval', model_dir,
                               experiment=FINETUNE_EXPERIMENT)
        figures[arm][_key(count)] = _scores(metrics, tasks, model_dir)
  figures.update(_describe(size, pretrain, finetune, vocabulary_file, tasks))
  return figures


def _describe(size: Size, pretrain, finetune, vocabulary_file: str,
              tasks: Sequence[Tuple[str, str]]) -> Dict[str, Any]:
  """The run's settings for its figures: sessions, the held-out session
  and its units, the test trials, the steps."""
  units = vocabulary_lib.load(vocabulary_file)
  trained = set(vocabulary_lib.load(
      demo_data.demo_vocabulary_file(pretrain.task)).sessions)
  held_out = [s for s in units.sessions if s not in trained]
  if len(held_out) != 1:
    raise ValueError(f'{vocabulary_file}: expected one session beyond the '
                     f'pretrained ones, found {held_out}.')
  demo = finetune.task.demo_data
  return {
      'trial_counts': [int(n) for n in size.trial_counts],
      'tasks': [[t, m] for t, m in tasks],
      'pretrain_sessions': len(trained),
      'held_out_session': held_out[0],
      'held_out_units': len(units.units_of(held_out[0])),
      'test_trials': int(demo.num_held_out_session_trials),
      'steps': {'pretrain': int(size.pretrain_steps),
                'identification': int(size.identification_steps),
                'adaptation': int(size.adaptation_steps)},
      'batch_size': int(size.batch_size),
      'pretrain_batch_size': int(pretrain.task.train_data.global_batch_size),
      'seed': SEED,
      'freeze': {v: list(configs.UNIT_IDENTIFICATION_FREEZE[v])
                 for v in VARIANTS},
  }
