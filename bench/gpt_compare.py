#!/usr/bin/python3
"""bench/gpt_compare.py: the same character-level GPT trained by tessera and by PyTorch, side
by side, from the same initial weights, on the same windows of the same text, with the same
optimizer and schedule: the validation curves and the tokens per second of both, in training
and in generation (each with a key/value cache, one position per new token).

    /usr/bin/python3 bench/gpt_compare.py --tessera _build/tools/tessera --text FILE \\
        [--steps 2000] [--eval-every 200] [--precision fp32|bf16]
        [tessera train --model gpt options...]

--precision bf16: both train in mixed precision, float32 weights and optimizer state, the
forward under autocast (tessera's --precision bf16; PyTorch's torch.autocast("cpu",
torch.bfloat16), whose CPU autocast has no float16 in 1.13).

PyTorch 1.13 comes from Debian (python3-torch); without it the script says so and exits 77
(skipped). Nothing in the build or `make check` needs it. The windows are drawn by the same
function of (seed, step) as tools/train_gpt.c; the initial weights are tessera's
(--save-initial), read from the safetensors file directly.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import torch
except ImportError:
    print("gpt_compare: PyTorch is not installed (Debian package python3-torch): skipped")
    sys.exit(77)

M64 = (1 << 64) - 1


def mix(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def windows(text, seed, draw, B, T):
    """tools/train_gpt.c's windows(): starts from (seed, draw, b) alone."""
    n = len(text)
    xs, ys = [], []
    for b in range(B):
        start = mix(seed ^ mix((draw * 0x100000001B3 + b) & M64)) % (n - T)
        xs.append(text[start:start + T])
        ys.append(text[start + 1:start + T + 1])
    x = torch.tensor(np.frombuffer(b"".join(xs), dtype=np.uint8).reshape(B, T), dtype=torch.long)
    y = torch.tensor(np.frombuffer(b"".join(ys), dtype=np.uint8).reshape(B, T), dtype=torch.long)
    return x, y


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        assert info["dtype"] == "F32", (name, info["dtype"])
        arr = np.frombuffer(data[8 + hlen + a:8 + hlen + b], dtype=np.float32).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


