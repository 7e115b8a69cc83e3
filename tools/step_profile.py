"""One training step, op by op: where its time goes, against PyTorch's.

Opt-in, not part of the app:

  python -m tools.step_profile [--precision=auto|float32|bfloat16]
      [--narrow_dropout_bits] [--batch=128] [--steps=8] [--dispatches=3]
      [--top=25] [--torch_python=/tmp/torchpeer/bin/python]

Trains `--dispatches` calls of `--steps` steps each through
`train.train_epoch` (the jitted `lax.scan` of `train.train_steps`, the
default config's model, optimizer and metrics, random batches) under
`jax.profiler.trace`, after a call that compiles and warms up. Each XLA
thunk of the compiled module (a fusion, a copy, a loop) is an event of the
profile's trace, named as its HLO instruction: its time, less the time of
the thunks it runs inside it (a `while`'s body), summed and divided by the
steps, is its time a step. Its FLOPs and bytes come from the optimized HLO
(`compiled.as_text()`): a dot's `2*M*N*K`, a convolution's
`2 * outputs * window * input features`, one an element for the element-wise
ops and reductions, as XLA's cost analysis counts them; bytes are what the
instruction reads and writes (its operands and result).

Each op's layer: the model's layers (`conv1`, `batch_norm1`, ...) run here
under `jax.named_scope`s of their names, which XLA keeps in each
instruction's `op_name` (`transpose(...)`: the backward pass); the scopes
change the HLO's metadata alone, not what it computes. The rest (ReLU,
pooling, the loss, the optimizer, the metrics) by the source of the
instruction's innermost frame. A fusion belongs to the layer that most of
its instructions come from.

With `--torch_python` (a Python with PyTorch, as `tools/torch_peer.py`
says), `tools/step_profile_torch.py` profiles the same step in PyTorch,
fp32 or with bf16 autocast as `--precision`, and a table compares each
layer's forward and backward milliseconds. Prints the tables, then one JSON
object as its last line.
"""

import sys

from run import startup

if __name__ == '__main__':  # Before the modules below import TensorFlow.
  startup.begin(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
import collections
import dataclasses
import glob
import gzip
import json
import math
import os
import re
import shlex
import subprocess
import tempfile
import time

from absl import app
from absl import flags
from configs import default
from cpu import layers as cpu_layers
from flax import nnx
import jax
import numpy as np
from run import parallel
import train

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
flags.DEFINE_enum(
    'precision',
    'auto',
    ['auto', 'float32', 'bfloat16'],
    "config.matmul_precision; PyTorch's peer runs bf16 autocast where the "
    'matmuls are bf16, fp32 otherwise.',
)
flags.DEFINE_bool(
    'narrow_dropout_bits', True, 'config.narrow_dropout_bits (the default).'
)
flags.DEFINE_integer('batch', 128, 'Images a step (config.batch_size).')
flags.DEFINE_integer('steps', 8, 'Steps a dispatch (one lax.scan).')
flags.DEFINE_integer('dispatches', 3, 'Dispatches profiled, after warm-up.')
flags.DEFINE_integer('top', 25, 'Ops in the table of ops; 0: all.')
flags.DEFINE_string(
    'torch_python',
    '',
    'A Python with PyTorch: also profile the step in PyTorch and compare.',
)

# The layers in the order of the step, and the other parts of a step.
LAYERS = (
    'input',
    'conv1',
    'dropout1',
    'batch_norm1',
    'conv2',
    'batch_norm2',
    'relu',
    'avg_pool',
    'flatten',
    'linear1',
    'dropout2',
    'linear2',
    'loss',
    'metrics',
    'optimizer',
    'other',
)
_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'bf16': 2}
_BYTES |= {'f16': 2, 's32': 4, 'u32': 4, 'f32': 4, 's64': 8, 'u64': 8}
_BYTES |= {'f64': 8}
# Opcodes that XLA's cost analysis counts one FLOP an output element.
_ELEMENTWISE = frozenset(
    'add subtract multiply divide maximum minimum negate abs exponential log'
    ' log-plus-one exponential-minus-one tanh logistic rsqrt sqrt cbrt power'
    ' compare select and or xor not shift-left shift-right-logical'
    ' shift-right-arithmetic remainder sign floor ceil round-nearest-even'
    ' round-nearest-afz clamp atan2 sine cosine erf popcnt clz'.split()
)
# Instructions that only name, move or reinterpret data.
_PLUMBING = frozenset(
    'parameter constant bitcast broadcast reshape tuple get-tuple-element'
    ' convert bitcast-convert copy iota'.split()
)
_CONTAINERS = frozenset(('while', 'call', 'conditional'))


