"""The shortest run found to 99% test accuracy on a 2-core CPU: one epoch.

The same CNN as configs/default.py, another schedule: a one-cycle learning
rate (warm-up to 0.15, cosine decay) with Nesterov momentum reaches in one
epoch what the constant rate reaches in about three; half the batch (64), twice
the updates in as long an epoch on a CPU, kept every seed tried above 99.0%
where 128 left some at 98.98; no dropout, which one epoch does not need and
whose random bits cost a fifth of a CPU step.
"""

from configs import default


def get_config():
  """Returns the fast configuration (see the module docstring)."""
  config = default.get_config()
  config.num_epochs = 1
  config.batch_size = 64
  config.learning_rate = 0.15  # The peak of the one-cycle schedule.
  config.lr_schedule = 'one_cycle'
  config.nesterov = True
  config.dropout_rate = 0.0
  return config
