//! The CPU quota this process runs under, if any: a container's or a systemd unit's limit (cgroup v2 `cpu.max`,
//! cgroup v1 `cpu.cfs_quota_us` over `cpu.cfs_period_us`), and the counter of what its group has used.
//!
//! Why: journal mode's early answers are gated on spare CPU (spare_cpu.rs), read from `/proc/stat`, which counts
//! the whole machine. A database in a container held to two CPUs of a 64-core host sees the host idle while its own
//! quota is spent: an early answer's copies would then come out of the database's two CPUs. With a quota found the
//! gate takes the smaller of the two idle shares: the host's, and the quota's (what the group left unused of its
//! quota over the same window).
//!
//! Where the limit is: the tightest quota on the path from this process's group up to the root (a parent's limit
//! binds its children), counted by that group's usage (its siblings spend the same quota). Nothing is found (no
//! quota, a file missing or malformed) is the machine without a quota: the gate sees what it saw before.

use std::path::{Path, PathBuf};

/// The quota: how many thousandths of a CPU the group may use, and the file counting what it used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuQuota {
    pub millicpus: u64,
    pub usage: UsageFile,
}

/// A group's CPU time used so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageFile {
    /// cgroup v2 `cpu.stat`, its `usage_usec` line.
    CpuStat(PathBuf),
    /// cgroup v1 `cpuacct.usage`, in nanoseconds.
    CpuacctUsage(PathBuf),
}

/// The groups of `/proc/self/cgroup`: the v2 path (line `0::PATH`), and the v1 paths of the `cpu` and `cpuacct`
/// controllers (lines `N:CONTROLLERS:PATH`, controllers comma-separated).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CgroupPaths {
    pub unified: Option<String>,
    pub cpu: Option<String>,
    pub cpuacct: Option<String>,
}

pub fn parse_proc_self_cgroup(text: &str) -> CgroupPaths {
    let mut paths = CgroupPaths::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            paths.unified = Some(path.to_string());
            continue;
        }
        for controller in controllers.split(',') {
            match controller {
                "cpu" => paths.cpu = Some(path.to_string()),
                "cpuacct" => paths.cpuacct = Some(path.to_string()),
                _ => {}
            }
        }
    }
    paths
}

/// Thousandths of a CPU from cgroup v2 `cpu.max` ("QUOTA PERIOD", or "max PERIOD": none).
pub fn parse_cpu_max(text: &str) -> Option<u64> {
    let mut fields = text.split_ascii_whitespace();
    let quota = fields.next()?;
    let period: u64 = fields.next()?.parse().ok()?;
    if quota == "max" || period == 0 {
        return None;
    }
    Some(quota.parse::<u64>().ok()? * 1000 / period)
}

/// Thousandths of a CPU from cgroup v1 `cpu.cfs_quota_us` (−1: none) and `cpu.cfs_period_us`.
pub fn parse_cfs_quota(quota_text: &str, period_text: &str) -> Option<u64> {
    let quota: i64 = quota_text.trim().parse().ok()?;
    let period: u64 = period_text.trim().parse().ok()?;
    if quota <= 0 || period == 0 {
        return None;
    }
    Some(quota as u64 * 1000 / period)
}

/// Microseconds used from cgroup v2 `cpu.stat` (its `usage_usec` line).
pub fn parse_usage_usec(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
}

impl UsageFile {
    /// Microseconds of CPU the group has used; None where the file cannot be read or parsed.
    pub fn read_usec(&self) -> Option<u64> {
        match self {
            UsageFile::CpuStat(path) => parse_usage_usec(&std::fs::read_to_string(path).ok()?),
            UsageFile::CpuacctUsage(path) => std::fs::read_to_string(path)
                .ok()?
                .trim()
                .parse::<u64>()
                .ok()
                .map(|ns| ns / 1000),
        }
    }
}

/// The group directories from `path`'s own up to the hierarchy's root, under `root`.
fn up_from(root: &Path, path: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut rel = path.trim_matches('/').to_string();
    loop {
        dirs.push(if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&rel)
        });
        if rel.is_empty() {
            return dirs;
        }
        rel = rel
            .rsplit_once('/')
            .map(|(up, _)| up.to_string())
            .unwrap_or_default();
    }
}

