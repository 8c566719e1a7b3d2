//! Checks member images directly, without the engine: every stripe's parity with the reference backend, every
//! copy of every data chunk, and (when the expected array contents are known) every data chunk against them.

use paraid_parity::reference::Reference;
use paraid_parity::{Backend, CheckOutcome};

use crate::layout::{Geometry, Level};

/// What an audit found.
#[derive(Debug, Clone, Default)]
pub struct AuditReport {
    /// Stripes whose parity was checked (all members present), and of those the inconsistent ones with the
    /// reference's verdict.
    pub stripes_checked: u64,
    pub bad_stripes: Vec<(u64, CheckOutcome)>,
    /// Degraded stripes whose present parity was compared with parity computed from the expected contents.
    pub degraded_stripes_checked: u64,
    /// Data chunk copies compared (with the expected contents, or with the other copies).
    pub copies_checked: u64,
    /// Everything else that was wrong, one line each.
    pub problems: Vec<String>,
}

impl AuditReport {
    pub fn clean(&self) -> bool {
        self.bad_stripes.is_empty() && self.problems.is_empty()
    }

    /// One line per problem, for messages.
    pub fn describe(&self) -> String {
        let mut lines: Vec<String> = self
            .bad_stripes
            .iter()
            .map(|(s, o)| format!("stripe {s}: parity {o:?}"))
            .collect();
        lines.extend(self.problems.iter().cloned());
        lines.join("; ")
    }
}

/// The data area of a member image.
fn area<'a>(image: &'a [u8], data_offset_bytes: u64, g: &Geometry) -> &'a [u8] {
    &image[data_offset_bytes as usize..(data_offset_bytes + g.member_data_bytes()) as usize]
}

/// Audits `images` (slot order, None = missing) of an array with geometry `g`. With `expected` (the array's
/// contents), every present copy of every chunk must equal it and degraded stripes' parity must match it;
/// without, present copies of a chunk must agree with each other. At most 16 problems are listed.
pub fn audit_images(
    g: &Geometry,
    data_offset_bytes: u64,
    images: &[Option<Vec<u8>>],
    expected: Option<&[u8]>,
) -> AuditReport {
    const MAX_PROBLEMS: usize = 16;
    let mut report = AuditReport::default();
    let cb = g.chunk_bytes as usize;
    let areas: Vec<Option<&[u8]>> = images
        .iter()
        .map(|i| i.as_deref().map(|i| area(i, data_offset_bytes, g)))
        .collect();
    let cell = |member: usize, row: u64| -> Option<&[u8]> {
        areas[member].map(|a| &a[row as usize * cb..(row as usize + 1) * cb])
    };
    if let Some(expected) = expected {
        assert_eq!(expected.len() as u64, g.array_bytes());
    }
    for chunk in 0..g.data_chunks() {
        let want: Option<&[u8]> =
            expected.map(|e| &e[chunk as usize * cb..(chunk as usize + 1) * cb]);
        let mut first: Option<(usize, &[u8])> = None;
        for copy in 0..g.copies() {
            let addr = g.chunk_copy(chunk, copy);
            let Some(bytes) = cell(addr.member, addr.row) else {
                continue;
            };
            report.copies_checked += 1;
            let wrong = match (want, first) {
                (Some(w), _) => bytes != w,
                (None, Some((_, f))) => bytes != f,
                (None, None) => false,
            };
            if wrong && report.problems.len() < MAX_PROBLEMS {
                let at = match want.or(first.map(|f| f.1)) {
                    Some(w) => w.iter().zip(bytes).position(|(a, b)| a != b).unwrap_or(0),
                    None => 0,
                };
                report.problems.push(format!(
                    "chunk {chunk} copy {copy} on member {} row {} differs{} at +{at}",
                    addr.member,
                    addr.row,
                    if want.is_some() {
                        " from the expected contents"
                    } else {
                        " from another copy"
                    }
                ));
            }
            if first.is_none() {
                first = Some((addr.member, bytes));
            }
        }
    }
    if !g.level.has_parity() {
        return report;
    }
    let has_q = g.level == Level::Raid6;
    let k = g.data_per_stripe();
    let chunks = k + g.level.parity_chunks();
    for stripe in 0..g.stripes() {
        let cells: Vec<Option<&[u8]>> = (0..chunks)
            .map(|i| cell(g.stripe_member(stripe, i), stripe))
            .collect();
        if cells.iter().all(|c| c.is_some()) {
            let cells: Vec<&[u8]> = cells.iter().map(|c| c.expect("all present")).collect();
            report.stripes_checked += 1;
            let outcome = Reference.check(&cells, has_q);
            if outcome != CheckOutcome::Consistent {
                report.bad_stripes.push((stripe, outcome));
            }
            continue;
        }
        let Some(expected) = expected else {
            continue;
        };
        let data: Vec<&[u8]> = (0..k)
            .map(|i| {
                let chunk = stripe as usize * k + i;
                &expected[chunk * cb..(chunk + 1) * cb]
            })
            .collect();
        let mut p = vec![0u8; cb];
        let mut q = vec![0u8; cb];
        if has_q {
            Reference.gen_pq(&data, &mut p, &mut q);
        } else {
            Reference.gen_p(&data, &mut p);
        }
        report.degraded_stripes_checked += 1;
        for (index, want) in [(k, &p), (k + 1, &q)] {
            if index >= chunks {
                continue;
            }
            if let Some(stored) = cells[index] {
                if stored != &want[..] && report.problems.len() < MAX_PROBLEMS {
                    report.problems.push(format!(
                        "degraded stripe {stripe}: stored {} differs from the expected data's",
                        if index == k { "P" } else { "Q" }
                    ));
                }
            }
        }
    }
    report
}
