//! [`Spans`]: which byte ranges of one object a tier holds, and how they cover a request.

use std::collections::BTreeMap;
use std::ops::Range;

/// The ranges of one object version a tier holds, by start offset. No held range lies
/// inside another (a range inside a held one is not recorded; one holding others replaces
/// them), so ends grow with starts, and the range holding an offset is the last one starting
/// at or before it: each piece of a lookup is one probe of the map, however many ranges the
/// object has.
#[derive(Debug, Default, Clone)]
pub(crate) struct Spans(Starts);

/// Ends by start. Most versions a tier holds are held in one range (a small file read
/// whole, a footer): that one is kept inline, a map taken for more.
#[derive(Debug, Default, Clone)]
enum Starts {
    #[default]
    None,
    One(u64, u64),
    Many(BTreeMap<u64, u64>),
}

impl Starts {
    /// The held ranges starting within `starts`, in order.
    fn within(&self, starts: Range<u64>) -> impl Iterator<Item = (u64, u64)> + '_ {
        let (one, many) = match self {
            Self::None => (None, None),
            Self::One(s, e) => (starts.contains(s).then_some((*s, *e)), None),
            Self::Many(map) => (None, Some(map.range(starts))),
        };
        let many = many.into_iter().flatten().map(|(&s, &e)| (s, e));
        one.into_iter().chain(many)
    }

    /// The held range starting last at or before `pos`.
    fn at_or_before(&self, pos: u64) -> Option<(u64, u64)> {
        match self {
            Self::None => None,
            Self::One(s, e) => (*s <= pos).then_some((*s, *e)),
            Self::Many(map) => map.range(..=pos).next_back().map(|(&s, &e)| (s, e)),
        }
    }

    /// The start of the first held range starting after `pos`.
    fn first_after(&self, pos: u64) -> Option<u64> {
        match self {
            Self::None => None,
            Self::One(s, _) => (*s > pos).then_some(*s),
            Self::Many(map) => map.range(pos + 1..).next().map(|(&s, _)| s),
        }
    }

    fn end_of(&self, start: u64) -> Option<u64> {
        match self {
            Self::None => None,
            Self::One(s, e) => (*s == start).then_some(*e),
            Self::Many(map) => map.get(&start).copied(),
        }
    }

    fn insert(&mut self, start: u64, end: u64) {
        match self {
            Self::None => *self = Self::One(start, end),
            Self::One(s, _) if *s == start => *self = Self::One(start, end),
            Self::One(s, e) => *self = Self::Many(BTreeMap::from([(*s, *e), (start, end)])),
            Self::Many(map) => {
                map.insert(start, end);
            }
        }
    }

    fn remove(&mut self, start: u64) {
        match self {
            Self::None => {}
            Self::One(s, _) => {
                if *s == start {
                    *self = Self::None;
                }
            }
            Self::Many(map) => {
                map.remove(&start);
                if map.len() <= 1 {
                    *self = map.pop_first().map_or(Self::None, |(s, e)| Self::One(s, e));
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self, Self::None)
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let (one, many) = match self {
            Self::None => (None, None),
            Self::One(s, e) => (Some((*s, *e)), None),
            Self::Many(map) => (None, Some(map)),
        };
        let many = many.into_iter().flatten().map(|(&s, &e)| (s, e));
        one.into_iter().chain(many)
    }
}

/// One piece of a request: the bytes `piece`, and the held range they lie in, if any.
pub(crate) type Piece = (Range<u64>, Option<Range<u64>>);

/// What recording a range did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Inserted {
    /// A held range holds it already: nothing recorded.
    Covered,
    /// Recorded; the held ranges it holds were removed (their entries are no longer needed).
    Replacing(Vec<Range<u64>>),
}

impl Spans {
    /// Records that `range` is held, unless a held range holds it already.
    pub(crate) fn insert(&mut self, range: Range<u64>) -> Inserted {
        if self.holds(&range) {
            return Inserted::Covered;
        }
        // Ends grow with starts: the first one reaching past `range` ends the run.
        let inside: Vec<Range<u64>> = (self.0.within(range.start..range.end))
            .take_while(|&(_, end)| end <= range.end)
            .map(|(start, end)| start..end)
            .collect();
        for r in &inside {
            self.0.remove(r.start);
        }
        self.0.insert(range.start, range.end);
        Inserted::Replacing(inside)
    }

    /// Whether one held range holds all of `range`.
    pub(crate) fn holds(&self, range: &Range<u64>) -> bool {
        self.holding(range.start)
            .is_some_and(|held| held.end >= range.end)
    }

