"""Runs every command block of README.md and docs/*.md as written; tabulates.

Writes OUTPUT.md and OUTPUT.json and exits 0 when every block that ran did; how
blocks run and which are skipped: docs/architecture.md, "The docs' commands".
"""
import argparse
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CPP_LOG = re.compile(r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |'
                      r'^WARNING: All log messages before absl')
# Variables a reader sets for their own machine and project.
_USER_VARIABLE = re.compile(r'\$\{?([A-Z][A-Z0-9_]*)')
# What the documented commands take from the user's own data or accounts.
_EXTERNAL = (
    (re.compile(r'(?<![\w/])/data/'), 'data under /data/'),
    (re.compile(r'gs://'), 'Cloud Storage'),
    (re.compile(r'--tpu[_=]|launch_cloud_tpu'), 'a Cloud TPU'),
    (re.compile(r'\bDIR\b|/path/to/|\bsession\.nwb\b|\b[abc]\.nwb\b'),
     'a placeholder for the user\'s files'),
    (re.compile(r'host1:|TF_CONFIG='), 'several hosts'),
    (re.compile(r'jax\[cuda|run_xla_steps'), 'a GPU machine with JAX'),
    (re.compile(r'\bpip install\b'), 'installing into this environment'),
)


@dataclasses.dataclass(frozen=True)
class Block:
  """A fenced command block: its page `path`, the `line` of its opening fence,
  its `text`."""
  path: str
  line: int
  text: str

  @property
  def where(self) -> str:
    return f'{self.path}:{self.line}'

  @property
  def title(self) -> str:
    """The block's first command line (comments skipped), shortened."""
    for line in self.text.splitlines():
      line = line.strip()
      if line and not line.startswith('#'):
        return line if len(line) <= 80 else line[:77] + '...'
    return ''


def pages(repo: str = REPO) -> List[str]:
  """README.md and every docs/*.md, relative to `repo`."""
  return ['README.md'] + sorted(
      os.path.relpath(p, repo)
      for p in glob.glob(os.path.join(repo, 'docs', '*.md')))


def doc_blocks(repo: str = REPO, language: str = 'bash') -> List[Block]:
  """Every ```<language> block of `pages(repo)`, in that order."""
  out = []
  for path in pages(repo):
    with open(os.path.join(repo, path), encoding='utf-8') as f:
      text = f.read()
    for m in re.finditer(r'^```(\w*)\n(.*?)^```', text, re.S | re.M):
      if m.group(1) == language:
        out.append(Block(path, text.count('\n', 0, m.start()) + 1,
                         m.group(2)))
  return out


def external_needs(block: Block) -> List[str]:
  """What `block` needs that only the user has (empty: it runs here)."""
  needs = [why for pattern, why in _EXTERNAL if pattern.search(block.text)]
  assigned = set(re.findall(r'^\s*([A-Z][A-Z0-9_]*)=', block.text, re.M))
  unset = sorted(set(_USER_VARIABLE.findall(block.text)) - assigned)
  if unset:
    needs.append('$' + ', $'.join(unset))
  return needs


