"""Unit tests of the benchmark suites' pure parts: doc sections, fio and sysbench parsing, ratios.

    python3 -m unittest discover -s bench/lib -p 'test_*.py'

No root, no fio, no servers: what needs those is exercised by running the suites (`--quick`).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
import tempfile
import unittest
import unittest.mock
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402
import vmlab  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parents[1]


def load_script(name: str, path: Path):
    """The suites are extension-less executables: load one as a module."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


fio_suite = load_script("bench_fio_run", BENCH_DIR / "fio" / "run")
oltp_suite = load_script("bench_oltp_run", BENCH_DIR / "oltp" / "run")
writehole_suite = load_script("bench_vm_writehole", BENCH_DIR / "vm" / "writehole")
rebuild_suite = load_script("bench_vm_rebuild", BENCH_DIR / "vm" / "rebuild")


class DocSections(unittest.TestCase):
    def setUp(self):
        self.directory = tempfile.TemporaryDirectory()
        self.doc = Path(self.directory.name) / "benchmarks.md"

    def tearDown(self):
        self.directory.cleanup()

    def test_creates_the_file_with_its_heading(self):
        bl.replace_section("## fio", "numbers", self.doc)
        text = self.doc.read_text()
        self.assertTrue(text.startswith("# Benchmarks\n"))
        self.assertIn("## fio\n\nnumbers\n", text)

    def test_other_sections_are_kept_byte_for_byte(self):
        others = "# Benchmarks\n\nintro\n\n## Parity\n\nparity table\n```\n## not a heading in a fence\n```\n\n"
        self.doc.write_text(others + "## fio\n\nold\n\n## Later\n\nlater text\n")
        bl.replace_section("## fio", "new", self.doc)
        text = self.doc.read_text()
        self.assertTrue(text.startswith(others))
        self.assertIn("## fio\n\nnew\n\n## Later\n\nlater text\n", text)
        self.assertNotIn("old", text)

    def test_subsections_keep_their_order_and_the_others(self):
        order = ["### A", "### B", "### C"]
        bl.replace_subsection("## fio", "### C", "c1", "intro", order, self.doc)
        bl.replace_subsection("## fio", "### A", "a1", "intro", order, self.doc)
        bl.replace_subsection("## fio", "### C", "c2", "intro2", order, self.doc)
        body = bl.section_body("## fio", self.doc)
        self.assertLess(body.index("### A"), body.index("### C"))
        self.assertIn("a1", body)
        self.assertIn("c2", body)
        self.assertNotIn("c1", body)
        self.assertTrue(body.strip().startswith("intro2"))


def fio_side(io_bytes: int, ios: int, runtime_ms: int, mean_ns: float, p99_ns: float | None) -> dict:
    percentiles = {"99.000000": p99_ns} if p99_ns is not None else {}
    return {"io_bytes": io_bytes, "total_ios": ios, "runtime": runtime_ms,
            "clat_ns": {"mean": mean_ns, "percentile": percentiles}}


class FioSummary(unittest.TestCase):
    def test_mixed_job_weights_latency_by_ios_and_takes_the_worse_p99(self):
        report = {"read": fio_side(7000 * 4096, 7000, 10_000, 100_000, 400_000),
                  "write": fio_side(3000 * 4096, 3000, 10_000, 200_000, 900_000)}
        cpu = bl.CpuUsage(wall_s=10, system_s=15, client_s=2, servers_s=3, kernel_threads_s=1)
        row = fio_suite.summarize(fio_suite.JOB_BY_NAME["rand 70/30 4K QD32"], report, cpu, servers_present=True)
        self.assertAlmostEqual(row["iops"], 1000)
        self.assertAlmostEqual(row["lat_mean_us"], 130)
        self.assertAlmostEqual(row["lat_p99_us"], 900)
        gb = 10_000 * 4096 / 1e9
        self.assertAlmostEqual(row["cpu_s_per_gb"], 6 / gb)
        self.assertAlmostEqual(row["system_cpu_s_per_gb"], 15 / gb)
        self.assertAlmostEqual(row["cpu_us_per_io"], 600)
        self.assertAlmostEqual(row["server_cpu_percent"], 30)

    def test_json_after_engine_warnings_is_found(self):
        self.assertEqual(fio_suite._json_part('fio: warning\n{"a": 1}'), '{"a": 1}')


