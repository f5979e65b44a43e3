"""The adaptation curves' driver: what each arm trains, and its figures.

The tests check the figures' tables, plot and missing scores, never the
scores (`python -m official_ext.benchmark readout_adaptation` measures
them); what each arm trains (frozen modules unchanged, grown rows
bit-identical) is tested in tests/readout/test_unit_token_model.py.
"""
import io

import pytest

from official_ext.benchmarks import readout_adaptation as adaptation


def _figures():
  """Hand-made figures of two tasks at two counts."""
  tasks = [['choice', 'balanced_accuracy'], ['wheel_speed', 'r2']]
  arm = lambda base: {str(n): {'choice/balanced_accuracy': base + n / 100,
                               'wheel_speed/r2': base + n / 200,
                               'average/score': base + n / 150}
                      for n in (16, 64)}
  return {'trial_counts': [16, 64], 'tasks': tasks, 'pretrain_sessions': 6,
          'held_out_session': 'session-006', 'held_out_units': 37,
          'test_trials': 128, 'batch_size': 32,
          'steps': {'pretrain': 600, 'identification': 100,
                    'adaptation': 300},
          'pretrained': arm(0.5), 'identification': arm(0.45),
          'scratch': arm(0.25), 'pretrained_session_per_token': arm(0.4),
          'identification_session_per_token': arm(0.35),
          'scratch_session_per_token': arm(0.2)}


def test_tables_and_plot_show_every_arm_at_every_count():
  figures = _figures()
  summary = adaptation.summary_table(figures)
  lines = summary.splitlines()
  assert lines[0] == ('| held-out session: `average/score` | 16 trials | '
                      '64 trials |')
  assert lines[2] == ('| (a) pretrained, unit identification then '
                      'fine-tuning | 0.607 | 0.927 |')
  assert lines[3] == ("| (a') pretrained, unit identification alone | "
                      '0.557 | 0.877 |')
  assert lines[4] == '| (b) the same model from scratch | 0.357 | 0.677 |'
  assert lines[5] == ('| (c) as (a), session embedding on every input '
                      'token | 0.507 | 0.827 |')
  assert lines[7] == ('| (d) as (b), session embedding on every input '
                      'token | 0.307 | 0.627 |')
  assert len(lines) == 8
  table = adaptation.table(figures)
  rows = table.splitlines()
  assert rows[0] == ('| trials | arm | choice (balanced accuracy) | '
                     'wheel_speed (r2) | **average/score** |')
  assert rows[2] == '| 16 | (a) | 0.660 | 0.580 | **0.607** |'
  assert rows[4] == '| 16 | (b) | 0.410 | 0.330 | **0.357** |'
  assert rows[6] == "| 16 | (c') | 0.510 | 0.430 | **0.457** |"
  assert rows[13] == '| 64 | (d) | 0.840 | 0.520 | **0.627** |'
  assert 'session embedding added to every input token' in table
  # Figures of the default variant's arms alone.
  alone = {k: v for k, v in figures.items() if 'session_per_token' not in k}
  assert len(adaptation.table(alone).split('\n\n')[0].splitlines()) == 8
  assert 'every input token' not in adaptation.table(alone)
  assert '6 sessions' in table and '`session-006` (37 units)' in table
  # The README's block shows the plot `report` draws (docs/ from the root).
  assert adaptation.readme_block(figures).startswith(summary)
  assert adaptation.readme_block(figures).endswith(
      '(docs/readout_adaptation.png)')
  assert 'docs/readout_adaptation.png' in [
      p.replace('\\', '/') for p in adaptation.PLOTS]
  stream = io.BytesIO()
  adaptation.plot(figures, stream)
  assert stream.getvalue().startswith(b'\x89PNG')


def test_a_score_the_run_did_not_report_is_named():
  with pytest.raises(ValueError, match=r"dir: the evaluation reported no "
                     r"\['wheel_speed/r2'\]"):
    adaptation._scores({'choice/balanced_accuracy': 0.5,  # pylint: disable=protected-access
                        'average/score': 0.5},
                       [('choice', 'balanced_accuracy'), ('wheel_speed', 'r2')],
                       'dir')
