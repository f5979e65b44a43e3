r"""Ensembles of stored predictions (docs/yt8m.md#ensembles): fitted weights.

  python -m official_ext.yt8m.ensemble --fit_on=/tmp/a_val,/tmp/b_val \
      --predictions=/tmp/a_test,/tmp/b_test --output_file=/tmp/submission.csv
"""
import dataclasses
import json
import os
from typing import Callable, Dict, List, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

from official_ext.core import output_files
from official_ext.yt8m import metrics
from official_ext.yt8m import predict
from official_ext.yt8m import segment_eval
from official_ext.yt8m import stored_predictions

_CHUNK_ROWS = 8192
FIRST_STEP = 0.5
LAST_STEP = 1.0 / 64


@dataclasses.dataclass
class AlignedSets:
  """Stored sets of one flag, their rows in one order.

  Attributes:
    sets: the sets, in model order.
    rows: per set, int [N]: its row of each aligned row.
  """
  sets: List[stored_predictions.StoredPredictions]
  rows: List[np.ndarray]

  @property
  def first(self) -> stored_predictions.StoredPredictions:
    return self.sets[0]

  def mean(self, weights: Sequence[float], start: int = 0,
           stop: Optional[int] = None) -> np.ndarray:
    """float32 [rows, C]: the weighted mean of aligned rows start:stop."""
    out = None
    for w, s, rows in zip(weights, self.sets, self.rows):
      if w == 0:
        continue
      part = (s.probabilities[rows[start:stop]].astype(np.float32) *
              np.float32(w))
      out = part if out is None else out + part
    return out


def is_own_output(head: bytes) -> bool:
  """Whether a file's first bytes are those of a submission this command
  writes (video or segment level)."""
  return output_files.begins_with(predict.VIDEO_HEADER + '\n',
                                  predict.SEGMENT_HEADER + '\n')(
                                      head.replace(b'\r\n', b'\n'))


def _check_same(sets, flag: str) -> None:
  first = sets[0]
  for s in sets[1:]:
    for what, a, b in (
        ('level', first.level, s.level),
        ('num_classes', first.num_classes, s.num_classes),
        ('class_ids', first.class_ids.tolist(), s.class_ids.tolist()),
        ('segment_size', first.segment_size, s.segment_size)):
      if a != b:
        short = lambda v: (f'{len(v)} classes {v[:5]}...' if
                           isinstance(v, list) and len(v) > 5 else v)
        raise ValueError(f'{flag}: {s.path} holds {what} {short(b)}; '
                         f'{first.path} holds {short(a)}. The sets of an '
                         'ensemble hold the same rows and classes.')


def align(sets: Sequence[stored_predictions.StoredPredictions],
          flag: str = '--predictions') -> AlignedSets:
  """Checks that `sets` hold the same rows and classes; aligns their rows.

  Raises:
    ValueError: naming the file: another level, classes or segment size; a
      repeated id; ids that another set lacks or adds.
  """
  sets = list(sets)
  _check_same(sets, flag)
  keys = [s.keys() for s in sets]
  orders = []
  for s, k in zip(sets, keys):
    order = np.argsort(k, kind='stable')
    ordered = k[order]
    repeated = np.flatnonzero(ordered[1:] == ordered[:-1])
    if repeated.size:
      raise ValueError(f'{flag}: {s.path} holds {ordered[repeated[0]]!r} '
                       'twice (the input held a video more than once).')
    orders.append(order)
  first_sorted = keys[0][orders[0]]
  rank_of_first = np.empty_like(orders[0])
  rank_of_first[orders[0]] = np.arange(len(orders[0]))
  rows = []
  for s, k, order in zip(sets, keys, orders):
    other = k[order]
    if len(other) != len(first_sorted) or not np.array_equal(other,
                                                             first_sorted):
      missing = sorted(set(first_sorted) - set(other))
      extra = sorted(set(other) - set(first_sorted))
      raise ValueError(
          f'{flag}: {s.path} holds {len(other)} rows, {sets[0].path} '
          f'{len(first_sorted)}: {len(missing)} of the latter are missing '
          f'(e.g. {missing[:3]}) and {len(extra)} are not in it (e.g. '
          f'{extra[:3]}). The sets of an ensemble are predictions of the '
          'same records.')
    rows.append(order[rank_of_first])
  return AlignedSets(sets, rows)


