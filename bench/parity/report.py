#!/usr/bin/env python3
"""Turns bench-parity --json output into the "## Parity" section of docs/benchmarks.md and plots.

    bench/parity/report.py --command "CMD" HEADLINE.jsonl [SWEEP.jsonl ...]
        [--title "Parity on an H100"] [--machine "TEXT"] [--gpu-sweep FILE ...]

HEADLINE.jsonl: one run at one geometry (the table and the bar plot). SWEEP files: more runs at
other k (the gen/recover-versus-k plot). GPU sweep files: runs at other geometries whose GPU rows
make the GPU-versus-geometry table and plot. Only the section named by --title (default
"Parity") of docs/benchmarks.md is rewritten; the other sections are left as they are. --machine
describes the machine that ran the benchmark when that is not this one (a device run).
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
IMG_DIR = os.path.join(ROOT, "docs", "img")

OPS = ["gen_pq", "gen_p", "update_pq", "recover_2data", "check_pq"]
GPU_OPS = ["gen_pq_kernel", "recover_2data_kernel", "device_memcpy", "gen_pq_pinned_roundtrip", "pinned_h2d", "gen_pq_batch", "recover_2data_batch"]


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        wanted = ["avx2", "avx512f", "avx512bw", "gfni"]
        have = [w for w in wanted if re.search(r"\b%s\b" % w, text)]
        flags = ", ".join(have)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores ({flags}), Linux {platform.release()}"


def version(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "?"


def bar_plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = []
    for r in rows:
        if r["op"] in OPS and r["backend"] not in backends:
            backends.append(r["backend"])
    k, chunk = rows[0]["k"], rows[0]["chunk_bytes"]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / max(1, len(backends))
    for i, b in enumerate(backends):
        values = []
        for op in OPS:
            v = [r["gbps"] for r in rows if r["backend"] == b and r["op"] == op]
            values.append(v[0] if v else 0.0)
        xs = [j + (i - (len(backends) - 1) / 2) * width for j in range(len(OPS))]
        bars = ax.bar(xs, values, width, label=b, hatch="//" if b == "isal" else None, edgecolor="black", linewidth=0.4)
        for x, v in zip(xs, values):
            if v > 0:
                ax.text(x, v, f"{v:.0f}" if v >= 10 else f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(OPS)))
    ax.set_xticklabels(OPS)
    ax.set_ylabel("GB/s of data, one core (best window)")
    ax.set_title(f"paraid parity vs ISA-L, k={k}, {chunk // 1024} KiB chunks")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sweep_plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for ax, op in zip(axes, ["gen_pq", "recover_2data"]):
        backends = sorted({r["backend"] for r in rows if r["op"] == op and r["backend"] != "reference"})
        for b in backends:
            pts = sorted((r["k"], r["gbps"]) for r in rows if r["op"] == op and r["backend"] == b)
            label = b
            if b == "isal":
                label = "isal pq_gen" if op == "gen_pq" else "isal ec_encode_data"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, linestyle="--" if b == "isal" else "-")
        ax.set_title(op)
        ax.set_xlabel("data chunks k")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("GB/s of data, one core (best window)")
    chunk = rows[0]["chunk_bytes"]
    fig.suptitle(f"RAID6 gen and 2-data recover versus k, {chunk // 1024} KiB chunks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt(v):
    return f"{v:.1f}"


def gpu_targets(headline):
    """The GPU targets of the parity issue, from one run's GPU rows."""

    def one(op):
        v = [r["gbps"] for r in headline if r["op"] == op]
        return v[0] if v else None

    out = []
    pairs = [
        ("gen_pq_kernel", "device_memcpy", 0.80, "kernel (gen P+Q, data in GPU memory) >= 80% of device memcpy"),
        ("recover_2data_kernel", "device_memcpy", 0.80, "kernel (2-data recover) >= 80% of device memcpy"),
        ("gen_pq_pinned_roundtrip", "pinned_h2d", 0.85, "host -> GPU -> host >= 85% of pinned host-to-device copy"),
    ]
    rows = []
    for op, peer, target, what in pairs:
        v, p = one(op), one(peer)
        if v is None or p is None:
            continue
        ratio = v / p
        rows.append(f"| {what} | {fmt(v)} vs {fmt(p)} GB/s ({100 * ratio:.0f}%) | {'met' if ratio >= target else 'not met'} |")
    if rows:
        out.append("| GPU target | measured | status |")
        out.append("|---|---|---|")
        out.extend(rows)
        out.append("")
    return out