class FioRatios(unittest.TestCase):
    @staticmethod
    def result(mib_s: float, iops: float, cpu: float) -> dict:
        return {"rows": [{"job": job.name, "mib_s": mib_s, "iops": iops, "cpu_s_per_gb": cpu}
                         for job in fio_suite.JOBS]}

    def test_statuses_follow_the_targets(self):
        results = {"paraid-raid6": self.result(950, 95_000, 1.0), "nbdkit-raw": self.result(1000, 100_000, 0.5),
                   "btrfs-raid6": self.result(100, 30_000, 4.0)}
        rows = {row[0]: row for row in fio_suite.ratio_rows(results)}
        self.assertEqual(rows["RAID6 seq write 1M / nbdkit raw"][1:4], ["0.950", ">= 0.9", "met"])
        self.assertEqual(rows["RAID6 rand write 4K QD32 / btrfs raid6"][1:4], ["3.167", ">= 5", "**not met**"])
        self.assertEqual(rows["RAID6 seq write 1M QD32 / btrfs raid6"][3:], ["met", "10.00"])
        self.assertEqual(rows["RAID6 CPU-s per GB written (seq write 1M) / btrfs raid6"][1:4], ["0.250", "<= 0.5", "met"])
        self.assertTrue(rows["RAID5 seq write 1M / nbdkit raw"][3].startswith("not measured"))
        self.assertTrue(rows["RAID6 rand read 4K QD32 / qemu-nbd raw"][3].startswith("not measured"))

    def test_the_o_direct_peer_is_a_ratio_of_its_own(self):
        results = {"paraid-raid6": self.result(950, 60_000, 1.0), "nbdkit-raw": self.result(1000, 170_000, 0.5),
                   "qemu-nbd-raw": self.result(900, 59_000, 0.5)}
        rows = {row[0]: row for row in fio_suite.ratio_rows(results)}
        self.assertEqual(rows["RAID6 rand read 4K QD32 / nbdkit raw"][3], "**not met**")
        self.assertEqual(rows["RAID6 rand read 4K QD32 / qemu-nbd raw"][1:4], ["1.017", ">= 0.9", "met"])
        self.assertEqual(rows["RAID6 seq write 1M / qemu-nbd raw"][1:4], ["1.056", ">= 0.9", "met"])
        self.assertFalse(any("md raid6" in label for label in rows), "md rows appear only where md was measured")


SYSBENCH_OUTPUT = """
Latency histogram (values are in milliseconds)
       value  ------------- distribution ------------- count
       1.000 |**********                               10
       2.000 |****************************************  80
       5.000 |****                                      5
       9.000 |****                                      4
      20.000 |*                                         1

SQL statistics:
    transactions:                        100  (10.00 per sec.)
    queries:                             600 (60.00 per sec.)
    ignored errors:                      0      (0.00 per sec.)
Latency (ms):
         min:                                    0.50
         avg:                                    2.50
         max:                                   20.00
         99th percentile:                        9.00
"""


class SysbenchParsing(unittest.TestCase):
    def test_tps_latency_and_histogram_percentiles(self):
        result = oltp_suite.parse_sysbench(SYSBENCH_OUTPUT)
        self.assertEqual(result["tps"], 10.0)
        self.assertEqual(result["transactions"], 100)
        self.assertEqual(result["lat_avg_ms"], 2.5)
        self.assertEqual(result["lat_p99_ms"], 9.0)
        self.assertEqual(result["lat_p95_ms"], 5.0)  # 95 of 100 events are at or under 5 ms
        self.assertEqual(result["lat_p99_hist_ms"], 9.0)

    def test_output_without_transactions_is_an_error(self):
        with self.assertRaises(bl.SetupFailed):
            oltp_suite.parse_sysbench("FATAL: connection creation failed")


def oltp_round(target: str, tps: float, p99: float) -> dict:
    return {"target": target, "title": target, "rows": [
        {"workload": "oltp_write_only", "tps": tps, "lat_avg_ms": 1.0, "lat_p95_ms": 2.0, "lat_p99_ms": p99,
         "cpu_ms_per_txn": 0.5, "array_io": {"tag": tps}}]}