def check_labels(aligned: AlignedSets, flag: str = '--fit_on') -> None:
  """ValueError naming the file unless every set holds the same labels."""
  for s in aligned.sets:
    if not s.has_labels:
      raise ValueError(f'{flag}: {s.path} holds no labels (predicted from '
                       'unlabelled records); weights are fitted on '
                       'predictions of labelled (validation) records.')
  first = aligned.first
  for s, rows in zip(aligned.sets[1:], aligned.rows[1:]):
    for start in range(0, len(rows), _CHUNK_ROWS):
      a = first.labels(aligned.rows[0][start:start + _CHUNK_ROWS])
      b = s.labels(rows[start:start + _CHUNK_ROWS])
      differ = np.flatnonzero((a != b).any(axis=1))
      if differ.size:
        row = aligned.rows[0][start + differ[0]]
        raise ValueError(f'{flag}: {s.path} and {first.path} hold other '
                         f'labels for video {first.keys()[row]!r}.')


def video_gap(aligned: AlignedSets, weights: Sequence[float],
              top_k: int = 20) -> float:
  """GAP (top_k a video) of the weighted mean against the first set's labels."""
  first = aligned.first
  acc = metrics.AveragePrecisionAccumulator(first.num_classes, top_k)
  n = len(aligned.rows[0])
  for start in range(0, n, _CHUNK_ROWS):
    acc.accumulate(aligned.mean(weights, start, start + _CHUNK_ROWS),
                   first.labels(aligned.rows[0][start:start + _CHUNK_ROWS]))
  return float(acc.result()['gap'])


def segment_ranking(aligned: AlignedSets, weights: Sequence[float],
                    cap: int, top_classes: Optional[int] = None
                    ) -> predict.SegmentRanking:
  """The ranking `predict` builds, of the weighted mean of every segment."""
  first = aligned.first
  # The stored columns are the ranked classes: rank every column.
  ranking = predict.SegmentRanking(np.arange(first.class_ids.size), cap,
                                   first.segment_size,
                                   top_classes=top_classes)
  rows = aligned.rows[0]
  for start in range(0, len(rows), _CHUNK_ROWS):
    part = rows[start:start + _CHUNK_ROWS]
    ranking.add(first.video_ids[part], first.segment_start_times[part],
                aligned.mean(weights, start, start + _CHUNK_ROWS))
  return ranking


def segment_map(aligned: AlignedSets, weights: Sequence[float],
                ratings: segment_eval.SegmentRatings,
                top_k: int = segment_eval.DEFAULT_TOP_K,
                top_classes: Optional[int] = None) -> float:
  """mAP@top_k (`segment_eval`) of the lists of the weighted mean."""
  ranking = segment_ranking(aligned, weights, top_k, top_classes)
  class_ids = aligned.first.class_ids
  lists = {int(c): ranking.ranked(i) for i, c in enumerate(class_ids)}
  return float(segment_eval.mean_average_precision_of_lists(
      lists, ratings, top_k, class_ids.tolist())['map'])


def fit_weights(score: Callable[[np.ndarray], float], num_models: int,
                first_step: float = FIRST_STEP, last_step: float = LAST_STEP
                ) -> Dict[str, object]:
  """Non-negative weights summing to 1 that maximise `score`.

  Coordinate search on the simplex from the best single model, halving the
  step from `first_step` to `last_step` (docs/yt8m.md#ensembles).

  Returns:
    `weights` float64 [num_models], `score`, `single_scores` (each model
    alone), `evaluations`.
  """
  eye = np.eye(num_models)
  single = [score(eye[i]) for i in range(num_models)]
  best_i = int(np.argmax(single))
  w, best = eye[best_i].copy(), single[best_i]
  evaluations, step = num_models, first_step
  while num_models > 1 and step >= last_step:
    improved = False
    for i in range(num_models):
      for t in (step, -step):
        # w' = (1 - t) w + t e_i >= 0: t >= -w_i / (1 - w_i) when t < 0.
        if t < 0:
          t = max(t, -w[i] / (1.0 - w[i])) if w[i] < 1 else t
        if t == 0 or (t < 0 and w[i] == 0):
          continue
        candidate = np.clip((1 - t) * w + t * eye[i], 0.0, None)
        candidate /= candidate.sum()
        value = score(candidate)
        evaluations += 1
        if value > best:
          w, best, improved = candidate, value, True
    if not improved:
      step /= 2
  return {'weights': w, 'score': best, 'single_scores': single,
          'evaluations': evaluations}


def _load(paths: Sequence[str], flag: str) -> AlignedSets:
  if not paths:
    raise ValueError(f'{flag}: no stored predictions given.')
  return align([stored_predictions.load(p, flag) for p in paths], flag)