/// The tightest quota of `paths` under a cgroup file system mounted at `fs_root` (`/sys/fs/cgroup` on a running
/// system: v2 there or under `unified/`, v1 controllers under `cpu/` and `cpuacct/`), v2 first.
pub fn find_in(fs_root: &Path, paths: &CgroupPaths) -> Option<CpuQuota> {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok();
    if let Some(path) = &paths.unified {
        for mount in [fs_root.to_path_buf(), fs_root.join("unified")] {
            if !mount.join("cgroup.controllers").exists() {
                continue;
            }
            let tightest = up_from(&mount, path)
                .into_iter()
                .filter_map(|dir| {
                    let millicpus = parse_cpu_max(&read(dir.join("cpu.max"))?)?;
                    Some((millicpus, dir))
                })
                .min_by_key(|(millicpus, _)| *millicpus);
            if let Some((millicpus, dir)) = tightest {
                return Some(CpuQuota {
                    millicpus,
                    usage: UsageFile::CpuStat(dir.join("cpu.stat")),
                });
            }
        }
    }
    let (cpu, cpuacct) = (paths.cpu.as_ref()?, paths.cpuacct.as_ref()?);
    // v1 counts usage in the cpuacct hierarchy; with both controllers on one mount (`cpu,cpuacct`) the same
    // directory holds both files.
    let cpu_mount = fs_root.join("cpu");
    let tightest = up_from(&cpu_mount, cpu)
        .into_iter()
        .filter_map(|dir| {
            let millicpus = parse_cfs_quota(
                &read(dir.join("cpu.cfs_quota_us"))?,
                &read(dir.join("cpu.cfs_period_us"))?,
            )?;
            Some((millicpus, dir))
        })
        .min_by_key(|(millicpus, _)| *millicpus)?;
    let (millicpus, dir) = tightest;
    // The quota's group in the cpuacct hierarchy: the same path relative to its mount where the two controllers
    // share one hierarchy (the usual case), else this process's own cpuacct group.
    let rel = dir.strip_prefix(&cpu_mount).ok()?.to_path_buf();
    let usage = [
        dir.join("cpuacct.usage"),
        fs_root.join("cpuacct").join(&rel).join("cpuacct.usage"),
        fs_root
            .join("cpuacct")
            .join(cpuacct.trim_matches('/'))
            .join("cpuacct.usage"),
    ]
    .into_iter()
    .find(|p| p.exists())?;
    Some(CpuQuota {
        millicpus,
        usage: UsageFile::CpuacctUsage(usage),
    })
}

/// This process's quota, if it runs under one (module doc).
pub fn find() -> Option<CpuQuota> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    find_in(Path::new("/sys/fs/cgroup"), &parse_proc_self_cgroup(&text))
}