def gpu_sweep_section(rows, img_name):
    """Table (and plot) of the GPU rows of several runs, one line per geometry."""
    geos = sorted({(r["k"], r["chunk_bytes"]) for r in rows})

    def one(k, chunk, backend, op):
        v = [r["gbps"] for r in rows if r["k"] == k and r["chunk_bytes"] == chunk and r["backend"] == backend and r["op"] == op]
        return v[-1] if v else None

    out = ["GPU figures across geometries (GB/s of data; memcpy and h2d are GB/s copied):", ""]
    out.append("| k | chunk | gen kernel | recover kernel | device memcpy | gen kernel / memcpy | pinned round trip | pinned h2d | round trip / h2d | gen batch (host memory) | best CPU gen_pq, one core |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    plotted = []
    for k, chunk in geos:
        g = one(k, chunk, "cuda", "gen_pq_kernel")
        r = one(k, chunk, "cuda", "recover_2data_kernel")
        m = one(k, chunk, "cuda", "device_memcpy")
        rt = one(k, chunk, "cuda", "gen_pq_pinned_roundtrip")
        h = one(k, chunk, "cuda", "pinned_h2d")
        b = one(k, chunk, "cuda", "gen_pq_batch")
        cpus = [x["gbps"] for x in rows if x["k"] == k and x["chunk_bytes"] == chunk and x["op"] == "gen_pq" and x["backend"] not in ("isal", "reference")]
        c = max(cpus) if cpus else None
        if g is None or m is None:
            continue
        cell = lambda v: "–" if v is None else fmt(v)
        pct = lambda a, bb: "–" if a is None or bb is None else f"{100 * a / bb:.0f}%"
        out.append(f"| {k} | {chunk // 1024} KiB | {cell(g)} | {cell(r)} | {cell(m)} | {pct(g, m)} | {cell(rt)} | {cell(h)} | {pct(rt, h)} | {cell(b)} | {cell(c)} |")
        plotted.append((f"k={k}\n{chunk // 1024}K", g, r, m, rt, h, b, c))
    out.append("")
    if plotted:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(11, 4.8))
        names = ["gen kernel", "recover kernel", "device memcpy", "pinned round trip", "pinned h2d", "gen batch", "CPU gen_pq (1 core)"]
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(plotted))]
            ys = [p[1 + i] or 0.0 for p in plotted]
            ax.bar(xs, ys, width, label=name, edgecolor="black", linewidth=0.3)
        ax.set_yscale("log")
        ax.set_xticks(range(len(plotted)))
        ax.set_xticklabels([p[0] for p in plotted])
        ax.set_ylabel("GB/s (log scale)")
        ax.set_title("GPU parity: kernel against device memcpy, round trip against pinned h2d")
        ax.legend(fontsize=7, ncol=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(IMG_DIR, img_name), dpi=110)
        plt.close(fig)
        out.append(f"![GPU parity across geometries](img/{img_name})")
        out.append("")
    return out


IN_PLACE_OPS = ["gen_pq_64mib", "recover_2data_64mib"]
HOST_CPU = re.compile(r"host CPU ([0-9.]+) ms per GB \(([0-9.]+) cores busy\)")


