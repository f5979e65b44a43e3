r"""The 3rd YouTube-8M challenge's segment-level mAP@K of a submission.

  python -m official_ext.yt8m.segment_eval --submission=/tmp/segments.csv \
      --input_path='/data/yt8m/3/frame/validate/validate*.tfrecord'
"""
import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from official_ext.core import average_precision
from official_ext.core.input import input_files

SEGMENT_HEADER = 'Class,Segments'
DEFAULT_TOP_K = 100000

_CONTEXT = {
    'id': tf.io.FixedLenFeature([], tf.string, default_value=''),
    'segment_labels': tf.io.VarLenFeature(tf.int64),
    'segment_start_times': tf.io.VarLenFeature(tf.int64),
    'segment_scores': tf.io.VarLenFeature(tf.float32),
}


def read_class_ids(path: str,
                   num_classes: Optional[int] = None) -> List[int]:
  """Class ids of a `segment_label_ids.csv` (optional header), in file order.

  Raises:
    ValueError: naming the file and line: not an integer, outside
      [0, num_classes), repeated; or a file without ids.
  """
  with tf.io.gfile.GFile(path, 'r') as f:
    lines = f.read().splitlines()
  ids, line_of, seen_header = [], {}, False
  for number, line in enumerate(lines, start=1):
    text = line.strip()
    if not text:
      continue
    where = f'--segment_label_ids {path}, line {number}'
    if not re.fullmatch(r'-?[0-9]+', text):
      if not ids and not seen_header and re.fullmatch(r'[A-Za-z_][\w ]*',
                                                      text):
        seen_header = True  # e.g. "Index".
        continue
      raise ValueError(f'{where}: {text!r} is not a class id (one integer a '
                       'line, optionally under one header line).')
    cls = int(text)
    if cls < 0:
      raise ValueError(f'{where}: class id {cls} is negative.')
    if num_classes is not None and cls >= num_classes:
      raise ValueError(f'{where}: class id {cls} is outside [0, '
                       f'{num_classes}) (task.validation_data.num_classes).')
    if cls in line_of:
      raise ValueError(f'{where}: class id {cls} repeats line '
                       f'{line_of[cls]}.')
    line_of[cls] = number
    ids.append(cls)
  if not ids:
    raise ValueError(f'--segment_label_ids {path} holds no class id.')
  return ids


@dataclasses.dataclass
class SegmentRatings:
  """Segment ratings of labelled records.

  Attributes:
    scores: {(`<video>:<start>`, class): rating score}.
    positives: {class: number of positive (score > 0) ratings}.
    num_records: records read.
  """
  scores: Dict[Tuple[str, int], float]
  positives: Dict[int, int]
  num_records: int


def read_ratings(input_path: str, batch_size: int = 256) -> SegmentRatings:
  """Reads the segment ratings of every record of `input_path`.

  Raises:
    ValueError: naming the file (and video) of a damaged record, unequal
      segment lists or a negative class/start; naming `input_path` when it
      holds no rating.
  """
  files = input_files.match_input_files(input_path)
  scores: Dict[Tuple[str, int], float] = {}
  num_records = 0
  for path in files:
    dataset = tf.data.TFRecordDataset(path).batch(batch_size)
    try:
      for batch in dataset:
        context, _, _ = tf.io.parse_sequence_example(
            batch, context_features=_CONTEXT)
        ragged = {k: tf.RaggedTensor.from_sparse(context[k]).to_list()
                  for k in ('segment_labels', 'segment_start_times',
                            'segment_scores')}
        for i, vid in enumerate(context['id'].numpy()):
          vid = vid.decode()
          labels = ragged['segment_labels'][i]
          starts = ragged['segment_start_times'][i]
          values = ragged['segment_scores'][i]
          if not len(labels) == len(starts) == len(values):
            raise ValueError(
                f'Video {vid!r} in file {path}: segment_labels has '
                f'{len(labels)}, segment_start_times {len(starts)} and '
                f'segment_scores {len(values)} entries; expected one each per '
                'rating.')
          for label, start, value in zip(labels, starts, values):
            if label < 0 or start < 0:
              raise ValueError(f'Video {vid!r} in file {path}: rating of '
                               f'class {label} at frame {start}; expected '
                               'both >= 0.')
            key = (f'{vid}:{start}', int(label))
            scores[key] = max(scores.get(key, -np.inf), float(value))
        num_records += int(batch.shape[0])
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
      raise ValueError(f'File {path} cannot be read as segment-rated '
                       f'tf.SequenceExample records: {e.message}') from e
  if not scores:
    raise ValueError(f'--input_path={input_path!r}: no segment rating in '
                     f'{num_records} record(s) ({len(files)} file(s)); '
                     'expected segment-rated records (segment_labels, '
                     'segment_start_times, segment_scores).')
  positives: Dict[int, int] = {}
  for (_, label), value in scores.items():
    if value > 0:
      positives[label] = positives.get(label, 0) + 1
  return SegmentRatings(scores, positives, num_records)


