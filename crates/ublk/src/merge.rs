//! WRITEs that continue one another and arrived together, served as one export write; small READs that arrived
//! together, served by one export call (`Export::read_many`), as the NBD server serves its READs.
//!
//! A client writing sequentially in pieces smaller than a RAID stripe (a 128 KiB copy, a log appender at queue
//! depth) would otherwise make the array read and log for each piece; merged, the pieces cover whole stripes.
//! Requests in flight together have no order among themselves, so the arrived batch may be sorted to find the
//! runs. Each request still gets its own answer: its length, or the merged write's error (each covers part of
//! the range, so an error may concern any of them). The NBD server does the same for its WRITEs.

use std::io;

use paraid_nbd::Export;

use crate::sys::{self, IoDesc};

/// Requests served together: one request, a run of WRITEs that continue one another, or READs that arrived
/// together (`serve_read_batch`).
pub(crate) type Job = Vec<(u16, IoDesc)>;

/// The jobs for a batch of arrived requests: WRITEs merged into runs (contiguous, same FUA, at most
/// `merge_limit_bytes` each; 0 turns merging off), READs of at most `paraid_nbd::GATHER_READ_MAX_BYTES` (the NBD
/// server's limit) gathered in arrival
/// order into jobs of up to `read_batch` (0 or 1: each alone), everything else one job per request.
///
/// With `whole_bytes` (the write the export serves best whole: a RAID stripe; 0 when unknown), a WRITE that is
/// already whole (aligned, a multiple) is served alone: merging serves partial pieces whole, while merging whole
/// ones would only serialize them on one worker behind a copy (1 MiB writes, which arrive as two whole 512 KiB
/// requests, ran 40 % slower that way in the TCG guest). Runs are not cut at stripe boundaries: longer runs
/// did better there (64 KiB pieces: 3.4x unmerged against 2.3x when cut).
pub(crate) fn plan_jobs(
    arrived: &[(u16, IoDesc)],
    merge_limit_bytes: u64,
    whole_bytes: u64,
    read_batch: usize,
    jobs: &mut Vec<Job>,
) {
    let limit_sectors = merge_limit_bytes / sys::SECTOR_BYTES;
    let whole_sectors = whole_bytes / sys::SECTOR_BYTES;
    let at_boundary = |sector: u64| whole_sectors > 0 && sector.is_multiple_of(whole_sectors);
    let mut writes: Vec<(u16, IoDesc)> = Vec::new();
    let mut reads: Job = Vec::new();
    for &(tag, desc) in arrived {
        let whole = at_boundary(desc.start_sector) && at_boundary(desc.nr_sectors as u64);
        if read_batch > 1
            && desc.op() == sys::IO_OP_READ
            && (1..=u64::from(paraid_nbd::GATHER_READ_MAX_BYTES)).contains(&desc.len_bytes())
        {
            reads.push((tag, desc));
            if reads.len() == read_batch {
                jobs.push(std::mem::take(&mut reads));
            }
        } else if limit_sectors > 0 && desc.op() == sys::IO_OP_WRITE && !whole {
            writes.push((tag, desc));
        } else {
            jobs.push(vec![(tag, desc)]);
        }
    }
    if !reads.is_empty() {
        jobs.push(reads);
    }
    writes.sort_by_key(|(_, desc)| desc.start_sector);
    let mut run: Job = Vec::new();
    let mut run_sectors = 0u64;
    for (tag, desc) in writes {
        let continues = run.last().is_some_and(|(_, last)| {
            last.end_sector() == desc.start_sector
                && last.fua() == desc.fua()
                && run_sectors + desc.nr_sectors as u64 <= limit_sectors
        });
        if !continues && !run.is_empty() {
            jobs.push(std::mem::take(&mut run));
            run_sectors = 0;
        }
        run_sectors += desc.nr_sectors as u64;
        run.push((tag, desc));
    }
    if !run.is_empty() {
        jobs.push(run);
    }
}

/// Serves a run of two or more WRITEs as one export write from `merged` (their data copied in, in order); every
/// tag's result: its length, or the write's negative errno.
pub(crate) fn serve_write_run<'b>(
    export: &dyn Export,
    run: &[(u16, IoDesc)],
    mut buffer: impl FnMut(u16, usize) -> &'b [u8],
    merged: &mut Vec<u8>,
    results: &mut Vec<(u16, i32)>,
) {
    let first = &run[0].1;
    let offset_bytes = first.offset_bytes();
    merged.clear();
    for &(tag, desc) in run {
        merged.extend_from_slice(buffer(tag, desc.len_bytes() as usize));
    }
    let served = if offset_bytes.saturating_add(merged.len() as u64) > export.size_bytes() {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    } else {
        export.write(offset_bytes, merged, first.fua())
    };
    for &(tag, desc) in run {
        let result = match &served {
            Ok(()) => desc.len_bytes() as i32,
            Err(e) => sys::negative_errno(e),
        };
        results.push((tag, result));
    }
}