class Block(torch.nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = torch.nn.LayerNorm(C, eps=1e-5)
        self.attn = torch.nn.Module()
        self.attn.c_attn = torch.nn.Linear(C, 3 * C)
        self.attn.c_proj = torch.nn.Linear(C, C)
        self.ln_2 = torch.nn.LayerNorm(C, eps=1e-5)
        self.mlp = torch.nn.Module()
        self.mlp.c_fc = torch.nn.Linear(C, 4 * C)
        self.mlp.c_proj = torch.nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(2, 3)) * (1.0 / math.sqrt(C // self.H)) + mask[:T, :T]
        y = (att.softmax(dim=3) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attn.c_proj(y)
        h = torch.nn.functional.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp.c_proj(h)


class GPT(torch.nn.Module):
    def __init__(self, V, T, L, H, C):
        super().__init__()
        self.transformer = torch.nn.Module()
        self.transformer.wte = torch.nn.Embedding(V, C)
        self.transformer.wpe = torch.nn.Embedding(T, C)
        self.transformer.h = torch.nn.ModuleList(Block(C, H) for _ in range(L))
        self.transformer.ln_f = torch.nn.LayerNorm(C, eps=1e-5)
        m = torch.full((T, T), float("-inf")).triu(1)
        self.register_buffer("mask", m)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T))
        for blk in self.transformer.h:
            x = blk(x, self.mask)
        x = self.transformer.ln_f(x)
        return x @ self.transformer.wte.weight.t()  # tied head


def lr_at(step, base, warmup, total, lo):
    """ts_lr_at for a cosine schedule."""
    if step < warmup:
        return base * (step + 1) / warmup
    t, span = step - warmup, total - warmup
    if span <= 0 or t >= span:
        return lo
    return lo + 0.5 * (base - lo) * (1 + math.cos(math.pi * t / span))


@torch.no_grad()
def generate_speed(model, T, seed):
    """Samples T - 1 bytes after a one-byte prompt with a key/value cache (as tessera generate
    does: temperature 0.8, all 256 candidates), returns tokens per second, prompt included."""
    gen = torch.Generator().manual_seed(seed)
    tr = model.transformer
    C = tr.wte.weight.shape[1]
    caches = [([], []) for _ in tr.h]
    tok, t0 = ord("T"), time.time()
    for pos in range(T):
        x = (tr.wte.weight[tok] + tr.wpe.weight[pos]).view(1, 1, C)
        for blk, (ks, vs) in zip(tr.h, caches):
            H = blk.H
            q, k, v = blk.attn.c_attn(blk.ln_1(x)).split(C, dim=2)
            ks.append(k.view(1, H, 1, C // H))
            vs.append(v.view(1, H, 1, C // H))
            K, V = torch.cat(ks, 2), torch.cat(vs, 2)
            att = (q.view(1, H, 1, C // H) @ K.transpose(2, 3)) * (1.0 / math.sqrt(C // H))
            y = (att.softmax(dim=3) @ V).transpose(1, 2).reshape(1, 1, C)
            x = x + blk.attn.c_proj(y)
            h = torch.nn.functional.gelu(blk.mlp.c_fc(blk.ln_2(x)), approximate="tanh")
            x = x + blk.mlp.c_proj(h)
        logits = tr.ln_f(x).view(C) @ tr.wte.weight.t()
        tok = int(torch.multinomial(torch.softmax(logits / 0.8, 0), 1, generator=gen))
    return T / (time.time() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cpu_blas")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    text = open(a.text, "rb").read()
    ntrain = len(text) - len(text) // 10
    train, val = text[:ntrain], text[ntrain:]
    common = ["--model", "gpt", "--text", a.text, "--steps", str(a.steps),
              "--eval-every", str(a.eval_every), "--eval-batches", str(a.eval_batches),
              "--context", str(a.context), "--layers", str(a.layers), "--heads", str(a.heads),
              "--embd", str(a.embd), "--batch-size", str(a.batch_size), "--lr", str(a.lr),
              "--warmup-steps", str(a.warmup_steps), "--weight-decay", str(a.weight_decay),
              "--seed", str(a.seed), "--device", a.device, "--precision", a.precision,
              "--json"]
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init.st")
        t0 = time.time()
        final = os.path.join(tmp, "final.st")
        res = subprocess.run([a.tessera, "train", *common, "--save-initial", init,
                              "--save", final], capture_output=True, text=True, check=True)
        t_ts = time.time() - t0
        ours = [r for r in (json.loads(l) for l in res.stdout.splitlines()
                            if l.startswith("{")) if "val_loss" in r]  # not start / end
        weights = read_safetensors(init)
        # generation: context - 1 new bytes after a one-byte prompt, a few times; tessera
        # reports its own speed on stderr
        gen_ts = []
        for seed in range(1, 4):
            g = subprocess.run([a.tessera, "generate", "--resume", final, "--prompt", "T",
                                "--tokens", str(a.context - 1), "--seed", str(seed),
                                "--device", a.device], capture_output=True, text=True,
                               check=True)
            gen_ts.append(float(g.stderr.split("(")[-1].split()[0]))
    model = GPT(256, a.context, a.layers, a.heads, a.embd)
    state = {k: v for k, v in model.state_dict().items() if k != "mask"}
    for k in state:
        state[k] = weights[k]
    model.load_state_dict({**state, "mask": model.mask}, strict=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and ".h." in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and ".h." in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16")

    theirs, t0, since, loss_sum = [], time.time(), 0, 0.0
    lo = a.lr / 10
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.lr, a.warmup_steps, a.steps, lo)
        x, y = windows(train, a.seed, step, a.batch_size, a.context)
        with autocast():
            loss = torch.nn.functional.cross_entropy(model(x).view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_sum += loss.item()
        since += 1
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            secs = time.time() - t0
            with torch.no_grad(), autocast():
                v = sum(torch.nn.functional.cross_entropy(
                    model(xv).view(-1, 256), yv.view(-1)).item()
                    for xv, yv in (windows(val, a.seed ^ 0x5EED, e, a.batch_size, a.context)
                                   for e in range(a.eval_batches))) / a.eval_batches
            theirs.append({"step": step + 1, "train_loss": loss_sum / since, "val_loss": v,
                           "tokens_per_s": since * a.batch_size * a.context / secs})
            since, loss_sum, t0 = 0, 0.0, time.time()
    print(f"{'step':>6} {'tessera val':>12} {'pytorch val':>12} {'diff':>8} "
          f"{'tessera tok/s':>14} {'pytorch tok/s':>14}")
    for o, t in zip(ours, theirs):
        print(f"{o['step']:>6} {o['val_loss']:>12.4f} {t['val_loss']:>12.4f} "
              f"{o['val_loss'] - t['val_loss']:>+8.4f} {o['tokens_per_s']:>14.0f} "
              f"{t['tokens_per_s']:>14.0f}")
    gen_pt = [generate_speed(model, a.context, seed) for seed in range(1, 4)]
    print(f"generation, {a.context - 1} new bytes after a one-byte prompt, tokens/s (best of "
          f"3): tessera {max(gen_ts):.0f}, PyTorch {max(gen_pt):.0f}")
    print(f"training tokens/s over the whole run (median of the evaluation intervals): "
          f"tessera {sorted(o['tokens_per_s'] for o in ours)[len(ours) // 2]:.0f}, PyTorch "
          f"{sorted(t['tokens_per_s'] for t in theirs)[len(theirs) // 2]:.0f}")
    d = abs(ours[-1]["val_loss"] - theirs[-1]["val_loss"])
    print(f"final validation loss: tessera {ours[-1]['val_loss']:.4f}, PyTorch "
          f"{theirs[-1]['val_loss']:.4f}, difference {d:.4f} nats "
          f"({'within' if d <= 0.03 else 'OUTSIDE'} 0.03); tessera's whole run {t_ts:.1f} s")
    return 0 if d <= 0.03 else 1


if __name__ == "__main__":
    sys.exit(main())