@dataclasses.dataclass
class SubmissionLabels:
  """A submission's rated entries per class, in submission order.

  Attributes:
    positions: {class: int [n] positions in the class's cut line}.
    labels: {class: bool [n] whether each is a positive}.
    num_unrated: submitted (segment, class) pairs without a rating.
    other_classes: classes with a line that are not evaluated.
  """
  positions: Dict[int, np.ndarray]
  labels: Dict[int, np.ndarray]
  num_unrated: int
  other_classes: List[int]


def read_submission(path: str, ratings: SegmentRatings, classes: Set[int],
                    top_k: int = DEFAULT_TOP_K) -> SubmissionLabels:
  """A submission's first `top_k` segments per evaluated class, rated ones kept.

  Raises:
    ValueError: naming the file and line of a malformed line, a repeated
      class or segment; or the file when it has no class line.
  """
  positions, labels, other = {}, {}, []
  num_unrated, seen_lines = 0, {}
  with tf.io.gfile.GFile(path, 'r') as f:
    for number, line in enumerate(f, start=1):
      line = line.strip()
      if not line or (number == 1 and line.lower() == SEGMENT_HEADER.lower()):
        continue
      head, comma, rest = line.partition(',')
      try:
        if not comma:
          raise ValueError
        cls = int(head)
      except ValueError:
        raise ValueError(f'Submission {path}, line {number}: expected '
                         f'`<class>,<video>:<start> ...`, got {line[:80]!r}.'
                         ) from None
      if cls in seen_lines:
        raise ValueError(f'Submission {path}, line {number}: class {cls} '
                         f'already has line {seen_lines[cls]}.')
      seen_lines[cls] = number
      segments = rest.split()[:top_k]
      if len(set(segments)) != len(segments):
        seen = set()
        repeated = next(s for s in segments if s in seen or seen.add(s))
        raise ValueError(f'Submission {path}, line {number}: segment '
                         f'{repeated!r} is listed twice for class {cls}.')
      if cls not in classes:
        other.append(cls)
        continue
      positions[cls], labels[cls], unrated = _rated(segments, cls, ratings)
      bad = next((s for s in unrated if ':' not in s), None)
      if bad is not None:
        raise ValueError(f'Submission {path}, line {number}: '
                         f'{bad!r} is not `<video>:<start>`.')
      num_unrated += len(unrated)
  if not seen_lines:
    raise ValueError(f'Submission {path} has no class line '
                     '(`<class>,<video>:<start> ...`).')
  return SubmissionLabels(positions, labels, num_unrated, sorted(other))


def _rated(segments: Sequence[str], cls: int, ratings: SegmentRatings):
  """(positions, positives, unrated count) of class `cls`'s rated segments."""
  pos, lab, unrated = [], [], []
  for i, segment in enumerate(segments):
    value = ratings.scores.get((segment, cls))
    if value is None:
      unrated.append(segment)
      continue
    pos.append(i)
    lab.append(value > 0)
  return np.asarray(pos, np.int64), np.asarray(lab, bool), unrated


def ranked_lists_labels(lists: Dict[int, Sequence[str]],
                        ratings: SegmentRatings, classes: Set[int],
                        top_k: int = DEFAULT_TOP_K) -> SubmissionLabels:
  """`read_submission` of ranked lists held in memory ({class: segments})."""
  positions, labels, other, num_unrated = {}, {}, [], 0
  for cls, segments in lists.items():
    if cls not in classes:
      other.append(cls)
      continue
    positions[cls], labels[cls], unrated = _rated(list(segments)[:top_k], cls,
                                                  ratings)
    num_unrated += len(unrated)
  return SubmissionLabels(positions, labels, num_unrated, sorted(other))


def mean_average_precision(submission: str, ratings: SegmentRatings,
                           top_k: int = DEFAULT_TOP_K,
                           class_ids: Optional[Sequence[int]] = None
                           ) -> Dict[str, object]:
  """The challenge's mAP@K of `submission` against `ratings` (docs/yt8m.md).

  `class_ids`: the classes to evaluate; None: every class with a rating.
  Returns `map`, `per_class_ap` {class: AP} and counts of the classes and
  entries evaluated, ignored or missing.

  Raises:
    ValueError: no evaluated class has a positive rating, top_k <= 0, or a
      malformed submission.
  """
  evaluated, without = _evaluated_classes(ratings, top_k, class_ids)
  read = read_submission(submission, ratings, set(evaluated), top_k)
  return _mean_average_precision(read, ratings, evaluated, without, top_k)


