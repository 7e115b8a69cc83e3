"""PyTorch's training step, op by op and layer by layer: step_profile's peer.

Runs from PyTorch's own virtual environment (see `tools/torch_peer.py`),
from the repository's root; `tools/step_profile.py --torch_python=...` runs
it and compares:

  /tmp/torchpeer/bin/python -m tools.step_profile_torch [--bf16]
      [--batch=128] [--steps=24]

`tools/torch_peer.py`'s CNN and its step (eager, channels_last, SGD 0.1 with
momentum 0.9, `--bf16`: bf16 autocast) on random batches, profiled by
`torch.profiler` after warm-up. Each op's self CPU time is its layer's: the
forward ops run inside the layer's module (hooks open a `record_function`
of its name), the backward ops inside the autograd node that the forward op
recorded (the same sequence number); ReLU, pooling and the flatten are
functions, named by their ops. Prints the top ops, then one JSON object
(ms a step by layer and pass) as its last line.
"""

import argparse
import collections
import json
import time

import torch
from torch.nn import functional as F
from tools import torch_peer

# Ops of the functional parts of the forward pass, and their backward nodes.
FUNCTIONS = {
    'relu': 'relu',
    'threshold_backward': 'relu',
    'ReluBackward': 'relu',
    'avg_pool2d': 'avg_pool',
    'AvgPool2DBackward': 'avg_pool',
    'permute': 'flatten',
    'PermuteBackward': 'flatten',
    'flatten': 'flatten',
    'view': 'flatten',
    'reshape': 'flatten',
    'ViewBackward': 'flatten',
    'UnsafeViewBackward': 'flatten',
    'CloneBackward': 'flatten',
}
_BACKWARD = 'autograd::engine::evaluate_function: '


def _hook_labels(model):
  """Forward hooks that run each child module inside `record_function`."""
  for name, module in model.named_children():
    frames = []

    def pre(module, args, name=name, frames=frames):
      del module, args
      frame = torch.profiler.record_function(f'layer:{name}')
      frame.__enter__()
      frames.append(frame)

    def post(module, args, output, frames=frames):
      del module, args, output
      frames.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post)


def _function_layer(name: str) -> str | None:
  """The functional layer an op or a backward node belongs to, if any."""
  name = (
      name.removeprefix(_BACKWARD).removeprefix('aten::').rstrip('0123456789')
  )
  return FUNCTIONS.get(name)


def _layer(e, parent) -> tuple[str, str]:
  """(layer, pass) of event `e`, inside `parent`'s (None: at the top)."""
  if e.name.startswith('layer:'):
    return e.name.removeprefix('layer:'), 'fwd'
  if e.name in ('loss', 'optimizer', 'step'):
    return e.name, 'fwd' if e.name == 'loss' else ''
  if e.name.startswith(_BACKWARD):
    if e.name.endswith('AccumulateGrad'):
      return 'optimizer', ''
    return _function_layer(e.name) or 'other', 'bwd'
  if parent and parent[0] != 'step':
    return parent
  function = _function_layer(e.name)
  return (function, 'fwd') if function else ('other', '')


def layer_times(events, steps: int):
  """(ms a step by layer and pass, ms a step by op) from the events."""
  layer_of = {}  # id(event) -> (layer, pass)
  forward_layer = {}  # An autograd node's sequence number -> its layer.
  for e in sorted(events, key=lambda e: e.time_range.start):
    parent = layer_of.get(id(e.cpu_parent)) if e.cpu_parent else None
    layer = _layer(e, parent)
    if layer == ('other', 'bwd') and e.sequence_nr in forward_layer:
      layer = (forward_layer[e.sequence_nr], 'bwd')
    layer_of[id(e)] = layer
    if layer[1] == 'fwd' and e.sequence_nr >= 0:
      forward_layer.setdefault(e.sequence_nr, layer[0])
  totals = collections.defaultdict(lambda: {'fwd': 0.0, 'bwd': 0.0, '': 0.0})
  ops = collections.defaultdict(float)
  for e in events:
    layer, direction = layer_of[id(e)]
    if layer == 'step':
      layer = 'other'
    ms = e.self_cpu_time_total / 1000 / steps
    totals[layer][direction] += ms
    ops[(e.name, layer, direction)] += ms
  return {k: dict(v) for k, v in totals.items()}, ops


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--bf16', action='store_true', help='bf16 autocast.')
  parser.add_argument('--batch', type=int, default=torch_peer.BATCH)
  parser.add_argument('--steps', type=int, default=24, help='Steps profiled.')
  parser.add_argument('--top', type=int, default=25, help='Ops shown.')
  args = parser.parse_args()
  torch.manual_seed(0)
  model = torch_peer.CNN().to(memory_format=torch.channels_last)
  optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  _hook_labels(model)
  images = torch.rand(args.batch, 1, 28, 28).contiguous(
      memory_format=torch.channels_last
  )
  labels = torch.randint(0, 10, (args.batch,))
  model.train()

  def step():  # torch_peer.train_epoch's step.
    with torch.profiler.record_function('step'):
      with torch.autocast('cpu', dtype=torch.bfloat16, enabled=args.bf16):
        logits = model(images)
      with torch.profiler.record_function('loss'):
        loss = F.cross_entropy(logits.float(), labels)
      with torch.profiler.record_function('optimizer'):
        optimizer.zero_grad(set_to_none=True)
      loss.backward()
      with torch.profiler.record_function('optimizer'):
        optimizer.step()

  for _ in range(8):
    step()
  start = time.perf_counter()
  for _ in range(args.steps):
    step()
  step_ms = (time.perf_counter() - start) * 1000 / args.steps
  with torch.profiler.profile(
      activities=[torch.profiler.ProfilerActivity.CPU]
  ) as profile:
    for _ in range(args.steps):
      step()
  events = [e for e in profile.events() if e.device_type.name == 'CPU']
  layers, ops = layer_times(events, args.steps)
  total = sum(ops.values())
  mode = 'bf16 autocast' if args.bf16 else 'fp32'
  print(
      f'PyTorch {torch.__version__} {mode}, {torch.get_num_threads()} '
      f'threads: {step_ms:.2f} ms a step unprofiled; ops summed {total:.2f} ms'
  )
  print(f'{"torch op":44s} {"layer":16s} {"ms":>7s} {"share":>6s}')
  ranked = sorted(ops.items(), key=lambda kv: -kv[1])
  for (name, layer, direction), ms in ranked[: args.top]:
    name = name.replace(_BACKWARD, 'bwd: ')
    where = f'{layer} {direction}'.strip()
    print(f'{name[:44]:44s} {where:16s} {ms:7.3f} {100 * ms / total:5.1f}%')
  rest = sum(ms for _, ms in ranked[args.top :])
  if rest:
    print(
        f'{f"the other {len(ranked) - args.top} ops":44s} {"":16s} '
        f'{rest:7.3f} {100 * rest / total:5.1f}%'
    )
  print(
      json.dumps(
          {
              'mode': mode,
              'torch': torch.__version__,
              'threads': torch.get_num_threads(),
              'step_ms': step_ms,
              'ops_ms': total,
              'layers': layers,
          },
          sort_keys=True,
      )
  )


if __name__ == '__main__':
  main()
