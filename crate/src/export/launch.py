

# ---------------------------------------------------------------------- how it is launched
# One process per host (a TPU VM worker, a GPU node), each driving its own devices, or one
# process for everything. The flags say how many processes there are and which this one is;
# without them the script takes what jax.distributed.initialize() detects (Cloud TPU, Slurm,
# Open MPI, Kubernetes), and runs as one process where it detects nothing.


def fail(message):
    """Every refusal of this script: one line on stderr, exit status 2, nothing written."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


class Flags(argparse.ArgumentParser):
    def error(self, message):
        fail(f"{message} (python3 {os.path.basename(sys.argv[0])} --help lists the flags)")


def launch_flags(argv):
    p = Flags(
        description="Train the exported shardlab run; once per host on a cluster.",
        allow_abbrev=False,
    )
    p.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address, the same for every process")
    p.add_argument("--num-processes", type=int, metavar="N", help="how many processes run this script (one per host)")
    p.add_argument("--process-id", type=int, metavar="I", help="this process, 0 to N-1")
    p.add_argument(
        "--local-devices", type=int, metavar="K",
        help="simulate K CPU devices in this process (the CPU backend only; default: the mesh's devices over N)",
    )
    p.add_argument("--steps", type=int, default=STEPS, metavar="N", help=f"updates in all (default {STEPS})")
    p.add_argument("--checkpoint-dir", metavar="D", help="save to D (a filesystem every process sees) and resume from it")
    p.add_argument(
        "--checkpoint-every", type=int, default=0, metavar="K",
        help="save every K steps as well as after the last (needs --checkpoint-dir)",
    )
    flags = p.parse_args(argv)
    check_flags(flags)
    return flags


def check_flags(flags):
    if flags.steps < 1:
        fail(f"--steps {flags.steps}: give at least 1")
    if flags.checkpoint_every < 0:
        fail(f"--checkpoint-every {flags.checkpoint_every}: give 0 (only after the last step) or more")
    if flags.checkpoint_every and flags.checkpoint_dir is None:
        fail("--checkpoint-every needs --checkpoint-dir D to save into")
    if flags.local_devices is not None and flags.local_devices < 1:
        fail(f"--local-devices {flags.local_devices}: give at least 1")
    n, i = flags.num_processes, flags.process_id
    if n is not None and n < 1:
        fail(f"--num-processes {n}: give at least 1")
    if i is not None and n is None:
        fail("--process-id needs --num-processes N")
    if i is not None and not 0 <= i < n:
        fail(f"--process-id {i} is out of range for --num-processes {n}: give 0 to {n - 1}")
    if n is not None and n > 1 and MESH_DEVICES % n:
        fail(f"the mesh {MESH_TEXT} has {MESH_DEVICES} devices, which {n} processes cannot share evenly")
    if flags.coordinator is not None:
        host, _, port = flags.coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            fail(f"--coordinator {flags.coordinator}: give HOST:PORT, e.g. 10.0.0.2:1234")


def simulated_cpu_devices(flags):
    """How many CPU devices this process simulates: --local-devices, else XLA_FLAGS' count when
    set, else its share of the mesh. Accelerators, when there are enough, are used instead."""
    if flags.local_devices is not None:
        return flags.local_devices
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return None
    return max(1, MESH_DEVICES // (flags.num_processes or 1))


FLAGS = launch_flags(sys.argv[1:]) if __name__ == "__main__" else launch_flags([])
# Stdout carries the JSON lines alone: what libraries print there (gloo's connection messages,
# from C++) goes to stderr.
RECORDS = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

import numpy as np  # noqa: E402
import jax  # noqa: E402

# The CPU backend reads its device count when it starts, so it is set before any device is used.
if simulated_cpu_devices(FLAGS) is not None:
    jax.config.update("jax_num_cpu_devices", simulated_cpu_devices(FLAGS))
# float32 matmuls in full float32 (no TF32 / bf16 passes on GPUs or TPUs); under
# COMPUTE_DTYPE = "bfloat16" the model computes with bfloat16 copies of the float32 weights.
jax.config.update("jax_enable_x64", False)
jax.config.update("jax_default_matmul_precision", "highest")
# The random-bit layout of dropout masks (shardlab's --rng original / partitionable).
jax.config.update("jax_threefry_partitionable", RNG_PARTITIONABLE)

import jax.numpy as jnp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.extend.random import threefry2x32_p  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402


def start_processes(flags):
    """jax.distributed.initialize when more than one process runs: with the flags' values, or
    with what JAX detects on a cluster when none is given."""
    if flags.coordinator is None and flags.num_processes is None:
        try:
            jax.distributed.initialize()
        except ValueError:
            pass  # no cluster detected: this is the only process
        return
    if (flags.num_processes or 1) == 1 and flags.coordinator is None:
        return
    try:
        jax.distributed.initialize(flags.coordinator, flags.num_processes, flags.process_id)
    except (ValueError, RuntimeError) as e:
        fail(
            f"jax.distributed.initialize failed ({str(e).splitlines()[0]}): give every process "
            "--coordinator HOST:PORT --num-processes N --process-id I"
        )


def leader():
    """Only process 0 prints and writes files."""
    return jax.process_index() == 0


def say(record):
    if leader():
        print(json.dumps(record, separators=(",", ":")), file=RECORDS, flush=True)


# Each mesh axis's type, as the mode needs it: Auto for jit with shardings and for shard_map
# (whose body makes the axes Manual).
AXIS_TYPE = jax.sharding.AxisType.Auto


def mesh_devices():
    """The devices of the mesh: all of every process's when several run; on one host the first
    MESH_DEVICES, simulated CPU devices when there are too few accelerators."""
    devices = jax.devices()
    if jax.process_count() == 1 and len(devices) < MESH_DEVICES and devices[0].platform != "cpu":
        cpus = jax.devices("cpu")
        if len(cpus) >= MESH_DEVICES:
            print(f"note: {len(devices)} {devices[0].platform} devices are too few for the mesh "
                  f"{MESH_TEXT}; using {MESH_DEVICES} simulated CPU devices", file=sys.stderr)
            devices = cpus
    found = f"{jax.process_count()} process(es) found {len(devices)} device(s)"
    if len(devices) < MESH_DEVICES:
        fail(
            f"the mesh {MESH_TEXT} needs {MESH_DEVICES} devices but {found}: launch more processes "
            f"or give each --local-devices {MESH_DEVICES // jax.process_count()} (CPU)"
        )
    if jax.process_count() > 1 and len(devices) != MESH_DEVICES:
        fail(
            f"the mesh {MESH_TEXT} needs {MESH_DEVICES} devices but {found}: every process's devices "
            "must be in the mesh; give each process fewer, or export a larger mesh"
        )
    return devices[:MESH_DEVICES]


@functools.cache
def make_mesh():
    """jax.make_mesh over the mesh's devices, in the order it picks for the hardware's topology."""
    names = tuple(name for name, _ in MESH_AXES)
    shape = tuple(size for _, size in MESH_AXES)
    return jax.make_mesh(shape, names, axis_types=(AXIS_TYPE,) * len(names), devices=mesh_devices())


def sharding(spec):
    return NamedSharding(make_mesh(), spec)