class OltpRounds(unittest.TestCase):
    def test_rows_hold_medians_and_the_median_round_details(self):
        merged = oltp_suite.merge_rounds([oltp_round("r6", 100, 9.0), oltp_round("r6", 300, 7.0),
                                          oltp_round("r6", 200, 8.0)])
        row = merged["rows"][0]
        self.assertEqual((row["tps"], row["lat_p99_ms"]), (200, 8.0))
        self.assertEqual(row["array_io"], {"tag": 200})  # from the round of median TPS
        self.assertEqual(len(merged["rounds"]), 3)
        self.assertEqual(oltp_suite.lookup_rounds({"r6": merged}, "r6", "oltp_write_only", "tps"), [100, 300, 200])

    def test_one_round_is_left_as_measured_and_failed_rounds_are_left_out(self):
        one = oltp_round("r6", 100, 9.0)
        self.assertIs(oltp_suite.merge_rounds([one]), one)
        merged = oltp_suite.merge_rounds([{"target": "r6", "title": "r6", "failed": "x"}, oltp_round("r6", 100, 9.0),
                                          oltp_round("r6", 300, 7.0)])
        self.assertEqual(merged["rows"][0]["tps"], 200)
        self.assertEqual(merged["rows"][0]["rounds_measured"], 2)

    def test_a_ratio_is_the_median_of_the_ratios_within_rounds(self):
        # Round ratios 0.50, 1.20, 0.67: the median is 0.67, where the ratio of the medians would be 200 / 250.
        results = {"paraid-raid6": oltp_suite.merge_rounds([oltp_round("paraid-raid6", 100, 4.0),
                                                            oltp_round("paraid-raid6", 300, 4.0),
                                                            oltp_round("paraid-raid6", 200, 4.0)]),
                   "passthrough": oltp_suite.merge_rounds([oltp_round("passthrough", 200, 4.0),
                                                           oltp_round("passthrough", 250, 4.0),
                                                           oltp_round("passthrough", 300, 4.0)])}
        rows = oltp_suite.ratio_rows(results, ["oltp_write_only"])
        tps = next(r for r in rows if r[0] == "RAID6 TPS / passthrough, oltp_write_only")
        self.assertTrue(tps[1].startswith("0.667 "), tps)
        self.assertIn("(rounds: 0.50, 1.20, 0.67)", tps[1])
        self.assertEqual(tps[3], "**not met**")


    def test_other_policies_get_rows_only_where_measured(self):
        results = {"paraid-raid6": oltp_round("paraid-raid6", 90, 6.0), "passthrough": oltp_round("passthrough", 100, 5.0)}
        labels = [r[0] for r in oltp_suite.ratio_rows(results, ["oltp_write_only"])]
        self.assertFalse([label for label in labels if "journal" in label], labels)
        results["paraid-raid6-journal"] = oltp_round("paraid-raid6-journal", 95, 5.5)
        rows = oltp_suite.ratio_rows(results, ["oltp_write_only"])
        p99 = next(r for r in rows if r[0] == "RAID6 journal p99 / passthrough p99, oltp_write_only")
        self.assertTrue(p99[1].startswith("1.10"), p99)
        self.assertEqual(p99[3], "–")

    def test_a_counter_delta_is_what_each_counter_counted_between_the_snapshots(self):
        before = {"waits": 3, "wait_us": 1_000, "long_waits": 0}
        after = {"waits": 10, "wait_us": 4_500, "long_waits": 2}
        self.assertEqual(oltp_suite.counter_delta(before, after), {"waits": 7, "wait_us": 3_500, "long_waits": 2})

    def test_mariadb_options_are_kept_in_order_and_default_to_none(self):
        self.assertEqual(oltp_suite.parse_args([]).mariadb_option, [])
        args = oltp_suite.parse_args(["--mariadb-option=--innodb-flush-neighbors=0",
                                      "--mariadb-option=--innodb-io-capacity=2000"])
        self.assertEqual(args.mariadb_option, ["--innodb-flush-neighbors=0", "--innodb-io-capacity=2000"])

    def test_every_target_has_a_title_and_a_way_to_set_it_up(self):
        for target in oltp_suite.TARGET_ORDER:
            self.assertIn(target, oltp_suite.TARGET_TITLES)
            self.assertIn(target, oltp_suite.STORAGE)


