"""Shared helpers for paraid's benchmark suites (bench/fio/run, bench/oltp/run).

What lives here: a teardown stack that also runs on Ctrl-C/SIGTERM, background servers whose
CPU time we can read, CPU accounting that separates our work from other users of the machine,
loop devices and mounts that are found and removed even after a crash, facts about the machine,
and rewriting one "## " section of docs/benchmarks.md without touching the others.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC_PATH = REPO_ROOT / "docs" / "benchmarks.md"
IMG_DIR = REPO_ROOT / "docs" / "img"
RESULTS_DIR = REPO_ROOT / "bench" / "results"

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
GIB = 1 << 30
MIB = 1 << 20


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class SetupFailed(Exception):
    """A target could not be set up; the suite records the reason and goes on with the next target."""


# ---------------------------------------------------------------------------------------------
# Teardown


class Teardown:
    """A stack of undo steps. Every resource is pushed right after it exists, so that an error or
    a signal at any point removes exactly what was made, newest first."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, callable]] = []

    def push(self, label: str, undo) -> None:
        self._steps.append((label, undo))

    def mark(self) -> int:
        return len(self._steps)

    def unwind(self, to_mark: int = 0) -> None:
        # A second Ctrl-C during teardown would leave mounts and loop devices behind: every
        # undo step has its own timeout instead.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            while len(self._steps) > to_mark:
                label, undo = self._steps.pop()
                try:
                    undo()
                except Exception as error:  # keep unwinding: one stuck step must not strand the rest
                    log(f"teardown: {label}: {error}")
        finally:
            signal.signal(signal.SIGINT, previous)


def raise_keyboard_interrupt_on_sigterm() -> None:
    """SIGTERM and SIGHUP take the same path as Ctrl-C, so `finally:` blocks tear everything down."""

    def handler(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # If this script is SIGKILLed, its servers get SIGTERM from the kernel instead of lingering.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def run(argv: list[str], check: bool = True, timeout_s: float | None = 600, quiet: bool = False,
        env: dict | None = None) -> subprocess.CompletedProcess:
    if not quiet:
        log("$ " + " ".join(argv))
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    except OSError as error:  # the tool is missing or not executable
        if check:
            raise SetupFailed(f"cannot run {argv[0]}: {error}") from error
        return subprocess.CompletedProcess(argv, 127, "", str(error))
    except subprocess.TimeoutExpired as error:
        raise SetupFailed(f"{argv[0]} did not finish in {timeout_s:.0f} s") from error
    if check and result.returncode != 0:
        raise SetupFailed(f"{argv[0]} exited {result.returncode}: {(result.stderr or result.stdout).strip()[-600:]}")
    return result


def have_tool(name: str) -> bool:
    return shutil.which(name) is not None


# ---------------------------------------------------------------------------------------------
# Servers