@dataclasses.dataclass
class Instruction:
  """One instruction of the optimized HLO, as its text gives it."""

  name: str
  computation: str
  opcode: str
  shape: str
  operands: list[str]
  attrs: str
  op_name: str = ''
  frame: int = 0


@dataclasses.dataclass
class Op:
  """A thunk of the step: an instruction of a non-fused computation."""

  name: str
  kind: str
  layer: str
  direction: str  # 'fwd', 'bwd' or '' (neither: the optimizer, the input).
  fuses: str  # The other layers whose instructions a fusion holds.
  flops: float
  bytes: float
  ms: float = 0.0
  calls: float = 0.0


def _depths(text: str, start: int = 0):
  """Each index of `text` from `start`, with the bracket depth after its
  character; None inside quotes."""
  depth, quoted = 0, False
  for i in range(start, len(text)):
    c = text[i]
    if c == '"':
      quoted = not quoted
    elif not quoted and c in '([{':
      depth += 1
    elif not quoted and c in ')]}':
      depth -= 1
    yield i, None if quoted else depth


def _split_top(text: str, sep: str = ',') -> list[str]:
  """`text` split at `sep` outside brackets and quotes."""
  parts, start = [], 0
  for i, depth in _depths(text):
    if depth == 0 and text[i] == sep:
      parts.append(text[start:i])
      start = i + 1
  parts.append(text[start:])
  return [p.strip() for p in parts if p.strip()]


def _closing(text: str, start: int) -> int:
  """The index of the bracket closing the one at `text[start]`."""
  for i, depth in _depths(text, start):
    if depth == 0 and text[i] in ')]}':
      return i
  raise ValueError(f'unbalanced: {text[start:start + 80]}')


def shape_bytes_elements(shape: str) -> tuple[int, int]:
  """Bytes and elements of an HLO shape (`f32[2,3]{1,0}`, tuples summed)."""
  total_bytes = total_elements = 0
  for dtype, dims in re.findall(r'\b([a-z]+\d*)\[([\d,]*)\]', shape):
    n = math.prod(int(d) for d in dims.split(',') if d)
    total_elements += n
    total_bytes += n * _BYTES.get(dtype, 0)
  return total_bytes, total_elements


def _dims(shape: str) -> list[int]:
  match = re.search(r'\[([\d,]*)\]', shape)
  return [int(d) for d in match.group(1).split(',') if d] if match else []


