"""The shared/vmlab guest as the VM suites use it: build it once, boot it for one guest script, read its files.

The host kernel has no md, so every comparison with md runs in a vmlab guest (QEMU; TCG on this project's
machines). A suite is a host script (bench/vm/<suite>) that copies the paraid binary into its results directory,
boots one guest with `boot_guest` to run its guest script (which writes under /host/<results directory>), then
reads what the guest wrote with `read_key_values` and `fio_json`.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl

VMLAB_DIR = bl.REPO_ROOT.parent / "shared" / "vmlab"


def ensure_built(vmlab: Path) -> None:
    if (vmlab / "build" / "root.img").exists():
        return
    env = dict(os.environ)
    if "MIRROR" not in env:
        # vmlab's build.sh looks for the mirror in /etc/apt/sources.list too and stops (pipefail)
        # where that file is absent, as on this project's machines: name the mirror for it.
        mirror = apt_mirror()
        if mirror:
            env["MIRROR"] = mirror
    bl.log(f"vmlab: {vmlab}/build is missing: running build.sh (a few minutes)")
    result = subprocess.run([str(vmlab / "build.sh")], env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0 or not (vmlab / "build" / "root.img").exists():
        raise bl.SetupFailed(f"vmlab build.sh exited {result.returncode}: "
                             f"{(result.stderr or result.stdout).strip()[-600:]}")


def apt_mirror() -> str | None:
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:"):
                for uri in line.split()[1:]:
                    if "security" not in uri:
                        return uri.rstrip("/")
    return None


def guest_command(settings: dict[str, str], script: Path) -> str:
    """The shell line the guest runs: its settings as environment variables, then the script as the guest sees
    it (the repository is shared at /host)."""
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in settings.items()) + \
        f" bash /host/{script.relative_to(bl.REPO_ROOT)}"


def boot_guest(*, vmlab: Path, command: str, disks: int, disk_size_gib: int, disk_dir: Path, mem_mib: int,
               cpus: int, console_path: Path, timeout_s: float, teardown: bl.Teardown,
               disk_throttle: dict[str, int] | None = None, throttled_disks: list[int] | None = None) -> int:
    """One boot that runs `command` in /host (the repository), its console to `console_path` and this terminal.
    Returns the command's exit status. The disks (sparse files in `disk_dir`) are removed at teardown. With
    `disk_throttle` (QEMU's throttling options without the prefix, e.g. {"bps-total": 33554432} or
    {"iops-total": 500}), QEMU throttles each data disk on its own (see `throttling_wrapper`), or only the data
    disks numbered in `throttled_disks` (0 is the guest's /dev/vdb)."""
    argv = [str(vmlab / "run.sh"), "--disks", str(disks), "--disk-size", str(disk_size_gib),
            "--disk-dir", str(disk_dir), "--mem", str(mem_mib), "--cpus", str(cpus),
            "--share", str(bl.REPO_ROOT), "--", command]
    env = dict(os.environ)
    if disk_throttle:
        wrapper_dir = throttling_wrapper(disk_throttle, teardown, throttled_disks)
        env["PATH"] = f"{wrapper_dir}:{env.get('PATH', '')}"
        which = "each" if throttled_disks is None else "numbers " + ", ".join(map(str, throttled_disks))
        bl.log(f"QEMU data disks throttled ({which}): {throttle_options(disk_throttle)} (wrapper in {wrapper_dir})")
    bl.log("$ " + " ".join(shlex.quote(a) for a in argv))
    teardown.push(f"remove {disk_dir}", lambda: shutil.rmtree(disk_dir, ignore_errors=True))
    console = console_path.open("w")
    # Its own session, so that the teardown ends run.sh and the QEMU it started, and nothing else.
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, cwd=bl.REPO_ROOT, env=env)

    def stop_guest():
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    teardown.push("stop the guest", stop_guest)
    deadline = time.monotonic() + timeout_s
    for line in process.stdout:
        console.write(line)
        console.flush()
        print(line, end="", flush=True)
        if time.monotonic() > deadline:
            raise bl.SetupFailed(f"the guest did not finish in {timeout_s:.0f} s")
    console.close()
    return process.wait()


