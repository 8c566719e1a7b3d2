//! What seeds did: per-seed reports, totals over a range, and failures with their replay command.

use super::*;

/// What one seed did.
#[derive(Debug, Clone, Default)]
pub struct SeedReport {
    pub level: Option<Level>,
    pub members: usize,
    pub chunk_bytes: u64,
    pub array_bytes: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    /// Background ticks run as steps (`Step::Tick`).
    pub ticks: u64,
    pub discards: u64,
    /// Array requests that failed while a fault made failure legitimate (beyond tolerance).
    pub request_errors: u64,
    /// Blocks compared with the model (reads, and full read-backs after crashes and restarts).
    pub blocks_verified: u64,
    pub crashes: u64,
    pub power_cuts_mid_request: u64,
    pub kills: u64,
    pub restarts: u64,
    pub member_failures: u64,
    pub admin_fails: u64,
    pub evictions: u64,
    pub members_removed: u64,
    pub beyond_tolerance: u64,
    pub beyond_tolerance_refusals: u64,
    pub stale_refusals: u64,
    pub re_adds: u64,
    /// Blocks that block status reported as holes after a read, checked against the model as zeros.
    pub hole_blocks_verified: u64,
    /// Re-added members rebuilt only where the write-intent bitmap marked writes (some rows found in sync).
    pub re_adds_from_bitmap: u64,
    /// Failed members offered back to the running array (`paraid add` of the same device, its durable contents),
    /// and of those, the ones re-added (rebuilt only where the bitmap marks writes).
    pub members_back: u64,
    pub members_back_re_added: u64,
    /// Of the members offered back, those that had failed in the middle of their own rebuild into the slot
    /// (their superblock says `rebuilding`), and of those, the ones re-added (in sync below their checkpoint).
    pub members_back_mid_rebuild: u64,
    pub members_back_mid_rebuild_re_added: u64,
    /// Failed arrays started by `force` from the member that left last.
    pub forced: u64,
    /// Re-assemblies looked at read-only first (`restarts.rs`, `read_only_look`): served and read back whole, or
    /// refused (only without the log: a RAID5/6 stopped uncleanly with a member missing); members unchanged.
    pub read_only_looks: u64,
    pub read_only_refusals: u64,
    /// Power losses in the middle of a rebuild (`rebuild_power_losses`).
    pub rebuild_power_losses: u64,
    pub transient_errors: u64,
    pub unretryable_read_errors: u64,
    /// Pieces read around a member the engine found slow (the latency class's delays): from another copy, or
    /// solved and checked against P and Q.
    pub steered_reads: u64,
    pub rebuilds: u64,
    pub replacements: u64,
    /// Blank members that failed while they were rebuilt (`failing_new_members`): each rebuild aborted, the
    /// member kept out.
    pub new_member_failures: u64,
    /// Resyncs after an unclean stop, and the stripes they rewrote.
    pub resyncs: u64,
    pub resync_rewritten: u64,
    pub corruptions_planted: u64,
    pub corruptions_detected: u64,
    pub corruptions_repaired: u64,
    /// Member-image audits (parity and copies checked from raw bytes) and the stripes they covered.
    pub audits: u64,
    pub stripes_audited: u64,
    pub crash_writes_kept: u64,
    pub crash_writes_dropped: u64,
    pub crash_writes_torn: u64,
    /// Seeds ended by a known engine bug (a power cut inside a superblock update; see docs/reliability.md).
    pub known_bug_hits: u64,
    /// Blocks of missing members being written at a crash that came back as neither old nor new (the partial
    /// parity log's documented limit; a violation under `strict`).
    pub write_hole_limit_blocks: u64,
    /// Batches of concurrent requests, their requests, and the writes gathered (joined into another write's
    /// gather), full stripes written by gathers meanwhile, and gathers of writes queued on a busy stripe.
    pub batches: u64,
    pub batch_requests: u64,
    pub gathered_writes: u64,
    pub gathered_stripes: u64,
    pub queued_gathers: u64,
    /// Gathers a stream's request led because its continuation was told (`Array::note_write_follows`).
    pub gathers_for_followers: u64,
    /// Writes answered while held by write-back (`SimConfig::write_back`).
    pub held_writes: u64,
    /// Held writes a kill cut short, written by the next assembly from the store they were kept in (held.rs).
    pub held_replayed: u64,
    /// Journal mode (`SimConfig::journal`): writes answered once durable in the log, and chunk pages recovery
    /// rolled forward from it.
    pub answered_from_log: u64,
    pub pages_rolled_forward: u64,
    /// Of those, writes whose data was logged before they read anything (`Ppl::log_data_first`).
    pub log_data_first: u64,
    /// Writes that logged their partial parity alone, the log being deep or the write not lone
    /// (`Ppl::parity_alone`).
    pub log_parity_alone: u64,
    /// Lone answers: writes through `write_answering` that found another awaiting its answer and took the log's
    /// own way (`Ppl::await_answer`).
    pub log_not_lone: u64,
    /// Full-stripe writes that logged no marker, the stripe's newest live entry being one.
    pub log_markers_skipped: u64,
    /// A gate on spare CPU: writes through `write_answering` it turned to the log's own way.
    pub log_cpu_busy: u64,
    /// Online checks and repairs of a consistent array beside a batch (each must find and rewrite nothing).
    pub online_checks: u64,
    /// Writes (stripes of) that rode a stream entry of the partial parity log, and stream entries extended ahead.
    pub log_rides: u64,
    pub log_stream_extensions: u64,
    /// RAID5 stripes whose log entries went to a written chunk's member's ring, not the P member's (ppl/spread.rs).
    pub log_entries_off_parity: u64,
    /// Flushes of every member made because a log round found no room in the ring (to retire its records).
    pub log_ring_full_flushes: u64,
    /// Read-modify-write reads the stripe cache served and those that went to the members.
    pub stripe_cache_hits: u64,
    pub stripe_cache_misses: u64,
    pub faults: FaultCounts,
    pub virtual_delay: Duration,
    /// A digest of every step's trace line: two runs of one seed replay exactly when it matches.
    pub trace_digest: u64,
}

