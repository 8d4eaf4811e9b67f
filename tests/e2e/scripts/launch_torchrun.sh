#!/bin/bash
# A cluster's wrapper script around torchrun, as users keep them: options fixed here, the
# script's arguments passed through.
set -e
PORT=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
exec python -m torch.distributed.run --nproc-per-node 2 --master-port "$PORT" \
    "$(dirname "$0")/any_launcher.py" "$@"
