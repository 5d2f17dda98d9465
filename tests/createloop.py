#!/usr/bin/python3
"""A create loop run as its own process (stdlib only: it runs in a Debian root with that root's
python3): creates through gpuhook-runtime until a stop file appears, each in a bundle of its own
(config.json; ``root.path`` an empty folder), each followed by its delete, as an engine drives
them; writes its progress and, at the end, its failures as JSON.

    createloop.py RUNTIME ENV_JSON FOLDER [THREADS]

``FOLDER/count`` holds the number of creates done; ``FOLDER/stop``, once made, ends the loop;
``FOLDER/result.json`` is ``{"creates": N, "failures": ["<id>: exit <code>: <stderr>", ...]}``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

SPEC = {
    "ociVersion": "1.0.2",
    "process": {
        "args": ["/bin/true"],
        "cwd": "/",
        "user": {"uid": 0, "gid": 0},
        "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=1"],
    },
    "linux": {"namespaces": [{"type": "mount"}]},
}


def main(argv: list[str]) -> int:
    runtime, env_file, folder = argv[:3]
    threads = int(argv[3]) if len(argv) > 3 else 2
    with open(env_file) as fh:
        env = json.load(fh)
    rootfs = os.path.join(folder, "rootfs")
    os.makedirs(rootfs, exist_ok=True)
    lock = threading.Lock()
    state = {"next": 0, "creates": 0}
    failures: list[str] = []
    stop = os.path.join(folder, "stop")

    def one(k: int) -> str:
        cid = f"loop-{k}"
        bundle = os.path.join(folder, cid)
        os.makedirs(bundle)
        spec = {**SPEC, "root": {"path": rootfs, "readonly": True}}
        with open(os.path.join(bundle, "config.json"), "w") as fh:
            json.dump(spec, fh)
        out = subprocess.run([runtime, "create", "--bundle", bundle, cid], env=env,
                             capture_output=True, text=True, check=False)  # fmt: skip
        failure = ""
        with open(os.path.join(bundle, "config.json")) as fh:
            edited = "/dev/nvidia1" in fh.read()
        if out.returncode != 0 or out.stderr or not edited:
            failure = f"{cid}: exit {out.returncode}: {out.stderr.strip()} (edited: {edited})"
        subprocess.run([runtime, "delete", cid], env=env, capture_output=True, check=False)
        shutil.rmtree(bundle)
        return failure

    def run() -> None:
        while not os.path.exists(stop):
            with lock:
                k = state["next"]
                state["next"] += 1
            failure = one(k)
            with lock:
                state["creates"] += 1
                if failure:
                    failures.append(failure)
                with open(os.path.join(folder, "count.tmp"), "w") as fh:
                    fh.write(str(state["creates"]))
                os.replace(os.path.join(folder, "count.tmp"), os.path.join(folder, "count"))

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    with open(os.path.join(folder, "result.json"), "w") as fh:
        json.dump({"creates": state["creates"], "failures": failures}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
