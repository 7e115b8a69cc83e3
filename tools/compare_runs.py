"""An epoch's seconds of whole training commands, run in turn: opt-in.

How docs/speed.md compares this project with the Flax example and PyTorch:

  python -m tools.compare_runs --rounds=3 [--epoch=2] \
      --run='ours=python main.py --workdir={workdir} \
          --config=configs/default.py --config.num_epochs=2' \
      --run='pytorch bf16=/tmp/torchpeer/bin/python -m tools.torch_peer \
          --data_dir=../shared/data/mnist --bf16'

Each round runs every command once, in the order given, one at a time, in
the foreground of this process; `{workdir}` is a new directory each time,
removed after. An epoch's seconds run from the arrival of the epoch line
before it to its own (the training and the full evaluation): a line with
`epoch: N` and `test_accuracy: X`, which this project's `main.py`, the
Flax example's and `tools/torch_peer.py` each print once an epoch is
evaluated; its test accuracy is reported. `--epoch=0` times whole
commands only, and reports the last epoch's accuracy. Peak RSS is the
kernel's count for each finished command, which starts at the fork and so
includes this process's own (some 20 MB). Stolen seconds are the CPU time
that the hypervisor gave to other machines while the command ran (all of
this machine's CPUs, from /proc/stat; None where it has no such count): on
a shared virtual machine a round slowed by its neighbours shows there. Prints each run, a table of
medians, with each run's speed against the first round by round, then one
JSON object as its last line.
"""

import collections
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import typing

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_multi_string(
    'run',
    [],
    "NAME=COMMAND, once per command; '{workdir}' in COMMAND is a new "
    'directory.',
)
flags.DEFINE_integer(
    'rounds', 3, 'Rounds; each runs every command once.', lower_bound=1
)
flags.DEFINE_integer(
    'epoch',
    2,
    'The epoch timed, from the line of the epoch before; 0: whole commands.',
    lower_bound=0,
)

_EPOCH_LINE = re.compile(r'\bepoch:\s*(\d+)\b.*\btest_accuracy:\s*([\d.]+)')


class Run(typing.NamedTuple):
  """One command's figures."""

  epoch_seconds: float | None
  seconds: float
  peak_rss_gb: float
  test_accuracy: float | None
  stolen_seconds: float | None


def stolen_seconds(stat: str = '/proc/stat') -> float | None:
  """CPU seconds stolen by the hypervisor since boot, all CPUs; or None.

  The eighth count of /proc/stat's `cpu` line, in clock ticks (proc(5)).
  """
  try:
    with open(stat) as f:
      counts = f.readline().split()
  except OSError:
    return None
  if len(counts) < 9 or counts[0] != 'cpu':
    return None
  return int(counts[8]) / os.sysconf('SC_CLK_TCK')


def parse_runs(specs: list[str]) -> dict[str, list[str]]:
  """{name: argv} from `NAME=COMMAND` specs; ValueError names a bad one."""
  runs = {}
  for spec in specs:
    name, _, command = spec.partition('=')
    if not name.strip() or not command.strip():
      raise ValueError(f'--run={spec!r}: expected NAME=COMMAND')
    if name in runs:
      raise ValueError(f'--run={spec!r}: the name {name!r} is taken')
    runs[name] = shlex.split(command)
  if not runs:
    raise ValueError('no --run given: expected NAME=COMMAND, once per command')
  return runs


def run_once(name: str, argv: list[str], epoch: int) -> Run:
  """Runs `argv` once; RuntimeError if it fails or prints no epoch line."""
  with tempfile.TemporaryDirectory() as scratch:
    workdir = os.path.join(scratch, 'workdir')
    argv = [arg.replace('{workdir}', workdir) for arg in argv]
    env = dict(os.environ, PYTHONUNBUFFERED='1')  # Lines as they happen.
    start, stolen_before = time.monotonic(), stolen_seconds()
    arrivals, accuracies = {}, {}  # By epoch.
    tail = collections.deque(maxlen=20)
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    ) as process:
      for line in process.stdout:
        tail.append(line)
        match = _EPOCH_LINE.search(line)
        if match and int(match.group(1)) not in arrivals:
          arrivals[int(match.group(1))] = time.monotonic()
          accuracies[int(match.group(1))] = float(match.group(2))
      # wait4, not wait: the command's resource usage, its peak RSS.
      _, status, usage = os.wait4(process.pid, 0)
      seconds, stolen_after = time.monotonic() - start, stolen_seconds()
      process.returncode = os.waitstatus_to_exitcode(status)
  missing = sorted({epoch - 1, epoch} - arrivals.keys() - {0}) if epoch else []
  if process.returncode:
    why = f'exited with {process.returncode}'
  elif missing:
    why = f'printed no epoch line for epoch {" or ".join(map(str, missing))}'
  else:
    last = max(accuracies, default=None)
    return Run(
        epoch_seconds=arrivals[epoch] - arrivals.get(epoch - 1, start)
        if epoch
        else None,
        seconds=seconds,
        peak_rss_gb=usage.ru_maxrss / 1e6,  # Kilobytes on Linux.
        test_accuracy=accuracies.get(epoch or last),
        stolen_seconds=None
        if stolen_before is None or stolen_after is None
        else stolen_after - stolen_before,
    )
  sys.stderr.write(''.join(tail))
  raise RuntimeError(f'{name!r} ({shlex.join(argv)}) {why}')


def compare(runs: dict[str, list[str]], rounds: int, epoch: int) -> dict:
  """Each run's figures, round by round, and its speed against the first."""
  results = {name: [] for name in runs}
  for number in range(1, rounds + 1):
    for name, argv in runs.items():
      run = run_once(name, argv, epoch)
      results[name].append(run)
      print(f'round {number}, {name}: {json.dumps(run._asdict())}', flush=True)
  timed = 'epoch_seconds' if epoch else 'seconds'
  first = [getattr(run, timed) for run in next(iter(results.values()))]
  summary = {'timed': f'epoch {epoch}' if epoch else 'whole command'}
  for name, name_runs in results.items():
    values = [getattr(run, timed) for run in name_runs]
    # Round by round: a machine that slows for a while slows both.
    paired = [f / v for f, v in zip(first, values)]
    summary[name] = {
        'seconds': round(statistics.median(values), 2),
        'runs': [round(v, 2) for v in values],
        'paired_speedup': round(statistics.median(paired), 2),
        'pairs': [round(p, 2) for p in paired],
        'peak_rss_gb': [round(run.peak_rss_gb, 2) for run in name_runs],
        'test_accuracy': [run.test_accuracy for run in name_runs],
        'stolen_seconds': [
            None if run.stolen_seconds is None else round(run.stolen_seconds, 1)
            for run in name_runs
        ],
    }
  return summary


def main(argv):
  del argv
  try:
    runs = parse_runs(FLAGS.run)
  except ValueError as error:
    raise app.UsageError(str(error)) from None
  try:
    summary = compare(runs, FLAGS.rounds, FLAGS.epoch)
  except RuntimeError as error:
    sys.exit(f'compare_runs: {error}')
  print(
      f'\n{summary["timed"]}, seconds: median (rounds), x first run, '
      'seconds stolen'
  )
  for name in runs:
    s = summary[name]
    print(
        f'{name:30s} {s["seconds"]:8.2f} {s["runs"]}  x{s["paired_speedup"]}'
        f' {s["pairs"]}  stolen {s["stolen_seconds"]}'
    )
  print(json.dumps(summary))


if __name__ == '__main__':
  app.run(main)