def process_cpu_s(pid: int) -> float:
    """utime + stime of every thread of `pid` (and its reaped children), in seconds."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()
    # After the command name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLOCK_TICKS_PER_S


class Server:
    """A long-running process (NBD server, nbdfuse, mysqld) with its stderr in a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict | None = None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.process: subprocess.Popen | None = None
        self._last_cpu_s = 0.0

    def start(self, teardown: Teardown) -> "Server":
        log("$ " + " ".join(self.argv) + " &")
        log_file = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                        preexec_fn=_die_with_parent, env=self.env)
        log_file.close()
        teardown.push(f"stop {self.name}", self.stop)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def exited(self) -> bool:
        return self.process is None or self.process.poll() is not None

    def log_tail(self, chars: int = 800) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:].strip()
        except OSError:
            return ""

    def cpu_s(self) -> float:
        # Keep the last reading: after the process exits /proc no longer has it.
        if not self.exited():
            self._last_cpu_s = process_cpu_s(self.pid)
        return self._last_cpu_s

    def wait_for_unix_socket(self, path: Path, timeout_s: float = 30) -> None:
        self.wait_until(lambda: _unix_socket_accepts(path), f"socket {path}", timeout_s)

    def wait_until(self, ready, what: str, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.exited():
                raise SetupFailed(f"{self.name} exited with {self.process.returncode} before {what} was ready: "
                                  f"{self.log_tail()}")
            if ready():
                return
            time.sleep(0.1)
        raise SetupFailed(f"{self.name}: {what} not ready after {timeout_s:.0f} s: {self.log_tail()}")

    def stop(self, timeout_s: float = 20) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.cpu_s()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log(f"{self.name} ignored SIGTERM for {timeout_s:.0f} s: killing it")
            self.process.kill()
            self.process.wait(timeout=10)


def _unix_socket_accepts(path: Path) -> bool:
    if not path.exists():
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


# ---------------------------------------------------------------------------------------------
# CPU accounting


@dataclass
class CpuSample:
    """CPU seconds consumed so far, by the whole machine and by the parts a benchmark owns."""

    system_busy_s: float
    kernel_threads_ticks: dict[tuple[int, int], int]
    children_s: float
    servers_s: float
    wall_s: float = field(default_factory=time.monotonic)

    @staticmethod
    def take(servers: list[Server]) -> "CpuSample":
        return CpuSample(
            system_busy_s=_system_busy_s(),
            kernel_threads_ticks=_kernel_threads_ticks(),
            children_s=_children_s(),
            servers_s=sum(server.cpu_s() for server in servers),
        )


@dataclass
class CpuUsage:
    """CPU used during one measured interval.

    `attributed_s` = client (fio, sysbench: the children we waited for) + our servers + all kernel
    threads (loop workers, btrfs and block-layer kworkers). It excludes other users of a shared
    machine; `system_s` (from /proc/stat) includes them and is an upper bound."""

    wall_s: float
    system_s: float
    client_s: float
    servers_s: float
    kernel_threads_s: float

    @property
    def attributed_s(self) -> float:
        return self.client_s + self.servers_s + self.kernel_threads_s

    @staticmethod
    def between(before: CpuSample, after: CpuSample) -> "CpuUsage":
        return CpuUsage(
            wall_s=after.wall_s - before.wall_s,
            system_s=after.system_busy_s - before.system_busy_s,
            client_s=after.children_s - before.children_s,
            servers_s=after.servers_s - before.servers_s,
            kernel_threads_s=_kernel_threads_delta_s(before.kernel_threads_ticks, after.kernel_threads_ticks),
        )

    def as_dict(self) -> dict:
        return {"wall_s": self.wall_s, "system_s": self.system_s, "client_s": self.client_s,
                "servers_s": self.servers_s, "kernel_threads_s": self.kernel_threads_s,
                "attributed_s": self.attributed_s}


def _system_busy_s() -> float:
    with open("/proc/stat") as stat:
        first = stat.readline().split()
    # user nice system idle iowait irq softirq steal (guest time is already inside user).
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS_PER_S


def _kernel_threads_ticks() -> dict[tuple[int, int], int]:
    """utime + stime of every kernel thread, keyed by (pid, start time) so a reused pid is a new thread."""
    ticks = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # exited while we looked
        fields = text[text.rindex(")") + 2:].split()
        if entry.name == "2" or fields[1] == "2":  # kthreadd and its children
            # After the name: utime(11) stime(12) ... starttime(19).
            ticks[(int(entry.name), int(fields[19]))] = int(fields[11]) + int(fields[12])
    return ticks


def _kernel_threads_delta_s(before: dict[tuple[int, int], int], after: dict[tuple[int, int], int]) -> float:
    # Per thread: kworkers come and go, and a total would drop by the whole lifetime of one that
    # exited. The time of threads that exited during the interval is lost (an underestimate).
    return sum(ticks - before.get(key, 0) for key, ticks in after.items()) / CLOCK_TICKS_PER_S


def _children_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------
# Loop devices and mounts


def attach_loop(path: Path, teardown: Teardown) -> str:
    """A loop device over `path`, with direct I/O when the backing file allows it (so the page
    cache does not hold a second copy of every block)."""
    result = run(["losetup", "--find", "--show", "--direct-io=on", str(path)], check=False)
    if result.returncode != 0:
        result = run(["losetup", "--find", "--show", str(path)])
    device = result.stdout.strip()
    teardown.push(f"detach {device}", lambda: run(["losetup", "-d", device], timeout_s=60))
    return device


BLKIO_V1_ROOT = Path("/sys/fs/cgroup/blkio")


def device_number(device: str | Path) -> str:
    """`major:minor` of a block device node, as the blkio throttle files name devices."""
    rdev = os.stat(device).st_rdev
    return f"{os.major(rdev)}:{os.minor(rdev)}"


def throttle_line(device_number_text: str, bytes_per_s: int) -> str:
    """One line for blkio.throttle.{read,write}_bps_device (0 removes the limit)."""
    if bytes_per_s < 0:
        raise ValueError(f"a bandwidth cannot be negative: {bytes_per_s}")
    return f"{device_number_text} {int(bytes_per_s)}"


def in_cgroup_argv(argv: list[str], cgroup_dir: Path) -> list[str]:
    """`argv` started inside the cgroup v1 directory `cgroup_dir`: a shell moves itself there, then
    execs the command (same pid, so its CPU time is still read from /proc/PID)."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup_dir), *argv]


class BlkioThrottle:
    """A cgroup v1 blkio group whose members' bandwidth is capped per device: each throttled
    device then behaves like an independent device of that bandwidth (as long as the CPU can move
    the sum), which a set of files on tmpfs does not (they all share the same cores). Only I/O that
    bypasses the page cache (O_DIRECT, as paraid and the benchmark's fio do) is throttled by v1."""

    def __init__(self, name: str, teardown: Teardown):
        if not (BLKIO_V1_ROOT / "blkio.throttle.write_bps_device").exists():
            raise SetupFailed(f"no cgroup v1 blkio throttle at {BLKIO_V1_ROOT}")
        self.dir = BLKIO_V1_ROOT / name
        self.dir.mkdir(exist_ok=True)
        self.limited: list[str] = []
        teardown.push(f"remove cgroup {self.dir}", self.remove)

    def limit(self, device: str | Path, bytes_per_s: int) -> None:
        number = device_number(device)
        for kind in ("read", "write"):
            (self.dir / f"blkio.throttle.{kind}_bps_device").write_text(throttle_line(number, bytes_per_s) + "\n")
        self.limited.append(number)

    def wrap(self, argv: list[str]) -> list[str]:
        return in_cgroup_argv(argv, self.dir)

    def remove(self) -> None:
        for number in self.limited:
            for kind in ("read", "write"):
                try:
                    (self.dir / f"blkio.throttle.{kind}_bps_device").write_text(throttle_line(number, 0) + "\n")
                except OSError:
                    pass  # the device is gone already
        for _ in range(50):  # processes leave the group as they exit; rmdir fails until then
            try:
                self.dir.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        log(f"cannot remove cgroup {self.dir} (a process is still in it)")


# Below this, devices written all at once did not reach their count times one alone: they share a bottleneck (the
# CPU, QEMU's I/O thread, blk-throttle handing out less than its cap), and a ratio to one device alone (a
# rebuild's rate, say) says nothing about the devices.
INDEPENDENCE_MIN = 0.85


def independence_ratio(aggregate_bytes_s: float, single_bytes_s: float, count: int) -> float:
    """How close `count` devices written at once come to `count` times one device alone: 1.0 means
    they behave as independent devices; well below 1 means they share a bottleneck (the CPU)."""
    if single_bytes_s <= 0 or count <= 0:
        raise ValueError("need a positive single-device bandwidth and device count")
    return aggregate_bytes_s / (single_bytes_s * count)


def mount(device: str, mountpoint: Path, teardown: Teardown, fs_type: str | None = None,
          options: str | None = None) -> None:
    mountpoint.mkdir(parents=True, exist_ok=True)
    argv = ["mount"] + (["-t", fs_type] if fs_type else []) + (["-o", options] if options else [])
    run(argv + [device, str(mountpoint)])
    teardown.push(f"unmount {mountpoint}", lambda: _unmount(mountpoint))


def _unmount(mountpoint: Path) -> None:
    result = run(["umount", str(mountpoint)], check=False, timeout_s=120)
    if result.returncode != 0:
        # Busy (a straggler still has a file open): detach now, the kernel finishes later.
        run(["umount", "-l", str(mountpoint)], timeout_s=60)


def remove_leftovers(work_dir: Path) -> None:
    """Remove what a killed earlier run left under `work_dir`: FUSE and other mounts (deepest
    first), loop devices backed by its files, then the directory itself."""
    prefix = str(work_dir.resolve()) + "/"
    mounts = []  # (is FUSE, mountpoint)
    with open("/proc/self/mounts") as table:
        for line in table:
            fields = line.split()
            target = fields[1].replace("\\040", " ")
            if target.startswith(prefix):
                mounts.append((fields[2].startswith("fuse"), target))
    # Filesystems first, then the loop devices under them, then the FUSE exports those loop
    # devices read from: the reverse of how they were stacked.
    for _fuse, target in sorted((m for m in mounts if not m[0]), key=lambda m: len(m[1]), reverse=True):
        _unmount_leftover(target)
    listing = run(["losetup", "--list", "--json"], check=False, quiet=True)
    if listing.returncode == 0 and listing.stdout.strip():
        for device in json.loads(listing.stdout).get("loopdevices", []):
            if (device.get("back-file") or "").startswith(prefix):
                log(f"leftover loop device {device['name']} on {device['back-file']}: detaching")
                run(["losetup", "-d", device["name"]], check=False, quiet=True)
    for _fuse, target in (m for m in mounts if m[0]):
        _unmount_leftover(target)
    if work_dir.exists():
        shutil.rmtree(work_dir, ignore_errors=True)


def _unmount_leftover(target: str) -> None:
    log(f"leftover mount {target}: unmounting")
    if run(["umount", target], check=False, quiet=True).returncode != 0:
        run(["umount", "-l", target], check=False, quiet=True)


def fs_type(path: Path) -> str:
    """The type of the filesystem holding `path` (longest mount-point prefix in /proc/self/mounts)."""
    resolved = str(Path(path).resolve())
    best, best_type = "", "unknown"
    with open("/proc/self/mounts") as table:
        for line in table:
            fields = line.split()
            target = fields[1].replace("\\040", " ")
            inside = resolved == target or resolved.startswith(target.rstrip("/") + "/")
            if inside and len(target) >= len(best):
                best, best_type = target, fields[2]
    return best_type


def make_sparse_files(directory: Path, count: int, size_bytes: int, stem: str = "m") -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = directory / f"{stem}{index}.img"
        with open(path, "wb") as member:
            member.truncate(size_bytes)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------
# paraid


def find_paraid(explicit: str | None) -> Path | None:
    candidates = []
    if explicit:
        candidates.append(Path(explicit))
    if os.environ.get("PARAID"):
        candidates.append(Path(os.environ["PARAID"]))
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "release" / "paraid")
    candidates += [REPO_ROOT / "target-bench" / "release" / "paraid", REPO_ROOT / "target" / "release" / "paraid"]
    on_path = shutil.which("paraid")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.resolve()
    return None


def paraid_commands(paraid: Path) -> set[str]:
    """The subcommands that `paraid --help` lists (so new ones, such as rebuild, are detected)."""
    result = run([str(paraid), "--help"], check=False, quiet=True)
    commands = set()
    in_commands = False
    for line in result.stdout.splitlines():
        if line.strip().lower().startswith("commands:"):
            in_commands = True
            continue
        if in_commands:
            if not line.startswith("  "):
                if line.strip():
                    in_commands = False
                continue
            commands.add(line.split()[0])
    return commands


def paraid_label(paraid: Path | None) -> str:
    """Which paraid was measured: path, version, build time, and $PARAID_COMMIT when the caller knows it."""
    if paraid is None:
        return "not found"
    built = time.strftime("%Y-%m-%d %H:%M", time.localtime(paraid.stat().st_mtime))
    label = f"`{paraid}` ({tool_version([str(paraid), '--version'])}, built {built}"
    if os.environ.get("PARAID_COMMIT"):
        label += f", commit {os.environ['PARAID_COMMIT']}"
    return label + ")"


def nbd_unix_uri(socket_path: Path) -> str:
    return f"nbd+unix:///?socket={socket_path}"


# ---------------------------------------------------------------------------------------------
# The machine


def machine_facts() -> dict:
    facts = {"kernel": os.uname().release, "cores": os.cpu_count()}
    lscpu = run(["lscpu"], check=False, quiet=True).stdout
    for line in lscpu.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            facts["cpu_model"] = value.strip()
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                facts["memory_gib"] = round(int(line.split()[1]) / (1 << 20), 1)
    facts["loadavg_at_start"] = os.getloadavg()[0]
    return facts


def machine_line(facts: dict) -> str:
    return (f"{facts.get('cpu_model', 'unknown CPU')}, {facts['cores']} cores, {facts.get('memory_gib', '?')} GiB, "
            f"Linux {facts['kernel']}; load average {facts['loadavg_at_start']:.2f} at start"
            + (f", {facts['loadavg_at_end']:.2f} at end" if "loadavg_at_end" in facts else "") + " "
            "(the machine is shared with other engineers' builds: CPU figures below are attributed, see the notes)")


def tool_version(argv: list[str]) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    text = (result.stdout or result.stderr).strip().splitlines()
    return text[0].strip() if text else "?"


# ---------------------------------------------------------------------------------------------
# docs/benchmarks.md


def _split_top_sections(text: str) -> list[tuple[str | None, str]]:
    """[(heading line or None for the preamble, body)] for every '## ' section."""
    sections: list[tuple[str | None, str]] = []
    heading, body = None, []
    in_fence = False
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith("## "):
            sections.append((heading, "".join(body)))
            heading, body = line.rstrip("\n"), []
        else:
            body.append(line)
    sections.append((heading, "".join(body)))
    return sections


def _join_sections(sections: list[tuple[str | None, str]]) -> str:
    out = []
    for heading, body in sections:
        if heading is not None:
            out.append(heading + "\n")
        out.append(body)
    return "".join(out)


def section_body(heading: str, doc_path: Path = DOC_PATH) -> str | None:
    if not doc_path.exists():
        return None
    for found, body in _split_top_sections(doc_path.read_text()):
        if found == heading:
            return body
    return None


def replace_section(heading: str, body: str, doc_path: Path = DOC_PATH) -> None:
    """Rewrite one '## ' section, leaving every other section (other people's) as it is.

    The file is read just before it is written, and replaced atomically, so a concurrent edit of
    another section is lost only if it lands in the few milliseconds between the two."""
    body = body.rstrip("\n") + "\n\n"
    if doc_path.exists():
        text = doc_path.read_text()
    else:
        text = "# Benchmarks\n\n"
    sections = _split_top_sections(text)
    for index, (found, _old) in enumerate(sections):
        if found == heading:
            sections[index] = (heading, "\n" + body)
            break
    else:
        last_heading, last_body = sections[-1]
        sections[-1] = (last_heading, last_body.rstrip("\n") + "\n\n")
        sections.append((heading, "\n" + body))
    doc_path.parent.mkdir(parents=True, exist_ok=True)
    temporary = doc_path.with_suffix(".md.tmp-bench")
    temporary.write_text(_join_sections(sections).rstrip("\n") + "\n")
    os.replace(temporary, doc_path)


def replace_subsection(heading: str, subheading: str, sub_body: str, intro: str,
                       order: list[str], doc_path: Path = DOC_PATH) -> None:
    """Rewrite one '### ' part of a '## ' section and keep its other parts (e.g. a tmpfs run keeps
    the last disk run). `order` lists the known '### ' headings in the order they appear."""
    old = section_body(heading, doc_path) or ""
    parts: dict[str, str] = {}
    current, lines = None, []
    for line in old.splitlines(keepends=True):
        if line.startswith("### "):
            if current is not None:
                parts[current] = "".join(lines)
            current, lines = line.rstrip("\n"), []
        elif current is not None:
            lines.append(line)
    if current is not None:
        parts[current] = "".join(lines)
    parts[subheading] = "\n" + sub_body.rstrip("\n") + "\n\n"
    known = [h for h in order if h in parts] + [h for h in parts if h not in order]
    body = intro.rstrip("\n") + "\n\n" + "".join(h + "\n\n" + parts[h].strip("\n") + "\n\n" for h in known)
    replace_section(heading, body, doc_path)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "–"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


# ---------------------------------------------------------------------------------------------
# Plots


def pyplot():
    """matplotlib's pyplot (Agg), installed with pip on first use; None if that fails."""
    try:
        import matplotlib
    except ImportError:
        log("matplotlib missing: installing it with pip")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"], check=False)
        try:
            import matplotlib
        except ImportError:
            log("matplotlib unavailable: no plots this run")
            return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def grouped_bars(path: Path, title: str, ylabel: str, groups: list[str], series: dict[str, list[float | None]],
                 log_scale: bool = False) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    figure, axes = plt.subplots(figsize=(max(6.0, 1.3 * len(groups) + 2.5), 4.2))
    width = 0.8 / max(1, len(series))
    for index, (name, values) in enumerate(series.items()):
        xs = [g + (index - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [v if v is not None else 0 for v in values]
        bars = axes.bar(xs, heights, width, label=name)
        axes.bar_label(bars, labels=[_short_number(v) for v in values], fontsize=6, rotation=90, padding=2)
    axes.set_xticks(range(len(groups)))
    axes.set_xticklabels(groups, rotation=15, ha="right", fontsize=8)
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=10)
    if log_scale:
        # Bars on a log axis start at the bottom edge: put it a decade under the smallest value.
        axes.set_yscale("log")
        positive = [v for values in series.values() for v in values if v and v > 0]
        if positive:
            axes.set_ylim(bottom=10 ** math.floor(math.log10(min(positive)) - 1), top=max(positive) * 8)
    else:
        axes.margins(y=0.15)
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=7, ncols=2)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def _short_number(value: float | None) -> str:
    if value is None:
        return ""
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def ratio_text(ratio: float, met: bool, goal: float | None, relation: str) -> str:
    """Three decimals, or four where three would round across the goal (0.8997 is not 0.900 >= 0.9)."""
    text = f"{ratio:.3f}"
    if goal is not None:
        shown = float(text)
        if (shown >= goal if relation == ">=" else shown <= goal) != met:
            text = f"{ratio:.4f}"
    return text


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def relative_to_doc(path: Path) -> str:
    return os.path.relpath(path, DOC_PATH.parent)