def in_place_section(rows, img_name):
    """64 MiB batches on the best CPU backend, the GPU through its slots and the GPU in place, with the host CPU
    each cost (parsed from the rows' notes, which bench/parity/src/in_place.rs writes)."""
    rows = [r for r in rows if r["op"] in IN_PLACE_OPS]
    if not rows:
        return []
    geos = sorted({(r["k"], r["chunk_bytes"]) for r in rows})

    def one(k, chunk, op, kind):
        for r in rows:
            if r["k"] != k or r["chunk_bytes"] != chunk or r["op"] != op:
                continue
            if (kind == "cpu") == (not r["backend"].startswith("cuda")) and (kind == "cpu" or r["backend"] == kind):
                m = HOST_CPU.search(r.get("note", ""))
                return r["backend"], r["gbps_median"], float(m.group(1)) if m else None
        return None

    out = ["Batches of 64 MiB of distinct stripes (beyond the caches), RAID6, through the `Backend` trait: the best CPU",
           "backend on one core, the GPU through its staging slots (ordinary memory), and the GPU in place (memory from",
           "`alloc_host`, registered with the GPU: what a rebuild's buffers now are). GB/s of data, median window; host CPU",
           "is the process's CPU time (every thread, the driver's included) per GB of data.", ""]
    out.append("| k | chunk | op | CPU GB/s (ms CPU per GB) | GPU staged | GPU in place | in place / CPU rate | CPU time: CPU / in place |")
    out.append("|---|---|---|---|---|---|---|---|")
    plotted = []
    for k, chunk in geos:
        for op in IN_PLACE_OPS:
            c, st, ip = one(k, chunk, op, "cpu"), one(k, chunk, op, "cuda-staged"), one(k, chunk, op, "cuda-in-place")
            if not (c and ip):
                continue
            cell = lambda x: "–" if x is None else f"{fmt(x[1])} ({x[2]:.1f})"
            ratio = f"{ip[1] / c[1]:.2f}x"
            cpu_ratio = f"{c[2] / ip[2]:.0f}x" if c[2] and ip[2] else "–"
            out.append(f"| {k} | {chunk // 1024} KiB | {op.replace('_64mib', '')} | {c[0]} {cell(c)} | {cell(st)} | {cell(ip)} | {ratio} | {cpu_ratio} |")
            plotted.append((f"k={k} {chunk // 1024}K\n{op.replace('_64mib', '')}", c, st, ip))
    out.append("")
    if plotted:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
        names = ["CPU, one core", "GPU staged", "GPU in place"]
        width = 0.8 / len(names)
        for ax, index, label in [(axes[0], 1, "GB/s of data (median)"), (axes[1], 2, "host CPU ms per GB (log)")]:
            for i, name in enumerate(names):
                xs = [j + (i - 1) * width for j in range(len(plotted))]
                ys = [(p[1 + i][index] or 0.0) if p[1 + i] else 0.0 for p in plotted]
                ax.bar(xs, ys, width, label=name, edgecolor="black", linewidth=0.3)
            ax.set_xticks(range(len(plotted)))
            ax.set_xticklabels([p[0] for p in plotted], fontsize=7)
            ax.set_ylabel(label)
            if index == 2:
                ax.set_yscale("log")
            ax.grid(axis="y", alpha=0.3)
        axes[0].legend(fontsize=8)
        axes[0].set_title("rate")
        axes[1].set_title("what it costs the host")
        fig.tight_layout()
        fig.savefig(os.path.join(IMG_DIR, img_name), dpi=110)
        plt.close(fig)
        out.append(f"![64 MiB batches: CPU, GPU staged, GPU in place](img/{img_name})")
        out.append("")
    return out


