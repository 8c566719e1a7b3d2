//! Requests of one batch that continue one another on a member, run as one vectored system call.
//!
//! Why: a window of whole stripes writes one chunk per member per stripe, and consecutive stripes' chunks lie
//! back to back on each member; on members in memory, which run on the calling thread (`run_inline`), a 1 MiB
//! RAID6 write of 64 KiB chunks was 24 `pwrite`s where one `pwritev` per member (6) moves the same bytes. Only
//! requests that are already contiguous are joined, and only reads with reads, writes with writes of the same
//! FUA: the batch's requests run concurrently by the `MemberIo` contract, so no order between them is given up.
//! A vectored call that fails or stops short runs its requests again one by one, so each gets its own result
//! (which request of a run hit a bad range is what the array acts on).

use std::io;
use std::os::unix::io::AsRawFd;

use super::{IoOp, IoReq};

/// Most iovecs one call takes (the kernel's UIO_MAXIOV).
const MAX_IOVECS: usize = 1024;
/// Most bytes one joined call moves (a run stops before going past it).
const MAX_RUN_BYTES: u64 = 1 << 30;

/// What a request contributes to a run: its slot, direction (read; write with FUA or without), first byte and
/// length. `None`: it runs alone (flushes, discards).
fn shape(req: &IoReq<'_>) -> Option<(usize, u8, u64, u64)> {
    match &req.op {
        IoOp::Read { offset_bytes, buf } => Some((req.slot, 0, *offset_bytes, buf.len() as u64)),
        IoOp::Write {
            offset_bytes,
            buf,
            fua,
        } => Some((req.slot, 1 + *fua as u8, *offset_bytes, buf.len() as u64)),
        IoOp::Flush | IoOp::Discard { .. } => None,
    }
}