/// Sums over many seeds.
#[derive(Debug, Clone, Default)]
pub struct SimTotals {
    pub seeds: u64,
    pub by_level: [(u64, &'static str); 5],
    pub sum: SeedReport,
    pub violations: u64,
    pub failing_seeds: Vec<u64>,
    pub known_bug_seeds: Vec<u64>,
}

impl SimTotals {
    pub fn new() -> SimTotals {
        SimTotals {
            by_level: [
                (0, "raid0"),
                (0, "raid1"),
                (0, "raid5"),
                (0, "raid6"),
                (0, "raid10"),
            ],
            ..SimTotals::default()
        }
    }

    pub fn add(&mut self, seed: u64, r: &SeedReport) {
        self.seeds += 1;
        let at = match r.level {
            Some(Level::Raid0) => 0,
            Some(Level::Raid1) => 1,
            Some(Level::Raid5) => 2,
            Some(Level::Raid6) => 3,
            Some(Level::Raid10) => 4,
            None => return,
        };
        self.by_level[at].0 += 1;
        if r.known_bug_hits > 0 {
            self.known_bug_seeds.push(seed);
        }
        let s = &mut self.sum;
        s.reads += r.reads;
        s.writes += r.writes;
        s.flushes += r.flushes;
        s.ticks += r.ticks;
        s.discards += r.discards;
        s.request_errors += r.request_errors;
        s.blocks_verified += r.blocks_verified;
        s.crashes += r.crashes;
        s.power_cuts_mid_request += r.power_cuts_mid_request;
        s.kills += r.kills;
        s.restarts += r.restarts;
        s.member_failures += r.member_failures;
        s.admin_fails += r.admin_fails;
        s.evictions += r.evictions;
        s.members_removed += r.members_removed;
        s.beyond_tolerance += r.beyond_tolerance;
        s.beyond_tolerance_refusals += r.beyond_tolerance_refusals;
        s.stale_refusals += r.stale_refusals;
        s.re_adds += r.re_adds;
        s.hole_blocks_verified += r.hole_blocks_verified;
        s.re_adds_from_bitmap += r.re_adds_from_bitmap;
        s.members_back += r.members_back;
        s.members_back_re_added += r.members_back_re_added;
        s.members_back_mid_rebuild += r.members_back_mid_rebuild;
        s.members_back_mid_rebuild_re_added += r.members_back_mid_rebuild_re_added;
        s.forced += r.forced;
        s.read_only_looks += r.read_only_looks;
        s.read_only_refusals += r.read_only_refusals;
        s.rebuild_power_losses += r.rebuild_power_losses;
        s.transient_errors += r.transient_errors;
        s.unretryable_read_errors += r.unretryable_read_errors;
        s.steered_reads += r.steered_reads;
        s.rebuilds += r.rebuilds;
        s.replacements += r.replacements;
        s.new_member_failures += r.new_member_failures;
        s.resyncs += r.resyncs;
        s.resync_rewritten += r.resync_rewritten;
        s.corruptions_planted += r.corruptions_planted;
        s.corruptions_detected += r.corruptions_detected;
        s.corruptions_repaired += r.corruptions_repaired;
        s.audits += r.audits;
        s.stripes_audited += r.stripes_audited;
        s.crash_writes_kept += r.crash_writes_kept;
        s.crash_writes_dropped += r.crash_writes_dropped;
        s.crash_writes_torn += r.crash_writes_torn;
        s.known_bug_hits += r.known_bug_hits;
        s.write_hole_limit_blocks += r.write_hole_limit_blocks;
        s.batches += r.batches;
        s.batch_requests += r.batch_requests;
        s.gathered_writes += r.gathered_writes;
        s.gathered_stripes += r.gathered_stripes;
        s.queued_gathers += r.queued_gathers;
        s.gathers_for_followers += r.gathers_for_followers;
        s.held_writes += r.held_writes;
        s.held_replayed += r.held_replayed;
        s.answered_from_log += r.answered_from_log;
        s.log_data_first += r.log_data_first;
        s.log_parity_alone += r.log_parity_alone;
        s.log_not_lone += r.log_not_lone;
        s.log_cpu_busy += r.log_cpu_busy;
        s.pages_rolled_forward += r.pages_rolled_forward;
        s.online_checks += r.online_checks;
        s.log_rides += r.log_rides;
        s.log_entries_off_parity += r.log_entries_off_parity;
        s.log_stream_extensions += r.log_stream_extensions;
        s.log_markers_skipped += r.log_markers_skipped;
        s.log_ring_full_flushes += r.log_ring_full_flushes;
        s.stripe_cache_hits += r.stripe_cache_hits;
        s.stripe_cache_misses += r.stripe_cache_misses;
        s.faults += r.faults;
        s.virtual_delay += r.virtual_delay;
    }

    pub fn add_failure(&mut self, f: &SimFailure) {
        self.seeds += 1;
        self.violations += 1;
        self.failing_seeds.push(f.seed);
    }
}

impl fmt::Display for SimTotals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.sum;
        let levels: Vec<String> = self
            .by_level
            .iter()
            .map(|(n, name)| format!("{name} {n}"))
            .collect();
        writeln!(
            f,
            "seeds run          {} ({})",
            self.seeds,
            levels.join(", ")
        )?;
        writeln!(
            f,
            "requests           {} reads, {} writes, {} flushes, {} discards/write-zeroes; {} failed beyond tolerance; \
             {} background ticks",
            s.reads, s.writes, s.flushes, s.discards, s.request_errors, s.ticks
        )?;
        writeln!(
            f,
            "blocks verified    {} ({} more reported as holes by block status, verified as zeros)",
            s.blocks_verified, s.hole_blocks_verified
        )?;
        if s.batches > 0 {
            writeln!(
                f,
                "concurrency        {} batches of {} requests at once; {} writes gathered, {} full stripes gathered ({} \
                 led for a told continuation), {} gathers of writes queued on a busy stripe; {} online \
                 checks/repairs beside requests found nothing",
                s.batches,
                s.batch_requests,
                s.gathered_writes,
                s.gathered_stripes,
                s.gathers_for_followers,
                s.queued_gathers,
                s.online_checks
            )?;
        }
        if s.held_writes > 0 {
            writeln!(
                f,
                "write-back         {} writes answered while held, written in the background; {} of them written \
                 again after a kill, from the store they were kept in",
                s.held_writes, s.held_replayed
            )?;
        }
        if s.answered_from_log + s.pages_rolled_forward > 0 {
            writeln!(
                f,
                "journal            {} writes answered once durable in the log ({} logged before they read), {} pages rolled forward at restarts, {} writes logged partial parity alone (log deep, or not lone), {} not lone (lone answers), {} found the CPU busy (a gate on spare CPU)",
                s.answered_from_log, s.log_data_first, s.pages_rolled_forward, s.log_parity_alone, s.log_not_lone,
                s.log_cpu_busy
            )?;
        }
        if s.stripe_cache_hits + s.stripe_cache_misses > 0 {
            writeln!(
                f,
                "stripe cache       {} read-modify-write reads served from the cache, {} from the members",
                s.stripe_cache_hits, s.stripe_cache_misses
            )?;
        }
        if s.log_rides > 0 || s.log_stream_extensions > 0 {
            writeln!(
                f,
                "log streams        {} stripe writes rode a stream entry, {} stream entries extended ahead",
                s.log_rides, s.log_stream_extensions
            )?;
        }
        if s.log_markers_skipped > 0 {
            writeln!(
                f,
                "log markers        {} full-stripe writes logged none, their stripe's newest live entry being one",
                s.log_markers_skipped
            )?;
        }
        if s.log_entries_off_parity > 0 {
            writeln!(
                f,
                "log placement      {} RAID5 stripes' entries on a written chunk's member's ring",
                s.log_entries_off_parity
            )?;
        }
        if s.log_ring_full_flushes > 0 {
            writeln!(
                f,
                "log ring           full {} times (a flush of every member to retire records)",
                s.log_ring_full_flushes
            )?;
        }
        writeln!(
            f,
            "members            {} failures ({} by the admin), {} evictions, {} removed at restart, {} beyond tolerance \
             (assembly refused {}), {} stale members refused, {} re-added ({} rebuilt only where the bitmap marks \
             writes), {} failed arrays forced",
            s.member_failures,
            s.admin_fails,
            s.evictions,
            s.members_removed,
            s.beyond_tolerance,
            s.beyond_tolerance_refusals,
            s.stale_refusals,
            s.re_adds,
            s.re_adds_from_bitmap,
            s.forced
        )?;
        writeln!(
            f,
            "rebuilds           {} onto blank members or members back, {} live replacements, {} new members failed \
             while rebuilt; {} failed members added back while serving, {} of them re-added from the bitmap ({} had \
             failed in the middle of their own rebuild, {} of those re-added below its checkpoint)",
            s.rebuilds,
            s.replacements,
            s.new_member_failures,
            s.members_back,
            s.members_back_re_added,
            s.members_back_mid_rebuild,
            s.members_back_mid_rebuild_re_added
        )?;
        writeln!(
            f,
            "read-only          {} re-assemblies looked at read-only first ({} refused), members unchanged",
            s.read_only_looks, s.read_only_refusals
        )?;
        writeln!(
            f,
            "power and process  {} power losses ({} mid-request, {} mid-rebuild), {} kills, {} clean restarts; unflushed writes kept {}, \
             dropped {}, torn {}; {} resyncs rewrote {} stripes",
            s.crashes,
            s.power_cuts_mid_request,
            s.rebuild_power_losses,
            s.kills,
            s.restarts,
            s.crash_writes_kept,
            s.crash_writes_dropped,
            s.crash_writes_torn,
            s.resyncs,
            s.resync_rewritten
        )?;
        writeln!(
            f,
            "I/O faults         {} failed member I/Os, {} transient errors, {} unretryable read errors, {} delayed I/Os \
             ({:.1} s virtual; {} pieces read around the slow member)",
            s.faults.failed,
            s.transient_errors,
            s.unretryable_read_errors,
            s.faults.delayed,
            s.virtual_delay.as_secs_f64(),
            s.steered_reads
        )?;
        writeln!(
            f,
            "silent corruption  {} planted, {} found by check, {} repaired",
            s.corruptions_planted, s.corruptions_detected, s.corruptions_repaired
        )?;
        writeln!(
            f,
            "member audits      {} ({} stripes checked with the reference)",
            s.audits, s.stripes_audited
        )?;
        writeln!(
            f,
            "write-hole limit   {} blocks of missing members, unflushed and being written at a crash, came back as \
             neither old nor new",
            s.write_hole_limit_blocks
        )?;
        writeln!(
            f,
            "known engine bugs  {} seeds ended by a power cut inside a superblock update{}",
            s.known_bug_hits,
            if self.known_bug_seeds.is_empty() {
                String::new()
            } else {
                format!(
                    " (seeds {:?})",
                    &self.known_bug_seeds[..self.known_bug_seeds.len().min(10)]
                )
            }
        )?;
        write!(
            f,
            "violations         {}{}",
            self.violations,
            if self.failing_seeds.is_empty() {
                String::new()
            } else {
                format!(
                    " (seeds {:?})",
                    &self.failing_seeds[..self.failing_seeds.len().min(20)]
                )
            }
        )
    }
}