def section(headline, sweep, command, sweep_command, load_avg, gpu_note, title="Parity", machine_text=None, img_prefix="parity", gpu_sweep=()):
    k, chunk = headline[0]["k"], headline[0]["chunk_bytes"]
    seconds = headline[0].get("seconds", "?")
    cpu = headline[0].get("cpu", "?")
    backends = []
    for r in headline:
        if r["op"] in OPS and r["backend"] not in backends:
            backends.append(r["backend"])

    def get(b, op, key="gbps"):
        v = [r[key] for r in headline if r["backend"] == b and r["op"] == op]
        return v[0] if v else None

    cpu_backends = [b for b in backends if b not in ("isal", "reference")]
    best = max(cpu_backends, key=lambda b: get(b, "gen_pq") or 0) if cpu_backends else None
    out = []
    out.append(f"## {title}")
    out.append("")
    out.append("Written by `bench/parity/report.py` from `bench/parity/run --json` output (the next run rewrites this section).")
    out.append("")
    out.append(f"- Command: `{command}`" + (f"; sweep: `{sweep_command}`" if sweep or gpu_sweep else ""))
    if machine_text:
        out.append(f"- Machine: {machine_text}; benchmark thread pinned to {cpu}; load average {load_avg} at start.")
    else:
        out.append(f"- Machine: {machine()}; benchmark thread pinned to {cpu}; load average {load_avg} at start (the machine is shared with other engineers' builds).")
    out.append(f"- ISA-L: Debian libisal-dev {version(['dpkg-query', '-W', '-f', '${Version}', 'libisal-dev'])}, called through FFI in the same process, on the same core, interleaved with paraid's backends.")
    out.append(f"- Geometry: RAID6 k={k} data chunks of {chunk} bytes (64-byte aligned buffers); {seconds} s per row, split in 10 windows taken in turn by every contender, so a burst of load from elsewhere hits them alike. *best* is the best window, *median* the median one.")
    out.append("- GB/s counts data bytes: k x chunk per stripe for gen, recover and check; the one rewritten chunk for update (which reads old data, new data, P and Q and writes P and Q).")
    out.append("")
    out.append("| backend | " + " | ".join(f"{op} best / median" for op in OPS) + " |")
    out.append("|---|" + "---|" * len(OPS))
    for b in backends:
        cells = []
        for op in OPS:
            v, m = get(b, op), get(b, op, "gbps_median")
            cells.append("–" if v is None else f"{fmt(v)} / {fmt(m)}")
        out.append(f"| {b} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("ISA-L rows: `gen_pq` is `pq_gen`, `gen_p` is `xor_gen`, `recover_2data` is `ec_encode_data` with the inverted RAID6 matrix (tables made once, outside the timing); ISA-L has no update or check.")
    out.append("")
    if best and get("isal", "gen_pq"):
        out.append("Targets (best CPU backend against ISA-L `pq_gen`, same core, same run):")
        out.append("")
        out.append("| target | measured (best windows) | medians | status |")
        out.append("|---|---|---|---|")
        isal = get("isal", "gen_pq")
        isal_m = get("isal", "gen_pq", "gbps_median")
        for op in ["gen_pq", "recover_2data"]:
            v, m = get(best, op), get(best, op, "gbps_median")
            status = "met" if v >= isal and m >= isal_m else ("met on best windows" if v >= isal else "not met")
            out.append(f"| {best} {op} >= ISA-L pq_gen | {fmt(v)} vs {fmt(isal)} ({v / isal:.2f}x) | {fmt(m)} vs {fmt(isal_m)} ({m / isal_m:.2f}x) | {status} |")
        ec = get("isal", "recover_2data")
        if ec:
            v = get(best, "recover_2data")
            out.append(f"| {best} recover_2data vs ISA-L ec_encode_data (for reference) | {fmt(v)} vs {fmt(ec)} ({v / ec:.2f}x) | | |")
        out.append("")
    out.append(f"![parity GB/s per core, k={k}](img/{img_prefix}-k{k}-{chunk // 1024}k.png)")
    out.append("")
    if sweep:
        allrows = sweep + headline
        ks = sorted({r["k"] for r in allrows})

        def at(kk, b, op):
            v = [r["gbps"] for r in allrows if r["k"] == kk and r["backend"] == b and r["op"] == op]
            return v[-1] if v else None

        out.append(f"Sweep over k ({chunk // 1024} KiB chunks, best windows; k={k} from the run above):")
        out.append("")
        out.append(f"| k | {best} gen_pq | ISA-L pq_gen | ratio | {best} recover_2data | ratio to pq_gen | ISA-L ec_encode_data |")
        out.append("|---|---|---|---|---|---|---|")
        for kk in ks:
            g, i, r, e = at(kk, best, "gen_pq"), at(kk, "isal", "gen_pq"), at(kk, best, "recover_2data"), at(kk, "isal", "recover_2data")
            if None in (g, i, r):
                continue
            out.append(f"| {kk} | {fmt(g)} | {fmt(i)} | {g / i:.2f}x | {fmt(r)} | {r / i:.2f}x | {fmt(e) if e else '–'} |")
        below = []
        for kk in ks:
            g, i, r = at(kk, best, "gen_pq"), at(kk, "isal", "gen_pq"), at(kk, best, "recover_2data")
            if None not in (g, i, r) and (g < i or r < i):
                below.append(f"k={kk} (gen {g / i:.2f}x, recover {r / i:.2f}x)")
        if below:
            out.append("")
            out.append(
                "Below ISA-L pq_gen in this sweep: " + ", ".join(below) + ". With few data chunks every implementation, "
                "ISA-L included, runs into the same cache-bandwidth ceiling (P and Q are a third of the traffic at k=4), "
                "and the difference is within the run-to-run spread of this shared machine."
            )
        out.append("")
        out.append(f"![gen and recover versus k](img/{img_prefix}-sweep-{chunk // 1024}k.png)")
        out.append("")
    gpu_rows = [r for r in headline if r["op"] in GPU_OPS]
    out.append("### GPU")
    out.append("")
    if gpu_rows:
        out.append("| op | GB/s | note |")
        out.append("|---|---|---|")
        for op in GPU_OPS:
            for r in gpu_rows:
                if r["op"] == op:
                    out.append(f"| {op} | {fmt(r['gbps'])} | {r.get('note', '')} |")
        out.append("")
        out.extend(gpu_targets(headline))
    if gpu_sweep:
        out.extend(gpu_sweep_section(gpu_sweep, f"{img_prefix}-gpu-geometries.png"))
    out.extend(in_place_section(list(headline) + list(gpu_sweep), f"{img_prefix}-in-place.png"))
    out.append(gpu_note)
    out.append("")
    return "\n".join(out)


def replace_section(doc_text, new_section, title="Parity"):
    if not doc_text.strip():
        doc_text = "# Benchmarks\n"
    pattern = re.compile(r"^## " + re.escape(title) + r"\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(doc_text):
        return pattern.sub(lambda _: new_section + "\n", doc_text, count=1)
    return doc_text.rstrip("\n") + "\n\n" + new_section + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--command", required=True, help="the bench command that made HEADLINE")
    ap.add_argument("--sweep-command", default="", help="the command(s) that made the sweep files")
    ap.add_argument("--load", default="?", help="load average when the run started")
    ap.add_argument("--gpu-note", default="", help="a line about the GPU rows")
    ap.add_argument("--title", default="Parity", help="the section of docs/benchmarks.md to write")
    ap.add_argument("--machine", default=None, help="the machine that ran it, when not this one")
    ap.add_argument("--img-prefix", default="parity", help="file name prefix of the plots")
    ap.add_argument("--gpu-sweep", nargs="*", default=[], help="runs at other geometries for the GPU table")
    ap.add_argument("headline")
    ap.add_argument("sweep", nargs="*")
    args = ap.parse_args()
    headline = load(args.headline)
    if not headline:
        sys.exit(f"{args.headline}: no JSON rows")
    sweep = [r for path in args.sweep for r in load(path)]
    os.makedirs(IMG_DIR, exist_ok=True)
    k, chunk = headline[0]["k"], headline[0]["chunk_bytes"]
    prefix = args.img_prefix
    bar_plot(headline, os.path.join(IMG_DIR, f"{prefix}-k{k}-{chunk // 1024}k.png"))
    if sweep:
        sweep_plot(sweep + headline, os.path.join(IMG_DIR, f"{prefix}-sweep-{chunk // 1024}k.png"))
    gpu_sweep = [r for path in args.gpu_sweep for r in load(path)] + [r for r in headline if r["backend"] == "cuda" or r["op"] == "gen_pq"]
    if not any(r["backend"] == "cuda" for r in gpu_sweep):
        gpu_sweep = []
    text = open(DOC).read() if os.path.exists(DOC) else ""
    new = section(headline, sweep, args.command, args.sweep_command, args.load, args.gpu_note,
                  title=args.title, machine_text=args.machine, img_prefix=prefix, gpu_sweep=gpu_sweep)
    with open(DOC, "w") as f:
        f.write(replace_section(text, new, args.title))
    print(f"wrote the {args.title} section of {DOC}")


if __name__ == "__main__":
    main()
