

# ---------------------------------------------------------------------------- checkpoints
# --checkpoint-dir D: after every --checkpoint-every K steps and after the last, the state
# after the update (the parameters and optimizer state, in their stored shapes, and the next
# step, which with SEED fixes the RNG: step k's dropout key is fold_in(PRNGKey(SEED), k) and
# its batch is drawn from SplitMix64(SEED ^ k * GAMMA)) goes to D/step-N. It is written whole
# or not at all: the state is gathered to process 0, which writes it into a fresh
# D/.tmp-step-N-PID, flushes it to disk and renames it to D/step-N (a rename is atomic on a
# POSIX filesystem, as every process's view of D must be). A run killed mid-save leaves a
# .tmp folder that nothing reads and the next save removes. Started again with the same D, a
# run resumes from the newest step-N, after checking that this configuration wrote it.

CHECKPOINT_FORMAT = 1
KEEP_CHECKPOINTS = 2


def configuration():
    """What a checkpoint must have been written under: every setting of this file but STEPS."""
    return json.loads(json.dumps({name: globals()[name] for name in SETTINGS if name != "STEPS"}))


def checkpoint_steps(directory):
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted(int(n[5:]) for n in names if n.startswith("step-") and n[5:].isdigit())


def prepare_checkpoints(directory):
    """Checks D before anything runs: usable, and holding nothing of another run."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        fail(f"--checkpoint-dir {directory} is a file: give a directory")
    if leader():
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            fail(f"--checkpoint-dir {directory} cannot be made ({e.strerror}): give a writable directory")


def restore(directory):
    """(next step, (params, opt_state) as numpy in stored shapes) from D's newest checkpoint,
    or (0, None) when D holds none."""
    steps = checkpoint_steps(directory)
    if not steps:
        return 0, None
    path = os.path.join(directory, f"step-{steps[-1]}")
    with open(os.path.join(path, "checkpoint.json"), encoding="utf-8") as f:
        meta = json.load(f)
    mine = configuration()
    theirs = meta.get("configuration", {})
    if meta.get("format") != CHECKPOINT_FORMAT or theirs != mine:
        differ = [f"{k} {theirs.get(k)!r} there, {mine.get(k)!r} here" for k in mine if theirs.get(k) != mine.get(k)]
        fail(
            f"--checkpoint-dir {directory} holds a checkpoint of a different run "
            f"({'; '.join(differ[:3]) or 'another format'}): give another --checkpoint-dir, "
            "or run the script that saved it"
        )
    with np.load(os.path.join(path, "state.npz")) as f:
        params = {name: f[f"params/{name}"] for name, _ in state_shapes()}
        opt_state = () if OPTIMIZER == "sgd" else tuple(
            {name: f[f"{slot}/{name}"] for name, _ in state_shapes()} for slot in ("m", "v")
        )
    return meta["step"], (params, opt_state)


def to_host(arrays):
    """Global arrays as whole numpy arrays in their stored shapes, on every process."""
    shapes = dict(state_shapes())
    out = {}
    for name, x in arrays.items():
        whole = x if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)
        out[name] = in_model_order(name, np.asarray(whole)).reshape(shapes[name])
    return out


def save(directory, step, params, opt_state):
    arrays = {f"params/{n}": x for n, x in to_host(params).items()}
    for slot, state in zip(("m", "v"), opt_state):
        arrays.update({f"{slot}/{n}": x for n, x in to_host(state).items()})
    if not leader():
        return
    final = os.path.join(directory, f"step-{step}")
    for stale in (n for n in os.listdir(directory) if n.startswith(".tmp-step-")):
        shutil.rmtree(os.path.join(directory, stale), ignore_errors=True)
    if os.path.isdir(final):
        return  # this very state, saved by the run this one resumed
    tmp = os.path.join(directory, f".tmp-step-{step}-{os.getpid()}")
    os.makedirs(tmp)
    meta = {
        "format": CHECKPOINT_FORMAT,
        "step": step,
        "rng": {"seed": SEED, "root_key": [0, SEED & 0xFFFFFFFF], "next_step_key": np.asarray(step_key(step)).tolist()},
        "configuration": configuration(),
    }
    with open(os.path.join(tmp, "state.npz"), "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    with open(os.path.join(tmp, "checkpoint.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself reaches the disk
    finally:
        os.close(fd)
    for old in checkpoint_steps(directory)[:-KEEP_CHECKPOINTS]:
        # Renamed out of the way first, so that no step-N is ever half removed.
        gone = os.path.join(directory, f".tmp-step-{old}-old")
        os.replace(os.path.join(directory, f"step-{old}"), gone)
        shutil.rmtree(gone, ignore_errors=True)