/// A violation: what went wrong, where, and how to replay it.
#[derive(Debug, Clone)]
pub struct SimFailure {
    pub seed: u64,
    /// The step at which it was found.
    pub op: usize,
    pub what: String,
    pub geometry: String,
    /// The last steps before it.
    pub trace: Vec<String>,
    pub replay: String,
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A hung seed or a panic knows neither its step nor its geometry: they are left out rather than shown empty.
        write!(f, "simulation seed {}", self.seed)?;
        if !self.geometry.is_empty() {
            write!(f, " failed at step {} ({})", self.op, self.geometry)?;
        }
        writeln!(f, ": {}", self.what)?;
        writeln!(f, "replay: {}", self.replay)?;
        if !self.trace.is_empty() {
            writeln!(f, "last steps:")?;
        }
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SimFailure {}

impl SimFailure {
    /// The failure of a seed that ran past `limit`: hung.
    pub(super) fn hung(seed: u64, cfg: &SimConfig, limit: Duration) -> SimFailure {
        SimFailure {
            seed,
            op: 0,
            what: format!(
                "no result after {} s: hung (a deadlock in the engine, or PARAID_SIM_HANG_SECS too short)",
                limit.as_secs()
            ),
            geometry: String::new(),
            trace: Vec::new(),
            replay: cfg.replay(seed),
        }
    }

    /// The failure of a seed that panicked, with the panic's message.
    pub(super) fn panicked(
        seed: u64,
        cfg: &SimConfig,
        panic: Box<dyn std::any::Any + Send>,
    ) -> SimFailure {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        SimFailure {
            seed,
            op: 0,
            what: format!("panicked: {message}"),
            geometry: String::new(),
            trace: Vec::new(),
            replay: cfg.replay(seed),
        }
    }
}