def mean_average_precision_of_lists(lists: Dict[int, Sequence[str]],
                                    ratings: SegmentRatings,
                                    top_k: int = DEFAULT_TOP_K,
                                    class_ids: Optional[Sequence[int]] = None
                                    ) -> Dict[str, object]:
  """`mean_average_precision` of ranked lists held in memory."""
  evaluated, without = _evaluated_classes(ratings, top_k, class_ids)
  read = ranked_lists_labels(lists, ratings, set(evaluated), top_k)
  return _mean_average_precision(read, ratings, evaluated, without, top_k)


def _evaluated_classes(ratings: SegmentRatings, top_k: int,
                       class_ids: Optional[Sequence[int]]):
  """(evaluated classes, considered classes without a positive rating)."""
  if top_k <= 0:
    raise ValueError(f'--top_k={top_k}; expected > 0.')
  candidates = (set(int(c) for c in class_ids) if class_ids is not None else
                {cls for _, cls in ratings.scores})
  evaluated = sorted(c for c in candidates if ratings.positives.get(c, 0) > 0)
  without = sorted(candidates.difference(evaluated))
  if not evaluated:
    raise ValueError('No evaluated class has a positive segment rating '
                     f'({len(candidates)} class(es) considered); mAP is '
                     'undefined.')
  return evaluated, without


def _mean_average_precision(read: SubmissionLabels, ratings: SegmentRatings,
                            evaluated: List[int], without: List[int],
                            top_k: int) -> Dict[str, object]:
  index = {c: i for i, c in enumerate(evaluated)}
  scores, positive, classes = [], [], []
  for cls, pos in read.positions.items():
    scores.append(-pos.astype(np.float64))  # Earlier position, higher score.
    positive.append(read.labels[cls])
    classes.append(np.full(pos.shape, index[cls], np.int64))
  totals = np.array([ratings.positives[c] for c in evaluated], np.float64)
  aps = average_precision.grouped_average_precision(
      np.concatenate(scores) if scores else np.zeros([0]),
      np.concatenate(positive) if positive else np.zeros([0], bool),
      np.concatenate(classes) if classes else np.zeros([0], np.int64),
      len(evaluated), num_positives=totals)
  missing = sorted(set(evaluated).difference(read.positions))
  if without:
    logging.info('%d class(es) without a positive rating are not evaluated: '
                 '%s', len(without), without[:20])
  if missing:
    logging.warning('%d evaluated class(es) have no submission line (AP 0): '
                    '%s', len(missing), missing[:20])
  return {
      'map': float(np.mean(aps)),
      'per_class_ap': {c: float(a) for c, a in zip(evaluated, aps)},
      'num_classes': len(evaluated),
      'classes_without_positives': without,
      'classes_missing_from_submission': missing,
      'num_rated_submitted': int(sum(p.size for p in read.positions.values())),
      'num_unrated_ignored': read.num_unrated,
      'num_other_class_lines': len(read.other_classes),
      'top_k': int(top_k),
  }


def evaluate(submission: str, input_path: str, top_k: int = DEFAULT_TOP_K,
             segment_label_ids: Optional[str] = None) -> Dict[str, object]:
  """`mean_average_precision` of `submission` against `input_path`'s records."""
  class_ids = (read_class_ids(segment_label_ids) if segment_label_ids else
               None)
  ratings = read_ratings(input_path)
  logging.info('%d rated (segment, class) pairs in %d records of %s.',
               len(ratings.scores), ratings.num_records, input_path)
  return mean_average_precision(submission, ratings, top_k, class_ids)


FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  define = dict(flag_values=flag_values)
  flags.DEFINE_string('submission', None, 'Submission CSV (Class,Segments).',
                      **define)
  flags.DEFINE_string('input_path', None, 'Segment-rated TFRecord pattern.',
                      **define)
  flags.DEFINE_integer('top_k', DEFAULT_TOP_K, 'K of mAP@K: segments per '
                       'class considered.', **define)
  flags.DEFINE_string('segment_label_ids', None,
                      'File of the class ids to evaluate (default: every '
                      'class with a positive rating).', **define)
  flags.mark_flags_as_required(['submission', 'input_path'],
                               flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Scores the submission named by the parsed `flag_values`; prints mAP."""
  del argv
  fv = flag_values
  result = evaluate(fv.submission, fv.input_path, fv.top_k,
                    fv.segment_label_ids)
  print(f'mAP@{result["top_k"]}: {result["map"]:.6f} over '
        f'{result["num_classes"]} classes ({result["num_rated_submitted"]} '
        f'rated segments submitted, {result["num_unrated_ignored"]} unrated '
        f'ignored, {len(result["classes_missing_from_submission"])} classes '
        'without a line)')


if __name__ == '__main__':
  define_flags()
  app.run(main)
