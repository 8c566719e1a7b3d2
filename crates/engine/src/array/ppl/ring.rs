//! Where records go in a member's ring.

use super::*;

/// A member's ring: where the next record goes and the records not yet retired (seq, first page, pages).
#[derive(Default)]
pub(super) struct Ring {
    pub(super) head: u64,
    pub(super) live: VecDeque<(u64, u64, u64)>,
}

impl Ring {
    pub(super) fn cursor(&self) -> RingCursor {
        RingCursor {
            head: self.head,
            tail: self.live.front().map(|&(_, start, _)| start),
        }
    }
}

/// Where the next record of a ring goes, and where its oldest live record starts: enough to place records.
#[derive(Clone, Copy)]
pub(super) struct RingCursor {
    pub(super) head: u64,
    pub(super) tail: Option<u64>,
}

impl RingCursor {
    /// Places a record of `pages` contiguous pages (of the record space), if they are free.
    pub(super) fn place(&mut self, pages: u64, ring_pages: u64) -> Option<u64> {
        if pages > ring_pages {
            return None;
        }
        let start = match self.tail {
            None if self.head + pages <= ring_pages => self.head,
            None => 0,
            Some(tail) if self.head > tail => {
                if self.head + pages <= ring_pages {
                    self.head
                } else if pages <= tail {
                    0
                } else {
                    return None;
                }
            }
            Some(tail) if self.head + pages <= tail => self.head,
            Some(_) => return None,
        };
        self.tail.get_or_insert(start);
        self.head = start + pages;
        Some(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_places_records_contiguously_and_wraps_only_into_free_space() {
        let ring_pages = 10;
        let mut ring = Ring::default();
        let mut c = ring.cursor();
        assert_eq!(c.place(4, ring_pages), Some(0));
        assert_eq!(c.place(4, ring_pages), Some(4));
        // 2 pages left at the end, the start is taken: a 3-page record does not fit.
        assert_eq!(c.place(3, ring_pages), None);
        assert_eq!(c.place(11, ring_pages), None);
        ring.live.push_back((1, 0, 4));
        ring.live.push_back((2, 4, 4));
        ring.head = 8;
        // The first record retired: its 4 pages at the start are free; a record never wraps around the end.
        ring.live.pop_front();
        let mut c = ring.cursor();
        assert_eq!(c.place(3, ring_pages), Some(0));
        assert_eq!(c.place(1, ring_pages), Some(3));
        assert_eq!(
            c.place(1, ring_pages),
            None,
            "up to the oldest live record at 4"
        );
        // Everything retired: the ring starts wherever it is, wrapping when the record does not fit before the end.
        ring.live.clear();
        let mut c = ring.cursor();
        assert_eq!(c.place(2, ring_pages), Some(8));
        let mut c = ring.cursor();
        assert_eq!(c.place(3, ring_pages), Some(0));
    }
}