def writehole_row(iops: float) -> dict:
    return {"iops": iops, "mib_s": iops * 4096 / bl.MIB}


class WriteholeCosts(unittest.TestCase):
    def test_a_cost_is_taken_within_each_round_and_the_median_reported(self):
        # Round costs -50 %, -20 %, -20 %: median -20 %, where the ratio of the medians would say 120 / 200 - 1.
        rounds = {}
        for number, (log_on, log_off) in enumerate([(100, 200), (160, 200), (120, 150)], start=1):
            rounds[str(number)] = {"paraid-raid5-ppl": {"rows": {"rand-write-4K-QD32": writehole_row(log_on)}},
                                   "paraid-raid5-bitmap": {"rows": {"rand-write-4K-QD32": writehole_row(log_off)}}}
        costs = writehole_suite.costs(rounds)
        self.assertEqual(len(costs), 1)
        self.assertEqual([round(c, 3) for c in costs[0]["per_round"]], [-0.5, -0.2, -0.2])
        self.assertAlmostEqual(costs[0]["median"], -0.2)

    def test_a_round_missing_either_side_is_left_out(self):
        rounds = {"1": {"md-raid5-ppl": {"rows": {"rand-write-4K-QD1": writehole_row(30)}},
                        "md-raid5": {"missing": "no fio output"}},
                  "2": {"md-raid5-ppl": {"rows": {"rand-write-4K-QD1": writehole_row(30)}},
                        "md-raid5": {"rows": {"rand-write-4K-QD1": writehole_row(60)}}},
                  "3": {"md-raid5-ppl": {"rows": {"rand-write-4K-QD1": {"error": "fio error 5"}}},
                        "md-raid5": {"rows": {"rand-write-4K-QD1": writehole_row(60)}}}}
        costs = writehole_suite.costs(rounds)
        self.assertEqual([(c["what"], c["per_round"]) for c in costs], [("md: PPL against no bitmap", [-0.5])])


class QemuThrottlingWrapper(unittest.TestCase):
    def test_only_the_data_disks_get_the_throttle_and_every_other_argument_passes_unchanged(self):
        with tempfile.TemporaryDirectory() as directory:
            # A stand-in for QEMU that prints the arguments it was given, one per line.
            fake_qemu = Path(directory) / "fake-qemu"
            fake_qemu.write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
            fake_qemu.chmod(0o755)
            wrapper = Path(directory) / "qemu-system-x86_64"
            options = vmlab.throttle_options({"bps-total": 33554432, "iops-total": 500})
            for disks, throttled_at in [(None, [3, 7, 9]), ([1], [7]), ([0, 11], [3, 9])]:
                pattern = vmlab.throttled_drive_pattern(disks)
                wrapper.write_text(vmlab.THROTTLE_WRAPPER.format(options=options, qemu=str(fake_qemu),
                                                                 pattern=pattern))
                wrapper.chmod(0o755)
                argv = ["-drive", "if=none,id=root,file=/b/root.img,format=raw,snapshot=on",
                        "-drive", "if=none,id=d0,file=/d/disk0.img,format=raw,cache=none,discard=unmap",
                        "-device", "virtio-blk-pci,drive=d0,serial=data0,iothread=io0",
                        "-drive", "if=none,id=d1,file=/d/disk1.img,format=raw",
                        "-drive", "if=none,id=d11,file=/d/disk 11.img,format=raw",
                        "-append", "console=ttyS0 root=/dev/vda rw quiet"]
                out = subprocess.run([str(wrapper), *argv], capture_output=True, text=True, check=True).stdout
                expected = list(argv)
                for at in throttled_at:
                    expected[at] += ",throttling.bps-total=33554432,throttling.iops-total=500"
                self.assertEqual(out.splitlines(), expected, f"disks {disks}")
        with self.assertRaises(ValueError):
            vmlab.throttled_drive_pattern([])

    def test_a_setting_that_is_not_a_positive_number_is_refused(self):
        with self.assertRaises(ValueError):
            vmlab.throttle_options({"iops-total": 0})
        with self.assertRaises(ValueError):
            vmlab.throttle_options({"bps,file=/etc/passwd": 1})