def run(fit_on: Sequence[str], output_file: str,
        predictions: Sequence[str] = (),
        weights: Optional[Sequence[float]] = None, top_k: int = 20,
        segment_ratings: Optional[str] = None,
        segment_max_per_class: int = 100000,
        segment_top_classes: Optional[int] = None,
        segment_map_top_k: int = segment_eval.DEFAULT_TOP_K,
        overwrite: bool = False) -> Dict[str, object]:
  """Fits the weights on `fit_on` and writes the submission of `predictions`.

  Args:
    fit_on: stored sets of labelled records, one per model.
    output_file: the submission CSV.
    predictions: stored sets to combine, in the same model order (default:
      `fit_on`).
    weights: weights instead of a fit (>= 0, not all 0; normalised).
    The other arguments are the flags of the same names.

  Returns:
    `weights`, `level`, `rows` written; with a fit also `score`,
    `single_scores`, `metric` and `evaluations`.
  """
  predictions = list(predictions) or list(fit_on)
  _check_output(output_file, fit_on, predictions, segment_ratings, overwrite)
  num_models = len(predictions)
  fit = None
  if weights is not None:
    w = _given_weights(weights, num_models)
  else:
    if len(fit_on) != num_models:
      raise ValueError(f'--fit_on names {len(fit_on)} sets and --predictions '
                       f'{num_models}; expected one of each per model, in '
                       'the same order.')
    fit = _fit(fit_on, top_k, segment_ratings, segment_top_classes,
               segment_map_top_k)
    w = fit['weights']
  combined = _load(predictions, '--predictions')
  if fit is not None:
    _check_fit_matches(combined, fit['level'], fit['class_ids'])
  first = combined.first
  if first.level == 'video':
    written = _write_videos(combined, w, output_file, top_k)
  else:
    written = _write_segments(combined, w, output_file, segment_max_per_class,
                              segment_top_classes)
  result = {k: fit[k] for k in ('score', 'single_scores', 'evaluations',
                                'metric')} if fit else {}
  result.update(weights=w.tolist(), level=first.level, rows=int(written))
  return result


def _check_output(output_file: str, fit_on: Sequence[str],
                  predictions: Sequence[str],
                  segment_ratings: Optional[str], overwrite: bool) -> None:
  """Refuses an output that is an input, lies inside a model or a set, or
  (unless `overwrite`) is an existing file this command did not write."""
  inputs = [('--fit_on', ','.join(fit_on)),
            ('--predictions', ','.join(predictions)),
            ('--segment_ratings', segment_ratings)]
  output_files.check_output_file(output_file, '--output_file', inputs,
                                 models=[], own=is_own_output,
                                 overwrite=overwrite)
  target = os.path.realpath(output_file)
  for path in list(predictions) + list(fit_on):
    if target.startswith(os.path.realpath(path).rstrip('/') + '/'):
      raise ValueError(f'--output_file={output_file} lies inside the stored '
                       f'predictions {path}; nothing was written.')


def _given_weights(weights: Sequence[float], num_models: int) -> np.ndarray:
  """`--weights` normalised to sum 1; ValueError unless >= 0, not all 0."""
  w = np.asarray(weights, np.float64)
  if w.shape != (num_models,) or (w < 0).any() or not w.sum() > 0:
    raise ValueError(f'--weights={list(weights)}: expected {num_models} '
                     'weights >= 0 (one per --predictions set), not all 0.')
  return w / w.sum()


def _fit(fit_on: Sequence[str], top_k: int, segment_ratings: Optional[str],
         segment_top_classes: Optional[int],
         segment_map_top_k: int) -> Dict[str, object]:
  """`fit_weights` on the `fit_on` sets by their level's metric."""
  fit = _load(fit_on, '--fit_on')
  if fit.first.level == 'video':
    check_labels(fit)
    metric = f'gap (top {top_k})'
    score = lambda v: video_gap(fit, v, top_k)
  else:
    if not segment_ratings:
      raise ValueError('--fit_on holds segment-level predictions: '
                       '--segment_ratings names the segment-rated records '
                       'they were predicted from.')
    ratings = segment_eval.read_ratings(segment_ratings)
    metric = f'segment mAP@{segment_map_top_k}'
    score = lambda v: segment_map(fit, v, ratings, segment_map_top_k,
                                  segment_top_classes)
  found = fit_weights(score, len(fit_on))
  logging.info('Fitted weights %s: %s %.6f (each model alone: %s) in %d '
               'evaluations.', np.round(found['weights'], 4).tolist(), metric,
               found['score'], np.round(found['single_scores'], 6).tolist(),
               found['evaluations'])
  return dict(found, metric=metric, level=fit.first.level,
              class_ids=fit.first.class_ids.tolist())