    /// Forgets `range` if it is the range held at its start.
    pub(crate) fn remove(&mut self, range: &Range<u64>) {
        if self.0.end_of(range.start) == Some(range.end) {
            self.0.remove(range.start);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every held range.
    pub(crate) fn ranges(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.0.iter().map(|(s, e)| s..e)
    }

    /// The bytes the held ranges cover, each byte once where ranges overlap.
    pub(crate) fn bytes(&self) -> u64 {
        let (mut total, mut reached) = (0, 0);
        for range in self.ranges() {
            let start = range.start.max(reached);
            if range.end > start {
                total += range.end - start;
                reached = range.end;
            }
        }
        total
    }

    /// The held range starting last at or before `pos` (the one reaching furthest past it).
    fn holding(&self, pos: u64) -> Option<Range<u64>> {
        #[cfg(test)]
        tests::PROBES.with(|p| p.set(p.get() + 1));
        self.0.at_or_before(pos).map(|(s, e)| s..e)
    }

    /// Cuts `range` into consecutive pieces, each inside one held range or in a gap no held
    /// range touches.
    pub(crate) fn cover(&self, range: Range<u64>) -> Vec<Piece> {
        let mut pieces = Vec::new();
        let mut pos = range.start;
        while pos < range.end {
            match self.holding(pos).filter(|held| held.end > pos) {
                Some(held) => {
                    let end = held.end.min(range.end);
                    pieces.push((pos..end, Some(held)));
                    pos = end;
                }
                None => {
                    #[cfg(test)]
                    tests::PROBES.with(|p| p.set(p.get() + 1));
                    let next = self.0.first_after(pos).unwrap_or(u64::MAX);
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
#[allow(clippy::single_range_in_vec_init)] // one-range pieces are the common case here
mod tests {
    use super::*;

    thread_local! {
        /// Entries of the map a lookup visited.
        pub(super) static PROBES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

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
    fn a_range_inside_a_held_one_is_not_recorded_and_one_holding_others_replaces_them() {
        let mut s = Spans::default();
        s.insert(0..10);
        assert_eq!(s.insert(0..5), Inserted::Covered);
        assert_eq!(s.insert(2..8), Inserted::Covered);
        assert_eq!(s.insert(0..20), Inserted::Replacing(vec![0..10]));
        assert_eq!(s.insert(30..40), Inserted::Replacing(vec![]));
        assert_eq!(s.insert(35..50), Inserted::Replacing(vec![]));
        assert_eq!(s.insert(25..60), Inserted::Replacing(vec![30..40, 35..50]));
        assert_eq!(s.ranges().collect::<Vec<_>>(), vec![0..20, 25..60]);
        s.remove(&(0..10));
        assert!(s.covers(0..20));
        s.remove(&(0..20));
        s.remove(&(25..60));
        assert!(s.is_empty());
    }

    #[test]
    fn one_range_is_held_inline_and_a_second_takes_a_map_until_one_is_left() {
        let mut s = spans(&[20..30]);
        assert!(matches!(s.0, Starts::One(20, 30)));
        assert_eq!(s.insert(0..10), Inserted::Replacing(vec![]));
        assert!(matches!(s.0, Starts::Many(_)));
        assert_eq!(
            s.cover(0..30),
            vec![(0..10, Some(0..10)), (10..20, None), (20..30, Some(20..30))]
        );
        s.remove(&(0..10));
        assert!(matches!(s.0, Starts::One(20, 30)), "back inline: {:?}", s.0);
        assert_eq!(s.cover(0..30), vec![(0..20, None), (20..30, Some(20..30))]);
        s.remove(&(20..25));
        assert!(
            s.holds(&(20..30)),
            "a range that is not the one held at its start stays"
        );
        assert_eq!(s.insert(10..40), Inserted::Replacing(vec![20..30]));
        assert_eq!(s.ranges().collect::<Vec<_>>(), vec![10..40]);
        assert_eq!(
            s.cover(5..45),
            vec![(5..10, None), (10..40, Some(10..40)), (40..45, None)]
        );
    }

    #[test]
    fn a_lookup_of_an_object_held_in_many_pieces_costs_a_probe_per_piece() {
        // Overlapping neighbours, as downloads of adjacent pages leave them, and gaps.
        let mut s = Spans::default();
        let n = 5_000u64;
        for i in 0..n {
            s.insert(i * 20..i * 20 + 15);
            s.insert(i * 20 + 10..i * 20 + 18);
        }
        PROBES.with(|p| p.set(0));
        let pieces = s.cover(0..n * 20);
        let probes = PROBES.with(|p| p.get());
        assert_eq!(
            pieces.len() as u64,
            3 * n,
            "two held pieces and a gap per step"
        );
        // One probe per piece: a walk of every earlier range per piece is quadratic.
        assert!(probes <= 2 * pieces.len() as u64, "{probes} probes");
    }
}