def copy_checkout(scratch: str) -> str:
  """The checkout's tracked and untracked, not ignored files copied to
  `scratch`/repo (once); returns that folder."""
  copy = os.path.join(scratch, 'repo')
  if not os.path.isdir(copy):
    names = subprocess.run(
        ['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
        cwd=REPO, stdout=subprocess.PIPE, check=True).stdout.split(b'\0')
    for name in filter(None, (n.decode() for n in names)):
      source = os.path.join(REPO, name)
      if os.path.isfile(source):
        os.makedirs(os.path.dirname(os.path.join(copy, name)), exist_ok=True)
        shutil.copy2(source, os.path.join(copy, name))
  return copy


def run_block(block: Block, scratch: str, timeout: float) -> Dict[str, Any]:
  """Runs `block` in `copy_checkout(scratch)`; returns its table row."""
  copy = copy_checkout(scratch)
  tmp = os.path.join(scratch, 'tmp')
  os.makedirs(tmp, exist_ok=True)
  script = block.text.replace('/tmp/', tmp + '/')
  env = dict(os.environ, HOME=scratch, TMPDIR=tmp,
             PYTHONPATH=os.pathsep.join(
                 [copy] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
  started = time.perf_counter()
  try:
    result = subprocess.run(
        ['bash', '-e', '-o', 'pipefail', '-c', script], cwd=copy, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors='replace', timeout=timeout, check=False)
    code, output = result.returncode, result.stdout
  except subprocess.TimeoutExpired as e:
    out = e.stdout or ''
    code = 'timeout'
    output = (out.decode(errors='replace') if isinstance(out, bytes)
              else out) + f'\n(stopped after {timeout:g} s)'
  # The last line that is not TensorFlow's C++ logging (CUDA probes etc.).
  lines = [l for l in output.splitlines() if l.strip() and
           not _CPP_LOG.match(l)] or [l for l in output.splitlines()
                                      if l.strip()]
  return {'block': block.title, 'where': block.where, 'exit': code,
          'seconds': round(time.perf_counter() - started, 1),
          'last_line': lines[-1] if lines else '', 'tail': output[-4000:]}


def markdown(rows: Sequence[Dict[str, Any]]) -> str:
  """The table of `rows` as markdown."""
  def cell(v):
    return str(v).replace('|', '\\|').replace('\n', ' ')
  out = ['| block | file:line | exit code | seconds | last line |',
         '|---|---|---|---|---|']
  for r in rows:
    out.append('| ' + ' | '.join(cell(v) for v in (
        f"`{r['block']}`", r['where'], r['exit'], r['seconds'],
        r['last_line'])) + ' |')
  return '\n'.join(out) + '\n'


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--output', default='',
                 help='the table is written to OUTPUT.md and OUTPUT.json')
  p.add_argument('--scratch', default='',
                 help='where the blocks write (default: OUTPUT_scratch)')
  p.add_argument('--filter', default='',
                 help='only blocks whose file:line or text match this regex')
  p.add_argument('--timeout', type=float, default=7200.0,
                 help='seconds one block may run')
  p.add_argument('--include_external', action='store_true',
                 help='also run the blocks that need the user\'s data, '
                 'accounts or machines')
  p.add_argument('--list', action='store_true',
                 help='list the blocks and what they need; run none')
  a = p.parse_args(argv)
  blocks = [b for b in doc_blocks()
            if not a.filter or re.search(a.filter, b.where) or
            re.search(a.filter, b.text)]
  if a.list:
    for b in blocks:
      needs = external_needs(b)
      print(f'{b.where}\t{b.title}' +
            (f'\t(needs {"; ".join(needs)})' if needs else ''))
    return 0
  if not a.output:
    p.error('--output is required (unless --list)')
  if not blocks:
    p.error(f'--filter={a.filter!r} matches no block')
  output = os.path.abspath(a.output)
  scratch = os.path.abspath(a.scratch or output + '_scratch')
  os.makedirs(os.path.dirname(output), exist_ok=True)
  os.makedirs(scratch, exist_ok=True)
  rows = []
  for b in blocks:
    needs = external_needs(b)
    if needs and not a.include_external:
      row = {'block': b.title, 'where': b.where, 'exit': 'skipped',
             'seconds': 0.0, 'last_line': 'needs ' + '; '.join(needs),
             'tail': ''}
    else:
      print(f'running {b.where}: {b.title}', flush=True)
      row = run_block(b, scratch, a.timeout)
    print(f"  {row['where']}: exit {row['exit']}, {row['seconds']} s: "
          f"{row['last_line']}", flush=True)
    rows.append(row)
    # Written after every block: an interrupted run keeps its rows.
    with open(output + '.md', 'w', encoding='utf-8') as f:
      f.write(markdown(rows))
    with open(output + '.json', 'w', encoding='utf-8') as f:
      json.dump({'scratch': scratch, 'rows': rows}, f, indent=1)
  print(f'wrote {output}.md and {output}.json')
  return 0 if all(r['exit'] in (0, 'skipped') for r in rows) else 1


if __name__ == '__main__':
  sys.exit(main())
