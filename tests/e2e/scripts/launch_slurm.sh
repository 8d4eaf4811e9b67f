#!/bin/bash
# What `srun --ntasks 2 python any_launcher.py` does on one node, without Slurm: one process
# per task, each told its place by SLURM_* variables, the rendezvous by MASTER_ADDR/PORT.
export MASTER_ADDR=127.0.0.1
export MASTER_PORT=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export SLURM_NTASKS=2 SLURM_JOB_ID=4242
pids=()
for task in 0 1; do
    SLURM_PROCID=$task SLURM_LOCALID=$task python "$(dirname "$0")/any_launcher.py" "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
done
exit $status
