#!/usr/bin/python3
"""bench/contend_compare.py: how a training step degrades on a shared machine, tessera's next to
PyTorch's in the same run. Each framework times its step alone and then beside N busy
processes (each spinning on one core), and the ratio of the two medians is its slowdown.

    /usr/bin/python3 bench/contend_compare.py --tessera _build/tools/tessera \\
        [--model gpt|mlp] [--device cpu_blas|cpu_onednn] [--contend 1] [--steps 20]

tessera's side is `tessera bench train --model M --device D --steps S --contend N --json`
(the default GPT: context 128, 4 layers, 4 heads, 128 channels, batch 16, AdamW; the MLP:
784-256-128-10, batch 100, Adam); PyTorch's is the same model and optimizer on random data,
torch.set_num_threads(--threads) (tessera's plugins take their `threads` setting; set both
alike). PyTorch 1.13 comes from Debian (python3-torch); without it the script says so and
exits 77 (skipped). Nothing in the build or `make check` needs it.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

try:
    import torch
except ImportError:
    print("contend_compare: PyTorch is not installed (Debian package python3-torch): skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_compare import GPT  # noqa: E402  (the same model as the quality comparison)


def busy(n):
    """n processes, each spinning on one core."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs):
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()


def median(v):
    v = sorted(v)
    return v[len(v) // 2]


def torch_step(model_name):
    """A closure running one training step of the model, and what it trains on."""
    torch.manual_seed(1)
    if model_name == "gpt":
        B, T = 16, 128
        model = GPT(256, T, 4, 4, 128)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, 256, (B, T))
        y = torch.randint(0, 256, (B, T))

        def loss_fn():
            return torch.nn.functional.cross_entropy(model(x).view(-1, 256), y.view(-1))
    else:
        model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.rand(100, 784)
        y = torch.randint(0, 10, (100,))

        def loss_fn():
            return torch.nn.functional.cross_entropy(model(x), y)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
    return step


def time_steps(step, n):
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        t.append(time.perf_counter() - t0)
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--model", choices=["gpt", "mlp"], default="gpt")
    ap.add_argument("--device", default="cpu_blas")
    ap.add_argument("--contend", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    res = subprocess.run([a.tessera, "bench", "train", "--model", a.model, "--device", a.device,
                          "--steps", str(a.steps), "--contend", str(a.contend), "--json"],
                         capture_output=True, text=True, check=True)
    r = json.loads(res.stdout)["results"][0]
    ts_alone, ts_busy = r["ms_median"], r["ms_median_contended"]
    step = torch_step(a.model)
    time_steps(step, 5)  # warm-up: first allocations, thread pool
    # alone and busy in turn, three rounds: a machine whose load drifts weighs on both alike
    alone, crowded = [], []
    for _ in range(3):
        alone += time_steps(step, a.steps)
        procs = busy(a.contend)
        try:
            time.sleep(1)  # as tessera's bench: a second of them first
            crowded += time_steps(step, a.steps)
        finally:
            stop(procs)
    pt_alone, pt_busy = median(alone) * 1e3, median(crowded) * 1e3
    print(f"{a.model} step, median ms (tessera: of {a.steps}; PyTorch: of 3 x {a.steps}), "
          f"alone and beside {a.contend} busy "
          f"process(es), {a.threads} threads each, {os.cpu_count()} cores:")
    print(f"  tessera {a.device:<11} {ts_alone:9.3f} {ts_busy:9.3f}  {ts_busy / ts_alone:5.2f}x")
    print(f"  PyTorch {torch.__version__:<11} {pt_alone:9.3f} {pt_busy:9.3f}  "
          f"{pt_busy / pt_alone:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