class Hlo:
  """The optimized HLO module's instructions, computations and source frames."""

  def __init__(self, text: str):
    self.instructions: dict[str, Instruction] = {}
    self.computations: dict[str, list[Instruction]] = collections.defaultdict(
        list
    )
    self.entry = ''
    self.frames: dict[int, tuple[str, str, int, int]] = {}
    self._parse_frames(text)
    computation = None
    for line in text.splitlines():
      header = re.match(r'^(ENTRY )?%(\S+) .*\{$', line)
      if header:
        computation = header.group(2)
        if header.group(1):
          self.entry = computation
        continue
      if line.startswith('}'):
        computation = None
        continue
      if computation is None:
        continue
      instruction = self._parse_instruction(line.strip(), computation)
      if instruction:
        self.instructions[instruction.name] = instruction
        self.computations[computation].append(instruction)

  def _parse_frames(self, text: str) -> None:
    """Each stack frame's innermost location: file, function, line, column."""

    def section(name):
      body = text.split(f'\n{name}\n', 1)
      return body[1].split('\n\n', 1)[0].splitlines() if len(body) > 1 else []

    files = {
        int(l.split()[0]): l.split(None, 1)[1].strip('"')
        for l in section('FileNames')
    }
    functions = {
        int(l.split()[0]): l.split(None, 1)[1].strip('"')
        for l in section('FunctionNames')
    }
    locations = {}
    for line in section('FileLocations'):
      fields = dict(re.findall(r'(\w+)=(\d+)', line))
      locations[int(line.split()[0])] = (
          files.get(int(fields['file_name_id']), ''),
          functions.get(int(fields['function_name_id']), ''),
          int(fields['line']),
          int(fields['column']),
      )
    for line in section('StackFrames'):
      fields = dict(re.findall(r'(\w+)=(\d+)', line))
      location = locations.get(int(fields['file_location_id']))
      if location:
        self.frames[int(line.split()[0])] = location

  @staticmethod
  def _parse_instruction(line: str, computation: str) -> Instruction | None:
    match = re.match(r'^(?:ROOT )?%(\S+) = ', line)
    if not match:
      return None
    rest = line[match.end() :]
    if rest.startswith('('):  # A tuple shape.
      end = _closing(rest, 0) + 1
    else:
      end = rest.index(' ')
    shape, rest = rest[:end], rest[end:].strip()
    opcode = rest[: rest.index('(')]
    close = _closing(rest, len(opcode))
    operands = re.findall(r'%([^\s,)]+)', rest[len(opcode) : close + 1])
    attrs = rest[close + 1 :]
    op_name = re.search(r'op_name="([^"]*)"', attrs)
    frame = re.search(r'stack_frame_id=(\d+)', attrs)
    return Instruction(
        name=match.group(1),
        computation=computation,
        opcode=opcode,
        shape=shape,
        operands=operands,
        attrs=attrs,
        op_name=op_name.group(1) if op_name else '',
        frame=int(frame.group(1)) if frame else 0,
    )

  def called(self, instruction: Instruction, keys=('calls',)) -> list[str]:
    """The computations `instruction` names with `keys` (`calls=%c`)."""
    names = []
    for key in keys:
      for group in re.findall(
          rf'\b{key}=(\{{[^}}]*\}}|%[^\s,]+)', instruction.attrs
      ):
        names += re.findall(r'%([^\s,}]+)', group)
    return names

  def flops(self, instruction: Instruction) -> float:
    """XLA's cost analysis' FLOPs of one instruction, fusions' bodies summed."""
    _, elements = shape_bytes_elements(instruction.shape)
    op = instruction.opcode
    if op == 'fusion':
      return sum(
          self.flops(i)
          for c in self.called(instruction)
          for i in self.computations[c]
      )
    if op == 'dot':
      lhs = _dims(self.instructions[instruction.operands[0]].shape)
      contracting = re.search(
          r'lhs_contracting_dims=\{([\d,]*)\}', instruction.attrs
      )
      k = math.prod(lhs[int(d)] for d in contracting.group(1).split(',') if d)
      return 2.0 * elements * k
    if op == 'convolution':
      kernel = _dims(self.instructions[instruction.operands[1]].shape)
      labels = re.search(r'dim_labels=\w+_(\w+)->', instruction.attrs).group(1)
      window = math.prod(n for n, l in zip(kernel, labels) if l != 'o')
      groups = re.search(r'feature_group_count=(\d+)', instruction.attrs)
      return 2.0 * elements * window / (int(groups.group(1)) if groups else 1)
    if op in ('reduce', 'reduce-window'):
      inputs = instruction.operands[: len(instruction.operands) // 2]
      if op == 'reduce-window':
        size = re.search(r'size=([\dx]+)', instruction.attrs).group(1)
        return float(elements * math.prod(int(s) for s in size.split('x')))
      return float(
          sum(
              shape_bytes_elements(self.instructions[o].shape)[1]
              for o in inputs
          )
      )
    if op in _ELEMENTWISE:
      return float(elements)
    return 0.0

  def bytes(self, instruction: Instruction) -> float:
    """What the instruction reads (its operands) and writes (its result)."""
    read = sum(
        shape_bytes_elements(self.instructions[o].shape)[0]
        for o in instruction.operands
        if o in self.instructions
    )
    return float(read + shape_bytes_elements(instruction.shape)[0])

  def body(self, instruction: Instruction) -> list[Instruction]:
    """A fusion's instructions, nested fusions' too; others: itself."""
    if instruction.opcode != 'fusion':
      return [instruction]
    return [
        j
        for c in self.called(instruction)
        for i in self.computations[c]
        for j in self.body(i)
    ]

  def thunk_computations(self) -> set[str]:
    """The computations whose instructions run as thunks: not fused bodies."""
    found, todo = set(), [self.entry]
    while todo:
      name = todo.pop()
      if name in found:
        continue
      found.add(name)
      for i in self.computations[name]:
        if i.opcode in _CONTAINERS:
          todo += self.called(
              i,
              (
                  'body',
                  'condition',
                  'to_apply',
                  'branch_computations',
                  'true_computation',
                  'false_computation',
              ),
          )
    return found


class Layers:
  """Which layer, and which pass, an instruction of the step belongs to."""

  def __init__(self, hlo: Hlo, scopes):
    self.hlo = hlo
    self.scopes = frozenset(scopes)
    self._sources = {}

  def _source_name(self, path: str, line: int, column: int) -> str:
    """The name a call at `path:line:column` of models.py calls."""
    if path not in self._sources:
      try:
        with open(path) as f:
          self._sources[path] = f.read().splitlines()
      except OSError:
        self._sources[path] = []
    lines = self._sources[path]
    if not 0 < line <= len(lines):
      return 'other'
    text = lines[line - 1][column:]
    match = re.match(r'(?:\w+\.)?(\w+)', text)
    name = match.group(1) if match else 'other'
    return 'flatten' if name == 'reshape' else name

  def of(self, instruction: Instruction) -> tuple[str, str] | None:
    """(layer, 'fwd' | 'bwd' | '') of one instruction; None: no clue."""
    op_name = instruction.op_name
    backward = 'transpose(' in op_name
    for token in re.findall(r'[A-Za-z_]\w*', op_name):
      if token in self.scopes:
        return token, 'bwd' if backward else 'fwd'
    path, function, line, column = self.hlo.frames.get(
        instruction.frame, ('', '', 0, 0)
    )
    file = os.path.basename(path)
    if file == 'models.py':
      layer = self._source_name(path, line, column)
      layer = layer if layer in LAYERS else 'other'
    elif file == 'pooling.py':
      layer = 'avg_pool'
    elif '/losses/' in path or function == 'loss_fn':
      layer = 'loss'
    elif file == 'metrics.py':
      layer = 'metrics'
    elif file == 'optimizer.py' or '/optax/' in path:
      layer = 'optimizer'
    elif function == 'normalize':
      layer = 'input'
    elif file == 'train.py' or not path:  # The step's frame: no clue.
      return None
    else:
      return 'other', ''
    if layer in ('metrics', 'optimizer', 'input'):
      return layer, ''
    return layer, 'bwd' if backward else 'fwd'


def classify(hlo: Hlo, layers: Layers, instruction: Instruction) -> Op:
  """An `Op` for one thunk instruction, without its time; `layer` '' where
  its instructions give no clue."""
  body = hlo.body(instruction)
  opcodes = {i.opcode for i in body}
  rng = any(
      re.search(r'threefry|random_bits|random_wrap', i.op_name) for i in body
  )
  if 'convolution' in opcodes:
    kind = 'conv'
  elif 'dot' in opcodes:
    kind = 'dot'
  elif rng:
    kind = 'rng'
  elif 'reduce-window' in opcodes:
    kind = 'pool'
  elif instruction.opcode != 'fusion':
    kind = instruction.opcode
  elif 'reduce' in opcodes:
    kind = 'reduce'
  elif opcodes <= _PLUMBING | {'transpose', 'concatenate', 'pad', 'slice'}:
    kind = 'copy'
  else:
    kind = 'loop'
  if 'ynn_fusion' in instruction.attrs or 'ynn' in instruction.name:
    kind += ' (ynn)'
  # The instructions that compute vote; where none says, all that say.
  work = [i for i in body if i.opcode not in _PLUMBING]
  votes = collections.Counter(l for l in map(layers.of, work) if l)
  if not votes:
    votes = collections.Counter(
        l for l in map(layers.of, body + [instruction]) if l
    )
  # The heaviest instruction's layer first: a fusion's dot names it.
  heavy = [i for i in work if i.opcode in ('dot', 'convolution')]
  if heavy and layers.of(heavy[0]):
    layer, direction = layers.of(heavy[0])
  elif votes:
    layer, direction = votes.most_common(1)[0][0]
  else:
    layer, direction = '', ''
  others = sorted({l for l, _ in votes} - {layer}, key=LAYERS.index)
  return Op(
      name=instruction.name,
      kind=kind,
      layer=layer,
      direction=direction,
      fuses='+'.join(others),
      flops=hlo.flops(instruction),
      bytes=hlo.bytes(instruction),
  )


def resolve_unknown(hlo: Hlo, thunks: dict, ops: dict) -> None:
  """The layer of ops whose instructions give none: a loop body's, its
  loop's; others', the nearest of their users' and operands' (a zero
  buffer's, what reads it), else 'other'.
  """
  callers, users = {}, collections.defaultdict(list)
  for instruction in thunks.values():
    if instruction.opcode in _CONTAINERS:
      for c in hlo.called(instruction, ('body', 'condition')):
        callers[c] = instruction.name
    for o in instruction.operands:
      users[o].append(instruction.name)
  known = {n: (op.layer, op.direction) for n, op in ops.items() if op.layer}
  for name, op in ops.items():
    if op.layer:
      continue
    seen, frontier, found = {name}, [name], None
    while frontier and not found:
      step = []
      for n in frontier:
        caller = callers.get(thunks[n].computation)
        step += [caller] if caller else []
        step += users[n] + [o for o in thunks[n].operands if o in thunks]
      frontier = [n for n in step if n not in seen]
      seen.update(frontier)
      found = next((known[n] for n in frontier if n in known), None)
    if found:
      op.layer, op.direction = found
    else:
      op.layer = 'other'


# ---------------------------------------------------------------------------
# The trace.


def thunk_times(trace_dir: str, module: str) -> tuple[dict, dict]:
  """Each HLO instruction's summed self time (us) and calls, from the trace.

  A thunk's self time is its duration less that of the thunks that ran
  inside its span, on its thread (a `while`'s body) or, for a loop, on any.
  """
  paths = glob.glob(
      os.path.join(trace_dir, '**', '*.trace.json.gz'), recursive=True
  )
  if not paths:
    raise FileNotFoundError(f'no *.trace.json.gz under {trace_dir}')
  with gzip.open(paths[0]) as f:
    trace = json.load(f)
  events = [
      e
      for e in trace['traceEvents']
      if e.get('ph') == 'X'
      and e.get('args', {}).get('hlo_module') == module
      and 'hlo_op' in e.get('args', {})
  ]
  events.sort(key=lambda e: (e['ts'], -e['dur']))
  self_us = collections.defaultdict(float)
  calls = collections.defaultdict(int)
  by_thread = collections.defaultdict(list)
  for e in events:
    by_thread[(e['pid'], e['tid'])].append(e)
    calls[e['args']['hlo_op']] += 1
  for thread_events in by_thread.values():
    stack = []  # (end, name)
    for e in thread_events:
      while stack and e['ts'] >= stack[-1][0]:
        stack.pop()
      name, end = e['args']['hlo_op'], e['ts'] + e['dur']
      self_us[name] += e['dur']
      if stack:
        self_us[stack[-1][1]] -= e['dur']
      stack.append((end, name))
  return self_us, calls


def cpu_description() -> str:
  """This CPU's model name, CPUs this process may use, and bf16 flags."""
  model = 'unknown CPU'
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          model = line.partition(':')[2].strip()
          break
  except OSError:
    pass
  flags_found = cpu_layers.cpu_flags()
  shown = [
      f'{f}: {"yes" if f in flags_found else "no"}'
      for f in ('avx512_bf16', 'amx_bf16', 'amx_tile', 'avx512f', 'avx2')
  ]
  return f'{model}, {len(os.sched_getaffinity(0))} CPUs; {", ".join(shown)}'


def _scoped(module: nnx.Module, name: str) -> None:
  """Runs `module`'s calls under `jax.named_scope(name)` (metadata alone)."""
  base = type(module)

  def __call__(self, *args, **kwargs):  # pylint: disable=invalid-name
    with jax.named_scope(name):
      return base.__call__(self, *args, **kwargs)

  module.__class__ = type(base.__name__, (base,), {'__call__': __call__})


def scope_layers(model: nnx.Module) -> list[str]:
  """Puts each of `model`'s layers under a named scope; returns the names."""
  names = []
  for name, child in vars(model).items():
    if isinstance(child, nnx.Module):
      _scoped(child, name)
      names.append(name)
  return names


def profile_jax(config, steps: int, dispatches: int, scoped: bool = True):
  """Profiles the step of `config`; returns (ops, summary).

  Without JAX's persistent compilation cache: an executable from it keeps
  the metadata of the compilation that stored it, perhaps without scopes.
  """
  jax.config.update('jax_enable_compilation_cache', False)
  rng = np.random.default_rng(0)
  n = steps * config.batch_size
  data = {
      'image': rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
      'label': rng.integers(0, 10, n).astype(np.int32),
  }
  order = rng.permutation(n).reshape(steps, config.batch_size).astype(np.int32)
  model = train.create_model(config, cpu_layers.for_config(config))
  scopes = scope_layers(model) if scoped else []
  optimizer = train.create_optimizer(model, config, steps)
  metrics = train.create_metrics()
  mesh = parallel.create_mesh()
  objects = (model, optimizer, metrics)
  nnx.update(objects, parallel.replicate(nnx.state(objects), mesh))

  def run():
    train.train_epoch(
        model, optimizer, metrics, data, order, mesh=mesh, steps_per_call=steps
    )
    jax.block_until_ready(nnx.state(model))

  # The module that train_epoch dispatches, compiled here for its text.
  model.train()
  graphdef, state = nnx.split(objects)
  batches = parallel.global_batches(
      mesh, {k: v[order] for k, v in data.items()}
  )
  compiled = train.train_steps.lower(graphdef, mesh, state, batches).compile()
  del state, batches
  text = compiled.as_text()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  run()  # Compiles the dispatch and warms up.
  start = time.perf_counter()
  run()
  unprofiled_ms = (time.perf_counter() - start) * 1000 / steps
  with tempfile.TemporaryDirectory() as trace_dir:
    wall = 0.0
    with jax.profiler.trace(trace_dir, create_perfetto_trace=False):
      for _ in range(dispatches):
        start = time.perf_counter()
        run()
        wall += time.perf_counter() - start
    module = re.match(r'HloModule (\S+?),', text).group(1)
    self_us, calls = thunk_times(trace_dir, module)
  hlo = Hlo(text)
  layers = Layers(hlo, scopes)
  thunks = {
      i.name: i for c in hlo.thunk_computations() for i in hlo.computations[c]
  }
  total_steps = steps * dispatches
  classified = {n: classify(hlo, layers, i) for n, i in thunks.items()}
  resolve_unknown(hlo, thunks, classified)
  ops = []
  for name, us in self_us.items():
    if name not in thunks:
      continue
    op = classified[name]
    op.ms = us / 1000 / total_steps
    op.calls = calls[name] / total_steps
    ops.append(op)
  unmatched = sorted(set(self_us) - set(thunks))
  ops.sort(key=lambda o: -o.ms)
  step_flops = sum(
      hlo.flops(i)
      for c in hlo.thunk_computations()
      for i in hlo.computations[c]
      if i.opcode not in _CONTAINERS
  )
  summary = {
      'step_ms_profiled': wall * 1000 / total_steps,
      'step_ms': unprofiled_ms,
      'ops_ms': sum(o.ms for o in ops),
      'gflop': step_flops / 1e9,
      'xla_cost_gflop': cost.get('flops', 0.0) / 1e9,
      'unmatched': unmatched,
  }
  return ops, summary


# ---------------------------------------------------------------------------
# The tables.


def _rate(amount: float, ms: float) -> float:
  return amount / (ms * 1e6) if ms > 0 else 0.0  # Per ms -> per second, in G.


def op_table(ops: list[Op], top: int) -> list[str]:
  """The top ops: their times, shares, FLOPs and bytes, and their rates."""
  total = sum(o.ms for o in ops)
  lines = [
      f'{"op":34s} {"kind":12s} {"layer":16s} {"ms":>7s} {"share":>6s} '
      f'{"calls":>5s} {"GFLOP":>7s} {"GFLOP/s":>8s} {"MB":>7s} {"GB/s":>6s}'
      '  fuses'
  ]
  shown = ops[:top] if top else ops
  for o in shown:
    layer = f'{o.layer} {o.direction}'.strip()
    lines.append(
        f'{o.name[:34]:34s} {o.kind:12s} {layer:16s} {o.ms:7.3f} '
        f'{100 * o.ms / total:5.1f}% {o.calls:5.0f} {o.flops / 1e9:7.3f} '
        f'{_rate(o.flops, o.ms):8.1f} {o.bytes / 1e6:7.2f} '
        f'{_rate(o.bytes, o.ms):6.1f}  {o.fuses}'
    )
  rest = ops[len(shown) :]
  if rest:
    ms = sum(o.ms for o in rest)
    lines.append(
        f'{f"the other {len(rest)} ops":34s} {"":12s} {"":16s} {ms:7.3f} '
        f'{100 * ms / total:5.1f}%'
    )
  return lines


def layer_ms(ops: list[Op]) -> dict[str, dict[str, float]]:
  """Milliseconds a step by layer and pass ('fwd', 'bwd', '')."""
  out = {l: {'fwd': 0.0, 'bwd': 0.0, '': 0.0} for l in LAYERS}
  for o in ops:
    out[o.layer if o.layer in out else 'other'][o.direction] += o.ms
  return out


def layer_table(ours: dict, torch: dict | None) -> list[str]:
  """Each layer's forward and backward ms, ours and (if given) PyTorch's."""
  head = f'{"layer":12s} {"fwd":>7s} {"bwd":>7s} {"total":>7s}'
  if torch:
    head += f' | {"torch fwd":>9s} {"bwd":>7s} {"total":>7s} | ours/torch'
  lines = ['ms a step; ours then PyTorch', head] if torch else [head]
  sums = [0.0] * 6
  for layer in LAYERS:
    o = ours.get(layer, {})
    row = [o.get('fwd', 0.0), o.get('bwd', 0.0)]
    row.append(row[0] + row[1] + o.get('', 0.0))
    if torch:
      t = torch.get(layer, {})
      row += [t.get('fwd', 0.0), t.get('bwd', 0.0)]
      row.append(row[3] + row[4] + t.get('', 0.0))
    if not any(row):
      continue
    sums = [s + r for s, r in zip(sums, row)]
    lines.append(_layer_row(layer, row, torch))
  lines.append(_layer_row('step', sums[: len(row)], torch))
  return lines


def _layer_row(name, row, torch) -> str:
  line = f'{name:12s} {row[0]:7.2f} {row[1]:7.2f} {row[2]:7.2f}'
  if torch:
    ratio = f'{row[2] / row[5]:.2f}' if row[5] > 0.005 else '-'
    line += f' | {row[3]:9.2f} {row[4]:7.2f} {row[5]:7.2f} | {ratio:>10s}'
  return line


def run_torch(python: str, bf16: bool, batch: int, steps: int) -> dict:
  """`tools/step_profile_torch.py`'s JSON, run by `python`."""
  command = [
      python,
      '-m',
      'tools.step_profile_torch',
      f'--batch={batch}',
      f'--steps={steps}',
  ] + (['--bf16'] if bf16 else [])
  out = subprocess.run(
      command, capture_output=True, text=True, check=True, cwd=ROOT
  ).stdout
  lines = out.strip().splitlines()
  return {'table': lines[:-1], **json.loads(lines[-1])}


def main(argv):
  del argv
  config = default.get_config()
  config.update(
      batch_size=FLAGS.batch,
      matmul_precision=FLAGS.precision,
      narrow_dropout_bits=FLAGS.narrow_dropout_bits,
  )
  bf16, why = cpu_layers.bf16_matmuls(config)
  print('$ python -m tools.step_profile ' + shlex.join(sys.argv[1:]))
  print(f'CPU: {cpu_description()}')
  print(
      f'jax {jax.__version__}; matmuls: '
      f'{"bf16" if bf16 else "float32"} ({why}); narrow dropout bits: '
      f'{config.narrow_dropout_bits}; batch {config.batch_size}; '
      f'{FLAGS.dispatches} dispatches of {FLAGS.steps} steps profiled'
  )
  ops, summary = profile_jax(config, FLAGS.steps, FLAGS.dispatches)
  print(
      f'step: {summary["step_ms"]:.2f} ms unprofiled, '
      f'{summary["step_ms_profiled"]:.2f} ms profiled; ops summed '
      f'{summary["ops_ms"]:.2f} ms; {summary["gflop"]:.3f} GFLOP a step '
      f'(XLA cost analysis: {summary["xla_cost_gflop"]:.3f})'
  )
  if summary['unmatched']:
    print(f'thunks not in the HLO: {summary["unmatched"]}')
  print()
  for line in op_table(ops, FLAGS.top):
    print(line)
  ours = layer_ms(ops)
  torch = None
  if FLAGS.torch_python:
    torch = run_torch(FLAGS.torch_python, bf16, FLAGS.batch, FLAGS.steps * 3)
    print()
    for line in torch['table']:
      print(line)
  print()
  for line in layer_table(ours, torch and torch['layers']):
    print(line)
  result = {
      'precision': 'bfloat16' if bf16 else 'float32',
      'narrow_dropout_bits': config.narrow_dropout_bits,
      **{k: v for k, v in summary.items() if k != 'unmatched'},
      'ops': [dataclasses.asdict(o) for o in ops],
      'layers': ours,
  }
  if torch:
    result['torch'] = {k: v for k, v in torch.items() if k != 'table'}
  print(json.dumps(result, sort_keys=True))


if __name__ == '__main__':
  app.run(main)
