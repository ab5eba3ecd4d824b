"""The peer side of `shardlab bench peers`: one long-lived process that runs JAX train steps or
numpy matmuls on request, so that shardlab's and the peer's measurements can alternate step by
step within one run.

  python peers.py SCRIPT   runs the train step of SCRIPT (written by `shardlab export jax`)
  python peers.py numpy    runs numpy matmuls

It prints one JSON line when ready, {"ready":true,...}, then answers each line it reads:
  step        one train step (the exported script's main loop, one iteration) -> {"ms":t,"loss":L}
  matmul N    C = A @ B with A, B float32 N x N                          -> {"ms":t}
Anything it cannot do is answered {"error":"..."} and the process ends.
"""

import json
import os
import runpy
import sys
import time


def say(obj):
    print(json.dumps(obj, separators=(",", ":")), flush=True)


def train_peer(path):
    # The script configures JAX before it is used (its simulated devices: XLA_FLAGS', which
    # `bench peers` sets), so it runs first; its main() is guarded by __name__ == "__main__"
    # and does not run here. It points fd 1 at stderr (its records keep a copy of stdout): this
    # process answers on stdout, so fd 1 gets it back.
    g = runpy.run_path(path, run_name="shardlab_peer")
    os.dup2(g["RECORDS"].fileno(), sys.stdout.fileno())
    import jax  # noqa: E402  (already imported by the script)
    import numpy as np  # noqa: E402

    # The state and the batches as the script's main() makes them: placed in the mode's layout.
    dataset = g["Dataset"]()
    host = g["init_params"]()
    params = g["place"](host, g["PARAM_LAYOUT"])
    opt_state = tuple(g["place"](s, g["STATE_LAYOUT"]) for s in g["init_opt_state"](host))
    train_step = g["make_train_step"]()
    state = {"k": 0, "params": params, "opt_state": opt_state}

    def step():
        k = state["k"]
        inputs, targets = g["batch_arrays"](dataset, k)
        t0 = time.perf_counter()
        loss, state["params"], state["opt_state"] = train_step(
            state["params"], state["opt_state"], inputs, targets, np.asarray(g["step_key"](k)), g["adamw_hyper"](k + 1)
        )
        loss = float(loss)  # waits for the step, as the exported script's timing does
        ms = (time.perf_counter() - t0) * 1e3
        state["k"] = k + 1
        return {"ms": ms, "loss": loss}

    info = {"ready": True, "peer": "jax", "jax": jax.__version__, "numpy": np.__version__}
    info["devices"] = len(jax.devices())
    info["mode"] = g.get("MODE")
    return info, step


def numpy_peer():
    import numpy as np

    arrays = {}

    def matmul(n):
        if n not in arrays:
            rng = np.random.default_rng(0)
            a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
            b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
            a @ b  # warm-up: BLAS threads start, pages are touched
            arrays[n] = (a, b)
        a, b = arrays[n]
        t0 = time.perf_counter()
        a @ b
        return {"ms": (time.perf_counter() - t0) * 1e3}

    return {"ready": True, "peer": "numpy", "numpy": np.__version__}, matmul


def main():
    if len(sys.argv) != 2:
        say({"error": "usage: peers.py SCRIPT | numpy"})
        sys.exit(2)
    try:
        if sys.argv[1] == "numpy":
            info, matmul = numpy_peer()
            step = None
        else:
            info, step = train_peer(sys.argv[1])
            matmul = None
    except Exception as e:  # noqa: BLE001  (reported to shardlab, which names it)
        say({"error": f"{type(e).__name__}: {e}"})
        sys.exit(1)
    say(info)
    for line in sys.stdin:
        words = line.split()
        try:
            if words == ["step"] and step is not None:
                say(step())
            elif len(words) == 2 and words[0] == "matmul" and matmul is not None:
                say(matmul(int(words[1])))
            elif words == ["quit"]:
                return
            else:
                say({"error": f"unknown request {line.strip()!r}"})
                sys.exit(2)
        except Exception as e:  # noqa: BLE001
            say({"error": f"{type(e).__name__}: {e}"})
            sys.exit(1)


if __name__ == "__main__":
    main()
