"""The GPU check (testing/gpu_check.sh runs it): the service served as `make run` serves it, DEVICE=cuda against
DEVICE=cpu on the same machine, closed loops of 64 and 256 clients, GPU use sampled; then one batch's hooks timed."""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from testing import cli
from testing.batch_profile import profile
from testing.load import payload_templates
from testing.report import measure_closed, table, write_json
from testing.samples import request_bodies
from testing.server import get_json, sampling, start_server

HEAD = "device | clients | answers/s | p99 ms | model share | non-200 | late > 1 s | GPU use % (mean, max) | workers"


def gpu_use() -> float | None:
    """GPU 0's utilisation now, in % (nvidia-smi); None where it cannot be read."""
    smi = shutil.which("nvidia-smi")
    try:
        out = subprocess.run([smi or "nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return float(out) if out.isdigit() else None


def serve_and_load(device: str, clients: list[int], duration_s: float, templates: list[str], logs: Path
                   ) -> list[dict[str, Any]]:
    """Serve with DEVICE=device and measure each closed loop; each row with its GPU use."""
    rows = []
    with start_server({"DEVICE": device, "LOG_LEVEL": "INFO"}, logs / f"server-{device}.log") as server:
        service = get_json(server.url + "/") or {}
        workers = (service.get("config") or {}).get("workers", "?")
        model = service.get("model") or {}
        print(f"gpu_check: DEVICE={device}: {workers} workers, model on {model.get('device')} "
              f"({model.get('precision')})", flush=True)
        for n in clients:
            with sampling(gpu_use, 0.5) as readings:
                point = measure_closed(server, n, duration_s, templates)
            samples = [use for _, use in readings if use is not None]
            use = f"{statistics.mean(samples):.0f}, {max(samples):.0f}" if samples else "-"
            rows.append({"device": device, "clients": n, "workers": workers, "model_device": model.get("device"),
                         "gpu_use": use, "gpu_samples": samples,
                         **{k: v for k, v in point.items() if not k.startswith("_")}})
            print(f"gpu_check: DEVICE={device}, {n} clients: {point['throughput_rps']} answers/s, p99 "
                  f"{point['p99_ms']} ms, paths {point['paths']}, GPU {use}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testing.gpu_check", description=__doc__)
    ap.add_argument("--devices", default="cuda,cpu")
    ap.add_argument("--clients", default="64,256")
    ap.add_argument("--duration-s", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=Path("out/gpu_check"))
    ap.add_argument("--markdown", type=Path, help="append the table to this file (docs/benchmarks.md)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    templates = payload_templates(request_bodies(400, seed=3))
    started = time.time()
    rows = [row for device in args.devices.split(",")
            for row in serve_and_load(device, [int(c) for c in args.clients.split(",")], args.duration_s,
                                      templates, args.out)]
    batches = {device: profile(device, rounds=20, size=64, threads=0) for device in args.devices.split(",")}
    machine = (f"{platform.node()}: {batches[args.devices.split(',')[0]].get('gpu') or 'no GPU'}, "
               f"{batches['cpu' if 'cpu' in batches else args.devices.split(',')[0]]['cores']} cores")
    lines = [f"### GPU check, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))} ({machine})", "",
             "`bash testing/gpu_check.sh` (served as `make run` serves it, closed loops of "
             f"{args.duration_s:g} s after a warm-up, the request bodies of `testing.samples.request_bodies`)", "",
             *table(HEAD, [[r["device"], r["clients"], r["throughput_rps"], r["p99_ms"], r["model_share"],
                           r["non_200"], r["late_over_1s"], r["gpu_use"], r["workers"]] for r in rows]), "",
             "One batch of 64 lists (`testing.batch_profile`), median of 20, in ms:", "",
             *table("device | batch | predict (the network) | unbatch | total | network's share",
                    [[f"{b['device']} {b['precision']}", f"{b['median_ms']['batch']:.1f}",
                      f"{b['median_ms']['predict']:.1f}", f"{b['median_ms']['unbatch']:.1f}", f"{b['total_ms']:.1f}",
                      f"{100 * b['share']['predict']:.0f} %"] for b in batches.values()]), ""]
    text = "\n".join(lines)
    print(text)
    write_json(args.out / "gpu_check.json", {"rows": rows, "batches": batches})
    (args.out / "gpu_check.md").write_text(text + "\n", encoding="utf-8")
    if args.markdown:
        with args.markdown.open("a", encoding="utf-8") as md:
            md.write("\n" + text + "\n")
    return 0


if __name__ == "__main__":
    cli.run(main, "testing.gpu_check")