/// Serves READs that arrived together (a job `plan_jobs` gathered) in one `Export::read_many`, each into its own
/// tag's buffer; every tag's result: its length, or its own negative errno (a read past the device's end is
/// refused alone, without reaching the export).
pub(crate) fn serve_read_batch<'b>(
    export: &dyn Export,
    batch: &[(u16, IoDesc)],
    mut buffer: impl FnMut(u16, usize) -> &'b mut [u8],
    results: &mut Vec<(u16, i32)>,
) {
    let mut reads: Vec<(u64, &mut [u8])> = Vec::with_capacity(batch.len());
    let mut served: Vec<(u16, u64)> = Vec::with_capacity(batch.len());
    for &(tag, desc) in batch {
        debug_assert_eq!(desc.op(), sys::IO_OP_READ);
        let (offset_bytes, len_bytes) = (desc.offset_bytes(), desc.len_bytes());
        if crate::queue::ends_past_the_device(export, &desc) {
            results.push((tag, -libc::EINVAL));
            continue;
        }
        reads.push((offset_bytes, buffer(tag, len_bytes as usize)));
        served.push((tag, len_bytes));
    }
    if reads.is_empty() {
        return;
    }
    for ((tag, len_bytes), result) in served.into_iter().zip(export.read_many(&mut reads)) {
        results.push((
            tag,
            match result {
                Ok(()) => len_bytes as i32,
                Err(e) => sys::negative_errno(&e),
            },
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paraid_nbd::MemoryExport;

    fn write(start_sector: u64, nr_sectors: u32, fua: bool) -> IoDesc {
        IoDesc {
            op_flags: sys::IO_OP_WRITE as u32 | if fua { sys::IO_F_FUA } else { 0 },
            nr_sectors,
            start_sector,
            addr: 0,
        }
    }

    fn tags(jobs: &[Job]) -> Vec<Vec<u16>> {
        jobs.iter()
            .map(|job| job.iter().map(|(tag, _)| *tag).collect())
            .collect()
    }

    #[test]
    fn contiguous_writes_merge_in_sector_order_and_the_rest_stay_apart() {
        let read = IoDesc {
            op_flags: sys::IO_OP_READ as u32,
            nr_sectors: 8,
            start_sector: 0,
            addr: 0,
        };
        let arrived = [
            (0, write(256, 256, false)), // second piece
            (1, read),
            (2, write(0, 256, false)),   // first piece
            (3, write(512, 256, false)), // third piece
            (4, write(4096, 8, false)),  // elsewhere
            (5, write(768, 256, true)),  // continues, but FUA: a run of its own
        ];
        let mut jobs = Vec::new();
        plan_jobs(&arrived, 1 << 20, 0, 0, &mut jobs);
        assert_eq!(tags(&jobs), vec![vec![1], vec![2, 0, 3], vec![5], vec![4]]);
        // The limit splits a run; 0 turns merging off.
        jobs.clear();
        plan_jobs(&arrived, 256 * 1024, 0, 0, &mut jobs);
        assert_eq!(
            tags(&jobs),
            vec![vec![1], vec![2, 0], vec![3], vec![5], vec![4]]
        );
        jobs.clear();
        plan_jobs(&arrived, 0, 0, 0, &mut jobs);
        assert_eq!(jobs.len(), arrived.len());
    }

    #[test]
    fn a_run_is_one_write_of_the_pieces_in_order_and_each_gets_its_length() {
        let export = MemoryExport::new(1 << 20);
        let run = vec![(7, write(8, 8, false)), (3, write(16, 16, false))];
        let data = |tag: u16, len: usize| -> &'static [u8] {
            let byte = if tag == 7 { 0xaa } else { 0xbb };
            Box::leak(vec![byte; len].into_boxed_slice())
        };
        let mut results = Vec::new();
        serve_write_run(&export, &run, data, &mut Vec::new(), &mut results);
        assert_eq!(results, vec![(7, 4096), (3, 8192)]);
        let contents = export.contents();
        assert!(contents[4096..8192].iter().all(|&b| b == 0xaa));
        assert!(contents[8192..16384].iter().all(|&b| b == 0xbb));
        assert!(contents[..4096].iter().all(|&b| b == 0) && contents[16384] == 0);
        // Past the end: every piece fails, nothing is written.
        let past = vec![(1, write(2040, 8, false)), (2, write(2048, 8, false))];
        results.clear();
        serve_write_run(&export, &past, data, &mut Vec::new(), &mut results);
        assert_eq!(results, vec![(1, -libc::EINVAL), (2, -libc::EINVAL)]);
    }

    #[test]
    fn whole_stripes_stay_alone_and_partial_pieces_merge_across_them() {
        // Stripes of 256 KiB (512 sectors): a whole stripe is served alone; 128 KiB pieces merge up to the limit.
        let arrived = [
            (0, write(0, 256, false)),
            (1, write(256, 256, false)),
            (2, write(512, 256, false)),
            (3, write(768, 256, false)),
            (4, write(1024, 512, false)), // a whole stripe
            (5, write(1536, 256, false)),
        ];
        let mut jobs = Vec::new();
        plan_jobs(&arrived, 1 << 20, 256 * 1024, 0, &mut jobs);
        assert_eq!(tags(&jobs), vec![vec![4], vec![0, 1, 2, 3], vec![5]]);
        // Unaligned whole-size pieces are partial: they merge.
        let shifted = [(0, write(256, 512, false)), (1, write(768, 512, false))];
        jobs.clear();
        plan_jobs(&shifted, 1 << 20, 256 * 1024, 0, &mut jobs);
        assert_eq!(tags(&jobs), vec![vec![0, 1]]);
    }

    fn read(start_sector: u64, nr_sectors: u32) -> IoDesc {
        IoDesc {
            op_flags: sys::IO_OP_READ as u32,
            nr_sectors,
            start_sector,
            addr: 0,
        }
    }

    #[test]
    fn small_reads_gather_in_arrival_order_up_to_the_batch_and_large_ones_stay_alone() {
        let arrived = [
            (0, read(800, 8)),
            (1, write(0, 8, false)),
            (2, read(16, 8)),
            (3, read(4096, 256)), // 128 KiB: alone
            (4, read(8, 128)),    // 64 KiB: gathers
            (5, read(64, 8)),
        ];
        let mut jobs = Vec::new();
        plan_jobs(&arrived, 1 << 20, 0, 16, &mut jobs);
        assert_eq!(tags(&jobs), vec![vec![3], vec![0, 2, 4, 5], vec![1]]);
        jobs.clear();
        plan_jobs(&arrived, 1 << 20, 0, 3, &mut jobs);
        assert_eq!(tags(&jobs), vec![vec![3], vec![0, 2, 4], vec![5], vec![1]]);
        // 0 or 1: every read alone, in arrival order among the other lone jobs.
        for off in [0, 1] {
            jobs.clear();
            plan_jobs(&arrived, 1 << 20, 0, off, &mut jobs);
            assert_eq!(
                tags(&jobs),
                vec![vec![0], vec![2], vec![3], vec![4], vec![5], vec![1]]
            );
        }
    }

    #[test]
    fn a_read_batch_fills_each_tag_and_refuses_a_read_past_the_end_alone() {
        let export = MemoryExport::new(1 << 20);
        let contents: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        export.write(0, &contents, false).unwrap();
        let batch = vec![
            (4, read(8, 8)),
            (9, read(2047, 8)), // ends past the 1 MiB device
            (2, read(100, 16)),
        ];
        let mut memory = vec![0u8; 10 * 8192];
        let mut tag_buffers: Vec<Option<&mut [u8]>> = memory.chunks_mut(8192).map(Some).collect();
        let buffer = |tag: u16, len: usize| -> &mut [u8] {
            let whole = tag_buffers[tag as usize]
                .take()
                .expect("each tag's buffer taken once");
            &mut whole[..len]
        };
        let mut results = Vec::new();
        serve_read_batch(&export, &batch, buffer, &mut results);
        results.sort();
        assert_eq!(results, vec![(2, 8192), (4, 4096), (9, -libc::EINVAL)]);
        assert!(memory[4 * 8192..4 * 8192 + 4096] == contents[4096..8192]);
        assert!(memory[2 * 8192..3 * 8192] == contents[51200..59392]);
        assert!(memory[9 * 8192..].iter().all(|&b| b == 0));
    }
}