# vmlab's run.sh names each data disk's drive `if=none,id=d<N>,...` (the root disk is `id=root`) and has no
# option for QEMU's I/O throttling, so a suite that needs members of a known bandwidth puts this wrapper first on
# run.sh's PATH: it appends the throttle to those drive arguments and runs the real QEMU with the rest unchanged.
# Each drive gets its own limit (no throttle group), so the disks are independent, like separate drives.
THROTTLE_WRAPPER = """#!/bin/bash
# Written by bench/lib/vmlab.py: QEMU with vmlab data disks ({pattern}) throttled ({options}).
args=()
for arg in "$@"; do
    case $arg in
        {pattern}) arg="$arg,{options}" ;;
    esac
    args+=("$arg")
done
exec {qemu} "${{args[@]}}"
"""


def throttle_options(throttle: dict[str, int]) -> str:
    """QEMU's drive options for `throttle`: {"iops-total": 500} -> "throttling.iops-total=500"."""
    for key, value in throttle.items():
        if not key.replace("-", "").isalnum() or int(value) <= 0:
            raise ValueError(f"not a throttle setting: {key}={value}")
    return ",".join(f"throttling.{key}={int(value)}" for key, value in throttle.items())


def throttled_drive_pattern(disks: list[int] | None) -> str:
    """The wrapper's case pattern for the drive arguments of data disks `disks` (None: every data disk)."""
    if disks is None:
        return "if=none,id=d[0-9]*"
    if not disks or any(int(d) < 0 for d in disks):
        raise ValueError(f"not a list of data disk numbers: {disks}")
    return "|".join(f"if=none,id=d{int(d)},*" for d in disks)


def throttling_wrapper(throttle: dict[str, int], teardown: bl.Teardown, disks: list[int] | None = None) -> Path:
    """A directory holding `qemu-system-x86_64` that throttles vmlab's data disks, every one or those numbered in
    `disks` (THROTTLE_WRAPPER)."""
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise bl.SetupFailed("qemu-system-x86_64 is not installed (vmlab's build.sh installs it)")
    directory = Path(tempfile.mkdtemp(prefix="paraid-bench-qemu-"))
    teardown.push(f"remove {directory}", lambda: shutil.rmtree(directory, ignore_errors=True))
    wrapper = directory / "qemu-system-x86_64"
    wrapper.write_text(THROTTLE_WRAPPER.format(options=throttle_options(throttle), qemu=shlex.quote(qemu),
                                               pattern=throttled_drive_pattern(disks)))
    wrapper.chmod(0o755)
    return directory


def accel_line(console_path: Path) -> str | None:
    """run.sh's first line says which accelerator QEMU used (KVM or TCG, and why)."""
    if console_path.exists():
        for line in console_path.read_text(errors="replace").splitlines():
            if line.startswith("run: accel="):
                return line.removeprefix("run: ")
    return None


def read_key_values(path: Path) -> dict[str, str]:
    values = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
    return values


def fio_json(path: Path) -> dict:
    text = path.read_text()
    start = text.find("{")  # fio may print warnings before the document
    return json.loads(text[start:] if start >= 0 else text)


def read_key_values_line(path: Path) -> dict[str, str]:
    """Space-separated key=value pairs (the guest scripts' per-job CPU lines); empty if the file is missing."""
    if not path.exists():
        return {}
    return dict(token.split("=", 1) for token in path.read_text().split() if "=" in token)


def summarize_job(target_dir: Path, stem: str) -> dict | None:
    """One fio job a guest script ran (its `fio_job`: STEM.json and STEM.cpu in `target_dir`): throughput over
    reads and writes together, the mean completion latency of the side that moved data, and the guest's CPU per
    I/O and per GB. Where the guest flushed the device after the job (`flush_s` in STEM.cpu), throughput counts
    the job's time and the flush's together (what was written is then in place), and `iops_answered` /
    `mib_s_answered` keep fio's own figures. None if the job did not run; {"error": ...} if it ran and gave
    nothing to count."""
    path = target_dir / f"{stem}.json"
    if not path.exists():
        return None
    try:
        job = fio_json(path)["jobs"][0]
    except (ValueError, KeyError, IndexError) as error:
        return {"error": f"unreadable fio output: {error}"}
    if job.get("error"):
        return {"error": f"fio error {job['error']}"}
    read, write = job["read"], job["write"]
    bytes_moved = read["io_bytes"] + write["io_bytes"]
    ios = read["total_ios"] + write["total_ios"]
    runtime_s = max(read["runtime"], write["runtime"]) / 1000
    if not runtime_s or not ios:
        return {"error": "no I/O"}
    cpu = read_key_values_line(target_dir / f"{stem}.cpu")
    flush_s = float(cpu.get("flush_s") or 0)
    durable_s = runtime_s + flush_s
    row = {"mib_s": bytes_moved / durable_s / bl.MIB, "iops": ios / durable_s, "bytes": bytes_moved,
           "ios": ios, "runtime_s": runtime_s, "flush_s": flush_s,
           "mib_s_answered": bytes_moved / runtime_s / bl.MIB, "iops_answered": ios / runtime_s}
    side = write if write["total_ios"] else read
    row["lat_mean_us"] = side["clat_ns"]["mean"] / 1000
    if cpu.get("busy_ticks") and cpu.get("ticks_per_s"):
        busy_s = int(cpu["busy_ticks"]) / int(cpu["ticks_per_s"])
        row["guest_busy_s"] = busy_s
        row["guest_cpu_s_per_gb"] = busy_s / (bytes_moved / 1e9)
        row["guest_cpu_us_per_io"] = busy_s / ios * 1e6
    return row


