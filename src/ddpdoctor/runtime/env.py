"""Names of the environment variables the launcher uses to configure every rank, and the
launchers it names."""

from ddpdoctor.trace.words import Word

LOGDIR = "DDPDOCTOR_LOGDIR"
RUN_ID = "DDPDOCTOR_RUN_ID"
BACKEND = "DDPDOCTOR_BACKEND"
CPU = "DDPDOCTOR_CPU"  # "1": map CUDA to the CPU in every rank (runtime/cpu_mode.py)
CPU_DEVICES = "DDPDOCTOR_CPU_DEVICES"  # what torch.cuda.device_count() answers in CPU mode
MAX_STEPS = "DDPDOCTOR_MAX_STEPS"  # N: stop every rank at the start of DDP iteration N+1
EPOCH_STEPS = "DDPDOCTOR_EPOCH_STEPS"  # N: every DataLoader pass yields at most N batches
STOP_TIMEOUT = "DDPDOCTOR_STOP_TIMEOUT"  # seconds a stopping rank waits for the others
# after this many MB a trace keeps only what breaks the pattern
MAX_TRACE_MB = "DDPDOCTOR_MAX_TRACE_MB"
LAUNCHER = "DDPDOCTOR_LAUNCHER"  # a Launcher: how the job's top process starts workers
LAUNCHER_PID = "DDPDOCTOR_LAUNCHER_PID"  # ddpdoctor's pid: its direct child is the top process
FLIGHT_RECORDER = "DDPDOCTOR_FLIGHT_RECORDER"  # "1": PyTorch's flight recorder, not ddpdoctor's
RECORD_NCCL = "DDPDOCTOR_RECORD_NCCL"  # "1": wrap NCCL groups too (checked on one GPU)
TOP_PID = "DDPDOCTOR_TOP_PID"  # the job's top process: the workers it spawns die with it
WAKE = "DDPDOCTOR_WAKE"  # the launcher's FIFO: a rank that starts to wait writes a byte to it
TRACE_WRITE = "DDPDOCTOR_TRACE_WRITE"  # "1": write traces with pwrite, not through a mapping
# "1": each DDP gradient bucket recorded as it enters the recording group, not once per
# backward (runtime/ddp_buckets.py); for comparisons
BUCKETS_EACH = "DDPDOCTOR_BUCKETS_EACH"


class Launcher(Word):
    """How the job's top process starts its workers (``--launcher``, :data:`LAUNCHER`)."""

    TORCHRUN = "torchrun"
    PYTHON = "python"  # the script starts its own (mp.spawn, multiprocessing)
    COMMAND = "command"  # the user's own launch command: accelerate launch, srun, bash ...