/// The share of the quota left idle between two readings (wall time since some epoch and usage, both in µs), in
/// percent; None where no time passed or a counter went back. Usage beyond the quota (the kernel throttles only at
/// period ends) counts as none idle.
pub fn quota_idle_percent(millicpus: u64, before: (u64, u64), now: (u64, u64)) -> Option<u64> {
    let wall_usec = now.0.checked_sub(before.0)?;
    let used_usec = now.1.checked_sub(before.1)?;
    let capacity_usec = wall_usec.saturating_mul(millicpus) / 1000;
    if capacity_usec == 0 {
        return None;
    }
    Some(100u64.saturating_sub(used_usec.saturating_mul(100) / capacity_usec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_self_cgroup_names_the_v2_group_and_the_v1_cpu_groups() {
        let v2 = parse_proc_self_cgroup("0::/system.slice/db.service\n");
        assert_eq!(v2.unified.as_deref(), Some("/system.slice/db.service"));
        assert_eq!((v2.cpu, v2.cpuacct), (None, None));
        let v1 = parse_proc_self_cgroup(
            "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n",
        );
        assert_eq!(v1.cpu.as_deref(), Some("/docker/abc"));
        assert_eq!(v1.cpuacct.as_deref(), Some("/docker/abc"));
        assert_eq!(v1.unified.as_deref(), Some("/"));
        assert_eq!(parse_proc_self_cgroup("garbage\n"), CgroupPaths::default());
    }

    #[test]
    fn quotas_parse_to_thousandths_of_a_cpu() {
        assert_eq!(parse_cpu_max("200000 100000\n"), Some(2000));
        assert_eq!(parse_cpu_max("50000 100000"), Some(500));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("x 100000"), None);
        assert_eq!(parse_cpu_max(""), None);
        assert_eq!(parse_cfs_quota("150000\n", "100000\n"), Some(1500));
        assert_eq!(parse_cfs_quota("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs_quota("100000", "0"), None);
        assert_eq!(
            parse_usage_usec("usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n"),
            Some(123_456)
        );
        assert_eq!(parse_usage_usec("user_usec 1\n"), None);
    }

    #[test]
    fn the_idle_share_of_a_quota_is_what_the_window_left_unused() {
        // Two CPUs for 100 ms: 200 ms of capacity.
        assert_eq!(
            quota_idle_percent(2000, (0, 0), (100_000, 50_000)),
            Some(75)
        );
        assert_eq!(
            quota_idle_percent(2000, (0, 0), (100_000, 200_000)),
            Some(0)
        );
        // Over the quota within a period: none idle, not a wrap.
        assert_eq!(
            quota_idle_percent(2000, (0, 0), (100_000, 260_000)),
            Some(0)
        );
        assert_eq!(quota_idle_percent(500, (0, 0), (100_000, 0)), Some(100));
        // No time, or a counter that went back: nothing to say.
        assert_eq!(quota_idle_percent(2000, (5, 0), (5, 10)), None);
        assert_eq!(quota_idle_percent(2000, (0, 10), (100, 5)), None);
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("paraid-cpu-quota-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn the_tightest_v2_quota_up_the_path_is_found_with_its_own_usage() {
        let root = scratch("v2");
        write(&root.join("cgroup.controllers"), "cpu memory\n");
        write(&root.join("kubepods/cpu.max"), "400000 100000\n");
        write(&root.join("kubepods/pod1/cpu.max"), "150000 100000\n");
        write(&root.join("kubepods/pod1/cpu.stat"), "usage_usec 42\n");
        write(&root.join("kubepods/pod1/db/cpu.max"), "max 100000\n");
        let paths = parse_proc_self_cgroup("0::/kubepods/pod1/db\n");
        let quota = find_in(&root, &paths).expect("a quota");
        assert_eq!(quota.millicpus, 1500);
        assert_eq!(
            quota.usage,
            UsageFile::CpuStat(root.join("kubepods/pod1/cpu.stat"))
        );
        assert_eq!(quota.usage.read_usec(), Some(42));
        // No quota anywhere up the path: none.
        let none = parse_proc_self_cgroup("0::/other\n");
        write(&root.join("other/cpu.max"), "max 100000\n");
        assert_eq!(find_in(&root, &none), None);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_v1_quota_is_found_with_its_cpuacct_usage() {
        let root = scratch("v1");
        write(&root.join("cpu/docker/abc/cpu.cfs_quota_us"), "200000\n");
        write(&root.join("cpu/docker/abc/cpu.cfs_period_us"), "100000\n");
        write(&root.join("cpu/docker/cpu.cfs_quota_us"), "-1\n");
        write(&root.join("cpu/docker/cpu.cfs_period_us"), "100000\n");
        write(&root.join("cpuacct/docker/abc/cpuacct.usage"), "7000000\n");
        let paths = parse_proc_self_cgroup("4:cpu:/docker/abc\n3:cpuacct:/docker/abc\n0::/\n");
        let quota = find_in(&root, &paths).expect("a quota");
        assert_eq!(quota.millicpus, 2000);
        assert_eq!(quota.usage.read_usec(), Some(7000));
        let _ = std::fs::remove_dir_all(&root);
    }
}
