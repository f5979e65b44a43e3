"""YouTube-8M class names (the dataset's `vocabulary.csv`) and the report of
the best and worst classes that shows them.

`vocabulary.csv` (https://research.google.com/youtube8m/csv/2/vocabulary.csv)
has one row per class under the header
`Index,TrainVideoCount,KnowledgeGraphId,Name,WikiUrl,Vertical1,Vertical2,
Vertical3,WikiDescription`; `Index` is the class id of the records' labels and
`Name` its name (quoted when it holds a comma). Only `Index` and `Name` are
read, and both must be there.
"""
import csv
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

INDEX_COLUMN = 'Index'
NAME_COLUMN = 'Name'


def load_vocabulary(path: str, num_classes: int,
                    key: str = '--vocabulary') -> List[str]:
  """The class names of a vocabulary.csv, by class id.

  Args:
    path: the CSV file (any path `tf.io.gfile` reads).
    num_classes: the model's number of classes; the file must name each of
      the ids 0 .. num_classes - 1, and no other.
    key: the flag or config key `path` came from, for the errors.

  Returns:
    names: list of num_classes strings, names[i] the name of class i.

  Raises:
    ValueError (naming `key`, the file and the line): no `Index` or `Name`
      column, an `Index` that is not an integer, one that repeats, one
      outside [0, num_classes), or a class id without a row.
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

  Only classes with at least one positive in the evaluated data rank (an AP
  without positives is undefined). The worst list leaves out the classes
  already in the best one, so with fewer than 2n such classes it is shorter.

  Args:
    per_class_ap: float [C], per-class AP.
    class_positives: int [C], positives of each class in the data.
    n: classes per list (> 0).
    names: optional class names by id (`load_vocabulary`).

  Returns:
    Text: a title line, then `best:` and `worst:` lines, one class a line:
    `  <id> (<name>): AP 0.8125, 16 positives`, best first (ties: lower id
    first) and worst first (ties: lower id first).
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
