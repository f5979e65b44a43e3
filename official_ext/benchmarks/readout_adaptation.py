"""Adapting a pretrained unit-token readout model to a new recording.

    python -m official_ext.benchmark readout_adaptation \
        --json benchmarks/results/readout_adaptation.json
    python -m official_ext.benchmark report   # tables in README, docs; plot

The field's claim (POYO, torch_brain): a model pretrained over many
recordings adapts to a new one with few trials, by learning only the new
recording's unit and session embeddings with everything else frozen ("unit
identification"), then fine-tuning the whole model. Measured here on
generated data (`readout.demo_data`, unit tokens: sessions that share latent
dynamics but differ in unit count, gains and tuning), through the project's
train API (`official_ext.train.run`), every run in a folder of its own:

1. pretraining: the `readout_units_demo` experiment on its training
   sessions (`Size.pretrain_steps` steps);
2. for each count n of `Size.trial_counts` training trials of the held-out
   session (`readout_units_finetune_demo`, `demo_data.num_finetune_trials`
   n), two arms with the same budget of steps and the same model:
   (a) `pretrained`: `task.init_checkpoint` = the pretrained model, the
   encoder, decoder and readout frozen (`task.freeze`) for the first
   `Size.identification_steps` steps, then every module trained
   (`task.unfreeze_step`) up to `Size.adaptation_steps`;
   (b) `scratch`: the same experiment from a fresh initialisation, every
   module trained for `Size.adaptation_steps` steps;
   each evaluated on the held-out session's test trials (the experiment's
   validation split, the same trials for every arm and count): per-task
   primary metric and `average/score`.

`run` returns the figures (JSON); `table` and `summary_table` render them
(docs/readout.md, README.md: `report.BLOCKS`), `plot` draws the curves
(`PLOTS`: docs/readout_adaptation.png). The arms' scores are what one seed
measured, not a tuned result.
"""
import io
import os
import tempfile
from typing import Any, Callable, Dict, IO, List, NamedTuple, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import config_definitions
from official_ext import train
from official_ext.core import experiment_params
from official_ext.readout import configs

PRETRAIN_EXPERIMENT = 'readout_units_demo'
FINETUNE_EXPERIMENT = 'readout_units_finetune_demo'
ARMS = ('pretrained', 'scratch')
ARM_LABELS = {
    'pretrained': '(a) pretrained, unit identification then fine-tuning',
    'scratch': '(b) the same model from scratch',
}
# The modules frozen during unit identification (`task.freeze`): all but
# the unit and session embeddings.
IDENTIFICATION_FREEZE = ('encoder', 'decoder', 'readout')
SCORE = 'average/score'


class Size(NamedTuple):
  """The sizes of a run.

  Attributes:
    trial_counts: training trials of the held-out session, one adaptation
      per count and arm.
    pretrain_steps: training steps of the pretraining run.
    identification_steps: arm (a)'s steps with everything but the unit and
      session embeddings frozen (`task.unfreeze_step`).
    adaptation_steps: both arms' training steps on the held-out session.
    batch_size: trials per training batch (pretraining and adaptation).
    overrides: further overrides of both experiments (model and data
      sizes).
  """
  trial_counts: Tuple[int, ...]
  pretrain_steps: int
  identification_steps: int
  adaptation_steps: int
  batch_size: int
  overrides: Tuple[Tuple[str, Any], ...] = ()


FULL = Size(trial_counts=(16, 64, 256), pretrain_steps=600,
            identification_steps=100, adaptation_steps=300, batch_size=32)
QUICK = Size(trial_counts=(4, 8), pretrain_steps=2, identification_steps=1,
             adaptation_steps=2, batch_size=4, overrides=(
                 ('task.model.encoder.hidden_size', 8),
                 ('task.model.encoder.num_heads', 2),
                 ('task.model.encoder.num_layers', 1),
                 ('task.model.encoder.intermediate_size', 8),
                 ('task.model.encoder.num_latents', 4),
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
  """Per-task primary metric and `average/score` of both arms at every
  count of training trials (markdown)."""
  counts = figures['trial_counts']
  header = ['task (metric)'] + [f'{n} trials: {arm}' for n in counts
                                for arm in ('(a)', '(b)')]
  rows = [header, ['---'] * len(header)]
  names = [(f'{t} ({m.replace("_", " ")})', f'{t}/{m}')
           for t, m in _tasks(figures)]
  names.append(('**average/score**', SCORE))
  for label, name in names:
    cells = [_cell(_score(figures, arm, n, name)) for n in counts
             for arm in ARMS]
    if name == SCORE:
      cells = [f'**{c}**' for c in cells]
    rows.append([label] + cells)
  lines = ['| ' + ' | '.join(r) + ' |' for r in rows]
  return '\n'.join(lines) + '\n\n' + legend(figures)


def legend(figures: Dict[str, Any]) -> str:
  """What the arms and counts of `table` are (one paragraph)."""
  steps = figures['steps']
  return (
      f'(a) {ARM_LABELS["pretrained"][4:]}: the model pretrained '
      f'{steps["pretrain"]} steps on {figures["pretrain_sessions"]} '
      f'sessions, its encoder, decoder and readout frozen for '
      f'{steps["identification"]} of {steps["adaptation"]} steps; '
      f'(b) {ARM_LABELS["scratch"][4:]}, {steps["adaptation"]} steps; '
      f'both on n training trials of held-out session '
      f'`{figures["held_out_session"]}` ({figures["held_out_units"]} '
      f'units), scored on its {figures["test_trials"]} test trials.')


def summary_table(figures: Dict[str, Any]) -> str:
  """`average/score` of both arms against training trials (markdown)."""
  counts = figures['trial_counts']
  rows = [['held-out session: `average/score`'] +
          [f'{n} trials' for n in counts], ['---'] * (len(counts) + 1)]
  for arm in ARMS:
    rows.append([ARM_LABELS[arm]] + [_cell(_score(figures, arm, n, SCORE))
                                     for n in counts])
  return '\n'.join('| ' + ' | '.join(r) + ' |' for r in rows)


def docs_block(figures: Dict[str, Any]) -> str:
  """docs/readout.md's block: `table` and the plot (`PLOTS`)."""
  return (table(figures) + '\n\n![Scores against training trials of the '
          'held-out session, both arms](readout_adaptation.png)')


def plot(figures: Dict[str, Any], stream: IO[bytes]) -> None:
  """The curves: one panel per task and one of `average/score`, score
  against training trials (log scale), both arms; a PNG into `stream`."""
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
    for arm, style in zip(ARMS, ('o-', 's--')):
      points = [(n, _score(figures, arm, n, name)) for n in counts]
      points = [(n, v) for n, v in points if v is not None]
      ax.plot([n for n, _ in points], [v for _, v in points], style,
              label=ARM_LABELS[arm][:3])
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