/// Whether two of the requests of a batch are on one member (only then can a run join anything).
pub(super) fn may_join(reqs: &[IoReq<'_>]) -> bool {
    let mut seen = 0u64;
    for req in reqs {
        let slot = req.slot;
        if slot >= 64 || seen & (1 << slot) != 0 {
            return true;
        }
        seen |= 1 << slot;
    }
    false
}

/// Splits `indices` (into `reqs`) into runs: each a list of requests, in member order, that continue one
/// another on one member in one direction; a request that continues none is a run of its own.
pub(super) fn runs(reqs: &[IoReq<'_>], indices: &[usize]) -> Vec<Vec<usize>> {
    let mut joinable: Vec<(usize, u8, u64, u64, usize)> = Vec::new();
    let mut out: Vec<Vec<usize>> = Vec::new();
    for &i in indices {
        match shape(&reqs[i]) {
            Some((slot, dir, at, len)) if len > 0 => joinable.push((slot, dir, at, len, i)),
            _ => out.push(vec![i]),
        }
    }
    joinable.sort_unstable_by_key(|&(slot, dir, at, _, i)| (slot, dir, at, i));
    let mut run: Vec<usize> = Vec::new();
    let (mut run_key, mut run_end, mut run_bytes) = ((usize::MAX, 0u8), 0u64, 0u64);
    for (slot, dir, at, len, i) in joinable {
        let continues = (slot, dir) == run_key
            && at == run_end
            && run.len() < MAX_IOVECS
            && run_bytes + len <= MAX_RUN_BYTES;
        if !continues && !run.is_empty() {
            out.push(std::mem::take(&mut run));
        }
        if !continues {
            run_key = (slot, dir);
            run_bytes = 0;
        }
        run.push(i);
        run_end = at + len;
        run_bytes += len;
    }
    if !run.is_empty() {
        out.push(run);
    }
    out
}

/// Runs `run` (two requests or more from `runs`) on `fd` as one `preadv`/`pwritev2`; `Err` if the call failed or
/// moved fewer bytes than asked, in which case the caller runs them one by one (what was written meanwhile is
/// written again: the same bytes to the same place).
pub(super) fn run_joined(
    fd: &impl AsRawFd,
    reqs: &mut [IoReq<'_>],
    run: &[usize],
) -> io::Result<()> {
    debug_assert!(run.len() >= 2);
    let (_, dir, first_bytes, _) = shape(&reqs[run[0]]).expect("a run holds reads or writes");
    let mut iovecs: Vec<libc::iovec> = Vec::with_capacity(run.len());
    let mut total = 0usize;
    for &i in run {
        let (base, len) = match &mut reqs[i].op {
            IoOp::Read { buf, .. } => (buf.as_mut_ptr() as *mut libc::c_void, buf.len()),
            IoOp::Write { buf, .. } => (buf.as_ptr() as *mut libc::c_void, buf.len()),
            IoOp::Flush | IoOp::Discard { .. } => unreachable!("runs hold reads or writes"),
        };
        iovecs.push(libc::iovec {
            iov_base: base,
            iov_len: len,
        });
        total += len;
    }
    let flags = if dir == 2 { libc::RWF_DSYNC } else { 0 };
    loop {
        // SAFETY: the iovecs cover live buffers of distinct requests (reads: `&mut` buffers, which nothing else
        // holds while the batch runs; writes: buffers the kernel only reads), for the length of the call.
        let n = unsafe {
            if dir == 0 {
                libc::preadv(
                    fd.as_raw_fd(),
                    iovecs.as_ptr(),
                    iovecs.len() as libc::c_int,
                    first_bytes as libc::off_t,
                )
            } else {
                libc::pwritev2(
                    fd.as_raw_fd(),
                    iovecs.as_ptr(),
                    iovecs.len() as libc::c_int,
                    first_bytes as libc::off_t,
                    flags,
                )
            }
        };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if n as usize != total {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "short vectored transfer",
            ));
        }
        return Ok(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(slot: usize, at: u64, buf: &[u8], fua: bool) -> IoReq<'_> {
        IoReq::write(slot, at, buf, fua)
    }

    #[test]
    fn runs_join_what_continues_on_one_member_in_one_direction() {
        let page = vec![0u8; 4096];
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        let reqs = vec![
            write(1, 8192, &page, false),  // 0: continues 3 on slot 1
            write(0, 0, &page, false),     // 1
            write(0, 4096, &page, false),  // 2: continues 1
            write(1, 4096, &page, false),  // 3
            write(1, 12288, &page, true),  // 4: FUA, not with 0
            IoReq::read(0, 8192, &mut a),  // 5: a read, not with 2
            IoReq::new(0, IoOp::Flush),    // 6: alone
            write(0, 12288, &page, false), // 7: a gap after 2 (8192 is read), alone
            IoReq::read(0, 12288, &mut b), // 8: continues 5
        ];
        assert!(may_join(&reqs));
        assert!(!may_join(&reqs[..2]), "slots 1 and 0, one request each");
        let mut got = runs(&reqs, &(0..reqs.len()).collect::<Vec<_>>());
        got.sort();
        assert_eq!(
            got,
            vec![
                vec![1, 2],
                vec![3, 0],
                vec![4],
                vec![5, 8],
                vec![6],
                vec![7]
            ]
        );
    }

    #[test]
    fn a_joined_write_and_read_move_every_request_s_bytes() {
        let dir = std::env::temp_dir().join(format!("paraid-vectored-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("m");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("open");
        let bufs: Vec<Vec<u8>> = (0..3u8)
            .map(|n| vec![n + 1; 4096 * (n as usize + 1)])
            .collect();
        let mut reqs: Vec<IoReq<'_>> = vec![
            write(0, 4096 * 3, &bufs[2], false),
            write(0, 0, &bufs[0], false),
            write(0, 4096, &bufs[1], false),
        ];
        let all = runs(&reqs, &[0, 1, 2]);
        assert_eq!(all, vec![vec![1, 2, 0]]);
        run_joined(&file, &mut reqs, &all[0]).expect("pwritev");
        let on_disk = std::fs::read(&path).expect("read back");
        assert_eq!(on_disk, [&bufs[0][..], &bufs[1][..], &bufs[2][..]].concat());
        let (mut x, mut y) = (vec![0u8; 4096 * 2], vec![0u8; 4096 * 4]);
        let mut reads = vec![IoReq::read(0, 4096 * 2, &mut y), IoReq::read(0, 0, &mut x)];
        let all = runs(&reads, &[0, 1]);
        run_joined(&file, &mut reads, &all[0]).expect("preadv");
        drop(reads);
        assert_eq!([x, y].concat(), on_disk);
        // Past the end of the file a read comes back short: an error, for the caller to run one by one.
        let (mut p, mut q) = (vec![0u8; 4096], vec![0u8; 4096]);
        let mut past = vec![
            IoReq::read(0, 4096 * 5, &mut p),
            IoReq::read(0, 4096 * 6, &mut q),
        ];
        assert!(run_joined(&file, &mut past, &[0, 1]).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