def write_rebuild_results(directory: Path, paraid_outcomes: list[str], md_degraded_after: list[int],
                          single_mib_s: float = 32.0, parallel_mib_s: float = 190.0) -> None:
    """A vmrb-* results directory as the guest script leaves it: bars, md's and paraid's repeats of 32 s,
    33 s, ... with the guest 50 % busy (2 vCPUs, 100 ticks/s)."""
    def fio(path: Path, mib_s_per_job: list[float]):
        path.parent.mkdir(parents=True, exist_ok=True)
        jobs = [{"write": {"bw_bytes": int(v * bl.MIB)}} for v in mib_s_per_job]
        path.write_text("fio: a warning line\n" + json.dumps({"jobs": jobs}))
    fio(directory / "bar-before" / "write-1M.json", [single_mib_s * 0.9])
    fio(directory / "bar-before" / "write-4M.json", [single_mib_s])
    fio(directory / "bar-after" / "write-1M.json", [single_mib_s * 0.95])
    fio(directory / "parallel" / "write-1M.json", [parallel_mib_s / 6] * 6)
    (directory / "guest-facts.txt").write_text("kernel=6.12\nvcpus=2\nticks_per_s=100\n")
    member_bytes = 1000 * bl.MIB
    for target, count in (("md", len(md_degraded_after)), ("paraid", len(paraid_outcomes))):
        (directory / target).mkdir()
        for repeat in range(1, count + 1):
            seconds = 31 + repeat
            lines = ["start_s=1000.0 start_busy_ticks=500",
                     f"end_s={1000.0 + seconds} end_busy_ticks={500 + seconds * 100}"]
            if target == "md":
                lines.append(f"degraded_after={md_degraded_after[repeat - 1]} disk=/dev/vdh")
            else:
                lines.append("disk=/dev/vdh")
                result = {"kind": "rebuild", "outcome": paraid_outcomes[repeat - 1], "total_bytes": member_bytes,
                          "rate_bytes_per_s": member_bytes / seconds}
                (directory / target / f"status-{repeat}.json").write_text(
                    json.dumps({"array": {"last_result": result}}))
            (directory / target / f"rebuild-{repeat}.txt").write_text("\n".join(lines) + "\n")
    (directory / "md" / "facts.txt").write_text(f"component_kib={member_bytes // 1024}\n")


class VmRebuildResults(unittest.TestCase):
    def setUp(self):
        self.directory = tempfile.TemporaryDirectory()
        self.out = Path(self.directory.name)

    def tearDown(self):
        self.directory.cleanup()

    def summary(self) -> dict:
        guest = rebuild_suite.vm.read_key_values(self.out / "guest-facts.txt")
        bar = rebuild_suite.bar(self.out)
        results = {t: rebuild_suite.collect_target(self.out, t, 3, guest) for t, _ in rebuild_suite.TARGETS}
        judged = {t: rebuild_suite.judge(r, bar["single_bytes_s"]) for t, r in results.items()}
        return {"bar": bar, "results": results, "judged": judged}

    def test_rates_are_the_member_bytes_over_each_repeat_and_judged_on_the_median(self):
        write_rebuild_results(self.out, ["completed"] * 3, [0, 0, 0])
        summary = self.summary()
        # The bar is the best single-disk run (before and after, 1 MiB and 4 MiB): 32 MiB/s.
        self.assertAlmostEqual(summary["bar"]["single_bytes_s"], 32 * bl.MIB, delta=1)
        self.assertAlmostEqual(summary["bar"]["independence"], 190 / (6 * 32), places=3)
        paraid = summary["judged"]["paraid"]
        self.assertEqual(len(paraid["rates_bytes_s"]), 3)
        self.assertAlmostEqual(paraid["median_bytes_s"], 1000 * bl.MIB / 33)  # 32, 33, 34 s: the middle one
        self.assertAlmostEqual(paraid["ratio"], 1000 / 33 / 32)
        self.assertAlmostEqual(paraid["ratio_best"], 1000 / 32 / 32)
        self.assertAlmostEqual(paraid["guest_cpu_busy"], 0.5)
        self.assertTrue(rebuild_suite.target_cell(paraid, summary["bar"]).endswith("met"))

    def test_an_unfinished_or_failed_rebuild_is_an_error_and_left_out(self):
        write_rebuild_results(self.out, ["completed", "aborted", "completed"], [0, 1, 0])
        summary = self.summary()
        for target in ("md", "paraid"):
            runs = summary["results"][target]["runs"]
            self.assertIn("error", runs[1], target)
            self.assertEqual(len(summary["judged"][target]["rates_bytes_s"]), 2, target)
        (self.out / "paraid" / "rebuild-3.txt").write_text("start_s=1000.0 start_busy_ticks=500\n")
        summary = self.summary()
        self.assertIn("did not finish", summary["results"]["paraid"]["runs"][2]["error"])
        self.assertEqual(len(summary["judged"]["paraid"]["rates_bytes_s"]), 1)

    def test_members_that_are_not_independent_make_no_row_valid(self):
        write_rebuild_results(self.out, ["completed"] * 3, [0, 0, 0], parallel_mib_s=120)
        summary = self.summary()
        cell = rebuild_suite.target_cell(summary["judged"]["paraid"], summary["bar"])
        self.assertTrue(cell.startswith("not valid: independence 0.62"), cell)


