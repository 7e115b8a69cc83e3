#!/usr/bin/env bash
# A short run on a slice of MNIST, its export, and predict.py on five test
# digits, with the Python given (make smoke PYTHON=python3.12). Needs the
# original files in $MNIST_MANUAL_DIR.
set -euo pipefail
python="$1"
workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT
"$python" --version
"$python" main.py --workdir="$workdir" --config=configs/fast.py \
    --config.data_source=idx --config.train_split='train[:4096]' \
    --config.test_split='test[:1000]' 2>&1 | grep -E 'epoch:|Exported|error'
"$python" -m tools.mnist_pngs --config.data_source=idx --out="$workdir/digits" --num=5 > /dev/null
"$python" predict.py --saved_model="$workdir/export/mnist" "$workdir"/digits/*.png