def _check_fit_matches(combined: AlignedSets, fit_level: str,
                       fit_classes: List[int]) -> None:
  first = combined.first
  if fit_level != first.level or fit_classes != first.class_ids.tolist():
    raise ValueError(f'--predictions ({first.path}, ...) hold '
                     f'{first.level}-level predictions of '
                     f'{first.class_ids.size} classes and --fit_on '
                     f'{fit_level}-level ones of {len(fit_classes)}: '
                     'expected the same level and classes.')


def _write_videos(combined: AlignedSets, w: np.ndarray, output_file: str,
                  top_k: int) -> int:
  """Writes the video-level submission of the weighted mean; its videos."""
  first = combined.first

  def batches():
    rows = combined.rows[0]
    for start in range(0, len(rows), _CHUNK_ROWS):
      yield {'video_ids': first.video_ids[rows[start:start + _CHUNK_ROWS]],
             'probabilities': combined.mean(w, start, start + _CHUNK_ROWS)}
  return output_files.write_atomically(
      output_file,
      lambda out: predict.write_video_predictions(batches(), out, top_k))


def _write_segments(combined: AlignedSets, w: np.ndarray, output_file: str,
                    cap: int, top_classes: Optional[int]) -> int:
  """Writes the segment-level submission of the weighted mean; its segments."""
  ranking = segment_ranking(combined, w, cap, top_classes)
  output_files.write_atomically(output_file, _segment_writer(
      ranking, combined.first.class_ids))
  return ranking.num_segments


def _segment_writer(ranking: predict.SegmentRanking, class_ids: np.ndarray):
  """Writes `ranking` (ranked by column) with the stored class ids."""
  def write(out):
    out.write(predict.SEGMENT_HEADER + '\n')
    for position, cls in enumerate(class_ids):
      out.write(f'{int(cls)},' + ' '.join(ranking.ranked(position)) + '\n')
  return write


FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  define = dict(flag_values=flag_values)
  flags.DEFINE_list('fit_on', [], 'Stored predictions (predict '
                    '--output_probabilities) of labelled records, one per '
                    'model: the weights are fitted on them.', **define)
  flags.DEFINE_list('predictions', [], 'Stored predictions to combine, one '
                    'per model in the --fit_on order (default: the --fit_on '
                    'sets).', **define)
  flags.DEFINE_list('weights', None, 'Weights instead of a fit, one per '
                    'model.', **define)
  flags.DEFINE_string('output_file', None, 'The submission CSV.', **define)
  flags.DEFINE_integer('top_k', 20, 'Pairs a video (video level).', **define)
  flags.DEFINE_string('segment_ratings', None, 'Segment-rated records the '
                      '--fit_on sets were predicted from (segment level).',
                      **define)
  flags.DEFINE_integer('segment_max_per_class', 100000, 'Segments a class '
                       '(segment level).', **define)
  flags.DEFINE_integer('segment_top_classes', 0, "A segment enters only its "
                       "best N classes' lists (the starter's rule: 20); 0: "
                       'every class (segment level).', **define)
  flags.DEFINE_integer('segment_map_top_k', segment_eval.DEFAULT_TOP_K,
                       'K of the segment mAP@K the weights maximise.',
                       **define)
  flags.DEFINE_bool('overwrite', False, 'Replace an existing output file '
                    'that the ensemble did not write.', **define)
  flags.mark_flags_as_required(['output_file'], flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Fits (or takes) the weights and writes the submission; prints them."""
  del argv
  fv = flag_values
  weights = None
  if fv.weights:
    try:
      weights = [float(v) for v in fv.weights]
    except ValueError:
      raise ValueError(f'--weights={",".join(fv.weights)}: expected numbers.'
                       ) from None
  elif not fv.fit_on:
    raise ValueError('Give --fit_on (stored predictions of labelled records '
                     'to fit the weights on) or --weights.')
  result = run(fv.fit_on, fv.output_file, fv.predictions, weights,
               fv.top_k, fv.segment_ratings, fv.segment_max_per_class,
               fv.segment_top_classes or None, fv.segment_map_top_k,
               overwrite=fv.overwrite)
  print(json.dumps({k: result[k] for k in sorted(result)}))
  print(f'Wrote {result["rows"]} {result["level"]}s to {fv.output_file}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
