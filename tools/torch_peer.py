"""The same CNN and training in PyTorch, to time against: an opt-in peer.

Not part of the app or its tests: it needs PyTorch, which the app does not,
so it runs from a virtual environment of its own, outside the repository:

  python3 -m venv /tmp/torchpeer
  /tmp/torchpeer/bin/pip install torch==2.14.1 numpy
  /tmp/torchpeer/bin/python -m tools.torch_peer \
      --data_dir=../shared/data/mnist [--bf16] [--epochs=2]

(from the repository's root: data/sources.py reads the IDX files).

The Flax example's CNN layer for layer (BatchNorm's running averages decay
by 0.99, as Flax's do), SGD with learning rate 0.1 and momentum 0.9, batch
128 (468 full batches an epoch, as the app), channels_last, eager; with
`--bf16`, under `torch.autocast('cpu', dtype=torch.bfloat16)`, the one-line
change a PyTorch user makes to use a CPU's bf16 instructions. Each epoch
trains, then evaluates all 10,000 test images, and prints its seconds (both
together, as the epoch lines of docs/speed.md's comparisons); the last line
is the peak RSS.
"""

import argparse
import os
import resource
import time

from data import sources
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

BATCH = 128


def images_and_labels(data_dir: str, prefix: str):
  """A split's images `(N, 1, 28, 28)` in [0, 1], channels_last, and labels."""
  path = os.path.join(data_dir, prefix)
  images = sources.read_idx(f'{path}-images-idx3-ubyte.gz', 3)
  labels = sources.read_idx(f'{path}-labels-idx1-ubyte.gz', 1)
  x = torch.from_numpy(images[:, None].astype(np.float32) / 255)
  return (
      x.contiguous(memory_format=torch.channels_last),
      torch.from_numpy(labels.astype(np.int64)),
  )


class CNN(nn.Module):
  """models.CNN in PyTorch: conv/BN/ReLU/pool twice, then two dense layers."""

  def __init__(self, dropout_rate: float = 0.025):
    super().__init__()
    self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
    self.batch_norm1 = nn.BatchNorm2d(32, momentum=0.01)
    self.dropout1 = nn.Dropout(dropout_rate)
    self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
    self.batch_norm2 = nn.BatchNorm2d(64, momentum=0.01)
    self.linear1 = nn.Linear(3136, 256)
    self.dropout2 = nn.Dropout(dropout_rate)
    self.linear2 = nn.Linear(256, 10)

  def forward(self, x):
    x = self.conv1(x)
    x = F.avg_pool2d(F.relu(self.batch_norm1(self.dropout1(x))), 2)
    x = F.avg_pool2d(F.relu(self.batch_norm2(self.conv2(x))), 2)
    x = x.permute(0, 2, 3, 1).flatten(1)  # As the NHWC flatten of models.py.
    return self.linear2(F.relu(self.dropout2(self.linear1(x))))


def train_epoch(model, optimizer, images, labels, autocast):
  """One epoch of SGD steps on full batches of a random permutation."""
  model.train()
  steps = len(images) // BATCH
  for batch in torch.randperm(len(images))[: steps * BATCH].view(steps, -1):
    x = images[batch].contiguous(memory_format=torch.channels_last)
    with autocast():
      logits = model(x)
    loss = F.cross_entropy(logits.float(), labels[batch])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def evaluate(model, images, labels, autocast) -> tuple[float, float]:
  """Mean loss and accuracy (%) over all of `images`, in batches."""
  model.eval()
  loss_sum, correct = 0.0, 0
  with torch.no_grad(), autocast():
    for i in range(0, len(images), BATCH):
      logits = model(images[i : i + BATCH]).float()
      batch_labels = labels[i : i + BATCH]
      loss_sum += F.cross_entropy(logits, batch_labels, reduction='sum').item()
      correct += (logits.argmax(1) == batch_labels).sum().item()
  return loss_sum / len(images), 100 * correct / len(images)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--data_dir', required=True, help='The IDX files.')
  parser.add_argument('--bf16', action='store_true', help='bf16 autocast.')
  parser.add_argument('--epochs', type=int, default=2)
  args = parser.parse_args()
  torch.manual_seed(0)
  train_x, train_y = images_and_labels(args.data_dir, 'train')
  test_x, test_y = images_and_labels(args.data_dir, 't10k')
  model = CNN().to(memory_format=torch.channels_last)
  optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  autocast = lambda: torch.autocast(
      'cpu', dtype=torch.bfloat16, enabled=args.bf16
  )
  for epoch in range(1, args.epochs + 1):
    start = time.perf_counter()
    train_epoch(model, optimizer, train_x, train_y, autocast)
    loss, accuracy = evaluate(model, test_x, test_y, autocast)
    print(
        f'epoch: {epoch}, seconds: {time.perf_counter() - start:.2f}, '
        f'test_loss: {loss:.4f}, test_accuracy: {accuracy:.2f}',
        flush=True,
    )
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
  print(f'peak RSS: {peak:.2f} GB')


if __name__ == '__main__':
  main()