class VmRebuildRender(unittest.TestCase):
    def test_every_rate_gets_a_bar_row_and_a_row_per_array(self):
        with tempfile.TemporaryDirectory() as directory:
            out = Path(directory) / "vmrb-x"
            for mib_s, parallel in ((32, 190), (128, 400)):
                cap = rebuild_suite.cap_dir(out, mib_s)
                cap.mkdir(parents=True)
                write_rebuild_results(cap, ["completed"] * 2, [0, 0], single_mib_s=mib_s, parallel_mib_s=parallel)
            run = {"command": "bench/vm/rebuild", "started": "2026-11-24 10:00", "elapsed_s": 600,
                   "paraid_label": "paraid", "host": {"cores": 2, "kernel": "6", "loadavg_at_start": 0.5},
                   "args": {"member_mib_s": [32.0, 64.0, 128.0], "repeats": 2, "disk_size_gib": 1, "cpus": 2,
                            "mem_mib": 3072, "disk_dir": "/dev/shm/x", "paraid_workers": 4, "bar_seconds": 8}}
            (out / "run.json").write_text(json.dumps(run))
            with unittest.mock.patch.object(rebuild_suite.bl, "REPO_ROOT", Path(directory)):
                summary = rebuild_suite.build_summary(out)
                text = rebuild_suite.render(summary, out)
        self.assertEqual([cap["mib_s"] for cap in summary["caps"]], [32.0, 128.0])  # 64 never ran
        rows = [line for line in text.splitlines() if line.startswith("| 32 |") or line.startswith("| 128 |")]
        self.assertEqual(len(rows), 2 + 4, text)
        self.assertIn("| 128 | paraid RAID6", text)
        self.assertIn("not valid: independence 0.52", text)  # 400 MiB/s over six disks of 128
        self.assertIn("(peer)", text)


class ArrayIoInterval(unittest.TestCase):
    def test_percentiles_and_mean_cover_only_the_interval(self):
        before = {"write": {"requests": 10, "bytes": 40960, "latency_us": {"mean": 100.0, "buckets": [[103, 10]]}},
                  "trim": {"requests": 0, "latency_us": {}}}
        # 100 more writes: 98 at about 50 us, 2 at about 10 ms; the 10 earlier ones must not count.
        after = {"write": {"requests": 110, "bytes": 40960 + 100 * 16384,
                           "latency_us": {"mean": (10 * 100.0 + 98 * 50 + 2 * 10000) / 110,
                                          "buckets": [[51, 98], [103, 10], [10239, 2]]}},
                 "flush": {"requests": 3, "latency_us": {"mean": 20.0, "buckets": [[20, 3]]}},
                 "trim": {"requests": 0, "latency_us": {}}}
        io = oltp_suite.io_between(before, after)
        self.assertEqual(set(io), {"write", "flush"})  # kinds with nothing in the interval are left out
        self.assertEqual(io["write"]["requests"], 100)
        self.assertEqual(io["write"]["bytes"], 100 * 16384)
        self.assertAlmostEqual(io["write"]["mean_us"], (98 * 50 + 2 * 10000) / 100, places=1)
        self.assertEqual(io["write"]["p50_us"], 51)
        self.assertEqual(io["write"]["p99_us"], 10239)
        self.assertEqual(io["flush"], {"requests": 3, "bytes": 0, "mean_us": 20.0, "p50_us": 20, "p99_us": 20,
                                       "p99_9_us": 20})


