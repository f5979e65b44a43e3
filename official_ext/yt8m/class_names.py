"""YouTube-8M class names (the dataset's `vocabulary.csv`) and the report
of the best and worst classes that shows them.
"""
import csv
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

INDEX_COLUMN = 'Index'
NAME_COLUMN = 'Name'


def load_vocabulary(path: str, num_classes: int,
                    key: str = '--vocabulary') -> List[str]:
  """The class names of a vocabulary.csv (`Index`, `Name` columns), by id.

  Raises:
    ValueError: naming `key`, the file and the line: a missing column, an
      `Index` that is not an integer, repeats or lies outside
      [0, num_classes), or a class id without a row.
  """
  where = f'{key}={path!r}'
  with tf.io.gfile.GFile(path, 'r') as f:
    reader = csv.DictReader(f)
    header = reader.fieldnames or []
    for column in (INDEX_COLUMN, NAME_COLUMN):
      if column not in header:
        raise ValueError(
            f'{where}: no column {column!r} in the header {header}; expected '
            'the YouTube-8M vocabulary.csv header (Index,TrainVideoCount,'
            'KnowledgeGraphId,Name,...).')
    names = {}
    lines = {}
    for row in reader:
      line = reader.line_num
      value = row[INDEX_COLUMN]
      try:
        index = int(value)
      except (TypeError, ValueError):
        raise ValueError(f'{where}, line {line}: Index {value!r} is not an '
                         'integer class id.') from None
      if index in names:
        raise ValueError(f'{where}, line {line}: Index {index} repeats (first '
                         f'on line {lines[index]}).')
      if not 0 <= index < num_classes:
        raise ValueError(f'{where}, line {line}: Index {index} is outside '
                         f'[0, {num_classes}) (the model has {num_classes} '
                         'classes): is it the vocabulary of this data?')
      names[index] = row[NAME_COLUMN] or ''
      lines[index] = line
  missing = [i for i in range(num_classes) if i not in names]
  if missing:
    raise ValueError(f'{where}: no row for {len(missing)} of the '
                     f'{num_classes} class ids (first: {missing[:10]}).')
  return [names[i] for i in range(num_classes)]


def class_label(class_id: int, names: Optional[Sequence[str]]) -> str:
  """`12` or, with names, `12 (Guitar)`."""
  return f'{class_id} ({names[class_id]})' if names else str(class_id)


def best_and_worst_classes(per_class_ap: np.ndarray,
                           class_positives: np.ndarray, n: int,
                           names: Optional[Sequence[str]] = None) -> str:
  """The n best and n worst per-class APs, as lines for the evaluation log.

  Only classes with a positive rank; the worst list leaves out the best
  ones. Lines read `  <id> (<name>): AP 0.8125, 16 positives`; ties: the
  lower id first.
  """
  per_class_ap = np.asarray(per_class_ap, np.float64)
  class_positives = np.asarray(class_positives)
  rated = np.flatnonzero(class_positives > 0)
  best = rated[np.lexsort((rated, -per_class_ap[rated]))][:n]
  rest = np.setdiff1d(rated, best)
  worst = rest[np.lexsort((rest, per_class_ap[rest]))][:n]

  def lines(ids):
    return [f'  {class_label(int(i), names)}: AP {per_class_ap[i]:.4f}, '
            f'{int(class_positives[i])} positives' for i in ids]

  return '\n'.join(
      [f'Per-class AP of the {rated.size} classes with positives:', 'best:'] +
      lines(best) + ['worst:'] + lines(worst))
