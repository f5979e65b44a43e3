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
          'scratch': arm(0.25)}


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
  table = adaptation.table(figures)
  assert table.splitlines()[0] == (
      "| task (metric) | 16 trials: (a) | 16 trials: (a') | 16 trials: (b) "
      "| 64 trials: (a) | 64 trials: (a') | 64 trials: (b) |")
  assert ('| choice (balanced accuracy) | 0.660 | 0.610 | 0.410 | 1.140 | '
          '1.090 | 0.890 |' in table)
  assert ('| wheel_speed (r2) | 0.580 | 0.530 | 0.330 | 0.820 | 0.770 | '
          '0.570 |' in table)
  assert ('| **average/score** | **0.607** | **0.557** | **0.357** | '
          '**0.927** | **0.877** | **0.677** |') in table
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