class KernelThreadAccounting(unittest.TestCase):
    def test_an_exited_thread_does_not_make_the_interval_negative(self):
        before = {(10, 1): 500, (11, 2): 40}
        after = {(11, 2): 70, (12, 9): 5, (10, 99): 3}  # 10 exited and its pid was reused
        self.assertAlmostEqual(bl._kernel_threads_delta_s(before, after) * bl.CLOCK_TICKS_PER_S, 30 + 5 + 3)


class RatioText(unittest.TestCase):
    def test_rounding_never_contradicts_the_status(self):
        self.assertEqual(bl.ratio_text(0.8997, False, 0.9, ">="), "0.8997")
        self.assertEqual(bl.ratio_text(0.9512, True, 0.9, ">="), "0.951")
        self.assertEqual(bl.ratio_text(1.2004, False, 1.2, "<="), "1.2004")
        self.assertEqual(bl.ratio_text(3.0, False, None, ">="), "3.000")


class BlkioThrottleHelpers(unittest.TestCase):
    def test_device_number_is_major_colon_minor(self):
        # /dev/null is character device 1:3 on Linux; st_rdev is read the same way for block devices.
        self.assertEqual(bl.device_number("/dev/null"), "1:3")

    def test_throttle_line_and_its_removal(self):
        self.assertEqual(bl.throttle_line("7:3", 150 * bl.MIB), "7:3 157286400")
        self.assertEqual(bl.throttle_line("7:3", 0), "7:3 0")
        with self.assertRaises(ValueError):
            bl.throttle_line("7:3", -1)

    def test_wrapped_command_joins_the_group_then_runs_with_its_arguments(self):
        import subprocess
        with tempfile.TemporaryDirectory() as directory:
            group = Path(directory)
            result = subprocess.run(bl.in_cgroup_argv(["sh", "-c", 'echo "$$ $1"', "sh", "a b"], group),
                                    capture_output=True, text=True, check=True)
            pid, argument = result.stdout.strip().split(" ", 1)
            # exec keeps the pid: the process that joined the group is the one that runs the command.
            self.assertEqual((group / "cgroup.procs").read_text().strip(), pid)
            self.assertEqual(argument, "a b")

    def test_independence_ratio(self):
        self.assertAlmostEqual(bl.independence_ratio(6 * 150.0, 150.0, 6), 1.0)
        self.assertAlmostEqual(bl.independence_ratio(450.0, 150.0, 6), 0.5)
        with self.assertRaises(ValueError):
            bl.independence_ratio(1.0, 0.0, 6)