class Suite:
    """What one VM suite is: its name and results prefix, how it boots, how it summarizes and renders. `run_suite`
    does what all of them do around that: copy the paraid binary into the results directory (the guest sees the
    repository, not the target directory), boot under a teardown, write run.json and summary.json, log the
    results, rewrite the doc section; or, with --render, only the last two."""

    def __init__(self, *, command: str, results_prefix: str, boot, build_summary, render, doc_heading,
                 log_results, needs_paraid, succeeded, outcome_key: str = "guest_status",
                 binary_name: str = "paraid"):
        self.command = command  # bench/vm/<suite>
        self.results_prefix = results_prefix  # the results directory is bench/results/<prefix>-<time>
        self.boot = boot  # (args, out_dir, paraid_copy, teardown) -> outcome (a guest's exit status, or several)
        self.build_summary = build_summary  # (out_dir) -> summary
        self.render = render  # (summary, out_dir) -> the doc section's text
        self.doc_heading = doc_heading  # (summary) -> the doc section's heading
        self.log_results = log_results  # (summary) -> None: the figures to the terminal
        self.needs_paraid = needs_paraid  # (args) -> whether any target runs paraid
        self.succeeded = succeeded  # (args, outcome) -> whether every boot exited 0
        self.outcome_key = outcome_key  # run.json's name for the outcome
        self.binary_name = binary_name  # the binary's name in the results directory


def run_suite(suite: Suite, args, argv: list[str]) -> int:
    if args.render:
        out_dir = Path(args.render).resolve()
        summary = suite.build_summary(out_dir)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        bl.replace_section(suite.doc_heading(summary), suite.render(summary, out_dir))
        return 0
    command = suite.command + ("" if not argv else " " + " ".join(shlex.quote(a) for a in argv))
    paraid = bl.find_paraid(args.paraid)
    if paraid is None and suite.needs_paraid(args):
        print("no paraid binary: cargo build --release -p paraid, or --paraid PATH", file=sys.stderr)
        return 1
    bl.raise_keyboard_interrupt_on_sigterm()
    started = time.strftime("%Y-%m-%d %H:%M")
    start_s = time.monotonic()
    out_dir = bl.RESULTS_DIR / f"{suite.results_prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True)
    facts = bl.machine_facts()
    run_info = {"command": command, "argv": argv, "started": started}
    if hasattr(args, "targets"):
        run_info["targets"] = args.targets
    run_info.update({"paraid_label": bl.paraid_label(paraid),
                     "args": {k: v for k, v in vars(args).items() if k not in ("render",)}})
    teardown = bl.Teardown()
    outcome = None
    interrupted = False
    try:
        ensure_built(Path(args.vmlab))
        paraid_copy = out_dir / suite.binary_name
        if paraid is not None:
            shutil.copy2(paraid, paraid_copy)
        outcome = suite.boot(args, out_dir, paraid_copy, teardown)
    except KeyboardInterrupt:
        interrupted = True
        bl.log("interrupted: stopping the guest")
    except bl.SetupFailed as error:
        bl.log(f"failed: {error}")
    finally:
        teardown.unwind()
    facts["loadavg_at_end"] = os.getloadavg()[0]
    run_info.update({"host": facts, "elapsed_s": time.monotonic() - start_s, suite.outcome_key: outcome})
    (out_dir / "run.json").write_text(json.dumps(run_info, indent=2))
    summary = suite.build_summary(out_dir)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    bl.log(f"raw results: {out_dir}/summary.json")
    suite.log_results(summary)
    if interrupted:
        return 130
    if not args.no_doc:
        heading = suite.doc_heading(summary)
        bl.replace_section(heading, suite.render(summary, out_dir))
        bl.log(f"wrote the '{heading}' section of {bl.DOC_PATH}")
    return 0 if suite.succeeded(args, outcome) else 1
