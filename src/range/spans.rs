//! [`Spans`]: which byte ranges of one object a tier holds, and how they cover a request.

use std::collections::BTreeMap;
use std::ops::Range;

/// The ranges of one object version a tier holds, by start offset. Entries may overlap (a
/// later download can cover part of an earlier one); for one start only the longest is kept.
#[derive(Debug, Default, Clone)]
pub(crate) struct Spans(BTreeMap<u64, u64>);

/// One piece of a request: the bytes `piece`, and the held range they lie in, if any.
pub(crate) type Piece = (Range<u64>, Option<Range<u64>>);

impl Spans {
    /// Records that `range` is held. Returns the range it replaced at the same start, if any.
    pub(crate) fn insert(&mut self, range: Range<u64>) -> Option<Range<u64>> {
        let start = range.start;
        match self.0.get(&start) {
            Some(&end) if end >= range.end => None,
            _ => self.0.insert(start, range.end).map(|end| start..end),
        }
    }

    /// Forgets `range` if it is the range held at its start.
    pub(crate) fn remove(&mut self, range: &Range<u64>) {
        if self.0.get(&range.start) == Some(&range.end) {
            self.0.remove(&range.start);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every held range.
    pub(crate) fn ranges(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.0.iter().map(|(&s, &e)| s..e)
    }

    /// Cuts `range` into consecutive pieces, each inside one held range (the one reaching
    /// furthest) or in a gap no held range touches.
    pub(crate) fn cover(&self, range: Range<u64>) -> Vec<Piece> {
        let mut pieces = Vec::new();
        let mut pos = range.start;
        while pos < range.end {
            let best = self
                .0
                .range(..=pos)
                .map(|(&s, &e)| s..e)
                .filter(|held| held.end > pos)
                .max_by_key(|held| held.end);
            match best {
                Some(held) => {
                    let end = held.end.min(range.end);
                    pieces.push((pos..end, Some(held)));
                    pos = end;
                }
                None => {
                    let next = self.0.range(pos + 1..).next().map_or(u64::MAX, |(&s, _)| s);
                    let end = next.min(range.end);
                    pieces.push((pos..end, None));
                    pos = end;
                }
            }
        }
        pieces
    }

    /// Whether every byte of `range` is held.
    #[cfg(test)]
    pub(crate) fn covers(&self, range: Range<u64>) -> bool {
        self.cover(range).iter().all(|(_, held)| held.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(ranges: &[Range<u64>]) -> Spans {
        let mut s = Spans::default();
        for r in ranges {
            s.insert(r.clone());
        }
        s
    }

    #[test]
    fn a_request_is_cut_into_held_pieces_and_gaps() {
        let s = spans(&[10..20, 15..40, 50..60]);
        assert_eq!(
            s.cover(0..70),
            vec![
                (0..10, None),
                (10..20, Some(10..20)),
                (20..40, Some(15..40)),
                (40..50, None),
                (50..60, Some(50..60)),
                (60..70, None),
            ]
        );
        assert_eq!(s.cover(12..18), vec![(12..18, Some(10..20))]);
        assert!(s.covers(10..40));
        assert!(!s.covers(10..41));
    }

    #[test]
    fn the_longest_range_at_a_start_is_kept_and_removal_needs_the_exact_range() {
        let mut s = Spans::default();
        s.insert(0..10);
        assert_eq!(s.insert(0..5), None);
        assert_eq!(s.insert(0..20), Some(0..10));
        s.remove(&(0..10));
        assert!(s.covers(0..20));
        s.remove(&(0..20));
        assert!(s.is_empty());
    }
}