class RebuildReport(unittest.TestCase):
    def row(self, setup, rate_mib_s, bar_mib_s):
        row = {"setup": setup, "member_bytes": bl.GIB, "rebuilt_bytes": bl.GIB, "seconds": 1024 / rate_mib_s,
               "rate_bytes_s": rate_mib_s * bl.MIB, "paraid_rate_bytes_s": rate_mib_s * bl.MIB,
               "speed_limits": (64 * bl.MIB, 0), "cpu_s_per_gb": 1.0, "member_write_bytes_s": bar_mib_s * bl.MIB}
        if setup == "throttled":
            row.update(limit_bytes_s=150 * bl.MIB, parallel_write_bytes_s=6 * bar_mib_s * bl.MIB, direct_io=True,
                       independence=1.0)
        return row

    def test_ratio_is_rate_over_bar(self):
        row = fio_suite.finish_row(self.row("throttled", 140, 0)
                                   | {"member_write_bytes_s": None}, {"member_write_bytes_s": 150 * bl.MIB})
        self.assertAlmostEqual(row["ratio"], 140 / 150)

    def test_a_throttled_row_whose_members_were_not_independent_is_not_judged(self):
        row = fio_suite.finish_row(self.row("throttled", 75, 140) | {"independence": 0.59}, {})
        self.assertIn("not valid", fio_suite.target_cell(row))
        row = fio_suite.finish_row(self.row("throttled", 75, 140), {})
        self.assertEqual(fio_suite.target_cell(row), ">= 0.9: **not met** (best repeat 0.54, median 0.54)")

    def test_repeats_report_the_median_run_and_all_rates(self):
        runs = [{"seconds": 1024 / r, "rebuilt_bytes": bl.GIB, "rate_bytes_s": r * bl.MIB, "paraid_rate_bytes_s": 0,
                 "cpu": {"run": r}, "cpu_attributed_s": 1.0} for r in (70, 150, 140)]
        row = fio_suite.summarize_rebuilds(runs, bl.GIB, (0, 0))
        self.assertEqual(row["rate_bytes_s"], 140 * bl.MIB)
        self.assertEqual(row["cpu"], {"run": 140})
        self.assertEqual(sorted(row["rates_bytes_s"]), [70 * bl.MIB, 140 * bl.MIB, 150 * bl.MIB])
        self.assertAlmostEqual(row["cpu_s_per_gb"], 3.0 / (3 * bl.GIB / 1e9))
        self.assertEqual(fio_suite.rates_range(row), " (70–150)")
        self.assertEqual(row["best_rate_bytes_s"], 150 * bl.MIB)

    def test_the_target_is_judged_on_the_best_repeat_like_the_bar(self):
        # blk-throttle holds whole runs at half the cap: a median of 75 with a best of 148 against a bar of 150.
        row = fio_suite.finish_row(self.row("throttled", 75, 150) | {"best_rate_bytes_s": 148 * bl.MIB}, {})
        self.assertAlmostEqual(row["ratio"], 0.5)
        self.assertAlmostEqual(row["ratio_best"], 148 / 150)
        self.assertEqual(fio_suite.target_cell(row), ">= 0.9: met (best repeat 0.99, median 0.50)")

    def test_only_the_throttled_row_is_judged_against_the_target(self):
        class Args:
            member_dir = "/dev/shm"
            paraid_label = "paraid"
        rows = [fio_suite.finish_row(self.row("tmpfs", 400, 700), {}),
                fio_suite.finish_row(self.row("throttled", 140, 147), {})]
        text = fio_suite.rebuild_text({"status": "measured", "rows": rows}, Args, {"cpu_model": "x", "cores": 2,
                                      "memory_gib": 1, "kernel": "k", "loadavg_at_start": 0.5},
                                      "2026-01-01 00:00", "bench/fio/run --parts rebuild")
        lines = [line for line in text.splitlines() if line.startswith("| ")]
        tmpfs = next(line for line in lines if line.startswith("| tmpfs"))
        throttled = next(line for line in lines if line.startswith("| throttled"))
        self.assertIn("(reference)", tmpfs)
        self.assertNotIn("not met", tmpfs)
        self.assertIn("0.952", throttled)
        self.assertIn(">= 0.9: met", throttled)
        self.assertTrue(any("| 1.00 |" in line for line in lines), "the independence table is written")


class ParaidHelp(unittest.TestCase):
    def test_commands_are_read_from_clap_help(self):
        with tempfile.TemporaryDirectory() as directory:
            fake = Path(directory) / "paraid"
            fake.write_text("#!/bin/sh\nprintf 'About\\n\\nUsage: paraid <COMMAND>\\n\\nCommands:\\n"
                            "  create   Create\\n  rebuild  Rebuild\\n  help     Help\\n\\nOptions:\\n"
                            "  -h, --help  Print help\\n'\n")
            fake.chmod(0o755)
            self.assertEqual(bl.paraid_commands(fake), {"create", "rebuild", "help"})


if __name__ == "__main__":
    unittest.main()
